"""How the forward GEMM of ``y = x @ W.T + b`` is laid out: the one decision ``functional.linear``,
the thin path's fused ``Linear -> ReLU`` and the compiled chain all ask (``forward_layout``), and
the two laid-out GEMMs besides NumPy's own.

Four layouts, each giving every output element as the same dot product:

* ``DOT`` — ``np.dot(x, W.T)``, then ``y += b``: the default (the cheapest call);
* ``MATMUL`` — ``np.matmul(x, W.T)``, then ``y += b``: a large output, which ``np.dot`` would
  zero before the GEMM overwrites it (NumPy's ``cblas_matrixproduct`` clears its output);
* ``WEIGHT_FIRST`` — ``(W @ x.T).T``: float32, 2-48 rows, where OpenBLAS runs the transposed
  product faster, and only with a BLAS kernel that gives ``np.dot``'s bits both ways (checked
  once per process, ``same_bits_both_ways``);
* ``BIAS_FIRST`` — ``y = b`` then ``y += x @ W.T`` in one BLAS ``gemm`` with beta = 1 (as
  PyTorch's ``addmm``): a large output with a bias, one pass over ``y`` instead of three. The
  sums start from ``b``: the same bits while ``in_features`` fits one of OpenBLAS's K-blocks,
  other (as accurate) roundings past it. Needs NumPy's own BLAS bound (``fast/blas.py``).

docs/fast.md has the measurements behind each threshold. ``rules`` turns a layout off
(``linearkit.runtime.disabled`` is the documented switch). Imports nothing else of linearkit.
"""

from __future__ import annotations

import numpy as np

__all__ = ["BIAS_FIRST", "DOT", "MATMUL", "WEIGHT_FIRST", "forward_layout", "linear_bias_first",
           "linear_weight_first", "ones_vector", "same_bits_both_ways", "weight_first"]

DOT, MATMUL, WEIGHT_FIRST, BIAS_FIRST = "dot", "matmul", "weight_first", "bias_first"

#: the layouts that may be chosen (``linearkit.runtime.disabled`` removes some for a while)
rules = {WEIGHT_FIRST: True, BIAS_FIRST: True}

# From this many output elements (4 MiB of float32) np.matmul: no zeroing pass over a large y.
DOT_MAX_OUT = 1 << 20
# From this many output elements (1 MiB of float32) and 2 rows, a bias is added by the GEMM.
BIAS_FIRST_MIN_OUT = 1 << 18
# The few-row rule: rows in [FEW_ROWS_MIN, FEW_ROWS_MAX] and at least FEW_ROWS_MIN_OUT outputs.
FEW_ROWS_MIN, FEW_ROWS_MAX, FEW_ROWS_MIN_OUT = 2, 48, 128

_FLOAT32, _FLOAT64 = np.dtype(np.float32), np.dtype(np.float64)
# rows, in, out: shapes the few-row rule picks (the MNIST MLP's first layer at batch 32 among
# them), on which the bit check compares both layouts
_BIT_CHECK_SHAPES = ((32, 784, 256), (6, 256, 256), (48, 128, 128), (4, 512, 512),
                     (12, 300, 200), (2, 1024, 1024))
_bits_both_ways: bool | None = None     # the first few-row call decides, once per process


def forward_layout(rows: int, in_features: int, out_features: int, x_dtype,
                   weight: np.ndarray, bias: np.ndarray | None) -> str:
    """The layout of ``x (rows, in) @ weight.T (+ bias)``: ``DOT``, ``MATMUL``,
    ``WEIGHT_FIRST`` or ``BIAS_FIRST`` (the module docstring says when). ``x_dtype`` is the
    input's dtype; ``weight`` ``(out, in)`` and ``bias`` ``(out,)`` are the arrays themselves."""
    if out_features >= FEW_ROWS_MIN_OUT and weight_first(rows, in_features, out_features,
                                                         x_dtype, weight.dtype):
        return WEIGHT_FIRST
    if bias is not None and rows * out_features >= BIAS_FIRST_MIN_OUT and rows >= 2 \
            and rules[BIAS_FIRST] and x_dtype is weight.dtype is bias.dtype \
            and (x_dtype is _FLOAT32 or x_dtype is _FLOAT64) and _bias_gemm(x_dtype) is not None:
        return BIAS_FIRST
    return DOT if rows * out_features < DOT_MAX_OUT else MATMUL


def weight_first(rows: int, in_features: int, out_features: int, x_dtype, w_dtype) -> bool:
    """Whether ``x (rows, in) @ W.T`` runs as ``(W @ x.T).T``: float32 throughout, 2-48 rows,
    at least 128 outputs, past the sizes where OpenBLAS's small-matrix path makes both ways
    equal (``rows * in * out`` of 2^20 for 2-4 rows, 2^18 above), NumPy's BLAS is OpenBLAS, and
    its kernel gives ``np.dot``'s bits both ways (``same_bits_both_ways``, once per process)."""
    global _bits_both_ways
    if not (FEW_ROWS_MIN <= rows <= FEW_ROWS_MAX and out_features >= FEW_ROWS_MIN_OUT
            and x_dtype is w_dtype is _FLOAT32 and rules[WEIGHT_FIRST]
            and rows * in_features * out_features >= (1 << 20 if rows <= 4 else 1 << 18)):
        return False
    if _bits_both_ways is None:
        _bits_both_ways = _openblas() and same_bits_both_ways()
    return _bits_both_ways


def _openblas() -> bool:
    """Whether NumPy was built against OpenBLAS (the BLAS the few-row rule was measured on)."""
    try:
        blas = np.show_config(mode="dicts").get("Build Dependencies", {}).get("blas", {})
    except (TypeError, AttributeError):     # a NumPy without show_config(mode=)
        return False
    return "openblas" in str(blas.get("name", "")).lower()


def same_bits_both_ways() -> bool:
    """Whether ``(W @ x.T).T`` gives ``np.dot(x, W.T)``'s bits on the shapes the few-row rule
    picks, with the BLAS kernel this process loaded (OpenBLAS's SkylakeX kernel does, its
    Haswell kernel does not). x and W are slices of one random draw of about a million floats."""
    need = max((rows + n_out) * n_in for rows, n_in, n_out in _BIT_CHECK_SHAPES)
    values = np.random.default_rng(0).random(need, dtype=np.float32) - np.float32(0.5)
    for rows, n_in, n_out in _BIT_CHECK_SHAPES:
        x = values[:rows * n_in].reshape(rows, n_in)
        w = values[rows * n_in:(rows + n_out) * n_in].reshape(n_out, n_in)
        if not np.array_equal(np.dot(w, x.T).T, np.dot(x, w.T)):
            return False
    return True


def _bias_gemm(dtype):
    """NumPy's own BLAS ``gemm`` for ``dtype`` (ctypes, ``fast/blas.py``), or None."""
    from .fast import blas

    found = blas.functions(dtype)
    return None if found is None else found[0]


def linear_weight_first(x: np.ndarray, x2: np.ndarray, weight: np.ndarray,
                        bias: np.ndarray | None) -> np.ndarray:
    """``(W @ x2.T).T + bias`` into a new C-contiguous ``y (*, out)``; ``x2`` is ``x (*, in)``
    as 2-D ``(rows, in)``."""
    y2 = np.empty((x2.shape[0], weight.shape[0]), x2.dtype)
    y_t = np.dot(weight, x2.T)      # (out, rows)
    if bias is None:
        np.copyto(y2, y_t.T)
    else:
        np.add(y_t.T, bias, out=y2)
    return y2 if x.ndim == 2 else y2.reshape(x.shape[:-1] + (weight.shape[0],))


def linear_bias_first(x: np.ndarray, x2: np.ndarray, weight: np.ndarray,
                      bias: np.ndarray) -> np.ndarray:
    """``y = bias; y += x2 @ W.T`` (one BLAS gemm, beta = 1) into a new ``y (*, out)``."""
    from .fast.blas import NO_TRANS, ROW_MAJOR, TRANS

    gemm = _bias_gemm(x2.dtype)
    rows, (out_features, in_features) = x2.shape[0], weight.shape
    y2 = np.empty((rows, out_features), x2.dtype)
    np.copyto(y2, bias)
    if in_features:
        a = np.ascontiguousarray(x2)        # what np.matmul hands OpenBLAS for other layouts
        w = np.ascontiguousarray(weight)
        gemm(ROW_MAJOR, NO_TRANS, TRANS, rows, out_features, in_features, 1.0, a.ctypes.data,
             in_features, w.ctypes.data, in_features, 1.0, y2.ctypes.data, out_features)
    return y2 if x.ndim == 2 else y2.reshape(x.shape[:-1] + (out_features,))


_ones: dict = {}
# Rows of the cached ``ones`` vector (per dtype) at most; a larger batch gets a fresh one.
ONES_MAX = 1 << 16


def ones_vector(rows: int, dtype) -> np.ndarray:
    """``ones (rows,)`` of ``dtype``, the vector of the bias gradient's GEMV ``ones @ dy``: a
    view of one cached array per dtype (read it, never write it), fresh above 65,536 rows."""
    if rows > ONES_MAX:
        return np.ones(rows, dtype)
    ones = _ones.get(dtype.char)
    if ones is None or len(ones) < rows:
        ones = _ones[dtype.char] = np.ones(max(rows, 64), dtype)
    return ones[:rows]
