"""Activations and (log-)softmax against torch.nn: forward, input gradient, stability, repr."""

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
