"""Flatten against torch.nn.Flatten: shapes for several dim ranges, backward reshape, errors."""

import numpy as np
import pytest
import torch

import linearkit as lk
from linearkit.errors import ShapeError

CASES = [
    ((2, 3, 4, 5), 1, -1), ((2, 3, 4, 5), 0, -1), ((2, 3, 4, 5), 1, 2), ((2, 3, 4, 5), 2, 3),
    ((2, 3, 4, 5), -3, -2), ((2, 3, 4, 5), 2, 2), ((2, 3, 4, 5), 0, 0), ((2, 3), 1, -1),
    ((0, 3, 4), 1, -1), ((2, 0, 4), 0, 1), ((5,), 0, -1), ((), 0, -1), ((), -1, 0),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, start, end", CASES)
def test_matches_torch(shape, start, end, dtype):
    rng = np.random.default_rng(0)
    x = rng.normal(size=shape).astype(dtype)
    ours, theirs = lk.Flatten(start, end), torch.nn.Flatten(start, end)
    x_t = torch.from_numpy(x.copy()).requires_grad_()
    y_t = theirs(x_t)
    dy = rng.normal(size=tuple(y_t.shape)).astype(dtype)
    y_t.backward(torch.from_numpy(dy))
    y = ours(x)
    torch.testing.assert_close(torch.from_numpy(y), y_t.detach(), rtol=0, atol=0)
    y_vjp, backward = ours.vjp(x)
    dx = backward(dy)
    np.testing.assert_array_equal(y_vjp, y)
    assert dx.shape == x.shape and dx.dtype == dtype
    torch.testing.assert_close(torch.from_numpy(dx), x_t.grad, rtol=0, atol=0)
    assert repr(ours) == repr(theirs)


def test_is_a_view_and_input_grad_false():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    y, backward = lk.Flatten().vjp(x, input_grad=False)
    assert y.shape == (2, 12) and np.shares_memory(y, x)
    assert backward(np.ones_like(y)) is None


@pytest.mark.parametrize("shape, start, end", [((2, 3), 2, -1), ((2, 3), 0, 5), ((2, 3, 4), 2, 1),
                                               ((5,), 1, -1), ((2, 3), -3, -1)])
def test_bad_dims_raise_like_torch(shape, start, end):
    with pytest.raises((IndexError, RuntimeError)):
        torch.nn.Flatten(start, end)(torch.zeros(shape))
    with pytest.raises(ShapeError, match="flatten"):
        lk.Flatten(start, end)(np.zeros(shape, np.float32))


def test_in_a_model_before_linear():
    """The fix the Linear ShapeError hint names: Flatten, then Linear."""
    model = lk.Sequential(lk.Flatten(), lk.Linear(12, 2, rng=np.random.default_rng(0)))
    x = np.ones((4, 3, 4), np.float32)
    y, backward = model.vjp(x)
    assert y.shape == (4, 2) and backward(np.ones_like(y)).shape == x.shape
