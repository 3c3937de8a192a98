"""Linear's elementwise companions in one pass each, compiled by numba (``fast.kernels()`` only).

* ``bias_relu_(y, b)``: ``y = max(y + b, 0)`` in place over the fresh GEMM output ``y (M, N)``,
  where the NumPy path makes two passes (``y += b``, then ``np.maximum`` into a new array).
* ``relu_backward_into(dy, y, dz)``: ``functional.relu_backward`` without its four temporaries.
* ``outer_add_(out, column, row)``: ``out += column * row`` for a one-row ``dW = dyᵀ x``, without
  the block loop's temporaries.

Each does the NumPy path's operations on the same values in the same order, with
``fastmath=False`` (no FMA contraction, no reassociation): the same bits (tests/test_fast.py).
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["bias_relu_", "outer_add_", "relu_", "relu_backward_into"]

_JIT = {"cache": True, "error_model": "numpy", "fastmath": False, "nogil": True}


@numba.njit(**_JIT)
def bias_relu_(y, b):
    """``y (M, N) = max(y + b (N,), 0)`` in place, with ``np.maximum``'s rules: a NaN stays NaN
    and -0.0 becomes +0.0 (``maximum(a, 0)`` returns ``a`` only when ``a > 0`` or ``a`` is NaN)."""
    rows, cols = y.shape
    for i in range(rows):
        for j in range(cols):
            v = y[i, j] + b[j]
            y[i, j] = v if (v > 0 or np.isnan(v)) else 0


@numba.njit(**_JIT)
def relu_(y):
    """``y = max(y, 0)`` in place (``bias_relu_`` without a bias)."""
    rows, cols = y.shape
    for i in range(rows):
        for j in range(cols):
            v = y[i, j]
            y[i, j] = v if (v > 0 or np.isnan(v)) else 0


@numba.njit(**_JIT)
def relu_backward_into(dy, y, dz):
    """``dz (M, N) = 0 where y <= 0, else dy`` (``functional.relu_backward``: +0.0 for a dead unit
    even where dy is NaN or inf; dy passed through, NaN y included)."""
    rows, cols = y.shape
    for i in range(rows):
        for j in range(cols):
            dz[i, j] = 0 if y[i, j] <= 0 else dy[i, j]


@numba.njit(**_JIT)
def outer_add_(out, column, row):
    """``out (M, N) += column (M,) * row (N,)``: each product rounded, then added (no FMA)."""
    rows, cols = out.shape
    for i in range(rows):
        c = column[i]
        for j in range(cols):
            out[i, j] = out[i, j] + c * row[j]
