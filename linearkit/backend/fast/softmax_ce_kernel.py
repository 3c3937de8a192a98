"""Softmax cross-entropy with integer targets, forward and gradient, compiled by numba.

For logits ``x (M, C)`` and targets ``t (M,)`` (valid class indices, none ignored, no class
weights, no label smoothing: ``CrossEntropyLoss``'s common case), row ``i``'s loss is
``log s_i - (x[i, t_i] - top_i)`` with ``top_i = max_j x_ij`` and ``s_i = Σ_j exp(x_ij - top_i)``,
and its gradient ``softmax(x_i) - onehot(t_i)`` times the upstream scale. The NumPy path makes
about ten passes over ``(M, C)`` arrays (max, subtract, exp, sum, log, subtract, gather, exp
again, scatter, scale); the forward kernel makes one (one ``exp`` per element) and keeps the
exponentials in a buffer of the logits' dtype, which the backward turns into the gradient in
place (no ``exp`` at all).

Unlike the other kernels these do *not* give the NumPy path's bits: NumPy's SIMD float32
``exp``/``log`` are a few ulp from the exact values and numba's (LLVM's libm) are other
functions, so no float32 evaluation order could match. Instead the sums, logarithms and
target-class terms are float64 and each result is rounded once into the logits' dtype; the
target class's ``p - 1`` (where float32 cancels: the NumPy path is off by ~10 ulp there) is
computed from float64 values. tests/test_fast.py measures both paths against a float64
reference.
"""

from __future__ import annotations

import math

import numba
import numpy as np

__all__ = ["softmax_ce_backward", "softmax_ce_forward"]

_JIT = {"cache": True, "error_model": "numpy", "fastmath": False, "nogil": True}


@numba.njit(**_JIT)
def softmax_ce_forward(x, t, ignore_index, exps, row_sum, target_gap):
    """Sum over rows of the loss (a float64). Writes ``exps (M, C) = exp(x - top)`` (rounded to
    its dtype), ``row_sum (M,) = s`` and ``target_gap (M,) = exp(x_t - top) - s`` (float64).

    Returns -1.0 (no loss is negative), having written nothing, when a target is not a class
    index in ``[0, C)`` or equals ``ignore_index``: the caller runs the NumPy path, which
    raises or ignores. A row holding NaN or +inf, or only -inf, has a NaN loss (and gradient),
    as in PyTorch.
    """
    rows, cols = x.shape
    for i in range(rows):
        k = t[i]
        if k < 0 or k >= cols or k == ignore_index:
            return -1.0
    total = 0.0
    for i in range(rows):
        top = np.float64(x[i, 0])
        for j in range(1, cols):
            v = np.float64(x[i, j])
            if v > top or np.isnan(v):
                top = v
                if np.isnan(v):
                    break
        s = 0.0
        for j in range(cols):
            e = math.exp(np.float64(x[i, j]) - top)
            exps[i, j] = e
            s += e
        gap = np.float64(x[i, t[i]]) - top
        row_sum[i] = s
        target_gap[i] = math.exp(gap) - s
        total += math.log(s) - gap
    return total


@numba.njit(**_JIT)
def softmax_ce_backward(exps, t, row_sum, target_gap, scale, dx):
    """``dx (M, C) = (softmax(x_i) - onehot(t_i)) * scale`` from the forward's outputs; ``dx``
    may be ``exps`` itself (in place)."""
    rows, cols = exps.shape
    for i in range(rows):
        r = scale / row_sum[i]
        for j in range(cols):
            dx[i, j] = np.float64(exps[i, j]) * r
        dx[i, t[i]] = target_gap[i] * r
