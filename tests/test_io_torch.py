"""linearkit.io.torch: from_torch / to_torch on every supported layer, load_torch_state's safety."""

import copy
import pickle
import sys

import numpy as np
import pytest
import torch
from torch import nn
from torch.testing import assert_close

import linearkit as lk
from linearkit.io import from_torch, load_torch_state, to_torch


def _lazy():
    m = nn.LazyLinear(3)
    m(torch.zeros(1, 4))  # materialized: PyTorch turns it into an nn.Linear
    return m


# (id, torch module factory, input shape). Every supported type appears at least once.
CASES = [
    ("linear", lambda: nn.Linear(4, 3), (6, 4)),
    ("linear-nobias", lambda: nn.Linear(4, 3, bias=False), (6, 4)),
    ("linear-1d-input", lambda: nn.Linear(4, 3), (4,)),
    ("lazylinear", _lazy, (6, 4)),
    ("relu", nn.ReLU, (6, 4)),
    ("leakyrelu", lambda: nn.LeakyReLU(0.2), (6, 4)),
    ("gelu", nn.GELU, (6, 4)),
    ("gelu-tanh", lambda: nn.GELU(approximate="tanh"), (6, 4)),
    ("tanh", nn.Tanh, (6, 4)),
    ("sigmoid", nn.Sigmoid, (6, 4)),
    ("silu", nn.SiLU, (6, 4)),
    ("softmax", lambda: nn.Softmax(dim=1), (6, 4)),
    ("logsoftmax", lambda: nn.LogSoftmax(dim=-1), (6, 4)),
    ("dropout", lambda: nn.Dropout(0.3), (6, 4)),
    ("dropout0", lambda: nn.Dropout(0.0), (6, 4)),
    ("layernorm", lambda: nn.LayerNorm(4), (6, 4)),
    ("layernorm-2d", lambda: nn.LayerNorm((3, 4), eps=1e-3), (2, 3, 4)),
    ("layernorm-nobias", lambda: nn.LayerNorm(4, bias=False), (6, 4)),
    ("layernorm-noaffine", lambda: nn.LayerNorm(4, elementwise_affine=False), (6, 4)),
    ("batchnorm", lambda: nn.BatchNorm1d(4), (6, 4)),
    ("batchnorm-3d", lambda: nn.BatchNorm1d(4, eps=1e-3, momentum=0.2), (6, 4, 5)),
    ("batchnorm-cma", lambda: nn.BatchNorm1d(4, momentum=None), (6, 4)),
    ("batchnorm-nobias", lambda: nn.BatchNorm1d(4, bias=False), (6, 4)),
    ("batchnorm-noaffine", lambda: nn.BatchNorm1d(4, affine=False), (6, 4)),
    ("batchnorm-nostats", lambda: nn.BatchNorm1d(4, track_running_stats=False), (6, 4)),
    ("flatten", nn.Flatten, (2, 3, 4)),
    ("flatten-0-1", lambda: nn.Flatten(0, 1), (2, 3, 4)),
    ("identity", nn.Identity, (6, 4)),
    ("mlp", lambda: nn.Sequential(nn.Flatten(), nn.Linear(12, 5), nn.BatchNorm1d(5), nn.GELU(),
                                  nn.Dropout(0.0), nn.Linear(5, 3), nn.LogSoftmax(-1)),
     (6, 3, 4)),
    ("nested", lambda: nn.Sequential(nn.Linear(4, 5), nn.Sequential(
        nn.LayerNorm(5), nn.Sequential(nn.Tanh(), nn.Linear(5, 2))), nn.Identity()), (6, 4)),
]


def _randomize(module):
    """Non-default values everywhere, so a parameter or buffer copied wrong shows."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if name.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=g, dtype=t.dtype) + 0.5)
            elif t.is_floating_point():
                t.copy_(torch.randn(t.shape, generator=g, dtype=t.dtype))
            else:
                t.fill_(3)


def _prepare(factory, dtype, training):
    tm = factory().to(dtype)
    _randomize(tm)
    return tm.train(training)


def _modes(module):
    return [(name, m.training) for name, m in module.named_modules()]


def _torch_run(tm, x, dy):
    xt = torch.from_numpy(x.copy()).requires_grad_(True)
    y = tm(xt)
    y.backward(torch.from_numpy(dy))
    grads = {n: p.grad.numpy() for n, p in tm.named_parameters()}
    return y.detach().numpy(), xt.grad.numpy(), grads


def _lk_run(model, x, dy):
    y, backward = model.vjp(x)
    dx = backward(dy)
    return y, dx, {n: p.grad for n, p in model.named_parameters()}


def _check_same(tm, model, x, check_values=True):
    """Keys, modes, outputs, input and parameter gradients, and the state after the call."""
    assert list(model.state_dict()) == list(tm.state_dict())
    assert _modes(model) == _modes(tm)
    shape = copy.deepcopy(tm)(torch.from_numpy(x)).shape  # a copy: BatchNorm's stats stay
    dy = np.random.default_rng(2).standard_normal(shape).astype(x.dtype)
    y_t, dx_t, g_t = _torch_run(tm, x, dy)
    y_l, dx_l, g_l = _lk_run(model, x, dy)
    assert y_l.dtype == x.dtype and y_l.shape == y_t.shape
    if not check_values:  # a Dropout that drops: masks differ, so compare shapes only
        return
    assert_close(y_l, y_t)
    assert_close(dx_l, dx_t)
    assert list(g_l) == list(g_t)
    for name in g_t:
        # a parameter gradient sums over the batch: float32 rounding grows with the terms'
        # size, so the absolute tolerance scales with the gradient's (4.weight here, max 44,
        # differs by 1.9e-5 in one element on an AMD EPYC's OpenBLAS kernel)
        atol, rtol = (1e-5, 1.3e-6) if x.dtype == np.float32 else (1e-7, 1e-7)  # torch's
        scale = max(1.0, float(np.abs(g_t[name]).max()))
        assert_close(g_l[name], g_t[name], atol=atol * scale, rtol=rtol, msg=name)
    for key, value in tm.state_dict().items():  # BatchNorm's running stats moved alike
        assert_close(np.asarray(model.state_dict()[key]), value.numpy(), msg=key)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_from_torch_then_to_torch_agree_with_pytorch(case, dtype, training):
    name, factory, shape = case
    np_dtype = np.float32 if dtype == torch.float32 else np.float64
    x = np.random.default_rng(0).standard_normal(shape).astype(np_dtype)
    drops = training and name == "dropout"
    tm = _prepare(factory, dtype, training)
    reference = _prepare(factory, dtype, training)  # the same values: tm is run (BN moves)
    reference.load_state_dict(tm.state_dict())

    model = from_torch(tm, dtype=np_dtype)  # dtype= matters only for tensor-less norms
    assert all(p.data.dtype == np_dtype for p in model.parameters())
    _check_same(tm, model, x, check_values=not drops)

    back = to_torch(from_torch(reference, dtype=np_dtype))
    assert type(back) is type(reference) or name == "lazylinear"
    assert [type(m) for m in back.modules()] == [type(m) for m in reference.modules()]
    assert all(t.dtype == dtype for t in back.parameters())
    assert str(back) == str(reference)
    _check_same(back, from_torch(back, dtype=np_dtype), x, check_values=not drops)
    if not drops:
        assert_close(back(torch.from_numpy(x)), reference(torch.from_numpy(x)))


def test_dropout_p_and_mode_survive_both_ways():
    model = from_torch(nn.Sequential(nn.Dropout(0.3)).eval())
    assert model[0].p == 0.3 and model.training is False and model[0].training is False
    assert to_torch(model)[0].p == 0.3


def test_mixed_modes_are_copied_per_module():
    tm = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5), nn.BatchNorm1d(2))
    tm[2].eval()
    model = from_torch(tm)
    assert _modes(model) == _modes(tm) == [("", True), ("0", True), ("1", True), ("2", False)]
    assert _modes(to_torch(model)) == _modes(tm)


def test_module_list_inside_sequential_stays_a_module_list_with_the_same_keys():
    tm = nn.Sequential(nn.Linear(4, 5), nn.ModuleList([nn.ReLU(), nn.Linear(5, 2)]))
    model = from_torch(tm)
    assert type(model[1]) is lk.ModuleList and repr(model) == repr(tm)
    assert list(model.state_dict()) == list(tm.state_dict()) == [
        "0.weight", "0.bias", "1.1.weight", "1.1.bias"]
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    with pytest.raises(NotImplementedError, match="ModuleList"):  # neither side can run it
        tm(torch.from_numpy(x))
    with pytest.raises(NotImplementedError, match="ModuleList"):
        model(x)
    expected = tm[1][1](tm[1][0](tm[0](torch.from_numpy(x))))  # the loop a ModuleList means
    assert_close(model[1][1](model[1][0](model[0](x))), expected.detach().numpy())
    back = to_torch(model)
    assert type(back[1]) is nn.ModuleList
    assert_close(back[1][1](back[1][0](back[0](torch.from_numpy(x)))), expected)


def test_residual_maps_to_a_torch_residual_and_back():
    lk.manual_seed(3)
    model = lk.Sequential(lk.Linear(4, 4), lk.Residual(lk.Sequential(lk.LayerNorm(4),
                                                                     lk.Linear(4, 4))))
    tm = to_torch(model)
    assert type(tm[1]).__name__ == "TorchResidual"
    assert list(tm.state_dict()) == list(model.state_dict())
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    _check_same(tm, model, x)
    again = from_torch(tm)
    assert isinstance(again[1], lk.Residual)
    assert_close(again(x), model(x))


def test_a_shared_module_stays_shared():
    shared = nn.Linear(3, 3)
    model = from_torch(nn.Sequential(shared, nn.Tanh(), shared))
    assert model[0] is model[2]
    back = to_torch(model)
    assert back[0] is back[2]


def test_weights_are_copies():
    tm = nn.Linear(2, 2)
    model = from_torch(tm)
    with torch.no_grad():
        tm.weight.zero_()
    assert np.abs(model.weight.data).sum() > 0
    back = to_torch(model)
    model.weight.data[...] = 7
    assert not torch.any(back.weight == 7)


def test_linearkit_to_pt_file_and_back(tmp_path):
    """linearkit -> to_torch -> torch.save(state_dict) -> load_torch_state -> linearkit."""
    lk.manual_seed(5)

    def build():
        return lk.Sequential(lk.Linear(6, 8), lk.BatchNorm1d(8), lk.SiLU(), lk.LayerNorm(8),
                             lk.Linear(8, 3), lk.Softmax(dim=-1))

    model = build()
    x = np.random.default_rng(0).standard_normal((10, 6)).astype(np.float32)
    model(x)  # training mode: running statistics move away from 0 / 1
    model.eval()
    expected = model(x)
    path = tmp_path / "model.pt"
    torch.save(to_torch(model).state_dict(), path)
    state = load_torch_state(path)
    assert list(state) == list(model.state_dict())
    assert all(isinstance(v, np.ndarray) for v in state.values())
    fresh = build().eval()
    fresh.load_state_dict(state)
    np.testing.assert_array_equal(fresh(x), expected)


# ----------------------------------------------------------------------------- clear errors
def test_an_unsupported_layer_is_named_by_path_and_type():
    tm = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Conv1d(1, 1, 1)))
    with pytest.raises(lk.FormatError) as err:
        from_torch(tm)
    text = str(err.value)
    assert "torch module '1.0' (Conv1d)" in text
    assert "no linearkit equivalent" in text and "Linear" in text and "BatchNorm1d" in text


def test_a_custom_torch_module_and_a_linear_subclass_are_refused():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 2)

        def forward(self, x):
            return self.fc(x) * 2

    class Scaled(nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    with pytest.raises(lk.FormatError, match=r"the root torch module \(Block\)"):
        from_torch(Block())
    with pytest.raises(lk.FormatError, match=r"torch module '0' \(Scaled\)"):
        from_torch(nn.Sequential(Scaled(2, 2)))


def test_an_unmaterialized_lazy_linear_is_refused_on_both_sides():
    with pytest.raises(lk.FormatError, match="(?s)unmaterialized LazyLinear.*forward pass"):
        from_torch(nn.Sequential(nn.LazyLinear(3)))
    with pytest.raises(lk.FormatError, match="(?s)linearkit module '1' .*unmaterialized"):
        to_torch(lk.Sequential(lk.ReLU(), lk.LazyLinear(3)))


def test_a_materialized_linearkit_lazy_linear_becomes_a_torch_linear():
    layer = lk.LazyLinear(3)
    layer(np.zeros((1, 5), np.float32))
    back = to_torch(layer)
    assert type(back) is nn.Linear and back.in_features == 5


def test_an_unsupported_linearkit_module_and_bad_arguments():
    class Double(lk.Module):
        def forward(self, x):
            return 2 * x

    with pytest.raises(lk.FormatError, match=r"(?s)linearkit module '0\.1' \(Double\).*no torch"):
        to_torch(lk.Sequential(lk.Sequential(lk.ReLU(), Double())))
    with pytest.raises(TypeError, match="torch.nn.Module"):
        from_torch(np.zeros(3))
    with pytest.raises(TypeError, match="linearkit Module"):
        to_torch(nn.Linear(2, 2))


def test_arguments_linearkit_refuses_and_dtypes_it_does_not_store():
    with pytest.raises(lk.FormatError, match=r"torch module '0' \(Softmax\) cannot be converted"):
        from_torch(nn.Sequential(nn.Softmax()))
    # bfloat16 is stored (ml_dtypes), bit for bit: tests/test_hostile_models.py round-trips it
    converted = from_torch(nn.Sequential(nn.Linear(2, 2).to(torch.bfloat16)))
    assert converted[0].weight.data.dtype == lk.precision.bfloat16()


def test_without_torch_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    for call in (lambda: from_torch(None), lambda: to_torch(lk.ReLU()),
                 lambda: load_torch_state("x.pt")):
        with pytest.raises(ModuleNotFoundError, match=r'pip install "linearkit\[torch\]"'):
            call()


# ----------------------------------------------------------------------------- load_torch_state
class _Payload:
    """Unpickling this creates ``marker`` (what a hostile checkpoint would do, harmlessly)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("writer", ["torch.save", "pickle.dump"])
def test_a_pickle_payload_is_refused_and_runs_no_code(tmp_path, writer):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    payload = {"weight": torch.zeros(2), "evil": _Payload(marker)}
    if writer == "torch.save":
        torch.save(payload, path)
    else:
        with open(path, "wb") as f:
            pickle.dump(payload, f, protocol=2)
    assert not marker.exists()
    with pytest.raises(lk.FormatError) as err:
        load_torch_state(path)
    assert str(path) in str(err.value) and "weights_only=True" in str(err.value)
    assert not marker.exists()
    if writer == "pickle.dump":  # the payload is live: a plain unpickle would have run it
        with open(path, "rb") as f:
            pickle.load(f).get("evil").close()
        assert marker.exists()


def test_load_torch_state_refuses_what_is_not_a_flat_state_dict(tmp_path):
    with pytest.raises(lk.FormatError, match="missing.pt: no such file"):
        load_torch_state(tmp_path / "missing.pt")
    torch.save(torch.zeros(3), tmp_path / "tensor.pt")
    with pytest.raises(lk.FormatError, match="tensor.pt: expected a state dict"):
        load_torch_state(tmp_path / "tensor.pt")
    torch.save({"model": {"w": torch.zeros(2)}, "epoch": 3}, tmp_path / "ckpt.pth")
    with pytest.raises(lk.FormatError, match="ckpt.pth: entry 'model' is a dict") as err:
        load_torch_state(tmp_path / "ckpt.pth")
    assert "ckpt['model']" in str(err.value)
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(lk.FormatError, match="garbage.pt: torch.load"):
        load_torch_state(tmp_path / "garbage.pt")


def test_load_torch_state_reads_bfloat16_as_float32(tmp_path):
    w = torch.randn(3, 2).to(torch.bfloat16)
    torch.save({"w": w, "n": torch.tensor(4)}, tmp_path / "bf16.pt")
    state = load_torch_state(tmp_path / "bf16.pt")
    assert state["w"].dtype == np.float32 and state["n"].dtype == np.int64
    np.testing.assert_array_equal(state["w"], w.float().numpy())


# ----------------------------------------------------------------------------- real data, files
def test_a_torch_mlp_on_mnist1d_converts_with_equal_outputs_and_gradients():
    data = lk.data.mnist1d()
    x = data.x_test[:256]
    torch.manual_seed(0)
    tm = nn.Sequential(nn.Linear(40, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.1),
                       nn.Linear(64, 64), nn.LayerNorm(64), nn.GELU(), nn.Linear(64, 10))
    _randomize(tm[1])
    tm.eval()
    model = from_torch(tm)
    _check_same(tm, model, x)
    back = to_torch(model)
    assert_close(back(torch.from_numpy(x)), tm(torch.from_numpy(x)))
    assert (model(x).argmax(1) == tm(torch.from_numpy(x)).argmax(1).numpy()).all()


def test_linearkit_to_safetensors_to_pytorch_to_safetensors_to_linearkit(tmp_path):
    """The acceptance round trip: our file is read by safetensors.torch into a torch model made
    by to_torch; torch writes it back; linearkit loads that into a fresh model."""
    st = pytest.importorskip("safetensors.torch")
    lk.manual_seed(9)

    def build():
        return lk.Sequential(lk.Linear(40, 16), lk.BatchNorm1d(16), lk.Tanh(), lk.Linear(16, 10))

    model = build()
    x = lk.data.mnist1d().x_test[:64]
    model(x)  # moves the running statistics
    model.eval()
    lk.save(model, tmp_path / "a.safetensors")
    tm = to_torch(build()).eval()
    tm.load_state_dict(st.load_file(tmp_path / "a.safetensors"))
    assert_close(tm(torch.from_numpy(x)).detach().numpy(), model(x))
    st.save_file(tm.state_dict(), tmp_path / "b.safetensors")
    fresh = build().eval()
    lk.load(tmp_path / "b.safetensors", fresh)
    np.testing.assert_array_equal(fresh(x), model(x))


def test_frozen_parameters_stay_frozen_both_ways():
    tm = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2))
    tm[0].weight.requires_grad_(False)
    model = from_torch(tm)
    assert [p.requires_grad for p in model.parameters()] == [False, True, True, True]
    model[1].bias.requires_grad = False
    assert [p.requires_grad for p in to_torch(model).parameters()] == [False, True, True, False]
