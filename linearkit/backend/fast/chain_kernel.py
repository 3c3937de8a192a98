"""A chain of ``Linear [-> ReLU]`` units (some wrapped in ``Residual``) as one compiled forward
and one compiled backward (``fast.kernels()`` only; the plan is made in runtime/compiled_chain.py).

Every GEMM and GEMV is the very BLAS call NumPy makes (``backend/fast/blas.py``: NumPy's own library,
same arguments), and every elementwise step is the NumPy path's operation in its order, with
``fastmath=False``: the outputs, ``dx`` and every gradient have the thin path's bits
(tests/test_compiled_chain.py runs both) under one BLAS thread count (OpenBLAS's bits depend on
it, and the chain sets its largest GEMM's count for all of them: docs/fast.md). What the chain
saves is the Python between the calls: the overhead of each NumPy call and each closure, about
40 of them in the recipe's step (docs/fast.md, "Figures behind choices in the code").

Layer ``i`` of the chain is ``weights[i] (out, in)``, ``biases[i] (out,)`` and ``flags[i]``,
a sum of backend/fast/chain_flags.py's bits. ``ws`` (1-D, ``chain_flags.workspace_per_row`` elements
per row) holds what the backward reads: each unit's output ``z_i (B, out)`` (its ReLU's output
when it has one) and, after a residual's last unit, the block's output ``skip + z``; the
chain's final output goes to ``out`` instead. All arrays C-contiguous,
one dtype (float32 or float64); every width at least 2 (NumPy calls GEMV otherwise), and at
least 2 rows for the backward (a forward of one row calls the GEMV np.dot calls there).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import binding as _llvm
from numba import types
from numba.extending import overload

from . import blas as _blas
from .blas import NO_TRANS, ROW_MAJOR, TRANS
from .chain_flags import (
    BIAS,
    BIAS_FIRST,
    NEED_DB,
    NEED_DW,
    NEED_DX,
    RELU,
    RES_END,
    RES_START,
    WEIGHT_FIRST,
)
from .elementwise_kernel import bias_relu_, relu_, relu_backward_into

__all__ = ["chain_backward", "chain_forward"]

# grad_modes[i, 0|1] for dW|db: 0 not computed, 1 overwrite the buffer, 2 add into it

_JIT = {"cache": True, "error_model": "numpy", "fastmath": False, "nogil": True}


# NumPy's BLAS, called by symbol: each process tells numba's linker where the symbols are
# (a cached kernel names them, so it links again in the next process). Passing the ctypes
# functions as arguments instead cost argument typing on every kernel call (docs/fast.md, "The
# compiled chain").
def _external(dtype, routine: str, signature):
    name = _blas.symbol(dtype, routine)
    address = _blas.address(name)
    if address is not None:     # otherwise blas.functions() is None and no kernel is called
        _llvm.add_symbol(name, address)
    return types.ExternalFunction(name, signature)


def _gemm_type(real):   # order, transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc
    i32, i64 = types.int32, types.int64
    return types.void(i32, i32, i32, i64, i64, i64, real, i64, i64, i64, i64, real, i64, i64)


def _gemv_type(real):   # order, trans, M, N, alpha, A, lda, X, incx, beta, Y, incy
    i32, i64 = types.int32, types.int64
    return types.void(i32, i32, i64, i64, real, i64, i64, i64, i64, real, i64, i64)


_GEMM = {types.float32: _external(np.float32, "gemm", _gemm_type(types.float32)),
         types.float64: _external(np.float64, "gemm", _gemm_type(types.float64))}
_GEMV = {types.float32: _external(np.float32, "gemv", _gemv_type(types.float32)),
         types.float64: _external(np.float64, "gemv", _gemv_type(types.float64))}


def gemm(order, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """CBLAS ``?gemm`` of NumPy's BLAS for ``alpha``'s dtype (compiled code only)."""
    raise NotImplementedError("called from compiled code only")


def gemv(order, trans, m, n, alpha, a, lda, x, incx, beta, y, incy):
    """CBLAS ``?gemv`` of NumPy's BLAS for ``alpha``'s dtype (compiled code only)."""
    raise NotImplementedError("called from compiled code only")


@overload(gemm)
def _gemm_for(order, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    fn = _GEMM[alpha]

    def impl(order, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        fn(order, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
    return impl


@overload(gemv)
def _gemv_for(order, trans, m, n, alpha, a, lda, x, incx, beta, y, incy):
    fn = _GEMV[alpha]

    def impl(order, trans, m, n, alpha, a, lda, x, incx, beta, y, incy):
        fn(order, trans, m, n, alpha, a, lda, x, incx, beta, y, incy)
    return impl


@numba.njit(**_JIT)
def _view(ws, offset, rows, cols):
    return ws[offset:offset + rows * cols].reshape(rows, cols)


@numba.njit(**_JIT)
def chain_forward(one, zero, x, weights, biases, flags, ws, out):
    """Run the chain on ``x (B, in_0)``, B >= 1: the final output into ``out (B, out_last)``,
    what the backward needs into ``ws``. ``one``/``zero``: 1 and 0 in the dtype (GEMM's alpha,
    beta)."""
    rows = x.shape[0]
    last = len(weights) - 1
    a = x
    skip = x
    offset = 0
    for i in range(last + 1):
        w = weights[i]
        n_out, n_in = w.shape
        f = flags[i]
        if f & RES_START:
            skip = a
        if i == last and not f & RES_END:
            z = out
        else:
            z = _view(ws, offset, rows, n_out)
            offset += rows * n_out
        if f & WEIGHT_FIRST:
            # y = (W @ x.T).T: backend.gemm.linear_weight_first's np.dot call, then its copy
            z_t = np.empty((n_out, rows), x.dtype)
            gemm(ROW_MAJOR, NO_TRANS, TRANS, n_out, rows, n_in, one, w.ctypes.data, n_in,
                 a.ctypes.data, n_in, zero, z_t.ctypes.data, rows)
            for r in range(rows):
                for c in range(n_out):
                    z[r, c] = z_t[c, r]
        elif rows == 1:
            # one row: np.dot's GEMV, y = W @ x (a forward only; the backward takes 2 rows up)
            gemv(ROW_MAJOR, NO_TRANS, n_out, n_in, one, w.ctypes.data, n_in, a.ctypes.data, 1,
                 zero, z.ctypes.data, 1)
        elif f & BIAS_FIRST:
            # y = b, then y += x @ W.T in the GEMM: backend.gemm.linear_bias_first's call
            b = biases[i]
            for r in range(rows):
                for c in range(n_out):
                    z[r, c] = b[c]
            gemm(ROW_MAJOR, NO_TRANS, TRANS, rows, n_out, n_in, one, a.ctypes.data, n_in,
                 w.ctypes.data, n_in, one, z.ctypes.data, n_out)
        else:
            # y = x @ W.T: np.dot's call for a C-contiguous x and the transposed view of W
            gemm(ROW_MAJOR, NO_TRANS, TRANS, rows, n_out, n_in, one, a.ctypes.data, n_in,
                 w.ctypes.data, n_in, zero, z.ctypes.data, n_out)
        if f & BIAS_FIRST:
            if f & RELU:
                relu_(z)
        elif f & RELU:
            if f & BIAS:
                bias_relu_(z, biases[i])
            else:
                relu_(z)
        elif f & BIAS:
            b = biases[i]
            for r in range(rows):
                for c in range(n_out):
                    z[r, c] = z[r, c] + b[c]
        if f & RES_END:                   # Residual: x + module(x)
            if i == last:
                s = out
            else:
                s = _view(ws, offset, rows, n_out)
                offset += rows * n_out
            for r in range(rows):
                for c in range(n_out):
                    s[r, c] = skip[r, c] + z[r, c]
            a = s
        else:
            a = z


@numba.njit(**_JIT)
def _add_into(acc, part):
    """``acc += part`` elementwise (NumPy's in-place add: each sum rounded once)."""
    flat_acc = acc.reshape(acc.size)
    flat_part = part.reshape(part.size)
    for k in range(flat_acc.size):
        flat_acc[k] = flat_acc[k] + flat_part[k]


@numba.njit(**_JIT)
def chain_backward(one, zero, dy, x, weights, flags, ws, out, weight_grads, bias_grads,
                   grad_modes, ones):
    """The chain's backward for ``dy (B, out_last)``; returns ``(dx (B, in_0), True)``, or
    ``(empty, False)`` when no layer needed an input gradient (a frozen prefix ends the walk).

    ``out``/``ws`` are the forward's; ``ones`` (B,) holds ones (the bias gradient is the GEMV
    ``ones @ dy``, as ``functional.linear_bias_grad``). ``weight_grads[i]``/``bias_grads[i]``
    receive dW/db as ``grad_modes`` says (a dummy where it says 0).
    """
    rows = dy.shape[0]
    last = len(weights) - 1
    offsets = np.empty(last + 1, np.int64)   # where z_i lies in ws (-1: in out)
    sums = np.empty(last + 1, np.int64)      # where a residual's sum after unit i lies
    offset = 0
    for i in range(last + 1):
        n_out = weights[i].shape[0]
        f = flags[i]
        offsets[i] = -1
        sums[i] = -1
        if not (i == last and not f & RES_END):
            offsets[i] = offset
            offset += rows * n_out
        if f & RES_END and i != last:
            sums[i] = offset
            offset += rows * n_out
    g = dy
    g_skip = dy
    for i in range(last, -1, -1):
        w = weights[i]
        n_out, n_in = w.shape
        f = flags[i]
        if f & RES_END:
            g_skip = g                    # the residual's dy, added to its dx below
        if not f & (NEED_DW | NEED_DB | NEED_DX):
            return np.empty((0, 0), dy.dtype), False
        if f & RELU:
            z = out if offsets[i] < 0 else _view(ws, offsets[i], rows, n_out)
            gz = np.empty((rows, n_out), dy.dtype)
            relu_backward_into(g, z, gz)
        else:
            gz = g
        if i == 0:
            a = x
        elif sums[i - 1] >= 0:
            a = _view(ws, sums[i - 1], rows, n_in)
        else:
            a = _view(ws, offsets[i - 1], rows, n_in)
        mode = grad_modes[i, 0]
        if mode:                          # dW = dy.T @ x: np.matmul's call
            gw = weight_grads[i]
            target = gw if mode == 1 else np.empty_like(gw)
            gemm(ROW_MAJOR, TRANS, NO_TRANS, n_out, n_in, rows, one, gz.ctypes.data, n_out,
                 a.ctypes.data, n_in, zero, target.ctypes.data, n_in)
            if mode == 2:
                _add_into(gw, target)
        mode = grad_modes[i, 1]
        if mode:                          # db = ones @ dy: np.dot's GEMV
            gb = bias_grads[i]
            target = gb if mode == 1 else np.empty_like(gb)
            gemv(ROW_MAJOR, TRANS, rows, n_out, one, gz.ctypes.data, n_out, ones.ctypes.data, 1,
                 zero, target.ctypes.data, 1)
            if mode == 2:
                _add_into(gb, target)
        if not f & NEED_DX:
            return np.empty((0, 0), dy.dtype), False
        dx = np.empty((rows, n_in), dy.dtype)   # dx = dy @ W: np.matmul's call
        gemm(ROW_MAJOR, NO_TRANS, NO_TRANS, rows, n_in, n_out, one, gz.ctypes.data, n_out,
             w.ctypes.data, n_in, zero, dx.ctypes.data, n_in)
        if f & RES_START:                 # Residual's backward: dy + module's dx
            for r in range(rows):
                for c in range(n_in):
                    dx[r, c] = g_skip[r, c] + dx[r, c]
        g = dx
    return g, True
