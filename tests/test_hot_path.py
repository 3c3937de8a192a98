"""The NumPy hot paths (the speed-ups in ``linearkit.functional``) equal straightforward references.

Bias gradients run as a GEMV ``ones @ dy`` (within float32 rounding of ``dy.sum(0)``); a small
one-row dW is accumulated directly, a large one block by block (both bitwise ``out + dyᵀ x``).
"""

import numpy as np
import pytest

from linearkit import functional as F
from linearkit.backend import gemm


def _reference_sum(dy2):
    return dy2.astype(np.float64).sum(axis=0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(2, 3), (32, 256), (130, 1000), (512, 64), (0, 5), (3, 0)])
def test_bias_grad_gemv_matches_sum(shape, dtype):
    rng = np.random.default_rng(sum(shape))
    dy = rng.standard_normal(shape).astype(dtype)
    tol = 2 * shape[0] * np.finfo(dtype).eps
    scale = np.abs(dy).astype(np.float64).sum(axis=0) + np.finfo(dtype).tiny
    fresh = F.linear_bias_grad(dy)
    assert fresh.dtype == dtype and fresh.shape == (shape[1],)
    assert np.all(np.abs(fresh - _reference_sum(dy)) <= tol * scale)
    out = np.full(shape[1], np.nan, dtype)
    assert F.linear_bias_grad(dy, out) is out
    np.testing.assert_array_equal(out, fresh)
    start = rng.standard_normal(shape[1]).astype(dtype)
    acc = start.copy()
    assert F.linear_bias_grad(dy, acc, accumulate=True) is acc
    np.testing.assert_array_equal(acc, start + fresh)


def test_bias_grad_leading_dims_and_non_contiguous():
    rng = np.random.default_rng(1)
    dy = rng.standard_normal((4, 5, 6)).astype(np.float32)
    np.testing.assert_allclose(F.linear_bias_grad(dy), dy.sum(axis=(0, 1)), rtol=1e-5, atol=1e-5)
    view = rng.standard_normal((6, 9)).astype(np.float32).T   # (9, 6), Fortran order
    np.testing.assert_allclose(F.linear_bias_grad(view), view.sum(0), rtol=1e-5, atol=1e-5)


def test_bias_grad_other_dtypes_keep_the_reduction():
    dy = np.arange(12, dtype=np.float16).reshape(4, 3)
    db = F.linear_bias_grad(dy)
    assert db.dtype == np.float16
    np.testing.assert_array_equal(db, dy.sum(axis=0))


def test_bias_grad_inf_and_nan_propagate():
    dy = np.array([[np.inf, 1.0, np.nan], [1.0, -np.inf, 2.0], [np.inf, np.inf, 3.0]], np.float32)
    with np.errstate(invalid="ignore"):  # inf + -inf is NaN, on purpose: no RuntimeWarning
        expected = dy.sum(axis=0)
        np.testing.assert_array_equal(F.linear_bias_grad(dy), expected)


def test_bias_grad_one_row_is_the_row():
    dy = np.array([[1.5, -0.0, 3.0]], np.float32)
    out = np.zeros(3, np.float32)
    F.linear_bias_grad(dy, out)
    np.testing.assert_array_equal(out, dy[0])
    assert np.signbit(out[1])


def test_bias_grad_large_batch_beyond_the_cached_ones():
    rows = gemm.ONES_MAX + 3
    dy = np.ones((rows, 2), np.float32)
    np.testing.assert_array_equal(F.linear_bias_grad(dy), [rows, rows])


@pytest.mark.parametrize("shape", [(16, 16), (64, 512), (200, 300), (300, 64)])
def test_one_row_weight_grad_accumulate_is_bitwise_outer(shape):
    out_features, in_features = shape
    rng = np.random.default_rng(out_features)
    dy = rng.standard_normal((1, out_features)).astype(np.float32)
    x = rng.standard_normal((1, in_features)).astype(np.float32)
    start = rng.standard_normal(shape).astype(np.float32)
    acc = start.copy()
    assert F.linear_weight_grad(dy, x, acc, accumulate=True) is acc
    np.testing.assert_array_equal(acc, start + dy.T * x)


def test_bias_grad_into_non_contiguous_out():
    dy = np.random.default_rng(2).standard_normal((7, 4)).astype(np.float32)
    buf = np.zeros((4, 2), np.float32)
    F.linear_bias_grad(dy, buf[:, 0])
    np.testing.assert_array_equal(buf[:, 0], F.linear_bias_grad(dy))
    assert not buf[:, 1].any()
