"""Activations and (log-)softmax against torch.nn: forward, input gradient, stability, repr."""

import re
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import linearkit as lk
from linearkit.errors import ShapeError

DTYPES = [np.float32, np.float64]

ELEMENTWISE = [
    ("ReLU", {}), ("LeakyReLU", {}), ("LeakyReLU", {"negative_slope": 0.2}),
    ("GELU", {}), ("GELU", {"approximate": "tanh"}), ("Tanh", {}), ("Sigmoid", {}), ("SiLU", {}),
]
ALONG_DIM = [("Softmax", {"dim": d}) for d in (0, 1, -1, 2)] + \
            [("LogSoftmax", {"dim": d}) for d in (0, 1, -1, 2)]


def close(ours, theirs):
    """assert_close with torch's default tolerances for the dtype (dtype must match too)."""
    torch.testing.assert_close(torch.from_numpy(np.asarray(ours)), theirs.detach())


def check(name, kwargs, x, dy):
    """Forward, module call and vjp's dx against torch; no warnings on the way."""
    ours, theirs = getattr(lk, name)(**kwargs), getattr(torch.nn, name)(**kwargs)
    x_t = torch.from_numpy(x.copy()).requires_grad_()
    y_t = theirs(x_t)
    y_t.backward(torch.from_numpy(dy))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = ours(x)
        y_vjp, backward = ours.vjp(x)
        dx = backward(dy)
    close(y, y_t)
    close(y_vjp, y_t)
    close(dx, x_t.grad)
    assert y.dtype == dx.dtype == x.dtype and dx.shape == x.shape
    assert repr(ours) == repr(theirs)
    return y, dx


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, kwargs", ELEMENTWISE + ALONG_DIM)
def test_matches_torch(name, kwargs, dtype):
    rng = np.random.default_rng(0)
    x = rng.normal(0, 3, (4, 5, 6)).astype(dtype)
    x[0, 0, :3] = [0.0, -0.0, 1e-8]  # the kinks
    check(name, kwargs, x, rng.normal(size=x.shape).astype(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, kwargs", ELEMENTWISE)
def test_large_magnitudes_are_stable(name, kwargs, dtype):
    """|x| up to 1e4: no overflow warning, no NaN, and the same values as torch."""
    x = np.array([-1e4, -1e3, -100.0, -88.0, -20.0, 20.0, 88.0, 100.0, 1e3, 1e4], dtype)
    y, dx = check(name, kwargs, x, np.ones_like(x))
    assert np.isfinite(y).all() and np.isfinite(dx).all()


def test_sigmoid_saturates_exactly():
    y = lk.Sigmoid()(np.array([-1e4, -200.0, 0.0, 200.0, 1e4], np.float32))
    np.testing.assert_array_equal(y, np.array([0.0, 0.0, 0.5, 1.0, 1.0], np.float32))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, kwargs", ALONG_DIM)
def test_softmax_large_logits(name, kwargs, dtype):
    """Logits of ±1e4 (exp overflows naively) and -inf entries: finite, torch's values."""
    rng = np.random.default_rng(1)
    x = (rng.normal(size=(3, 4, 5)) * 1e4).astype(dtype)
    x[1, 2, 3] = x[2, 0, 0] = -np.inf
    check(name, kwargs, x, rng.normal(size=x.shape).astype(dtype))


@pytest.mark.parametrize("name", ["Softmax", "LogSoftmax"])
def test_softmax_one_dim_and_errors(name):
    rng = np.random.default_rng(2)
    x = rng.normal(size=7)
    check(name, {"dim": 0}, x, rng.normal(size=7))
    check(name, {"dim": -1}, x, rng.normal(size=7))
    with pytest.raises(ShapeError, match="out of range"):
        getattr(lk, name)(dim=2)(np.zeros((3, 4)))
    with pytest.raises(TypeError, match="dim"):
        getattr(lk, name)()


def test_softmax_sums_to_one_and_matches_log():
    x = np.random.default_rng(3).normal(size=(8, 10)).astype(np.float32) * 5
    p = lk.Softmax(dim=1)(x)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(np.log(p), lk.LogSoftmax(dim=1)(x), atol=1e-4)


def test_relu_gradient_at_zero_is_zero():
    x = np.array([-1.0, 0.0, 2.0], np.float32)
    _, backward = lk.ReLU().vjp(x)
    np.testing.assert_array_equal(backward(np.ones(3, np.float32)), [0.0, 0.0, 1.0])


def test_gelu_rejects_unknown_approximation():
    with pytest.raises(ValueError, match="approximate"):
        lk.GELU(approximate="fast")


@pytest.mark.parametrize("name, kwargs", ELEMENTWISE + ALONG_DIM[:1])
def test_input_grad_false_and_single_use(name, kwargs):
    x = np.ones((2, 3), np.float32)
    module = getattr(lk, name)(**kwargs)
    y, backward = module.vjp(x, input_grad=False)
    assert backward(np.ones_like(y)) is None
    _, backward = module.vjp(x)
    backward(np.ones_like(y))
    with pytest.raises(lk.errors.BackwardError):
        backward(np.ones_like(y))


@settings(max_examples=25, deadline=None, database=None)
@given(st.sampled_from(ELEMENTWISE + ALONG_DIM), st.sampled_from(DTYPES),
       st.lists(st.integers(1, 4), min_size=3, max_size=4), st.integers(0, 2**16))
def test_property_matches_torch(case, dtype, shape, seed):
    """Random shapes (3-D and 4-D) and dtypes."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 4, shape).astype(dtype)
    check(*case, x, rng.normal(size=shape).astype(dtype))


# ------------------------------------------------ special values: ±inf, NaN, ±0, huge, vs torch
_BIG = {np.float32: [1e38, -1e38, 3e38, -3e38], np.float64: [1e300, -1e300, 1.7e308, -1.7e308]}
_SPECIAL_X = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 1.0, -1.0, 20.0, -20.0,
              100.0, -100.0]
_SPECIAL_DY = [2.0, -0.5, 0.0, np.nan, np.inf, -np.inf]
# Where torch's kernels overflow inside the formula (x³ in GELU-tanh's, x·(1+erf) in float32
# GELU's) or flush a float32 subnormal to 0 (sigmoid(-100) = 3.7e-44) and so give inf/NaN for a
# finite, representable answer, linearkit gives the answer torch computes in float64 (for a
# gradient, at x clipped to ±1e100, where float64 still holds x³: the function is saturated).
# Each entry must really differ from torch's own result, so the table stays true.
TORCH_KERNEL_LIMITS = {
    (np.float32, "GELU", "none", "y"): [np.inf, 3e38],
    (np.float32, "GELU", "tanh", "dx"): [1e38, -1e38, 3e38, -3e38],
    (np.float64, "GELU", "tanh", "dx"): [1e300, -1e300, 1.7e308, -1.7e308],
    (np.float32, "Sigmoid", "none", "dx"): [-100.0],
    (np.float32, "SiLU", "none", "dx"): [-100.0],
}


def _special_grid(dtype):
    xs = np.array(_SPECIAL_X + _BIG[dtype], dtype)
    dys = np.array(_SPECIAL_DY, dtype)
    return np.repeat(xs, len(dys)), np.tile(dys, len(xs))


def _torch_vjp(name, kwargs, x, dy, dtype):
    x_t = torch.from_numpy(x.astype(dtype)).requires_grad_()
    y_t = getattr(torch.nn, name)(**kwargs)(x_t)
    y_t.backward(torch.from_numpy(dy.astype(dtype)))
    return y_t.detach().numpy(), x_t.grad.numpy()


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, kwargs", ELEMENTWISE + [("LeakyReLU", {"negative_slope": 0.0}),
                                                        ("LeakyReLU", {"negative_slope": 2.0})])
def test_special_values_match_torch_without_warnings(name, kwargs, dtype):
    """Every activation at NaN, ±inf, ±0, tiny and huge inputs, with NaN/inf/0 upstream
    gradients: torch's values and NaN positions (forward, module call, vjp), and no NumPy
    RuntimeWarning (torch is silent)."""
    x, dy = _special_grid(dtype)
    module = getattr(lk, name)(**kwargs)
    y, backward = module.vjp(x)
    dx = backward(dy)
    np.testing.assert_array_equal(module(x), y)
    ours = {"y": y, "dx": dx}
    theirs = dict(zip(("y", "dx"), _torch_vjp(name, kwargs, x, dy, dtype)))
    for what in ("y", "dx"):
        assert ours[what].dtype == dtype and ours[what].shape == x.shape
        ref = theirs[what].copy()
        key = (dtype, name, kwargs.get("approximate", "none"), what)
        at = np.isin(x, np.array(TORCH_KERNEL_LIMITS.get(key, []), dtype))
        if at.any():
            x_ref = x.astype(np.float64)
            if what == "dx":
                x_ref = np.clip(x_ref, -1e100, 1e100)
            wide = _torch_vjp(name, kwargs, x_ref, dy, np.float64)[what == "dx"]
            with np.errstate(over="ignore"):
                ref[at] = wide[at].astype(dtype)
            assert not np.allclose(ref[at], theirs[what][at], equal_nan=True), "stale table"
        for i in np.flatnonzero(~np.isclose(ours[what], ref, rtol=1.3e-6, atol=1e-5,
                                            equal_nan=True)):
            pytest.fail(f"{name}{kwargs} {what} at x={x[i]!r}, dy={dy[i]!r}: ours "
                        f"{ours[what][i]!r}, torch {ref[i]!r}")


def test_relu_backward_passes_nan_input_and_zeroes_dead_units_like_torch():
    """torch's threshold_backward: ``0 where y <= 0, else dy``. A NaN input is not <= 0, so its
    gradient passes through; a dead unit gives exactly +0 even for a NaN or inf upstream."""
    x = np.array([np.nan, -1.0, 0.0, -0.0, 2.0, -3.0, 5.0], np.float32)
    dy = np.array([2.0, np.nan, np.inf, -1.0, -0.0, -4.0, np.nan], np.float32)
    _, backward = lk.ReLU().vjp(x)
    dx = backward(dy)
    _, dx_t = _torch_vjp("ReLU", {}, x, dy, np.float32)
    np.testing.assert_array_equal(dx, dx_t)
    np.testing.assert_array_equal(np.signbit(dx), np.signbit(dx_t))  # +0, never -0, when dead
    assert dx.dtype == np.float32 and not np.shares_memory(dx, dy)
    dx64 = lk.functional.relu_backward(dy.astype(np.float64), lk.functional.relu(x))
    np.testing.assert_array_equal(dx64, dx_t.astype(np.float64))


# -------------------------------------------------------------------- softmax on a 0-d input
@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("dim", [0, -1])
@pytest.mark.parametrize("name", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("value", [2.5, -7.0, 0.0, np.inf, -np.inf, np.nan])
def test_softmax_of_a_scalar_is_torchs(name, dim, value):
    """A 0-d input: softmax 1 and log_softmax 0 (NaN for ±inf/NaN), gradient 0 — as torch, for
    the module and the functional form, dim 0 or -1."""
    x = np.array(value, np.float32)
    dy = np.array(3.0, np.float32)
    y_t, dx_t = _torch_vjp(name, {"dim": dim}, x, dy, np.float32)
    fn = {"Softmax": "softmax", "LogSoftmax": "log_softmax"}[name]
    module = getattr(lk, name)(dim=dim)
    y, backward = module.vjp(x)
    dx = backward(dy)
    for ours, ref in ((y, y_t), (dx, dx_t), (module(x), y_t),
                      (getattr(lk.functional, fn)(x, dim), y_t),
                      (getattr(lk.functional, fn + "_backward")(dy, y, dim), dx_t)):
        assert ours.shape == () and ours.dtype == np.float32
        np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("dim", [1, -2, 5])
@pytest.mark.parametrize("name", ["Softmax", "LogSoftmax"])
def test_softmax_dim_out_of_range_raises_like_torch(name, dim):
    """torch raises IndexError ("Dimension out of range (expected to be in range of [-1, 0]");
    ours is an IndexError too (and a ShapeError), naming the range, the input and the module."""
    fn = getattr(lk.functional, {"Softmax": "softmax", "LogSoftmax": "log_softmax"}[name])
    for shape in [(), (3,)]:
        x = np.zeros(shape, np.float32)
        with pytest.raises(IndexError, match="Dimension out of range"):
            getattr(torch, fn.__name__)(torch.from_numpy(x), dim)
        with pytest.raises(IndexError, match=r"range \[-1, 0\]") as info:
            getattr(lk, name)(dim=dim)(x)
        assert isinstance(info.value, ShapeError) and f"{name}(dim={dim})" in str(info.value)
        with pytest.raises(IndexError, match=rf"dim={dim}.*range \[-1, 0\].*shape "
                                             rf"{re.escape(str(shape))}"):
            fn(x, dim)
    with pytest.raises(IndexError, match=r"range \[-2, 1\]"):
        fn(np.zeros((2, 3)), 2)


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
def test_softmax_infinite_logits_match_torch_silently(fn):
    """A slice holding +inf is NaN throughout in torch (inf - inf); an all -inf slice too."""
    x = np.array([[np.inf, 0.0, 1.0], [-np.inf, -np.inf, -np.inf], [np.inf, -np.inf, 2.0],
                  [-np.inf, 0.0, 1.0], [np.nan, 0.0, 1.0], [3e38, -3e38, 3e38]], np.float32)
    dy = np.array([1.0, 2.0, -1.0], np.float32) * np.ones_like(x)
    y_t, dx_t = _torch_vjp({"softmax": "Softmax", "log_softmax": "LogSoftmax"}[fn],
                           {"dim": 1}, x, dy, np.float32)
    y = getattr(lk.functional, fn)(x, 1)
    dx = getattr(lk.functional, fn + "_backward")(dy, y, 1)
    torch.testing.assert_close(torch.from_numpy(y), torch.from_numpy(y_t), equal_nan=True)
    torch.testing.assert_close(torch.from_numpy(dx), torch.from_numpy(dx_t), equal_nan=True)
