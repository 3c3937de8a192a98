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
computed from float64 values. tests/test_fast_kernels.py measures both paths against a float64
reference.

The exponentials are float64 ``exp`` of ``x - top <= 0``, computed by ``_exp_nonpositive``
(fdlibm's ``e_exp.c`` algorithm: error below 1 ulp) over the whole batch in one loop without
calls, which the compiler vectorizes; one libm ``exp`` call per element cost more than the
rest of the loss (docs/fast.md, "The whole step in one call").
"""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = ["softmax_ce_backward", "softmax_ce_forward"]

_JIT = {"cache": True, "error_model": "numpy", "fastmath": False, "nogil": True}

# fdlibm e_exp.c: ln2 split in two (the high part has 32 significant bits, so k * _LN2_HI is
# exact for |k| < 2^20), 1/ln2, and the coefficients of its rational approximation on
# [-ln2/2, ln2/2]
_LN2_HI, _LN2_LO = 6.93147180369123816490e-01, 1.90821492927058770002e-10
_INV_LN2 = 1.44269504088896338700e+00
_P1, _P2 = 1.66666666666666019037e-01, -2.77777777770155933842e-03
_P3, _P4 = 6.61375632143793436117e-05, -1.65339022054652515390e-06
_P5 = 4.13813679705723846039e-08
_ROUND = 6755399441055744.0      # 1.5 * 2^52: (v + _ROUND) - _ROUND rounds v to an integer
_LOWEST = -746.0                 # exp of anything below is 0 in float64 (2^-1076 and less)


@intrinsic
def _float64_from_bits(typingctx, bits):
    """The float64 whose IEEE 754 bits are the int64 ``bits`` (compiled code only)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())
    return types.float64(types.int64), codegen


@numba.njit(cache=True, error_model="numpy", fastmath=False, inline="always")
def _exp_nonpositive(d):
    """``exp(d)`` for a float64 ``d <= 0`` (``-inf`` gives 0, NaN gives NaN), within 1 ulp:
    fdlibm's reduction ``d = k ln2 + r``, its approximation of ``exp(r)``, then ``2^k`` as
    two exact powers of two (the second one rounds a subnormal result, once). Plain arithmetic
    and selects only, so a loop over it vectorizes."""
    v = d if d > _LOWEST else _LOWEST  # noqa: FURB136 (max() may keep a NaN: restored below)
    kf = (v * _INV_LN2 + _ROUND) - _ROUND
    hi = v - kf * _LN2_HI
    lo = kf * _LN2_LO
    r = hi - lo
    t = r * r
    c = r - t * (_P1 + t * (_P2 + t * (_P3 + t * (_P4 + t * _P5))))
    y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi)
    k = np.int64(kf)
    a = k if k > -1020 else np.int64(-1020)
    e = y * _float64_from_bits((a + 1023) << 52) * _float64_from_bits((k - a + 1023) << 52)
    return d if np.isnan(d) else e


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
    scratch = np.empty(rows * cols)      # the float64 exponentials, between the passes
    for i in range(rows):                # x - top, in float64; the target's gap
        top = np.float64(x[i, 0])
        for j in range(1, cols):         # a select, not a branch: NaN wins, and stays
            v = np.float64(x[i, j])
            top = v if (v > top or np.isnan(v)) else top
        base = i * cols
        for j in range(cols):
            scratch[base + j] = np.float64(x[i, j]) - top
        target_gap[i] = scratch[base + t[i]]
    for k in range(rows * cols):         # one loop without calls: vectorized
        scratch[k] = _exp_nonpositive(scratch[k])
    total = 0.0
    for i in range(rows):
        base = i * cols
        s = 0.0
        for j in range(cols):
            e = scratch[base + j]
            exps[i, j] = e
            s += e
        gap = target_gap[i]
        row_sum[i] = s
        target_gap[i] = scratch[base + t[i]] - s
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
