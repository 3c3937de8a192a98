"""NumPy's own BLAS (``gemm``, ``gemv``), callable from compiled code: the same library NumPy's
``np.dot`` / ``np.matmul`` call, with the same arguments, so a compiled chain gets their bits.

NumPy's PyPI wheels link an ILP64 OpenBLAS (``scipy-openblas64``) whose CBLAS symbols are
``scipy_cblas_{s,d}{gemm,gemv}64_``. They are looked up in NumPy's ``_multiarray_umath``
extension (``dlsym`` searches the libraries it loaded), so nothing is guessed from a path. Any
other build (MKL, Accelerate, an LP64 OpenBLAS) has other names or integer widths: then
``functions()`` returns None and callers keep the NumPy path. On first use each function is
checked once against ``np.dot``/``np.matmul`` on a few shapes; any bit of difference also
gives None. numba's own ``np.dot`` is not used: it calls SciPy's separate OpenBLAS build, whose
float64 GEMM can differ from NumPy's in the last bit (it did for 100x100x100: docs/fast.md).

Pointers and dimensions are declared as 64-bit integers (the ILP64 ``blasint``; a pointer is
passed the same way on every 64-bit ABI), so compiled code hands over ``a.ctypes.data``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["COL_MAJOR", "NO_TRANS", "ROW_MAJOR", "TRANS", "address", "functions", "symbol"]

ROW_MAJOR, COL_MAJOR = 101, 102      # CBLAS_ORDER
NO_TRANS, TRANS = 111, 112           # CBLAS_TRANSPOSE

_found: dict = {}      # dtype -> (gemm, gemv) or None


def functions(dtype):
    """``(gemm, gemv)`` ctypes functions of NumPy's BLAS for ``dtype`` (float32/float64), or
    None when this NumPy's BLAS is not one this module knows or its check failed.

    ``gemm(order, transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)`` and
    ``gemv(order, trans, M, N, alpha, A, lda, X, incx, beta, Y, incy)``, CBLAS argument order.
    """
    dtype = np.dtype(dtype)
    if dtype not in _found:
        _found[dtype] = _bind(dtype)
    return _found[dtype]


def symbol(dtype, routine: str) -> str:
    """The CBLAS symbol of ``routine`` ('gemm' or 'gemv') for ``dtype`` in NumPy's OpenBLAS."""
    return f"scipy_cblas_{'s' if np.dtype(dtype) == np.float32 else 'd'}{routine}64_"


def address(name: str):
    """The address of symbol ``name`` in the libraries NumPy's extension loaded, or None."""
    import ctypes  # here, not at import linearkit

    try:
        lib = ctypes.CDLL(np._core._multiarray_umath.__file__)
        return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
    except (AttributeError, OSError):
        return None


def _bind(dtype):
    import ctypes

    if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        return None
    real = ctypes.c_float if dtype == np.float32 else ctypes.c_double
    i64 = ctypes.c_int64
    gemm_address, gemv_address = address(symbol(dtype, "gemm")), address(symbol(dtype, "gemv"))
    if gemm_address is None or gemv_address is None:
        return None
    gemm = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_int, ctypes.c_int, i64, i64, i64, real,
                            i64, i64, i64, i64, real, i64, i64)(gemm_address)
    gemv = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_int, i64, i64, real, i64, i64, i64,
                            i64, real, i64, i64)(gemv_address)
    return (gemm, gemv) if _agrees(gemm, gemv, dtype) else None


def _agrees(gemm, gemv, dtype) -> bool:
    """Whether ``gemm``/``gemv`` called as the compiled chain calls them give NumPy's bits."""
    rng = np.random.default_rng(0)
    for m, k, n in ((7, 33, 5), (100, 100, 100), (64, 300, 20), (3, 784, 256)):
        a = rng.standard_normal((m, k)).astype(dtype)
        w = rng.standard_normal((n, k)).astype(dtype)
        dy = rng.standard_normal((m, n)).astype(dtype)
        ones = np.ones(m, dtype)
        got = [np.empty((m, n), dtype), np.empty((n, k), dtype), np.empty((m, k), dtype),
               np.empty(n, dtype), np.empty((n, m), dtype)]
        ptr = [g.ctypes.data for g in got]
        gemm(ROW_MAJOR, NO_TRANS, TRANS, m, n, k, 1.0, a.ctypes.data, k, w.ctypes.data, k, 0.0,
             ptr[0], n)                                   # y = x @ W.T
        gemm(ROW_MAJOR, TRANS, NO_TRANS, n, k, m, 1.0, dy.ctypes.data, n, a.ctypes.data, k, 0.0,
             ptr[1], k)                                   # dW = dy.T @ x
        gemm(ROW_MAJOR, NO_TRANS, NO_TRANS, m, k, n, 1.0, dy.ctypes.data, n, w.ctypes.data, k,
             0.0, ptr[2], k)                              # dx = dy @ W
        gemv(ROW_MAJOR, TRANS, m, n, 1.0, dy.ctypes.data, n, ones.ctypes.data, 1, 0.0, ptr[3], 1)
        gemm(ROW_MAJOR, NO_TRANS, TRANS, n, m, k, 1.0, w.ctypes.data, k, a.ctypes.data, k, 0.0,
             ptr[4], m)                                   # y.T = W @ x.T
        row = np.empty((1, n), dtype)
        gemv(ROW_MAJOR, NO_TRANS, n, k, 1.0, w.ctypes.data, k, a.ctypes.data, 1, 0.0,
             row.ctypes.data, 1)                          # one row: y = W @ x
        got.append(row)
        want = [np.dot(a, w.T), np.matmul(dy.T, a), np.matmul(dy, w), np.dot(ones, dy),
                np.dot(w, a.T), np.dot(a[:1], w.T)]
        if not all(np.array_equal(g, e) for g, e in zip(got, want)):
            return False
    return True
