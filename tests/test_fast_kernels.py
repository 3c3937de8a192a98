"""The elementwise and cross-entropy kernels of linearkit/backend/fast/ against the NumPy path.

bias+ReLU, ReLU backward and the one-row dW accumulate give the NumPy path's bits (specials
included); the fused softmax cross-entropy rounds float64 results once, so it is checked against
a float64 reference (and is more accurate than the NumPy path there), and for every case it
declines (weights, smoothing, ignored targets, bad targets, big inputs) the NumPy path runs.
"""

from __future__ import annotations

import numpy as np
import pytest

import linearkit as lk
from linearkit import functional as F
from linearkit.backend import fast

numba = pytest.importorskip("numba", reason="the fused kernels need numba (linearkit[fast])")
DTYPES = [np.float32, np.float64]


@pytest.fixture
def kernels():
    k = fast.kernels()
    assert k is not None
    return k


def _specials(a):
    flat = a.reshape(-1)
    flat[:6] = [np.nan, -0.0, 0.0, np.inf, -np.inf, np.finfo(a.dtype).tiny / 4]
    return a


@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_relu_is_bitwise_bias_add_then_maximum(kernels, dtype):
    rng = np.random.default_rng(0)
    y = _specials(rng.standard_normal((37, 19)).astype(dtype))
    b = rng.standard_normal(19).astype(dtype)
    b[1] = b[2] = 0.0                       # keeps -0.0 and +0.0 as they are
    expected = np.maximum(y + b, 0)
    got = y.copy()
    kernels.bias_relu_(got, b)
    assert got.tobytes() == expected.tobytes()
    got = y.copy()
    kernels.relu_(got)
    assert got.tobytes() == F.relu(y).tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
def test_relu_backward_kernel_is_bitwise_functional(kernels, dtype):
    rng = np.random.default_rng(1)
    y = F.relu(_specials(rng.standard_normal((33, 21)).astype(dtype)))
    dy = rng.standard_normal((33, 21)).astype(dtype)
    dy[0, :4] = [np.nan, np.inf, -np.inf, np.nan]       # on dead and live units alike
    dy[1, 0] = np.nan
    dz = np.empty_like(dy)
    kernels.relu_backward_into(dy, y, dz)
    assert dz.tobytes() == F.relu_backward(dy, y).tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (64, 3), (300, 500)])
def test_outer_add_is_bitwise_numpy(kernels, dtype, shape):
    rng = np.random.default_rng(2)
    out = rng.standard_normal(shape).astype(dtype)
    column = rng.standard_normal(shape[0]).astype(dtype)
    row = rng.standard_normal(shape[1]).astype(dtype)
    expected = out + column[:, None] * row
    kernels.outer_add_(out, column, row)
    assert out.tobytes() == expected.tobytes()


def test_batch1_weight_grad_accumulates_through_the_kernel(monkeypatch):
    """A one-row backward into an existing large gradient: the kernel, bitwise the NumPy path
    (a small one, <= 128 KiB, keeps NumPy's direct ``out += dyᵀ * x``: two ufunc calls cost
    less than the kernel's dispatch there)."""
    calls = []
    real = fast.kernels()

    class Spy:
        def __getattr__(self, name):
            if name == "outer_add_":
                calls.append(name)
            return getattr(real, name)

    rng = np.random.default_rng(3)
    dy = rng.standard_normal((1, 300)).astype(np.float32)
    x = rng.standard_normal((1, 200)).astype(np.float32)
    out = rng.standard_normal((300, 200)).astype(np.float32)   # 234 KiB: past the direct path
    expected = out + dy.T * x
    monkeypatch.setattr(fast, "kernels", lambda: Spy())
    F.linear_weight_grad(dy, x, out, accumulate=True)
    assert calls and out.tobytes() == expected.tobytes()


# ------------------------------------------------------------------ softmax cross-entropy
def _reference(x, t, reduction="mean"):
    """Loss and gradient in float64 from the float64 values of ``x (M, C)``."""
    x64 = x.astype(np.float64)
    top = x64.max(axis=1, keepdims=True)
    lse = np.log(np.exp(x64 - top).sum(axis=1)) + top[:, 0]
    rows = np.arange(len(x))
    loss = lse - x64[rows, t]
    p = np.exp(x64 - lse[:, None])
    p[rows, t] -= 1
    scale = 1 / len(x) if reduction == "mean" else 1.0
    return (loss.mean() if reduction == "mean" else loss.sum()), p * scale


def _ulps(got, exact):
    rounded = exact.astype(got.dtype)
    return np.max(np.abs(got.astype(np.float64) - exact) / np.spacing(np.abs(rounded)))


def _numpy_path(loss_fn, x, t, monkeypatch):
    with monkeypatch.context() as m:
        m.setenv("LINEARKIT_FAST", "0")
        loss, backward = loss_fn.vjp(x, t)
        return loss, backward()


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("shape", [(100, 10), (1, 3), (512, 10), (7, 1000)])
def test_fused_cross_entropy_is_within_1_5_ulp_of_float64(monkeypatch, shape, reduction):
    rng = np.random.default_rng(sum(shape))
    x = (4 * rng.standard_normal(shape)).astype(np.float32)
    t = rng.integers(0, shape[1], shape[0])
    loss_fn = lk.CrossEntropyLoss(reduction=reduction)
    loss, backward = loss_fn.vjp(x, t)
    grad = backward()
    exact_loss, exact_grad = _reference(x, t, reduction)
    assert loss.dtype == np.float32 and loss.shape == () and grad.dtype == np.float32
    assert abs(float(loss) - exact_loss) <= np.spacing(np.float32(exact_loss))
    assert _ulps(grad, exact_grad) <= 1.5
    # the NumPy path it replaces: the same values within its own float32 error, which is
    # absolute (a target probability near 1 cancels in exp(log p) - 1: ~1e-3 relative there)
    np_loss, np_grad = _numpy_path(loss_fn, x, t, monkeypatch)
    scale = 1.0 / shape[0] if reduction == "mean" else 1.0
    eps = np.finfo(np.float32).eps
    np.testing.assert_allclose(loss, np_loss, rtol=1e-5, atol=8 * eps * shape[0] * scale)
    np.testing.assert_allclose(grad, np_grad, rtol=1e-5, atol=2 * eps * scale)


def test_fused_cross_entropy_float64_and_1d_input_and_upstream_scale(monkeypatch):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((20, 6))
    t = rng.integers(0, 6, 20)
    loss, backward = lk.CrossEntropyLoss().vjp(x, t)
    grad = backward(np.float64(2.5))
    np_loss, _ = _numpy_path(lk.CrossEntropyLoss(), x, t, monkeypatch)
    _, exact = _reference(x, t)
    np.testing.assert_allclose(loss, np_loss, rtol=1e-14)
    np.testing.assert_allclose(grad, 2.5 * exact, rtol=1e-13, atol=1e-16)
    one = x[0].astype(np.float32)
    _, backward1 = lk.CrossEntropyLoss().vjp(one, np.array(t[0]))
    g1 = backward1()
    assert g1.shape == (6,)
    np.testing.assert_allclose(g1, _reference(one[None], t[:1])[1][0], rtol=1e-6, atol=1e-8)


def test_fused_cross_entropy_nonfinite_logits_as_numpy(monkeypatch):
    x = np.array([[1.0, np.inf, 0.0], [np.nan, 1.0, 2.0], [-np.inf, 0.0, 1.0],
                  [-np.inf, -np.inf, -np.inf], [3e38, -3e38, 0.0]], np.float32)
    t = np.array([0, 1, 2, 0, 0])
    loss_fn = lk.CrossEntropyLoss(reduction="sum")
    with np.errstate(all="ignore"):
        loss, backward = loss_fn.vjp(x[2:3], t[2:3])     # a -inf logit is fine
        assert np.isfinite(loss) and np.isfinite(backward()).all()
        for row in (0, 1, 3):                             # NaN, as the NumPy path and PyTorch
            loss, backward = loss_fn.vjp(x[row:row + 1], t[row:row + 1])
            np_loss, np_grad = _numpy_path(loss_fn, x[row:row + 1], t[row:row + 1], monkeypatch)
            assert np.isnan(loss) and np.isnan(np_loss)
            np.testing.assert_array_equal(np.isnan(backward()), np.isnan(np_grad))
        loss, backward = loss_fn.vjp(x[4:], t[4:])        # huge but finite: no overflow
        assert np.isfinite(loss) and float(loss) == 0.0


@pytest.mark.parametrize("kwargs, target", [
    ({"weight": np.ones(4, np.float32)}, [0, 1]),
    ({"label_smoothing": 0.1}, [0, 1]),
    ({"ignore_index": 1}, [0, 1]),
    ({"reduction": "none"}, [0, 1]),
    ({}, [0, 7]),          # out of range: the NumPy path's error
    ({}, [-1, 1]),
    ({"ignore_index": 3}, [0, 1]),     # 3 is a class, but no target is ignored: fused
])
def test_fused_cross_entropy_declines_what_it_does_not_cover(kwargs, target, monkeypatch):
    """Weights, smoothing, reduction='none' never reach the kernels; a target out of range or
    equal to ignore_index makes the forward kernel decline (writing nothing), and the NumPy
    path gives its result or its error."""
    called = []
    real = fast.kernels()

    class Spy:
        def __getattr__(self, name):
            if name.startswith("softmax_ce"):
                called.append(name)
            return getattr(real, name)

    monkeypatch.setattr(fast, "kernels", lambda: Spy())
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 3
    loss_fn = lk.CrossEntropyLoss(**kwargs)
    target = np.array(target)
    covered = not kwargs or kwargs == {"ignore_index": 3}
    if target.min() < 0 or target.max() >= 4:
        with pytest.raises(ValueError, match=f"class index {target[(target < 0) | (target >= 4)][0]}"):
            loss_fn.vjp(x, target)
        assert called == ["softmax_ce_forward"]      # it looked, declined, wrote nothing
        return
    loss, backward = loss_fn.vjp(x, target)
    grad = backward() if loss.ndim == 0 else backward(np.ones_like(loss))
    if covered:
        assert called == ["softmax_ce_forward", "softmax_ce_backward"]
    else:
        assert called == (["softmax_ce_forward"] if kwargs == {"ignore_index": 1} else [])
    monkeypatch.setattr(fast, "kernels", lambda: None)
    np_loss = loss_fn(x, target)
    np.testing.assert_allclose(loss, np_loss, rtol=2e-6)
    if loss.ndim == 0:
        np.testing.assert_allclose(grad, _numpy_path(loss_fn, x, target, monkeypatch)[1],
                                   rtol=2e-6, atol=1e-7)


def test_fused_cross_entropy_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    x = (3 * rng.standard_normal((64, 10))).astype(np.float32)
    t = rng.integers(0, 10, 64)
    loss, backward = lk.CrossEntropyLoss().vjp(x, t)
    xt = torch.tensor(x, requires_grad=True)
    ref = torch.nn.functional.cross_entropy(xt, torch.tensor(t))
    ref.backward()
    torch.testing.assert_close(torch.tensor(np.asarray(loss)), ref.detach())
    torch.testing.assert_close(torch.tensor(backward()), xt.grad)
