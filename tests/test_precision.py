"""The precision policy (linearkit/precision.py): 16-bit storage with float32 compute.

References: a float32 torch layer holding the same rounded weights (the compute IS float32, so
outputs and gradients agree to float32 rounding), our own float32 layer holding them (the same
GEMMs: bit for bit where the weight is upcast whole), and torch's ``.to(dtype)`` for rounding.
"""

import sys

import ml_dtypes
import numpy as np
import pytest
import torch
from fresh_process import imports
from hypothesis import given, settings
from hypothesis import strategies as st

import linearkit as lk
from linearkit import functional as F
from linearkit import precision as P

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
LOW = [BF16, F16]
TORCH = {BF16: torch.bfloat16, F16: torch.float16}


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint16 if a.itemsize == 2 else np.uint32)


def torch_round(a32: np.ndarray, dtype) -> np.ndarray:
    """``a32`` rounded by torch's ``.to(dtype)``, as raw 16-bit patterns."""
    return torch.from_numpy(np.ascontiguousarray(a32)).to(TORCH[dtype]).view(torch.int16) \
        .numpy().view(np.uint16)


def twin32(layer) -> lk.Linear:
    """Our float32 Linear holding the layer's (rounded) weights."""
    twin = lk.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None)
    twin.weight.data[...] = layer.weight.data.astype(np.float32)
    if layer.bias is not None:
        twin.bias.data[...] = layer.bias.data.astype(np.float32)
    return twin


def torch32(layer) -> torch.nn.Linear:
    t = torch.nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None)
    with torch.no_grad():
        t.weight.copy_(torch.from_numpy(layer.weight.data.astype(np.float32)))
        if layer.bias is not None:
            t.bias.copy_(torch.from_numpy(layer.bias.data.astype(np.float32)))
    return t


def closure_arrays(fn, seen=None) -> list:
    """Every ndarray a closure keeps alive through its cells (wrappers' closures included)."""
    seen = set() if seen is None else seen
    found = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, np.ndarray):
            found.append(value)
        elif callable(value):
            found += closure_arrays(value, seen)
    return found


# ----------------------------------------------------------------------------- the API
@pytest.mark.parametrize("spec, name", [
    (np.float32, "float32"), ("float32", "float32"), ("fp32", "float32"), (np.float64, "float64"),
    ("float64", "float64"), (np.float16, "float16"), ("fp16", "float16"), ("half", "float16"),
    ("bfloat16", "bfloat16"), ("bf16", "bfloat16"), (ml_dtypes.bfloat16, "bfloat16"),
    (BF16, "bfloat16"), (np.dtype("float16"), "float16")])
def test_storage_dtype_accepts_every_spelling(spec, name):
    assert P.storage_dtype(spec).name == name


@pytest.mark.parametrize("spec", [np.int32, "int8", np.complex64, np.longdouble, "float17",
                                  object, ml_dtypes.float8_e4m3fn])
def test_storage_dtype_refuses_others_listing_what_exists(spec):
    with pytest.raises(TypeError, match="float16, float32 or float64, or bfloat16"):
        P.storage_dtype(spec)


def test_is_float_covers_bfloat16_whose_kind_is_V():
    assert BF16.kind == "V"
    assert all(P.is_float(d) for d in (np.float16, np.float32, np.float64, BF16))
    assert not any(P.is_float(d) for d in (np.int16, np.uint16, np.longdouble, "V2",
                                           ml_dtypes.float8_e5m2))
    assert P.is_16bit(BF16) and P.is_16bit(np.float16)
    assert not P.is_16bit(np.float32) and not P.is_16bit(np.int16)


@pytest.mark.parametrize("storage, compute", [(np.float16, np.float32), (BF16, np.float32),
                                              (np.float32, np.float32), (np.float64, np.float64),
                                              ("bfloat16", np.float32)])
def test_compute_dtype(storage, compute):
    assert P.compute_dtype(storage) == compute


def test_compute_array_is_exact_and_leaves_wide_arrays_alone():
    every16 = np.arange(1 << 16, dtype=np.uint16)
    for dtype in LOW:
        a = every16.view(dtype)
        up = P.compute_array(a)
        assert up.dtype == np.float32
        ref = torch.from_numpy(every16.view(np.int16).copy()).view(TORCH[dtype]).float().numpy()
        nan = np.isnan(ref)           # torch quiets a signalling NaN, NumPy keeps its bits
        np.testing.assert_array_equal(np.isnan(up), nan)
        np.testing.assert_array_equal(bits(up)[~nan], bits(ref)[~nan])  # inf, subnormals, -0
    x = np.ones(3, np.float32)
    assert P.compute_array(x) is x


def test_bfloat16_upcast_keeps_every_bit_of_astype_on_strided_blocks():
    """compute_array's one-pass shift gives ml_dtypes' astype bits, NaN payloads included, on
    the strided column blocks the blocked dx GEMM upcasts, and on a 0-d array and a scalar."""
    every16 = np.arange(1 << 16, dtype=np.uint16).view(BF16).reshape(256, 256)
    for a in (every16, every16[:, 64:128], every16[::3, ::-5], every16.T, every16[7, 9:10]):
        up = P.compute_array(a)
        assert up.dtype == np.float32 and up.shape == a.shape and up.flags.c_contiguous
        np.testing.assert_array_equal(bits(up), bits(a.astype(np.float32)))
    for a in (np.array(every16[1, 2]), every16[1, 2]):
        assert bits(np.asarray(P.compute_array(a))) == bits(np.asarray(a.astype(np.float32)))


def test_policy_context_restores_and_set_policy_returns_the_previous():
    assert P.get_policy() == P.Policy()
    with P.policy(grads="storage") as pol:
        assert pol.grads == "storage" and pol.activations is None
        with P.policy(activations="float16"):
            assert P.get_policy().grads == "storage"
            assert P.get_policy().activations == np.float16
        assert P.get_policy().activations is None
    assert P.get_policy() == P.Policy()
    with pytest.raises(RuntimeError), P.policy(activations=BF16):
        raise RuntimeError
    assert P.get_policy() == P.Policy()
    previous = P.set_policy(grads="storage")
    try:
        assert previous == P.Policy() and P.get_policy().grads == "storage"
    finally:
        P.set_policy(grads="float32")
    assert P.get_policy() == P.Policy()


@pytest.mark.parametrize("kwargs, text", [({"grads": "float16"}, "grads must be"),
                                          ({"activations": np.float32}, "activations must be"),
                                          ({"activations": np.int8}, "storage dtype"),
                                          ({"compute": "int8"}, "storage dtype")])
def test_policy_refuses_bad_fields(kwargs, text):
    with pytest.raises((ValueError, TypeError), match=text), P.policy(**kwargs):
        pass
    assert P.get_policy() == P.Policy()


def test_bfloat16_without_ml_dtypes_names_the_extra(monkeypatch):
    monkeypatch.setattr(P, "_BF16", None)
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)
    with pytest.raises(ImportError, match=r'pip install "linearkit\[cli\]"'):
        lk.Linear(2, 2, dtype="bfloat16")
    assert lk.Linear(2, 2, dtype=np.float16)(np.ones(2, np.float32)).dtype == np.float32


def test_float16_layers_never_import_ml_dtypes():
    assert not imports("import numpy as np, linearkit as lk\n"
                       "m = lk.Linear(3, 2, dtype=np.float16)\n"
                       "y, b = m.vjp(np.ones((2, 3), np.float32)); b(np.ones((2, 2), np.float32))\n"
                       "opt = lk.optim.Adam(m.parameters()); opt.step()\n"
                       "lk.LayerNorm(3).to('float16')", "ml_dtypes")


# ----------------------------------------------------------------------------- Parameter
def test_parameter_takes_bfloat16_and_refuses_non_floats():
    p = lk.Parameter(np.ones(3, BF16))
    assert p.dtype == BF16 and "bfloat16" in repr(p)
    for bad in (np.ones(3, np.int16), np.ones(3, np.uint16), np.ones(2, ml_dtypes.float8_e4m3fn)):
        with pytest.raises(TypeError, match="floating-point"):
            lk.Parameter(bad)


@pytest.mark.parametrize("dtype", LOW)
def test_add_grad_stores_in_the_dtype_it_is_given(dtype):
    rng = np.random.default_rng(0)
    g1, g2 = (rng.standard_normal(5).astype(np.float32) for _ in range(2))
    p = lk.Parameter(np.zeros(5, dtype))
    p.add_grad(g1.copy(), dtype=np.dtype(np.float32))
    p.add_grad(g2.copy(), dtype=np.dtype(np.float32))
    assert p.grad.dtype == np.float32
    np.testing.assert_array_equal(p.grad, g1 + g2)
    q = lk.Parameter(np.zeros(5, dtype))
    q.add_grad(write=lambda out, acc: g1.copy(), dtype=dtype)         # storage: rounded
    q.add_grad(g2.copy(), dtype=dtype)                                # then accumulated in it
    assert q.grad.dtype == dtype
    np.testing.assert_array_equal(q.grad, g1.astype(dtype) + g2.astype(dtype))
    q.zero_grad(set_to_none=False)
    q.add_grad(g2.copy(), dtype=np.dtype(np.float32))                 # the buffer keeps its dtype
    assert q.grad.dtype == dtype
    np.testing.assert_array_equal(q.grad, g2.astype(dtype))


# ----------------------------------------------------------------------------- Linear
def make(dtype, n_in=24, n_out=10, bias=True, seed=0):
    return lk.Linear(n_in, n_out, bias=bias, dtype=dtype, rng=np.random.default_rng(seed))


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(24,), (7, 24), (3, 4, 24), (0, 24), (2, 0, 24)])
def test_linear_matches_a_float32_layer_holding_the_rounded_weights(dtype, bias, shape):
    """Outputs and every gradient: bitwise against our float32 layer (the same GEMMs), to
    float32 rounding against torch's float32 Linear; all float32."""
    rng = np.random.default_rng(1)
    layer = make(dtype, bias=bias)
    assert layer.weight.dtype == dtype and layer.dtype == dtype
    x = rng.standard_normal(shape).astype(np.float32)
    dy = rng.standard_normal(shape[:-1] + (10,)).astype(np.float32)
    y, back = layer.vjp(x)
    dx = back(dy)
    ref = twin32(layer)
    y32, back32 = ref.vjp(x)
    dx32 = back32(dy)
    ours = [y, dx, layer.weight.grad] + ([layer.bias.grad] if bias else [])
    mine32 = [y32, dx32, ref.weight.grad] + ([ref.bias.grad] if bias else [])
    for a, b in zip(ours, mine32):
        assert a.dtype == np.float32
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(layer(x), y)
    t = torch32(layer)
    xt = torch.from_numpy(x).requires_grad_()
    yt = t(xt)
    yt.backward(torch.from_numpy(dy))
    theirs = [yt, xt.grad, t.weight.grad] + ([t.bias.grad] if bias else [])
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(torch.from_numpy(np.asarray(a)), b.detach())


@pytest.mark.parametrize("dtype", LOW)
def test_blocked_upcast_matches_the_whole_one(dtype, monkeypatch):
    """Weights larger than one block are converted and multiplied by blocks of rows (forward)
    and of columns (dx): float32 results within float32 rounding of the whole conversion."""
    rng = np.random.default_rng(2)
    layer = make(dtype, 40, 30)
    x = rng.standard_normal((6, 40)).astype(np.float32)
    dy = rng.standard_normal((6, 30)).astype(np.float32)
    whole = [layer(x), F.linear_input_grad(dy, layer.weight.data)]
    monkeypatch.setattr(F, "BLOCK_ELEMENTS_16BIT", 7 * 40)           # 7 rows / a few columns a block
    blocked = [layer(x), F.linear_input_grad(dy, layer.weight.data)]
    for a, b in zip(blocked, whole):
        assert a.dtype == np.float32
        torch.testing.assert_close(torch.from_numpy(a), torch.from_numpy(b))


def test_large_layer_bitwise_with_float32_at_the_benchmark_shape():
    """4096x1024 (4 blocks of rows, 4 of columns): the blocks' GEMMs give the whole GEMM's bits
    wherever the BLAS kernel computes a narrower GEMM's elements as the wide one's (OpenBLAS's
    SkylakeX kernel does; its Haswell kernel does not: there, float32 rounding)."""
    rng = np.random.default_rng(3)
    layer = lk.Linear(1024, 4096, dtype="bfloat16", rng=rng)
    x = rng.standard_normal((8, 1024)).astype(np.float32)
    dy = rng.standard_normal((8, 4096)).astype(np.float32)
    w32 = layer.weight.data.astype(np.float32)
    assert layer.weight.size > F.BLOCK_ELEMENTS_16BIT
    rows, cols = F.BLOCK_ELEMENTS_16BIT // 1024, F.BLOCK_ELEMENTS_16BIT // 4096    # 1024 and 256
    for got, whole, by_blocks in (
            (F.linear(x, layer.weight.data), x @ w32.T,
             np.concatenate([x @ w32[i:i + rows].T for i in range(0, 4096, rows)], axis=1)),
            (F.linear_input_grad(dy, layer.weight.data), dy @ w32,
             np.concatenate([dy @ w32[:, i:i + cols] for i in range(0, 1024, cols)], axis=1))):
        np.testing.assert_array_equal(got, by_blocks)       # the blocks, exactly
        if np.array_equal(by_blocks, whole):                # this kernel: the whole GEMM's bits
            np.testing.assert_array_equal(got, whole)
        np.testing.assert_allclose(got, whole, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", LOW)
def test_storage_dtype_input_is_upcast(dtype):
    rng = np.random.default_rng(4)
    layer = make(dtype)
    x16 = rng.standard_normal((5, 24)).astype(dtype)
    y, back = layer.vjp(x16)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, layer(x16.astype(np.float32)))
    assert all(a.dtype == np.float32 for a in closure_arrays(back) if a.shape == x16.shape)
    assert back(np.ones((5, 10), np.float32)).dtype == np.float32
    listed = layer([[0.1] * 24])                                   # a list takes float32
    np.testing.assert_array_equal(listed, layer(np.full((1, 24), 0.1, np.float32)))


@pytest.mark.parametrize("dtype, x_dtype", [(BF16, np.float64), (BF16, np.float16),
                                            (F16, BF16), (F16, np.float64), (BF16, np.int32)])
def test_other_input_dtypes_are_refused_naming_the_layer_and_dtypes(dtype, x_dtype):
    model = lk.Sequential(lk.Linear(3, 24), make(dtype))
    model[0].to(dtype)
    with pytest.raises(lk.DTypeError) as err:
        model[1](np.ones((2, 24), x_dtype))
    text = str(err.value)
    assert "Linear(in_features=24, out_features=10" in text
    assert "float32" in text and dtype.name in text and np.dtype(x_dtype).name in text
    with pytest.raises(lk.DTypeError, match="module '0' "):     # its path, inside a model
        model(np.ones((2, 3), x_dtype))


@pytest.mark.parametrize("storage", [np.float32, np.float64, BF16, F16])
@pytest.mark.parametrize("asked", [np.float16, "bfloat16", np.float64, np.float32])
def test_unsupported_compute_is_refused_naming_the_layer(storage, asked):
    model = lk.Sequential(lk.ReLU(), lk.Linear(4, 2, dtype=storage))
    x = np.ones((2, 4), P.compute_dtype(storage))
    natural = P.compute_dtype(storage)
    with P.policy(compute=asked):
        if P.storage_dtype(asked) == natural:
            model(x)
            model.vjp(x)
            return
        for call in (model, model.vjp):
            with pytest.raises(lk.DTypeError) as err:
                call(x)
            text = str(err.value)
            assert "module '1' (Linear(in_features=4, out_features=2" in text
            assert f"{P.storage_dtype(asked)} compute" in text and str(np.dtype(storage)) in text
            if P.is_16bit(asked):
                assert "no half-precision BLAS" in text


@pytest.mark.parametrize("dtype", LOW)
def test_frozen_weight_and_no_input_grad_skip_their_gemms(dtype, monkeypatch):
    layer = make(dtype)
    layer.weight.requires_grad = False
    x = np.ones((3, 24), np.float32)
    calls = []
    monkeypatch.setattr(F, "linear_weight_grad", lambda *a: calls.append("dW"))
    monkeypatch.setattr(F, "_input_grad_16bit", lambda *a: calls.append("dx"))
    _, back = layer.vjp(x, input_grad=False)
    assert not [a for a in closure_arrays(back) if a.shape == x.shape]   # no activation kept
    assert back(np.ones((3, 10), np.float32)) is None
    assert calls == [] and layer.weight.grad is None
    assert layer.bias.grad.dtype == np.float32


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("input_grad", [True, False])
def test_what_the_backward_keeps_of_the_weight(dtype, input_grad):
    """float16: the forward's float32 copy of the weight, for dx (its upcast costs about half a
    GEMM); bfloat16: nothing (upcast again, cheaply); neither without input_grad."""
    layer = make(dtype)
    _, back = layer.vjp(np.ones((3, 24), np.float32), input_grad=input_grad)
    copies = [a for a in closure_arrays(back)
              if a.shape == layer.weight.shape and a.dtype == np.float32]
    assert len(copies) == (dtype == F16 and input_grad)
    for copy in copies:
        np.testing.assert_array_equal(copy, layer.weight.data.astype(np.float32))


@pytest.mark.parametrize("dtype", LOW)
def test_grads_storage_keeps_the_parameters_dtype_and_reproduces_underflow(dtype):
    rng = np.random.default_rng(5)
    layer = make(dtype)
    x = rng.standard_normal((4, 24)).astype(np.float32)
    dy = (rng.standard_normal((4, 10)) * 1e-9).astype(np.float32)    # below fp16's range
    with P.policy(grads="storage"):
        _, back = layer.vjp(x)
    _, back32 = layer.vjp(x)                   # default policy: float32 gradients
    back(dy)
    g16w, g16b = layer.weight.grad, layer.bias.grad
    layer.zero_grad()
    back32(dy)
    assert g16w.dtype == dtype and g16b.dtype == dtype and layer.weight.grad.dtype == np.float32
    np.testing.assert_array_equal(bits(g16w), torch_round(layer.weight.grad, dtype))
    np.testing.assert_array_equal(bits(g16b), torch_round(layer.bias.grad, dtype))
    underflow = np.mean((g16w.astype(np.float32) == 0) & (layer.weight.grad != 0))
    assert (underflow > 0.9) == (dtype == F16)     # fp16's range underflows; bf16's does not
    assert underflow == 0 or dtype == F16


def test_grads_policy_is_fixed_when_the_forward_runs():
    layer = make(BF16)
    x = np.ones((2, 24), np.float32)
    with P.policy(grads="storage"):
        _, back = layer.vjp(x)
    back(np.ones((2, 10), np.float32))                      # outside the block: still storage
    assert layer.weight.grad.dtype == BF16
    _, back = layer.vjp(x)
    with P.policy(grads="storage"):
        layer.zero_grad()
        back(np.ones((2, 10), np.float32))
    assert layer.weight.grad.dtype == np.float32


@pytest.mark.parametrize("keep", LOW)
@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_activations_policy_keeps_the_saved_input_in_16_bits(keep, dtype):
    rng = np.random.default_rng(6)
    layer = make(dtype)
    x = rng.standard_normal((16, 24)).astype(np.float32)
    dy = rng.standard_normal((16, 10)).astype(np.float32)
    with P.policy(activations=keep):
        y, back = layer.vjp(x)
    saved = [a for a in closure_arrays(back) if a.shape == x.shape]
    assert saved and all(a.dtype == keep for a in saved)
    assert all(a.dtype != np.float32 for a in saved)              # the float32 x is not kept
    dx = back(dy)
    dw = layer.weight.grad
    ref = twin32(layer)
    y32, back32 = ref.vjp(x)
    np.testing.assert_array_equal(y, y32)                          # the forward is unchanged
    np.testing.assert_array_equal(dx, back32(dy))                  # dx needs no activation
    expected = dy.T @ x.astype(keep).astype(np.float32)            # dW from the rounded x
    np.testing.assert_array_equal(dw, expected)
    eps = np.finfo(np.float16).eps if keep == F16 else 2.0 ** -7
    bound = eps * (np.abs(dy).T @ np.abs(x))                       # x's rounding, propagated
    assert np.all(np.abs(dw - ref.weight.grad) <= bound)


# ----------------------------------------------------------------------------- norms
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("kind", ["layer", "batch-train", "batch-eval"])
def test_norm_affine_in_16_bits_matches_torch_float32(dtype, kind):
    rng = np.random.default_rng(7)
    if kind == "layer":
        layer, twin = lk.LayerNorm(6, dtype=dtype), torch.nn.LayerNorm(6)
    else:
        layer, twin = lk.BatchNorm1d(6, dtype=dtype), torch.nn.BatchNorm1d(6)
    layer.weight.data[...] = rng.uniform(0.5, 1.5, 6)
    layer.bias.data[...] = rng.uniform(-1, 1, 6)
    if kind != "layer":
        layer.running_mean[...] = rng.uniform(-1, 1, 6)
        layer.running_var[...] = rng.uniform(0.5, 2, 6)
    twin.load_state_dict({k: torch.from_numpy(np.asarray(v).astype(
        np.float32 if P.is_float(np.asarray(v).dtype) else np.asarray(v).dtype))
        for k, v in layer.state_dict().items()})
    if kind == "batch-eval":
        layer.eval()
        twin.eval()
    x = rng.standard_normal((5, 6)).astype(np.float32)
    dy = rng.standard_normal((5, 6)).astype(np.float32)
    y, back = layer.vjp(x)
    dx = back(dy)
    xt = torch.from_numpy(x).requires_grad_()
    yt = twin(xt)
    yt.backward(torch.from_numpy(dy))
    for a, b in ((y, yt), (dx, xt.grad), (layer.weight.grad, twin.weight.grad),
                 (layer.bias.grad, twin.bias.grad)):
        assert a.dtype == np.float32
        torch.testing.assert_close(torch.from_numpy(a), b.detach())
    if kind == "batch-train":      # running statistics: torch's float32 update, rounded
        for name in ("running_mean", "running_var"):
            stored = getattr(layer, name)
            assert stored.dtype == dtype
            np.testing.assert_allclose(stored.astype(np.float32),
                                       getattr(twin, name).numpy(), rtol=2 * 2.0 ** -8)
        assert int(layer.num_batches_tracked) == 1


@pytest.mark.parametrize("norm", [lambda: lk.LayerNorm(6), lambda: lk.BatchNorm1d(6)])
def test_norms_keep_their_normalized_input_in_the_policys_dtype(norm):
    layer = norm().to("bfloat16")
    x = np.random.default_rng(8).standard_normal((5, 6)).astype(np.float32)
    with P.policy(activations=np.float16):
        y, back = layer.vjp(x)
    saved = [a for a in closure_arrays(back) if a.shape == x.shape]
    assert saved and all(a.dtype == np.float16 for a in saved)
    _, back32 = layer.vjp(x)
    dy = np.ones_like(y)
    dx16, dx32 = back(dy), back32(dy)
    np.testing.assert_allclose(dx16, dx32, atol=1e-2)


# ----------------------------------------------------------------------------- model.to
@pytest.mark.parametrize("dtype", LOW)
def test_model_to_rounds_as_torch_and_round_trips(dtype):
    model = lk.Sequential(lk.Linear(5, 8), lk.BatchNorm1d(8), lk.ReLU(), lk.LayerNorm(8),
                          lk.Linear(8, 3))
    y, back = model.vjp(np.random.default_rng(9).standard_normal((4, 5)).astype(np.float32))
    back(np.ones_like(y))                                  # gradients; running statistics != init
    before = {k: np.array(v) for k, v in model.state_dict().items()}
    assert model.to(dtype) is model
    after = model.state_dict()
    for key, value in before.items():
        if key.endswith("num_batches_tracked"):
            assert after[key].dtype == np.int64 and after[key] == value
            continue
        assert after[key].dtype == dtype, key
        np.testing.assert_array_equal(bits(after[key]), torch_round(value, dtype), err_msg=key)
    assert all(p.grad.dtype == np.float32 for p in model.parameters())
    assert all(m.dtype == dtype for m in model.modules() if hasattr(m, "dtype"))
    assert model(np.ones((4, 5), np.float32)).dtype == np.float32
    model.eval()
    y16 = model(np.ones((4, 5), np.float32))
    model.to(np.float32)
    for key, value in model.state_dict().items():
        if not key.endswith("num_batches_tracked"):
            assert value.dtype == np.float32
            np.testing.assert_array_equal(value, after[key].astype(np.float32))
    np.testing.assert_allclose(model(np.ones((4, 5), np.float32)), y16, rtol=1e-6, atol=1e-6)
    with pytest.raises(TypeError, match="float16, float32 or float64, or bfloat16"):
        model.to(np.int8)


@pytest.mark.parametrize("dtype", ["bfloat16", np.float16])
def test_lazy_linear_materializes_in_its_storage_dtype(dtype):
    layer = lk.LazyLinear(4, dtype=dtype)
    y = layer(np.ones((2, 3), np.float32))
    assert y.dtype == np.float32 and layer.weight.dtype == P.storage_dtype(dtype)
    assert isinstance(layer, lk.Linear) and layer.in_features == 3


# ----------------------------------------------------------------------------- properties
@settings(max_examples=40, deadline=None)
@given(dtype=st.sampled_from(LOW), n_in=st.integers(1, 40), n_out=st.integers(1, 40),
       lead=st.lists(st.integers(0, 4), max_size=2), block=st.sampled_from([1 << 20, 13, 100]),
       bias=st.booleans(), seed=st.integers(0, 2**16))
def test_property_any_shape_any_16_bit_dtype(dtype, n_in, n_out, lead, block, bias, seed):
    rng = np.random.default_rng(seed)
    layer = make(dtype, n_in, n_out, bias, seed)
    x = rng.standard_normal((*lead, n_in)).astype(np.float32)
    dy = rng.standard_normal((*lead, n_out)).astype(np.float32)
    saved, F.BLOCK_ELEMENTS_16BIT = F.BLOCK_ELEMENTS_16BIT, block
    try:
        y, back = layer.vjp(x)
        dx = back(dy)
    finally:
        F.BLOCK_ELEMENTS_16BIT = saved
    ref = twin32(layer)
    y32, back32 = ref.vjp(x)
    dx32 = back32(dy)
    for a, b in ((y, y32), (dx, dx32), (layer.weight.grad, ref.weight.grad)):
        assert a.dtype == np.float32 and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    if bias:
        np.testing.assert_array_equal(layer.bias.grad, ref.bias.grad)


@pytest.mark.parametrize("target", [BF16, np.float32, F16])
def test_a_bfloat16_state_dict_loads_into_any_storage(target):
    source = lk.Sequential(lk.Linear(3, 4), lk.BatchNorm1d(4)).to("bfloat16")
    saved = {k: np.array(v) for k, v in source.state_dict().items()}
    model = lk.Sequential(lk.Linear(3, 4), lk.BatchNorm1d(4)).to(target)
    assert model.load_state_dict(saved) == ([], [])
    for key, value in model.state_dict().items():
        if key.endswith("num_batches_tracked"):
            continue
        assert value.dtype == target
        np.testing.assert_array_equal(value.astype(np.float32), saved[key].astype(np.float32))
    saved["0.weight"] = saved["0.weight"][:2]
    with pytest.raises(RuntimeError, match="size mismatch for 0.weight"):
        model.load_state_dict(saved)
