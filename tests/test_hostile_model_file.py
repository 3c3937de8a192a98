"""Hostile model files: the architecture a file carries is bounded and checked against the
file's header before anything is built — every case a FormatError naming the file, fast, with
next to no memory; child names as ``add_module`` (and PyTorch's) takes them; LazyLinear
round-trips; ``inspect`` builds nothing; the CLI says one line and exits 2."""

import json
import threading
import time
import tracemalloc

import numpy as np
import pytest

import linearkit as lk
from linearkit.cli.commands import main
from linearkit.io.model_file import SPEC_KEY, read_spec
from linearkit.io.spec import FORMAT, MAX_NAME, MAX_NODES, MAX_SPEC_CHARS

MIB = 1 << 20


def _file(path, root, state=None, *, text=None):
    """A safetensors file holding ``state`` (a dict of arrays; {}: no tensors at all) and the
    architecture ``root`` (a node dict) or the raw spec JSON ``text``."""
    if text is None:
        text = json.dumps({"format": FORMAT, "root": root})
    lk.save(state or {}, path, metadata={SPEC_KEY: text})
    return path


def _node(kind, children=(), **args):
    node = {"type": kind, "args": args, "training": True}
    if children:
        node["children"] = [[name, child] for name, child in children]
    return node


def _refused(path, *phrases):
    """load_model(path) -> the FormatError, after checking it names the file and ``phrases``;
    returns ``(message, seconds, peak traced bytes)``."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(lk.FormatError) as err:
            lk.load_model(path)
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(err.value)
    assert message.startswith(f"{path}: "), message
    assert "hint:" in message, message
    for phrase in phrases:
        assert phrase in message, message
    return message, seconds, peak


def _deep_text(levels: int) -> str:
    node = '{"type":"ReLU","args":{}}'
    for _ in range(levels):
        node = '{"type":"Sequential","args":{},"children":[["0",' + node + "]]}"
    return '{"format":"' + FORMAT + '","root":' + node + "}"


# ---------------------------------------------------------------------------- bounds
def test_a_10000_deep_spec_is_a_format_error_naming_the_file(tmp_path):
    path = _file(tmp_path / "deep.safetensors", None, text=_deep_text(10_000))
    _, seconds, peak = _refused(path, "nests deeper than 64")
    assert peak < 10 * MIB and seconds < 2  # measured ~15 ms untraced (tracemalloc slows it)


def test_nesting_deeper_than_the_limit_but_shallow_for_python_is_refused(tmp_path):
    path = _file(tmp_path / "d.safetensors", None, text=_deep_text(65))
    _refused(path, "nests deeper than 64")
    path = _file(tmp_path / "ok.safetensors", None, text=_deep_text(63))
    assert isinstance(lk.load_model(path), lk.Sequential)


@pytest.mark.parametrize("root, phrase", [
    (_node("Linear", in_features=100_000, out_features=100_000), "(100000, 100000)"),
    (_node("Linear", in_features=15_000, out_features=15_000), "(15000, 15000)"),
    (_node("LayerNorm", normalized_shape=[10**10]), "(10000000000,)"),
    (_node("BatchNorm1d", num_features=10**10), "(10000000000,)"),
    (_node("SparseLinear", in_features=10**5, out_features=10**5, nnz=10**10), "(10000000000,)"),
    (_node("QuantizedLinear", in_features=10**5, out_features=10**5), "(100000, 100000)"),
    (_node("Sequential", [("0", _node("ReLU")),
                          ("1", _node("Linear", in_features=10**6, out_features=10**6))]),
     "module '1' (Linear)"),
], ids=["linear-1e5", "linear-15000", "layernorm-1e10", "batchnorm-1e10", "sparse-1e10",
        "quantized-1e5", "nested"])
def test_a_huge_spec_without_its_tensors_is_refused_before_any_allocation(root, phrase, tmp_path):
    path = _file(tmp_path / "huge.safetensors", root)
    _, seconds, peak = _refused(path, phrase, "expects tensor", "no such tensor")
    assert peak < 10 * MIB and seconds < 0.5  # measured ~0.1 ms, ~10 KiB


def test_a_lora_rank_that_disagrees_with_its_children_is_refused_before_allocation(tmp_path):
    from linearkit.layers.lora import LoRALinear

    lk.manual_seed(0)
    model = lk.Sequential(LoRALinear(lk.Linear(6, 4), rank=2))
    path = tmp_path / "lora.safetensors"
    lk.save(model, path)
    spec = read_spec(path)
    spec["root"]["children"][0][1]["args"]["rank"] = 10**9  # would allocate (1e9, 6) first
    _file(path, None, model.state_dict(), text=json.dumps(spec))
    _, _, peak = _refused(path, "module '0' (LoRALinear)", "rank=1000000000")
    assert peak < 10 * MIB


def test_too_many_nodes_too_long_a_text_and_too_many_brackets_are_refused(tmp_path):
    relus = [(str(i), _node("ReLU")) for i in range(MAX_NODES + 1)]
    _refused(_file(tmp_path / "n.safetensors", _node("Sequential", relus)),
             f"more than {MAX_NODES:,} modules")
    padded = json.dumps({"format": FORMAT, "root": _node("ReLU"), "pad": "x" * MAX_SPEC_CHARS})
    _refused(_file(tmp_path / "long.safetensors", None, text=padded), "characters of JSON")
    brackets = json.dumps({"format": FORMAT, "root": _node("ReLU"), "pad": [[]] * 100_000})
    _refused(_file(tmp_path / "b.safetensors", None, text=brackets), "JSON objects and arrays")


def test_duplicate_json_keys_are_refused(tmp_path):
    text = ('{"format":"' + FORMAT + '","root":{"type":"Linear","args":{"in_features":2,'
            '"out_features":2,"in_features":3}}}')
    _refused(_file(tmp_path / "dup.safetensors", None, text=text), "'in_features' twice")


# ---------------------------------------------------------------------------- spec vs header
def _classifier(n_in=8):
    return _node("Sequential", [("classifier", _node("Sequential", [
        ("0", _node("Linear", in_features=4, out_features=8)), ("1", _node("ReLU")),
        ("2", _node("Linear", in_features=n_in, out_features=3))]))])


def _classifier_state():
    lk.manual_seed(0)
    model = lk.Sequential(lk.Linear(4, 8), lk.ReLU(), lk.Linear(8, 3))
    return {f"classifier.{k}": v for k, v in model.state_dict().items()}


def test_a_shape_disagreement_names_the_module_path_expected_and_found(tmp_path):
    path = _file(tmp_path / "c.safetensors", _classifier(n_in=9), _classifier_state())
    _refused(path, "module 'classifier.2' (Linear)", "'classifier.2.weight'", "(3, 9)",
             "shape (3, 8)", "linearkit.save")
    good = _file(tmp_path / "good.safetensors", _classifier(), _classifier_state())
    assert lk.load_model(good).classifier[2].weight.shape == (3, 8)


def test_a_dtype_kind_disagreement_is_refused(tmp_path):
    state = _classifier_state()
    state["classifier.2.weight"] = state["classifier.2.weight"].astype(np.int32)
    _refused(_file(tmp_path / "i.safetensors", _classifier(), state),
             "'classifier.2.weight' to be a floating-point tensor", "I32")
    bn = lk.BatchNorm1d(3).state_dict()
    bn["num_batches_tracked"] = np.zeros((), np.float32)
    _refused(_file(tmp_path / "bn.safetensors", _node("BatchNorm1d", num_features=3), bn),
             "'num_batches_tracked' to be an integer tensor", "F32")


def test_a_tensor_no_module_holds_is_refused(tmp_path):
    state = _classifier_state()
    state["classifier.2.extra"] = np.zeros(2, np.float32)
    _refused(_file(tmp_path / "u.safetensors", _classifier(), state),
             "tensor 'classifier.2.extra' in the file belongs to no module",
             "module 'classifier.2' (Linear)")


def test_layers_are_built_without_their_random_init(tmp_path, monkeypatch):
    lk.manual_seed(0)
    model = lk.Sequential(lk.Linear(300, 200), lk.ReLU(), lk.LazyLinear(5))
    model(np.ones((1, 300), np.float32))  # materializes the LazyLinear into a Linear
    path = tmp_path / "m.safetensors"
    lk.save(model, path)

    def refuse(*args, **kwargs):
        raise AssertionError("a layer was randomly initialized before its weights loaded")

    monkeypatch.setattr(lk.Linear, "reset_parameters", refuse)
    stream = lk.core.random.default_generator().bit_generator.state
    again = lk.load_model(path)
    assert lk.core.random.default_generator().bit_generator.state == stream
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(again.state_dict()[key], value)


def test_uninitialized_is_scoped_to_its_thread():
    from linearkit.layers.linear import uninitialized

    seen = []
    with uninitialized():
        other = threading.Thread(target=lambda: seen.append(
            lk.Linear(4, 3, rng=np.random.default_rng(0)).weight.data.copy()))
        other.start()
        other.join()
    initialized = lk.Linear(4, 3, rng=np.random.default_rng(0)).weight.data
    np.testing.assert_array_equal(seen[0], initialized)


def test_a_users_type_is_checked_against_the_header_once_built(tmp_path):
    from linearkit.rules import LayerRule, Rebuild, register_rule

    class Scale(lk.Module):
        def __init__(self, d):
            super().__init__()
            self.d = d
            self.weight = lk.Parameter(np.ones(d, np.float32))

        def forward(self, x):
            return x * self.weight.data

    with register_rule(Scale, LayerRule(kind="scale", rebuild=Rebuild(lambda m: {"d": m.d}))):
        model = lk.Sequential(lk.Linear(2, 3), Scale(3))
        path = tmp_path / "s.safetensors"
        lk.save(model, path)
        assert isinstance(lk.load_model(path)[1], Scale)
        spec = read_spec(path)
        spec["root"]["children"][1][1]["args"]["d"] = 5
        _file(path, None, model.state_dict(), text=json.dumps(spec))
        _refused(path, "module '1' (", "Scale)", "'1.weight' of shape (5,)", "shape (3,)")


# ---------------------------------------------------------------------------- child names
@pytest.mark.parametrize("name, phrase", [
    ("forward", "'forward' would shadow"),
    ("training", "'training' would shadow"),
    ("state_dict", "'state_dict' would shadow"),
    ("_parameters", "'_parameters' would shadow"),
    ("", "empty"),
    ("a.b", "contains '.'"),
    (5, "must be a string"),
    ("x\x1b[2J", "control characters"),
    ("n" * (MAX_NAME + 1), f"more than {MAX_NAME}"),
])
def test_a_child_name_that_add_module_would_refuse_is_a_format_error(name, phrase, tmp_path):
    root = _node("Sequential", [(name, _node("Identity")), ("1", _node("ReLU"))])
    _refused(_file(tmp_path / "n.safetensors", root), phrase, "the root module (Sequential)")


def test_a_duplicate_child_name_is_refused_and_numeric_names_load(tmp_path):
    root = _node("Sequential", [("a", _node("ReLU")), ("a", _node("Tanh"))])
    _refused(_file(tmp_path / "d.safetensors", root), "'a' appears twice")
    root = _node("Sequential", [("0", _node("ReLU")), ("head", _node("Tanh"))])
    model = lk.load_model(_file(tmp_path / "ok.safetensors", root))
    assert [name for name, _ in model.named_children()] == ["0", "head"]


# (kind, name) pairs PyTorch refuses on an nn.Linear: a parameter may replace 'weight', a
# child or a buffer may not shadow it.
REFUSED = [(kind, name) for kind in ("module", "parameter", "buffer")
           for name in ("forward", "training", "state_dict", "_parameters", "weight", "", "a.b", 3)
           if (kind, name) != ("parameter", "weight")]


@pytest.mark.parametrize("kind, name", REFUSED, ids=[f"{k}-{n!r}" for k, n in REFUSED])
def test_add_module_and_register_refuse_what_torch_refuses(kind, name):
    torch = pytest.importorskip("torch")

    def attempt(module, child, param, buffer, name=name):
        try:
            if kind == "module":
                module.add_module(name, child)
            elif kind == "parameter":
                module.register_parameter(name, param)
            else:
                module.register_buffer(name, buffer)
        except (KeyError, TypeError) as err:
            return type(err), str(err)
        return None, ""

    torch_args = (torch.nn.ReLU(), torch.nn.Parameter(torch.ones(1)), torch.ones(1))
    ours_args = (lk.ReLU(), lk.Parameter(np.ones(1, np.float32)), np.ones(1))
    theirs = attempt(torch.nn.Linear(2, 2), *torch_args)
    ours = attempt(lk.Linear(2, 2), *ours_args)
    assert theirs[0] is not None and ours[0] is theirs[0], (ours, theirs)
    words = {"already exists", "can't contain", "can't be empty", "should be a string"}
    assert {w for w in words if w in theirs[1]} == {w for w in words if w in ours[1]}
    for legal in ("0", "ok"):  # what torch takes, linearkit takes
        assert attempt(torch.nn.Linear(2, 2), *torch_args, name=legal) == (None, "")
        assert attempt(lk.Linear(2, 2), *ours_args, name=legal) == (None, "")


def test_a_forward_child_added_in_code_is_refused_and_the_model_still_works():
    model = lk.Sequential(lk.Linear(2, 2))
    with pytest.raises(KeyError, match="attribute 'forward' already exists"):
        model.add_module("forward", lk.Identity())
    x = np.ones((1, 2), np.float32)
    assert model(x).shape == (1, 2) and list(model.state_dict()) == ["0.weight", "0.bias"]


# ---------------------------------------------------------------------------- LazyLinear
def test_a_lazy_linear_round_trips_through_its_own_file_unmaterialized_and_not(tmp_path):
    path = tmp_path / "lazy.safetensors"
    lk.save(lk.Sequential(lk.LazyLinear(4)), path)
    again = lk.load_model(path)
    assert type(again[0]) is lk.LazyLinear and again[0].in_features is None
    assert again(np.ones((2, 3), np.float32)).shape == (2, 4)
    lk.manual_seed(0)
    model = lk.Sequential(lk.LazyLinear(4), lk.ReLU())
    x = np.ones((2, 3), np.float32)
    y = model(x)  # materialized: saved as the Linear it became
    lk.save(model, path)
    np.testing.assert_array_equal(lk.load_model(path)(x), y)


def test_a_lazy_linear_spec_with_only_a_bias_is_refused(tmp_path):
    root = _node("Sequential", [("0", _node("LazyLinear", out_features=4))])
    path = _file(tmp_path / "b.safetensors", root, {"0.bias": np.zeros(4, np.float32)})
    _refused(path, "module '0' (LazyLinear)", "'0.bias'")


# ---------------------------------------------------------------------------- inspect and CLI
def test_inspect_reads_the_header_and_spec_only(tmp_path, monkeypatch):
    lk.manual_seed(0)
    path = tmp_path / "m.safetensors"
    lk.save(lk.Sequential(lk.Linear(4, 8), lk.BatchNorm1d(8), lk.Linear(8, 3)), path)

    def refuse(self, *args, **kwargs):
        raise AssertionError("inspect built a module")

    monkeypatch.setattr(lk.Module, "__init__", refuse)  # every layer's __init__ calls it
    from linearkit.analysis.inspect_file import describe_file, render

    info = describe_file(path)
    assert info["ledger"]["params"] == 4 * 8 + 8 + 8 + 8 + 8 * 3 + 3
    assert info["ledger"]["memory"] == {"weights": 4 * info["ledger"]["params"],
                                        "buffers": 8 * 4 * 2 + 8}
    text = render(info)
    assert "(0): Linear(in_features=4, out_features=8, bias=True)" in text
    assert "(1): BatchNorm1d(num_features=8" in text


@pytest.mark.parametrize("command", ["inspect", "ledger"])
@pytest.mark.parametrize("case", ["deep", "huge", "forward"])
def test_the_cli_says_one_line_and_exits_2(command, case, tmp_path, capsys):
    path = tmp_path / f"{case}.safetensors"
    if case == "deep":
        _file(path, None, text=_deep_text(10_000))
    elif case == "huge":
        _file(path, _node("Linear", in_features=100_000, out_features=100_000))
    else:
        _file(path, _node("Sequential", [("forward", _node("Identity"))]))
    assert main([command, str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "FormatError" in err and str(path) in err
    assert "Traceback" not in err and "internal error" not in err


# ---------------------------------------------------------------------------- save
@pytest.mark.parametrize("bad", ["notadict", [1, 2], {1: np.zeros(2)}])
def test_save_says_what_it_accepts(bad, tmp_path):
    with pytest.raises(TypeError, match="a linearkit Module .* or a dict of arrays"):
        lk.save(bad, tmp_path / "x.safetensors")
    assert not list(tmp_path.iterdir())
