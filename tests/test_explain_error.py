"""``linearkit.analysis.explain_error.explain`` against the real messages: every wrong-shape case
below builds a model (linearkit and torch, side by side), makes the mistake, runs it, and hands
the exception it raised (or its text) to ``explain``; the kind and the layer path must be right
in every way of asking (the exception with the model, its text with the model and the input's
shape, its text alone). Unrelated messages must come back not recognized. The last test prints
the counts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

import linearkit as lk
from linearkit.analysis.explain_error import explain

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError:  # the linearkit cases still run
    torch = nn = F = None

ROOT = Path(__file__).resolve().parents[1]


def raised(fn) -> BaseException:
    """The exception ``fn()`` raises (a case that raises nothing is a broken case)."""
    try:
        fn()
    except Exception as err:  # noqa: BLE001 - each case's own error, whatever its type
        return err
    raise AssertionError("the case raised nothing")


def zeros(side: str, shape):
    return torch.zeros(shape) if side == "torch" else np.zeros(shape, np.float32)


def layers_of(side: str):
    """The layer namespace of one side: torch.nn or linearkit (they share names)."""
    return nn if side == "torch" else lk


def mlp(side: str, widths, in_of=None, nested=False):
    """``Linear(widths[i], widths[i+1])`` with ReLU between; ``in_of[i]`` overrides layer i's
    in_features (the wrong layer). Nested: the first Linear in ``features``, the rest in
    ``classifier``. -> (model, [path of each Linear])."""
    ns, in_of = layers_of(side), in_of or {}
    mods = []
    for i in range(len(widths) - 1):
        mods.append(ns.Linear(in_of.get(i, widths[i]), widths[i + 1]))
        if i < len(widths) - 2:
            mods.append(ns.ReLU())
    if nested:
        model = ns.Sequential(OrderedDict(features=ns.Sequential(*mods[:2]),
                                          classifier=ns.Sequential(*mods[2:])))
    else:
        model = ns.Sequential(*mods)
    paths = [p for p, m in model.named_modules() if type(m).__name__ == "Linear"]
    return model, paths


@dataclass
class Case:
    """One mistake: ``make()`` -> (exception, model, input shape); the kind and layer expected
    for each way of asking (``modes``: 'exc' the exception + model, 'walk' its text + model +
    input shape, 'text' the text alone, 'numbers' the text + model); ``fix`` must be in the fix."""

    name: str
    side: str
    make: object
    kind: str
    layer: str | None
    fix: str = ""
    modes: tuple = ("exc", "walk", "text")
    other: dict = field(default_factory=dict)  # mode -> (kind, layer) where it differs


def ask(mode, err, model, shape):
    if mode == "exc":
        return explain(err, model)
    if mode == "walk":
        return explain(str(err), model, input_shape=shape)
    if mode == "numbers":
        return explain(str(err), model)
    return explain(str(err))


CASES: list[Case] = []
SIDES = ("linearkit", "torch")


def _modes(side, no_model_layer=True):
    # torch's message alone names no layer: the text-only mode asks the model ('numbers')
    if side == "torch":
        return ("exc", "walk", "numbers")
    return ("exc", "walk", "text") if no_model_layer else ("exc", "walk")


# Sequential MLPs of various widths, one Linear given the wrong in_features (+7)
for side in SIDES:
    for widths, nested in [((20, 30, 40, 10), True), ((64, 128, 32, 5), False),
                           ((100, 50, 25, 12, 3), False), ((8, 16, 9), True)]:
        for j in range(len(widths) - 1):
            def make(side=side, widths=widths, j=j, nested=nested):
                model, _ = mlp(side, widths, {j: widths[j] + 7}, nested)
                shape = (4, widths[0])
                return raised(lambda: model(zeros(side, shape))), model, shape
            path = mlp("linearkit", widths, None, nested)[1][j]
            CASES.append(Case(f"{side}-mlp{widths}-layer{j}", side, make, "linear_in_features",
                              path, f"Linear({widths[j]}, {widths[j + 1]})", _modes(side)))

# a 4-D image batch into a Linear without Flatten
for side in SIDES:
    for shape, hidden in [((8, 1, 28, 28), 128), ((4, 3, 8, 8), 16), ((2, 3, 32, 32), 64),
                          ((6, 2, 5, 5), 7)]:
        def make(side=side, shape=shape, hidden=hidden):
            model, _ = mlp(side, (int(np.prod(shape[1:])), hidden, 10))
            return raised(lambda: model(zeros(side, shape))), model, shape
        other = {"numbers": ("linear_in_features", "0")} if side == "torch" else {}
        CASES.append(Case(f"{side}-flatten{shape}", side, make, "missing_flatten", "0",
                          "Flatten()", _modes(side), other))


# a checkpoint whose Linear weight j is stored (in, out)
def _state(model, side):
    return {k: (v.detach().clone() if side == "torch" else v.copy())
            for k, v in model.state_dict().items()}


for side in SIDES:
    for widths, j in [((10, 20, 5), 0), ((10, 20, 5), 1), ((64, 32, 16, 4), 2), ((7, 3), 0)]:
        def make(side=side, widths=widths, j=j):
            model, paths = mlp(side, widths)
            sd = _state(model, side)
            sd[f"{paths[j]}.weight"] = sd[f"{paths[j]}.weight"].T
            return raised(lambda: model.load_state_dict(sd)), model, None
        CASES.append(Case(f"{side}-transposed-checkpoint{widths}-{j}", side, make,
                          "state_dict_transposed", mlp("linearkit", widths)[1][j],
                          ".T" if side == "torch" else 'layout="in_out"', ("exc", "text")))

# a checkpoint of another width
for side in SIDES:
    for widths, saved in [((10, 20, 5), (10, 24, 5)), ((16, 8, 3), (12, 8, 3))]:
        def make(side=side, widths=widths, saved=saved):
            model, _ = mlp(side, widths)
            sd = _state(mlp(side, saved)[0], side)
            return raised(lambda: model.load_state_dict(sd)), model, None
        CASES.append(Case(f"{side}-checkpoint-size{saved}", side, make, "state_dict_size", "0",
                          f"Linear({saved[0]}, {saved[1]})", ("exc", "text")))


# a Linear weight assigned transposed: F.linear's numbers come out swapped
def _transposed_weight(side, widths, j):
    model, paths = mlp(side, widths)
    layer = dict(model.named_modules())[paths[j]]
    if side == "torch":
        layer.weight = nn.Parameter(layer.weight.detach().T.clone())
    else:
        layer.weight = lk.Parameter(np.ascontiguousarray(layer.weight.data.T))
    shape = (4, widths[0])
    return raised(lambda: model(zeros(side, shape))), model, shape


for side in SIDES:
    for widths, j in [((512, 256, 10), 0), ((30, 12, 5), 1)]:
        CASES.append(Case(f"{side}-transposed-weight{widths}-{j}", side,
                          lambda side=side, widths=widths, j=j: _transposed_weight(side, widths, j),
                          "transposed_weight", mlp("linearkit", widths)[1][j], "W.T",
                          ("exc", "walk", "numbers")))


# LayerNorm and BatchNorm1d of the wrong width after a Linear
def _norm_model(side, kind, a, b, wrong, c):
    ns = layers_of(side)
    norm = ns.LayerNorm(wrong) if kind == "ln" else ns.BatchNorm1d(wrong)
    return ns.Sequential(ns.Linear(a, b), norm, ns.ReLU(), ns.Linear(wrong, c))


for side in SIDES:
    for kind, (a, b, wrong, c) in [("ln", (64, 128, 256, 10)), ("ln", (12, 20, 16, 3)),
                                   ("ln", (5, 9, 6, 2)), ("bn", (64, 128, 64, 10)),
                                   ("bn", (12, 20, 16, 3)), ("bn", (5, 9, 6, 2))]:
        def make(side=side, kind=kind, a=a, b=b, wrong=wrong, c=c):
            model = _norm_model(side, kind, a, b, wrong, c)
            shape = (32, a)
            return raised(lambda: model(zeros(side, shape))), model, shape
        expected = ("layernorm_shape", f"LayerNorm({b})") if kind == "ln" else \
            ("batchnorm_features", f"BatchNorm1d({b})")
        CASES.append(Case(f"{side}-{kind}{(a, b, wrong, c)}", side, make, expected[0], "1",
                          expected[1], _modes(side)))


# cross-entropy: a label >= the head's out_features, and float labels
def _logits(side, model, n, width):
    return model(zeros(side, (n, width)))


def _cross_entropy(side, logits, target):
    if side == "torch":
        return F.cross_entropy(logits, torch.tensor(target))
    return lk.CrossEntropyLoss()(logits, np.array(target))


for side in SIDES:
    for widths, nested, bad in [((8, 16, 10), False, 10), ((8, 16, 5), False, 7),
                                ((6, 12, 9, 4), True, 4)]:
        def make(side=side, widths=widths, nested=nested, bad=bad):
            model, _ = mlp(side, widths, nested=nested)
            target = [0, 1, bad, 2]
            logits = _logits(side, model, 4, widths[0])
            return raised(lambda: _cross_entropy(side, logits, target)), model, (4, widths[0])
        fix = "target - 1" if bad == widths[-1] else f"out_features={bad + 1}"
        CASES.append(Case(f"{side}-ce-target{bad}-of{widths[-1]}", side, make, "ce_target_range",
                          mlp("linearkit", widths, nested=nested)[1][-1], fix, ("exc", "walk")))
    for width in (10, 3):
        def make(side=side, width=width):
            model, _ = mlp(side, (6, width))
            logits = _logits(side, model, 4, 6)
            return raised(lambda: _cross_entropy(side, logits, [0.0, 1.0, 2.0, 1.0])), model, \
                (4, 6)
        CASES.append(Case(f"{side}-ce-float-target-{width}", side, make, "ce_target_dtype", None,
                          ".long()" if side == "torch" else "astype(np.int64)",
                          ("exc", "walk", "text")))


# torch-only classes: conv and pooling ranks, view, broadcasting, gradients, dtypes
def _torch_cases():
    class Head(nn.Module):
        """(N, S, F) -> (N, F*S) through a view of a transposed tensor: view() refuses."""

        def forward(self, x):
            return x.transpose(1, 2).view(x.size(0), -1)

    class Block(nn.Module):
        """A residual block whose Linear changes the width: the add cannot broadcast."""

        def __init__(self, a, b):
            super().__init__()
            self.proj = nn.Linear(a, b)

        def forward(self, x):
            return x + self.proj(x)

    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return 2 * x

        @staticmethod
        def backward(ctx, g):
            return 2 * g.T  # the bug: transposed

    def conv2d_flat():
        model = nn.Sequential(OrderedDict(stem=nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU()),
                                          head=nn.Sequential(nn.Flatten(), nn.Linear(4 * 26 * 26,
                                                                                     10))))
        return raised(lambda: model(torch.zeros(4, 784))), model, (4, 784)

    def conv1d_4d():
        model = nn.Sequential(nn.Conv1d(3, 8, 3), nn.ReLU())
        return raised(lambda: model(torch.zeros(2, 3, 4, 5))), model, (2, 3, 4, 5)

    def view():
        model = nn.Sequential(nn.Linear(4, 6), Head())
        return raised(lambda: model(torch.zeros(2, 3, 4))), model, (2, 3, 4)

    def residual():
        model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), Block(4, 5))
        return raised(lambda: model(torch.zeros(2, 3))), model, (2, 3)

    def bad_gradient():
        x = torch.zeros(5, 6, requires_grad=True)
        return raised(lambda: Double.apply(x).sum().backward()), None, None

    def float64_input():
        model, _ = mlp("torch", (3, 4, 2))
        return raised(lambda: model(torch.zeros(2, 3, dtype=torch.float64))), model, (2, 3)

    def conv_channels():
        model = nn.Sequential(nn.Conv2d(3, 8, 3))
        return raised(lambda: model(torch.zeros(2, 4, 8, 8))), model, (2, 4, 8, 8)

    return [
        Case("torch-conv2d-flat-input", "torch", conv2d_flat, "conv_input_rank", "stem.0",
             "x.view(4, 1, 28, 28)", ("exc", "walk", "numbers")),
        Case("torch-conv1d-4d-input", "torch", conv1d_4d, "conv_input_rank", "0", "squeeze",
             ("exc", "walk", "numbers")),
        Case("torch-conv-channels", "torch", conv_channels, "conv_channels", "0",
             "Conv2d(4, 8, kernel_size=3)", ("exc", "walk", "numbers")),
        Case("torch-view-of-transposed", "torch", view, "view_noncontiguous", "1", ".reshape",
             ("exc", "walk")),
        Case("torch-residual-width", "torch", residual, "broadcast_mismatch", "2", "",
             ("exc", "walk")),
        Case("torch-invalid-gradient", "torch", bad_gradient, "invalid_gradient", None, "grad.T",
             ("exc", "text")),
        Case("torch-float64-input", "torch", float64_input, "dtype_mismatch", "0", "float32",
             ("exc", "walk")),
    ]


def _linearkit_cases():
    def residual():
        model = lk.Sequential(lk.Linear(3, 4), lk.Residual(lk.Linear(4, 5)))
        return raised(lambda: model(np.zeros((2, 3), np.float32))), model, (2, 3)

    def float64_input():
        model, _ = mlp("linearkit", (3, 4, 2))
        return raised(lambda: model(np.zeros((2, 3)))), model, (2, 3)

    class Project(lk.Module):
        """A user's layer without a ledger rule: ``x @ w`` with ``w`` of the wrong height."""

        def __init__(self, rows, cols):
            super().__init__()
            self.w = lk.Parameter(np.zeros((rows, cols), np.float32))

        def forward(self, x):
            return x @ self.w.data

    def custom_matmul():
        model = lk.Sequential(lk.Linear(8, 512), lk.ReLU(), Project(256, 10))
        return raised(lambda: model(np.zeros((16, 8), np.float32))), model, (16, 8)

    return [Case("linearkit-custom-module-matmul", "linearkit", custom_matmul,
                 "matmul_inner_dim", "2", "(512, ...)", ("exc", "walk")),
            Case("linearkit-residual-width", "linearkit", residual, "residual_width", "1",
                 "projection", ("exc", "text")),
            Case("linearkit-float64-input", "linearkit", float64_input, "dtype_mismatch", "0",
                 "astype(np.float32)", ("exc", "text"))]


if torch is not None:
    CASES += _torch_cases()
CASES += _linearkit_cases()
CASES = [c for c in CASES if torch is not None or c.side == "linearkit"]

RESULTS: dict = {}  # case name -> {mode: (explanation, kind right, layer right, fix right)}


def run_case(case: Case) -> dict:
    if case.name not in RESULTS:
        err, model, shape = case.make()
        out = {}
        for mode in case.modes:
            e = ask(mode, err, model, shape)
            kind, layer = case.other.get(mode, (case.kind, case.layer))
            if mode == "text" and case.side == "torch":
                layer = layer if case.kind.startswith("state_dict") else None
            out[mode] = (e, e.kind == kind, e.layer == layer,
                         mode in case.other or case.fix in e.fix)
        RESULTS[case.name] = out
    return RESULTS[case.name]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_kind_and_the_layer_are_right(case):
    for mode, (e, kind_ok, layer_ok, fix_ok) in run_case(case).items():
        assert e.recognized, f"{mode}: {e}"
        assert kind_ok and layer_ok and fix_ok, f"{mode}: expected {case.kind} at " \
            f"{case.layer!r} with {case.fix!r} in the fix, got:\n{e}"
        assert e.fix and "\n" not in e.fix, "the fix is one line"


def test_the_transposed_checkpoint_loads_with_the_fix_it_names():
    # the fix is a real call: linearkit's layout="in_out" loads the transposed checkpoint
    model, _ = mlp("linearkit", (10, 20, 5))
    sd = {k: (v.T if v.ndim == 2 else v) for k, v in model.state_dict().items()}
    e = explain(raised(lambda: model.load_state_dict(sd)), model)
    assert 'layout="in_out"' in e.fix
    model.load_state_dict(sd, layout="in_out")


def test_the_walk_finds_the_layer_for_a_torch_model_that_does_not_convert():
    # a custom forward: from_torch refuses it, so the torch model itself runs, hooked
    if torch is None:
        pytest.skip("needs torch")

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(12, 24), nn.ReLU())
            self.out = nn.Linear(20, 3)

        def forward(self, x):
            return self.out(self.body(x.flatten(1)))

    net = Net()
    err = raised(lambda: net(torch.zeros(5, 3, 4)))
    e = explain(str(err), net, input_shape=(5, 3, 4))
    assert (e.kind, e.layer) == ("linear_in_features", "out") and "Linear(24, 3)" in e.fix
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in net.modules())


def test_a_pasted_traceback_is_read_from_its_last_line():
    text = ('Traceback (most recent call last):\n  File "train.py", line 3, in <module>\n'
            "RuntimeError: mat1 and mat2 shapes cannot be multiplied (16x512 and 256x128)")
    e = explain(text)
    assert (e.kind, e.layer) == ("linear_in_features", None) and "Linear(512, 128)" in e.fix


def test_older_torch_wordings_of_the_loss_messages_are_known():
    # wordings earlier torch releases used for the same mistakes (current ones are run above)
    assert explain("expected scalar type Long but found Float").kind == "ce_target_dtype"
    assert explain("Target 10 is out of bounds.").kind == "ce_target_range"


def _unrelated() -> list:
    errors = [raised(lambda: {"fc.bias": 0}["fc.weight"]),
              raised(lambda: Path(os.sep, "no", "such", "model.pt").read_bytes()),
              raised(lambda: 1 / 0),
              raised(lambda: __import__("no_such_module_for_explain")),
              ("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total "
               "capacity; 13.1 GiB already allocated)")]
    if torch is not None:
        errors += [raised(lambda: torch.empty(2 ** 60)),  # the CPU allocator's real message
                   raised(lambda: torch.zeros(2, device="meta").item())]
    return errors


UNRELATED = _unrelated()


@pytest.mark.parametrize("err", UNRELATED, ids=lambda e: type(e).__name__)
def test_an_unrelated_message_is_not_recognized(err):
    model = mlp("linearkit", (4, 3))[0]
    for e in (explain(err), explain(err, model, input_shape=(2, 4))):
        assert not e.recognized and e.kind == "unrecognized" and e.layer is None and not e.fix
        assert str(e).startswith("not recognized")


def test_the_docs_page_runs():
    text = (ROOT / "docs" / "explain.md").read_text(encoding="utf-8")
    blocks = [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]
    assert blocks
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/explain.md, python block {i + 1}", "exec"), {})  # noqa: S102


def test_a_linearkit_model_never_imports_torch():
    code = ("import sys, numpy as np, linearkit as lk\n"
            "from linearkit.analysis.explain_error import explain\n"
            "m = lk.Sequential(lk.Linear(8, 4), lk.ReLU(), lk.Linear(5, 2))\n"
            "e = explain('mat1 and mat2 shapes cannot be multiplied (3x4 and 5x2)', m,"
            " input_shape=(3, 8))\n"
            "assert e.layer == '2', e\n"
            "assert 'torch' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


def test_counts(capsys):
    explanations = [r for case in CASES for r in run_case(case).values()]
    per_side = {s: sum(c.side == s for c in CASES) for s in SIDES}
    recognized = sum(e.recognized for e, *_ in explanations)
    kinds = sum(k for _, k, _, _ in explanations)
    layers = sum(ok for _, _, ok, _ in explanations)
    unrelated = sum(not explain(err).recognized for err in UNRELATED)
    with capsys.disabled():
        print(f"\nexplain: {len(CASES)} wrong-shape cases ({per_side['linearkit']} linearkit, "
              f"{per_side['torch']} torch), {len(explanations)} explanations: recognized "
              f"{recognized}, kind right {kinds}, layer right {layers}; unrelated messages not "
              f"recognized {unrelated}/{len(UNRELATED)}")
    assert recognized == kinds == layers == len(explanations)
    assert unrelated == len(UNRELATED)
    assert min(per_side.values()) >= 30 or torch is None


def test_the_model_can_be_a_linearkit_model_file(tmp_path):
    model = lk.Sequential(lk.Linear(12, 6), lk.ReLU(), lk.Linear(5, 2))
    path = tmp_path / "m.safetensors"
    lk.save(model, str(path))
    message = "mat1 and mat2 shapes cannot be multiplied (3x6 and 5x2)"
    e = explain(message, str(path), input_shape=(3, 12))
    assert (e.kind, e.layer) == ("linear_in_features", "2") and "Linear(6, 2)" in e.fix


def test_the_command_prints_the_explanation_and_says_if_it_was_recognized(
        tmp_path, capsys, monkeypatch):
    from argparse import Namespace
    from io import StringIO

    from linearkit.analysis.explain_error.cli import run

    model = lk.Sequential(lk.Linear(12, 6), lk.ReLU(), lk.Linear(5, 2))
    path = str(tmp_path / "m.safetensors")
    lk.save(model, path)
    args = Namespace(message="mat1 and mat2 shapes cannot be multiplied (3x6 and 5x2)",
                     model=path, input_shape=(3, 12))
    assert run(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("linear_in_features at '2'") and "Linear(6, 2)" in out
    monkeypatch.setattr(sys, "stdin", StringIO("Traceback (most recent call last):\n"
                                               "KeyError: 'fc.weight'\n"))
    assert run(Namespace(message="-", model=None, input_shape=None)) == 1
    assert capsys.readouterr().out.startswith("not recognized")


def test_importing_linearkit_does_not_import_explain():
    code = ("import sys, linearkit, linearkit.analysis\n"
            "assert 'linearkit.analysis.explain_error' not in sys.modules\n"
            "assert 'torch' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)
