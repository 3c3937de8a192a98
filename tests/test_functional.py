"""The functional tier: fast paths equal the plain formulas; softmax is stable."""

import numpy as np
import pytest
import torch

from linearkit import functional as F


@pytest.mark.parametrize("rows", [0, 1, 2, 17])
@pytest.mark.parametrize("lead", [(), (3,)])
def test_linear_backward_equals_plain_formulas(rows, lead):
    rng = np.random.default_rng(rows)
    x = rng.standard_normal(lead + (rows, 6))
    w = rng.standard_normal((4, 6))
    dy = rng.standard_normal(lead + (rows, 4))
    dx, dw, db = F.linear_backward(dy, x, w)
    x2, dy2 = x.reshape(-1, 6), dy.reshape(-1, 4)
    np.testing.assert_allclose(dx, (dy2 @ w).reshape(x.shape), rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(dw, np.einsum("no,ni->oi", dy2, x2), rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(db, dy2.sum(0), rtol=1e-13, atol=1e-13)


def test_linear_backward_returns_fresh_arrays_and_skips_unrequested():
    x = np.ones((1, 3))
    dy = np.ones((1, 2))
    dx, dw, db = F.linear_backward(dy, x, np.ones((2, 3)))
    for g in (dx, dw, db):
        assert not np.shares_memory(g, dy) and not np.shares_memory(g, x)
    assert F.linear_backward(dy, x, np.ones((2, 3)), False, False, False) == (None, None, None)
    # 1-D input: db is a fresh copy of dy, never dy itself
    _, _, db = F.linear_backward(np.ones(2), np.ones(3), np.ones((2, 3)))
    assert db.shape == (2,)


def test_linear_flattens_leading_dims_like_einsum():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    y = F.linear(x, w, b)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, np.einsum("...i,oi->...o", x, w) + b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(F.linear(x[0, 0, 0], w), w @ x[0, 0, 0], rtol=1e-6)


@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_stable_for_large_logits_vs_torch(fn, dim):
    x = np.array([[1e4, -1e4, 0.0], [3.0, 3.0, 3.0], [-np.inf, 0.0, 1.0]])
    ours = getattr(F, fn)(x, dim)
    theirs = getattr(torch, fn)(torch.from_numpy(x), dim).numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=0)


def test_activation_dtype_is_kept():
    x = np.linspace(-3, 3, 7, dtype=np.float32)
    for y in (F.relu(x), F.gelu(x), F.gelu(x, "tanh"), F.sigmoid(x), F.silu(x), F.tanh(x),
              F.leaky_relu(x), F.softmax(x), F.log_softmax(x),
              F.gelu_backward(x, x), F.silu_backward(x, x), F.sigmoid_backward(x, x)):
        assert y.dtype == np.float32


@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("out_features", [3, 150])  # 150 > one 64-row block
def test_weight_and_bias_grad_into_buffers_equal_fresh(rows, out_features):
    rng = np.random.default_rng(rows + out_features)
    dy = rng.standard_normal((rows, out_features))
    x = rng.standard_normal((rows, 7))
    fresh_w, fresh_b = F.linear_weight_grad(dy, x), F.linear_bias_grad(dy)
    np.testing.assert_allclose(fresh_w, dy.T @ x, rtol=1e-13, atol=1e-13)
    buf_w, buf_b = np.full_like(fresh_w, 9.0), np.full_like(fresh_b, 9.0)
    assert F.linear_weight_grad(dy, x, buf_w) is buf_w
    assert F.linear_bias_grad(dy, buf_b) is buf_b
    np.testing.assert_allclose(buf_w, fresh_w, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(buf_b, fresh_b, rtol=1e-13, atol=1e-13)
    F.linear_weight_grad(dy, x, buf_w, accumulate=True)
    F.linear_bias_grad(dy, buf_b, accumulate=True)
    np.testing.assert_allclose(buf_w, 2 * fresh_w, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(buf_b, 2 * fresh_b, rtol=1e-13, atol=1e-13)
