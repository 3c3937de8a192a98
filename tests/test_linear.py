"""Linear / LazyLinear / Identity against PyTorch, a worked example by hand, and errors."""

import copy

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import linearkit as lk
from linearkit import functional as F
from linearkit.backend import gemm

DTYPES = [np.float32, np.float64]


def torch_twin(layer: lk.Linear) -> torch.nn.Linear:
    twin = torch.nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None,
                           dtype=torch.float64 if layer.dtype == np.float64 else torch.float32)
    twin.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in layer.state_dict().items()})
    return twin


def run_both(layer, x, dy):
    y, backward = layer.vjp(x)
    dx = backward(dy)
    twin = torch_twin(layer)
    xt = torch.from_numpy(np.ascontiguousarray(x)).requires_grad_()
    yt = twin(xt)
    yt.backward(torch.from_numpy(dy))
    return (y, dx, layer.weight.grad, None if layer.bias is None else layer.bias.grad), \
           (yt, xt.grad, twin.weight.grad, None if twin.bias is None else twin.bias.grad)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(5,), (7, 5), (3, 4, 5), (2, 3, 4, 5), (0, 5), (2, 0, 5)])
def test_forward_and_every_gradient_match_torch(dtype, bias, shape):
    rng = np.random.default_rng(0)
    layer = lk.Linear(5, 3, bias=bias, dtype=dtype, rng=rng)
    x = rng.standard_normal(shape).astype(dtype)
    dy = rng.standard_normal(shape[:-1] + (3,)).astype(dtype)
    ours, theirs = run_both(layer, x, dy)
    for a, b in zip(ours, theirs):
        if b is None:
            assert a is None
            continue
        assert a.dtype == dtype and a.shape == tuple(b.shape)
        torch.testing.assert_close(torch.from_numpy(np.asarray(a)), b.detach())


# (rows, in, out, lead): shapes where linear computes (W @ x.T).T on NumPy's OpenBLAS
WEIGHT_FIRST_SHAPES = [(32, 784, 256, ()), (6, 256, 256, ()), (48, 128, 128, ()),
                       (2, 1024, 1024, ()), (4, 512, 512, ()), (12, 300, 200, (3,))]


@pytest.mark.parametrize("rows,in_f,out_f,lead", WEIGHT_FIRST_SHAPES)
@pytest.mark.parametrize("bias", [True, False])
def test_few_rows_weight_first_gemm_matches_torch_and_np_dot(rows, in_f, out_f, lead, bias):
    """A few rows through a wide layer: the GEMM laid out as (W @ x.T).T (functional.py) gives
    a C-contiguous y, PyTorch's values and, in float32 on OpenBLAS, np.dot's very bits."""
    if not gemm.weight_first(rows, in_f, out_f, np.dtype(np.float32), np.dtype(np.float32)):
        pytest.skip("NumPy's BLAS is not OpenBLAS, or its kernel (OPENBLAS_CORETYPE=Haswell) "
                    "gives other bits the other way round: linear keeps x @ W.T")
    rng = np.random.default_rng(3)
    layer = lk.Linear(in_f, out_f, bias=bias, rng=rng)
    x = rng.standard_normal(lead + (rows, in_f)).astype(np.float32)
    dy = rng.standard_normal(lead + (rows, out_f)).astype(np.float32)
    ours, theirs = run_both(layer, x, dy)
    for a, b in zip(ours, theirs):
        if b is not None:
            torch.testing.assert_close(torch.from_numpy(np.asarray(a)), b.detach())
    y = ours[0]
    assert y.flags.c_contiguous and y.shape == lead + (rows, out_f)
    expected = np.dot(x.reshape(-1, in_f), layer.weight.data.T).reshape(y.shape)
    if bias:
        expected += layer.bias.data
    assert y.tobytes() == expected.tobytes()
    fortran = np.asfortranarray(x.reshape(-1, in_f))   # another layout: another BLAS call
    y_f = F.linear(fortran, layer.weight.data, None if layer.bias is None else layer.bias.data)
    assert y_f.flags.c_contiguous
    np.testing.assert_allclose(y_f, expected.reshape(-1, out_f), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows,in_f,out_f,dtype", [(1, 1024, 1024, np.float32),
                                                   (49, 784, 256, np.float32),
                                                   (32, 784, 100, np.float32),
                                                   (4, 784, 256, np.float32),
                                                   (32, 784, 256, np.float64)])
def test_weight_first_gemm_only_where_it_was_measured_faster(rows, in_f, out_f, dtype):
    """One row (GEMV), past 48 rows, under 128 outputs, OpenBLAS's small-matrix sizes and
    float64 keep x @ W.T (docs/fast.md has the measurements)."""
    assert not gemm.weight_first(rows, in_f, out_f, np.dtype(dtype), np.dtype(dtype))


def test_weight_first_only_where_the_kernel_gives_np_dots_bits(monkeypatch):
    """The rule asks the loaded BLAS kernel once: a kernel whose (W @ x.T).T differs from
    np.dot(x, W.T) in a bit (OpenBLAS's Haswell kernel does) keeps x @ W.T everywhere."""
    f32 = np.dtype(np.float32)
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]["name"]
    both_ways = "openblas" in blas.lower() and gemm.same_bits_both_ways()
    assert gemm.weight_first(32, 784, 256, f32, f32) == both_ways
    # the check itself: the two layouts compared on the rule's shapes with this process's BLAS
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 784)).astype(np.float32)
    w = rng.standard_normal((256, 784)).astype(np.float32)
    if not np.array_equal(np.dot(w, x.T).T, np.dot(x, w.T)):
        assert not gemm.same_bits_both_ways()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead", [(64,), (4, 16)])
def test_large_output_goes_through_matmul_with_np_dots_bits(monkeypatch, dtype, lead):
    """From gemm.DOT_MAX_OUT output elements the forward calls np.matmul (np.dot would zero the
    large y first); below it np.dot. The values are np.dot's to the bit either way. (With a
    bias, a large output takes the bias-first GEMM: the next tests.)"""
    rng = np.random.default_rng(5)
    out_f = gemm.DOT_MAX_OUT // 64   # 64 rows: exactly _DOT_MAX_OUT output elements
    w = rng.standard_normal((out_f, 8)).astype(dtype)
    x = rng.standard_normal(lead + (8,)).astype(dtype)
    calls = []
    real_dot, real_matmul = np.dot, np.matmul
    monkeypatch.setattr(F.np, "dot", lambda *a, **k: calls.append("dot") or real_dot(*a, **k))
    monkeypatch.setattr(F.np, "matmul",
                        lambda *a, **k: calls.append("matmul") or real_matmul(*a, **k))
    y = F.linear(x, w)
    assert calls == ["matmul"]
    expected = real_dot(x.reshape(64, 8), w.T)
    assert y.shape == lead + (out_f,)
    assert np.array_equal(y.reshape(64, out_f), expected)
    calls.clear()
    F.linear(x.reshape(64, 8)[:63], w)   # under the threshold (63 rows: no weight-first)
    assert calls == ["dot"]


def _spy_bias_first(monkeypatch):
    calls = []
    real = gemm.linear_bias_first
    monkeypatch.setattr(gemm, "linear_bias_first",
                        lambda *a: calls.append(a[2].shape) or real(*a))
    return calls


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead", [(64,), (4, 16)])
def test_large_output_adds_the_bias_in_the_gemm(monkeypatch, dtype, lead):
    """From gemm.BIAS_FIRST_MIN_OUT output elements (and 2 rows) the bias is written into y first
    and the GEMM adds into it. With K inside one of OpenBLAS's K-blocks the GEMM adds each dot
    product to b once, at the end: exactly ``np.dot(x, W.T) + b`` (which checks every argument
    of the BLAS call). One output fewer keeps ``x @ W.T; y += b``."""
    if gemm.forward_layout(64, 1, 1 << 12, np.dtype(dtype), np.empty((1 << 12, 1), dtype),
                           np.empty(1 << 12, dtype)) is not gemm.BIAS_FIRST:
        pytest.skip("NumPy's BLAS is not the ILP64 OpenBLAS backend/fast/blas.py binds")
    rng = np.random.default_rng(6)
    out_f = gemm.BIAS_FIRST_MIN_OUT // 64
    w = rng.standard_normal((out_f, 24)).astype(dtype)
    b = rng.standard_normal(out_f).astype(dtype)
    x = rng.standard_normal(lead + (24,)).astype(dtype)
    calls = _spy_bias_first(monkeypatch)
    y = F.linear(x, w, b)
    assert calls == [w.shape] and y.shape == lead + (out_f,) and y.flags.c_contiguous
    assert y.tobytes() == (np.dot(x.reshape(64, 24), w.T) + b).tobytes()
    # other layouts of x and W (copied, as np.matmul would): the same bits
    strided = np.repeat(x.reshape(64, 24), 2, axis=1)[:, ::2]      # every other column
    for x_other, w_other in ((np.asfortranarray(x.reshape(64, 24)), w),
                             (strided, np.asfortranarray(w))):
        assert not x_other.flags.c_contiguous
        assert F.linear(x_other, w_other, b).tobytes() == y.reshape(64, out_f).tobytes()
    calls.clear()
    F.linear(x.reshape(64, 24), w[:-1], b[:-1])       # one output under the threshold
    F.linear(x.reshape(64, 24), w)                    # no bias
    F.linear(x.reshape(64, 24), w, b.astype(np.float16))    # mixed dtypes: NumPy promotes
    assert calls == []


@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_first_gemm_over_many_k_blocks_is_as_accurate_and_matches_torch(monkeypatch, dtype):
    """K = 1024 spans several of OpenBLAS's K-blocks: the sums start from b, so the bits
    differ from ``x @ W.T + b`` (as PyTorch's addmm does); the error against a wider
    (``longdouble``) reference stays that of the other order, and the layer matches torch in
    every gradient."""
    rng = np.random.default_rng(7)
    layer = lk.Linear(1024, 512, dtype=dtype, rng=rng)
    x = (rng.standard_normal((2, 256, 1024)) / 8).astype(dtype)   # dW's sums of 512 stay ~O(1)
    dy = (rng.standard_normal((2, 256, 512)) / 8).astype(dtype)
    calls = _spy_bias_first(monkeypatch)
    ours, theirs = run_both(layer, x, dy)
    if not calls:
        pytest.skip("NumPy's BLAS is not the ILP64 OpenBLAS backend/fast/blas.py binds")
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(torch.from_numpy(np.asarray(a)), b.detach())
    w, b = layer.weight.data, layer.bias.data
    x2, y = x.reshape(-1, 1024), ours[0].reshape(-1, 512)
    other = np.dot(x2, w.T) + b
    assert not np.array_equal(y, other)             # the other order, measurably
    if np.finfo(np.longdouble).eps >= np.finfo(np.float64).eps:
        return                                      # no wider type to measure the error with
    wide = np.longdouble
    exact = x2[:64].astype(wide) @ w.T.astype(wide) + b.astype(wide)   # 64 rows: ~0.1 s
    err, err_other = np.abs(y[:64] - exact).mean(), np.abs(other[:64] - exact).mean()
    assert err <= 1.1 * err_other


def test_bias_first_needs_numpys_blas_bound(monkeypatch):
    """No binding (another BLAS, or its check failed): ``x @ W.T; y += b``, np.dot's bits."""
    from linearkit.backend.fast import blas

    rng = np.random.default_rng(8)
    w = rng.standard_normal((4096, 300)).astype(np.float32)
    b = rng.standard_normal(4096).astype(np.float32)
    x = rng.standard_normal((64, 300)).astype(np.float32)
    monkeypatch.setattr(blas, "functions", lambda dtype: None)
    calls = _spy_bias_first(monkeypatch)
    y = F.linear(x, w, b)
    assert calls == [] and y.tobytes() == (np.dot(x, w.T) + b).tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
def test_non_contiguous_input(dtype):
    rng = np.random.default_rng(1)
    layer = lk.Linear(6, 4, dtype=dtype, rng=rng)
    base = rng.standard_normal((6, 10, 3)).astype(dtype)
    x = base.transpose(2, 1, 0)[:, ::2]  # (3, 5, 6), strided
    assert not x.flags.c_contiguous
    dy = rng.standard_normal((3, 5, 4)).astype(dtype)
    ours, theirs = run_both(layer, x, dy)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(torch.from_numpy(np.asarray(a)), b.detach())


def test_golden_worked_example():
    """A worked example: W=[[1,2,3],[4,5,6]], b=[0.1,0.2], x=[[2,1,0]], dL/dy=[[0.5,-1]]."""
    layer = lk.Linear(3, 2, dtype=np.float64)
    layer.load_state_dict({"weight": np.array([[1, 2, 3], [4, 5, 6]]), "bias": np.array([0.1, 0.2])})
    y, backward = layer.vjp(np.array([[2.0, 1.0, 0.0]]))
    np.testing.assert_allclose(y, [[4.1, 13.2]])
    dx = backward(np.array([[0.5, -1.0]]))
    np.testing.assert_allclose(layer.weight.grad, [[1, 0.5, 0], [-2, -1, 0]])
    np.testing.assert_allclose(dx, [[-3.5, -4, -4.5]])
    np.testing.assert_allclose(layer.bias.grad, [0.5, -1])


def test_reused_layer_sums_both_contributions():
    rng = np.random.default_rng(2)
    layer = lk.Linear(4, 4, dtype=np.float64, rng=rng)
    x = rng.standard_normal((3, 4))
    y1, b1 = layer.vjp(x)
    _, b2 = layer.vjp(y1)
    dy = rng.standard_normal((3, 4))
    b1(b2(dy))
    twin = torch_twin(layer)
    xt = torch.from_numpy(x).requires_grad_()
    twin(twin(xt)).backward(torch.from_numpy(dy))
    torch.testing.assert_close(torch.from_numpy(layer.weight.grad), twin.weight.grad)
    torch.testing.assert_close(torch.from_numpy(layer.bias.grad), twin.bias.grad)


def test_two_backward_passes_double_the_gradient_and_zero_grad_clears():
    layer = lk.Linear(3, 2, dtype=np.float64, rng=np.random.default_rng(3))
    x, dy = np.ones((4, 3)), np.ones((4, 2))
    layer.vjp(x)[1](dy)
    first = layer.weight.grad.copy()
    layer.vjp(x)[1](dy)
    np.testing.assert_allclose(layer.weight.grad, 2 * first)
    layer.zero_grad(set_to_none=False)
    assert np.all(layer.weight.grad == 0)
    layer.zero_grad()
    assert layer.weight.grad is None and layer.bias.grad is None


class CountingGemm:
    """Counts np.matmul calls made by functional.linear_backward (the dX and dW GEMMs)."""

    def __init__(self, monkeypatch):
        self.calls = []
        real = np.matmul

        def counted(a, b, *args, **kwargs):
            self.calls.append((a.shape, b.shape))
            return real(a, b, *args, **kwargs)

        monkeypatch.setattr(F.np, "matmul", counted)


@pytest.mark.parametrize("rows", [1, 8])
def test_skipped_work_input_grad_false_and_frozen_weight(monkeypatch, rows):
    layer = lk.Linear(5, 3, rng=np.random.default_rng(4))
    x = np.ones((rows, 5), np.float32)
    dy = np.ones((rows, 3), np.float32)
    _, backward = layer.vjp(x, input_grad=False)
    counter = CountingGemm(monkeypatch)
    assert backward(dy) is None
    assert all(b != layer.weight.shape for _, b in counter.calls), "dX GEMM ran"
    assert layer.weight.grad is not None

    layer.zero_grad()
    layer.weight.requires_grad = False
    monkeypatch.undo()
    _, backward = layer.vjp(x)
    counter = CountingGemm(monkeypatch)
    dx = backward(dy)
    assert counter.calls == [((rows, 3), (3, 5))], "only the dX GEMM may run"
    assert dx.shape == x.shape and layer.weight.grad is None and layer.bias.grad is not None


@pytest.fixture
def numpy_gemms():
    """Count NumPy's GEMMs: keep Sequential off the compiled chain, whose BLAS calls np.matmul
    does not see (its flags skip the same work: tests/test_compiled_chain.py)."""
    with lk.runtime.disabled("compiled_chain"):
        yield


def test_first_layer_of_sequential_skips_dx(numpy_gemms, monkeypatch):
    model = lk.Sequential(lk.Linear(5, 4), lk.ReLU(), lk.Linear(4, 2))
    x = np.ones((3, 5), np.float32)
    _, backward = model.vjp(x, input_grad=False)
    counter = CountingGemm(monkeypatch)
    assert backward(np.ones((3, 2), np.float32)) is None
    # layer 2: dX and dW; layer 0: dW only.
    assert len(counter.calls) == 3


def test_frozen_prefix_is_not_visited(numpy_gemms, monkeypatch):
    model = lk.Sequential(lk.Linear(5, 4), lk.ReLU(), lk.Linear(4, 2))
    model[0].requires_grad_(False)
    _, backward = model.vjp(np.ones((3, 5), np.float32), input_grad=False)
    counter = CountingGemm(monkeypatch)
    backward(np.ones((3, 2), np.float32))
    assert len(counter.calls) == 1  # only layer 2's dW: no dX through the frozen prefix
    assert model[0].weight.grad is None


def test_backward_twice_and_wrong_dy_shape_are_clear_errors():
    model = lk.Sequential(lk.Linear(3, 2))
    _, backward = model.vjp(np.ones((4, 3), np.float32))
    with pytest.raises(lk.ShapeError, match=r"dy of shape \(4, 3\).*output has shape \(4, 2\)"):
        backward(np.ones((4, 3), np.float32))
    _, backward = model.vjp(np.ones((4, 3), np.float32))
    backward(np.ones((4, 2), np.float32))
    with pytest.raises(lk.BackwardError, match="already called"):
        backward(np.ones((4, 2), np.float32))


def test_dy_is_cast_to_the_output_dtype():
    layer = lk.Linear(3, 2)
    _, backward = layer.vjp(np.ones((1, 3), np.float32))
    dx = backward(np.ones((1, 2)))  # float64 dy, as autograd casts it
    assert dx.dtype == np.float32 and layer.weight.grad.dtype == np.float32


# ------------------------------------------------------------------------------ errors
def test_shape_error_names_path_signature_shape_and_flatten_hint():
    model = lk.Sequential(lk.Linear(8, 4), lk.ReLU(),
                          lk.Sequential(lk.Linear(4, 4), lk.ReLU(), lk.Linear(512, 10)))
    with pytest.raises(lk.ShapeError) as info:
        model(np.ones((2, 8), np.float32))
    text = str(info.value)
    assert "'2.2'" in text and "Linear(in_features=512, out_features=10, bias=True)" in text
    assert "(*, 512)" in text and "(2, 4)" in text
    flat = lk.Sequential(lk.Linear(48, 10))
    with pytest.raises(lk.ShapeError, match=r"flatten it first"):
        flat(np.ones((2, 3, 4, 4), np.float32))
    with pytest.raises(lk.ShapeError, match=r"flatten it first"):
        flat.vjp(np.ones((2, 3, 4, 4), np.float32))


def test_shape_error_transposed_hints_and_scalar():
    layer = lk.Linear(5, 3)
    with pytest.raises(lk.ShapeError, match="is the weight transposed"):
        layer(np.ones((2, 3), np.float32))
    with pytest.raises(lk.ShapeError, match="is the input transposed"):
        layer(np.ones((5, 7), np.float32))
    with pytest.raises(lk.ShapeError, match="0-d input"):
        layer(np.float32(1.0))
    assert isinstance(lk.ShapeError("x"), ValueError)


def test_dtype_policy_raises_like_torch_with_a_fix():
    layer = lk.Linear(3, 2)
    with pytest.raises(lk.DTypeError, match=r"expected a float32 input.*got float64") as info:
        layer(np.ones((1, 3)))
    assert "x.astype(np.float32)" in str(info.value) and "model.to(np.float64)" in str(info.value)
    with pytest.raises(lk.DTypeError, match="integer or boolean data must be cast"):
        layer(np.ones((1, 3), np.int64))
    with pytest.raises(RuntimeError):  # PyTorch raises on a dtype mismatch too
        torch.nn.Linear(3, 2)(torch.ones(1, 3, dtype=torch.float64))
    assert isinstance(lk.DTypeError("x"), TypeError)
    # A Python list has no dtype: it takes the layer's.
    assert layer([[1.0, 2.0, 3.0]]).dtype == np.float32
    assert layer.to(np.float64)(np.ones((1, 3))).dtype == np.float64


@pytest.mark.parametrize("args, kind, text", [
    ((-1, 5), ValueError, "LazyLinear"),
    ((2.5, 5), TypeError, "non-negative int"),
    ((3, -2), ValueError, "out_features must be a non-negative int"),
    ((True, 5), TypeError, "non-negative int"),
])
def test_invalid_constructor_arguments(args, kind, text):
    with pytest.raises(kind, match=text):
        lk.Linear(*args)


def test_invalid_dtype_argument():
    with pytest.raises(TypeError, match="float16, float32 or float64"):
        lk.Linear(2, 2, dtype=np.int32)


def test_nan_and_inf_propagate_as_in_torch():
    layer = lk.Linear(3, 2, dtype=np.float64, rng=np.random.default_rng(5))
    x = np.array([[np.nan, 1.0, 2.0], [np.inf, 0.0, 0.0], [1.0, 2.0, 3.0]])
    ours = layer(x)
    theirs = torch_twin(layer)(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
    np.testing.assert_array_equal(np.isinf(ours), np.isinf(theirs))


# --------------------------------------------------------------------------- init / misc
def test_default_init_bounds_and_nonzero_bias():
    layer = lk.Linear(400, 300, rng=np.random.default_rng(6))
    bound = 1 / np.sqrt(400)
    for p in (layer.weight.data, layer.bias.data):
        assert p.min() >= -bound and p.max() <= bound and p.dtype == np.float32
    assert np.abs(layer.bias.data).max() > bound / 2  # not zeros, whatever tutorials say
    assert np.std(layer.weight.data) == pytest.approx(bound / np.sqrt(3), rel=0.02)


def test_same_seed_same_weights():
    lk.manual_seed(7)
    a = lk.Linear(4, 3)
    lk.manual_seed(7)
    b = lk.Linear(4, 3)
    np.testing.assert_array_equal(a.weight.data, b.weight.data)
    c = lk.Linear(4, 3, rng=np.random.default_rng(1))
    d = lk.Linear(4, 3, rng=np.random.default_rng(1))
    np.testing.assert_array_equal(c.bias.data, d.bias.data)


def test_repr_matches_torch():
    assert repr(lk.Linear(20, 30)) == repr(torch.nn.Linear(20, 30))
    assert repr(lk.Linear(2, 3, bias=False)) == repr(torch.nn.Linear(2, 3, bias=False))
    assert repr(lk.Identity()) == repr(torch.nn.Identity())


def test_zero_sized_layers():
    empty_in = lk.Linear(0, 3)
    y = empty_in(np.ones((4, 0), np.float32))
    np.testing.assert_array_equal(y, np.broadcast_to(empty_in.bias.data, (4, 3)))
    assert lk.Linear(3, 0)(np.ones((4, 3), np.float32)).shape == (4, 0)


# -------------------------------------------------------------------------------- lazy
def test_lazy_linear_infers_then_fixes_width():
    lazy = lk.LazyLinear(4, rng=np.random.default_rng(0))
    assert repr(lazy) == "LazyLinear(in_features=?, out_features=4, bias=True)"
    assert list(lazy.parameters()) == [] and lazy.state_dict() == {}
    clone = copy.deepcopy(lazy)
    y = lazy(np.ones((2, 6), np.float32))
    assert y.shape == (2, 4) and lazy.weight.shape == (4, 6) and type(lazy) is lk.Linear
    with pytest.raises(lk.ShapeError, match=r"\(\*, 6\)"):
        lazy(np.ones((2, 7), np.float32))
    clone(np.ones((1, 9), np.float32))
    assert clone.in_features == 9  # the copy was independent


def test_lazy_linear_materializes_from_state_dict():
    source = lk.Linear(6, 4, rng=np.random.default_rng(1))
    lazy = lk.Sequential(lk.LazyLinear(4))
    lazy.load_state_dict({f"0.{k}": v for k, v in source.state_dict().items()})
    x = np.ones((2, 6), np.float32)
    np.testing.assert_array_equal(lazy(x), source(x))


def test_lazy_linear_vjp_and_same_init_as_linear():
    lazy = lk.LazyLinear(3, rng=np.random.default_rng(2))
    _, backward = lazy.vjp(np.ones((2, 5), np.float32))
    backward(np.ones((2, 3), np.float32))
    eager = lk.Linear(5, 3, rng=np.random.default_rng(2))
    np.testing.assert_array_equal(lazy.weight.data, eager.weight.data)
    assert lazy.weight.grad.shape == (3, 5)


def test_identity_passes_through():
    x = np.arange(6.0).reshape(2, 3)
    y, backward = lk.Identity(54, unused="x").vjp(x)
    assert y is x and backward(x) is x


@settings(max_examples=40, deadline=None)
@given(lead=st.lists(st.integers(0, 4), min_size=0, max_size=3),
       in_f=st.integers(1, 6), out_f=st.integers(1, 6), bias=st.booleans(),
       dtype=st.sampled_from(DTYPES))
def test_property_shapes_and_dtypes(lead, in_f, out_f, bias, dtype):
    layer = lk.Linear(in_f, out_f, bias=bias, dtype=dtype, rng=np.random.default_rng(0))
    x = np.ones(tuple(lead) + (in_f,), dtype)
    y, backward = layer.vjp(x)
    assert y.shape == tuple(lead) + (out_f,) and y.dtype == dtype
    dx = backward(np.ones_like(y))
    assert dx.shape == x.shape and dx.dtype == dtype
    assert layer.weight.grad.shape == (out_f, in_f) and layer.weight.grad.dtype == dtype
    ref = x.reshape(-1, in_f) @ layer.weight.data.T + (layer.bias.data if bias else 0)
    np.testing.assert_allclose(y.reshape(-1, out_f), ref, rtol=1e-6)


@pytest.mark.parametrize("rows", [1, 4])
def test_zero_grad_in_place_reuses_the_buffer_and_overwrites(rows):
    layer = lk.Linear(3, 2, dtype=np.float64, rng=np.random.default_rng(8))
    x, dy = np.full((rows, 3), 2.0), np.ones((rows, 2))
    layer.vjp(x)[1](dy)
    expected_w, expected_b = layer.weight.grad.copy(), layer.bias.grad.copy()
    buffers = layer.weight.grad, layer.bias.grad
    layer.zero_grad(set_to_none=False)
    layer.vjp(x)[1](dy)
    assert layer.weight.grad is buffers[0] and layer.bias.grad is buffers[1]
    np.testing.assert_array_equal(layer.weight.grad, expected_w)
    np.testing.assert_array_equal(layer.bias.grad, expected_b)
    layer.vjp(x)[1](dy)  # no zero_grad: accumulates in place
    np.testing.assert_array_equal(layer.weight.grad, 2 * expected_w)
    # A gradient assigned by hand after zero_grad is added to, never overwritten.
    layer.zero_grad(set_to_none=False)
    layer.weight.grad = np.ones((2, 3))
    layer.vjp(x)[1](dy)
    np.testing.assert_array_equal(layer.weight.grad, 1 + expected_w)


# ------------------------------------------------------------------- zero-feature matrix
ZERO_LEADS = [(), (4,), (2, 3), (0,), (2, 0)]  # input rank 1, 2, 3, and batches of 0


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors:UserWarning")  # torch's
@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("lead", ZERO_LEADS, ids=str)
@pytest.mark.parametrize("in_f,out_f", [(0, 3), (2, 0), (0, 0), (2, 3)])
def test_zero_features_every_rank_match_torch(in_f, out_f, lead, bias, dtype):
    """Zero in/out features on every input rank: forward, dx, dW, db, values and shapes."""
    rng = np.random.default_rng(1)
    layer = lk.Linear(in_f, out_f, bias=bias, dtype=dtype, rng=rng)
    x = rng.standard_normal(lead + (in_f,)).astype(dtype)
    dy = rng.standard_normal(lead + (out_f,)).astype(dtype)
    ours, theirs = run_both(layer, x, dy)
    for a, b in zip(ours, theirs):
        if b is None:
            assert a is None
            continue
        assert a.dtype == dtype and a.shape == tuple(b.shape)
        torch.testing.assert_close(torch.from_numpy(np.asarray(a)), b.detach())
    # forward alone, and the functional tier with a preallocated / accumulating buffer
    np.testing.assert_array_equal(layer(x), ours[0])
    w = layer.weight.data
    dw = np.full(w.shape, 1.0, dtype)
    F.linear_weight_grad(dy, x, dw, accumulate=True)
    np.testing.assert_allclose(dw, 1.0 + theirs[2].numpy(), rtol=1e-5, atol=1e-6)
    db = np.full((out_f,), 1.0, dtype)
    F.linear_bias_grad(dy, db, accumulate=True)
    np.testing.assert_allclose(db, 1.0 + dy.sum(axis=tuple(range(dy.ndim - 1))), rtol=1e-5,
                               atol=1e-6)
    assert F.linear_bias_grad(dy, np.empty((out_f,), dtype)).shape == (out_f,)
