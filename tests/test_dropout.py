"""Dropout: eval identity, inverted scaling, edge probabilities, drop rate, mask reuse, seeding."""

import warnings

import numpy as np
import pytest
import torch

import linearkit as lk

DTYPES = [np.float32, np.float64]


def positive(shape, dtype, seed=0):
    return np.random.default_rng(seed).uniform(0.5, 2.0, shape).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", [0.0, 0.3, 0.5, 1.0])
def test_eval_is_identity(p, dtype):
    x = positive((4, 5), dtype)
    drop = lk.Dropout(p).eval()
    np.testing.assert_array_equal(drop(x), x)
    y, backward = drop.vjp(x)
    np.testing.assert_array_equal(y, x)
    dy = positive((4, 5), dtype, seed=1)
    np.testing.assert_array_equal(backward(dy), dy)
    torch.testing.assert_close(torch.from_numpy(drop(x)),
                               torch.nn.Dropout(p).eval()(torch.from_numpy(x)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_train_zeroes_or_scales(p, dtype):
    x = positive((50, 40), dtype)
    y = lk.Dropout(p, rng=np.random.default_rng(0))(x)
    assert y.dtype == dtype and y.shape == x.shape
    kept = y != 0
    assert 0 < kept.sum() < x.size
    np.testing.assert_allclose(y[kept], x[kept] / (1 - p), rtol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_p_zero_and_one(dtype):
    x = positive((3, 4), dtype)
    dy = positive((3, 4), dtype, seed=1)
    y, backward = lk.Dropout(0.0).vjp(x)
    np.testing.assert_array_equal(y, x)
    np.testing.assert_array_equal(backward(dy), dy)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # p=1 must not divide by zero
        y, backward = lk.Dropout(1.0).vjp(x)
        dx = backward(dy)
    np.testing.assert_array_equal(y, np.zeros_like(x))
    np.testing.assert_array_equal(dx, np.zeros_like(x))
    assert y.dtype == dx.dtype == dtype
    torch.testing.assert_close(torch.from_numpy(y), torch.nn.Dropout(1.0)(torch.from_numpy(x)))


@pytest.mark.parametrize("p", [0.2, 0.5, 0.8])
def test_drop_rate_and_mean_are_right(p):
    """The dropped fraction is p (within 5 standard errors) and E[y] = x (inverted dropout)."""
    n = 200_000
    y = lk.Dropout(p, rng=np.random.default_rng(1))(np.ones(n, np.float32))
    rate = np.mean(y == 0)
    assert abs(rate - p) < 5 * np.sqrt(p * (1 - p) / n)
    assert abs(y.mean() - 1.0) < 5 * np.sqrt(p / (1 - p) / n)


@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_uses_the_forward_mask(dtype):
    drop = lk.Dropout(0.4, rng=np.random.default_rng(2))
    x = positive((30, 20), dtype)
    dy = positive((30, 20), dtype, seed=3)
    y, backward = drop.vjp(x)
    drop(x)  # another forward in between draws a new mask; the closure keeps its own
    dx = backward(dy)
    np.testing.assert_allclose(dx, dy * (y / x), rtol=1e-6)
    assert ((dx == 0) == (y == 0)).all()
    assert lk.Dropout(0.4).vjp(x, input_grad=False)[1](dy) is None


def test_deterministic_with_rng_and_manual_seed():
    x = positive((8, 9), np.float32)
    a = lk.Dropout(0.5, rng=np.random.default_rng(7))
    b = lk.Dropout(0.5, rng=np.random.default_rng(7))
    first = a(x)
    np.testing.assert_array_equal(first, b(x))
    assert not np.array_equal(first, a(x))  # each call draws a fresh mask
    np.testing.assert_array_equal(lk.Dropout(0.5, rng=7)(x), first)  # an int seed
    seeded = lk.Dropout(0.5, rng=7)
    assert not np.array_equal(seeded(x), seeded(x))  # ...seeds once, not on every call
    lk.manual_seed(11)
    c = lk.Dropout(0.5)
    first = c(x)
    lk.manual_seed(11)
    np.testing.assert_array_equal(c(x), first)


def test_train_eval_switch_and_repr():
    drop = lk.Dropout(0.5, rng=np.random.default_rng(0))
    x = positive((10, 10), np.float32)
    assert (drop(x) == 0).any()
    drop.eval()
    np.testing.assert_array_equal(drop(x), x)
    drop.train()
    assert (drop(x) == 0).any()
    assert repr(drop) == repr(torch.nn.Dropout(0.5)) == "Dropout(p=0.5, inplace=False)"
    assert repr(lk.Dropout(np.float32(0.25))) == "Dropout(p=0.25, inplace=False)"


@pytest.mark.parametrize("p", [-0.1, 1.5, float("nan"), "0.5", True])
def test_bad_probability(p):
    with pytest.raises(ValueError, match="between 0 and 1"):
        lk.Dropout(p)
