"""The math of every layer as functions on ndarrays: the linear map and its three gradients,
activations, softmax and the norms, forward and backward.

Modules, transforms, gradcheck and the tests all call down into these. They hold no model
state; what they do keep is machine-facing: the forward GEMM's layout comes from
``backend.gemm`` (which may call NumPy's own BLAS through ctypes), each large GEMM asks the
BLAS thread policy (``backend.threads``) first, and a cached ``ones`` vector serves the bias
gradient. The figures behind each threshold are in docs/fast.md, "Figures behind choices in the
code". Shapes use ``*`` for any number of leading dimensions (including none).
Every function keeps the dtype of its inputs (float32 stays float32). The linear GEMMs also take
a weight stored in float16 or bfloat16: it is upcast to float32 (``precision.compute_array``) in
blocks, and the result is float32 (NumPy has no half-precision BLAS).
"""

from __future__ import annotations

import math

import numpy as np

from . import precision as _precision
from .backend import fast as _fast
from .backend import gemm as _gemm
from .backend import threads as _threads
from .backend.gemm import DOT as _DOT
from .backend.gemm import MATMUL as _MATMUL
from .backend.gemm import WEIGHT_FIRST as _WEIGHT_FIRST
from .errors import DimError

__all__ = [
    "erf",
    "gelu",
    "gelu_backward",
    "leaky_relu",
    "leaky_relu_backward",
    "linear",
    "linear_backward",
    "linear_bias_grad",
    "linear_input_grad",
    "linear_weight_grad",
    "log_softmax",
    "log_softmax_backward",
    "relu",
    "relu_backward",
    "sigmoid",
    "sigmoid_backward",
    "silu",
    "silu_backward",
    "softmax",
    "softmax_backward",
    "tanh",
    "tanh_backward",
]


# ----------------------------------------------------------------------------- linear
def _rows(a: np.ndarray) -> np.ndarray:
    """``a (*, n)`` as a 2-D ``(prod(*), n)`` view; 2-D passes through, 1-D becomes one row.

    The row count is written out, not ``-1``: NumPy cannot infer it when ``n`` is 0.
    """
    return a if a.ndim == 2 else a.reshape(math.prod(a.shape[:-1]), a.shape[-1])


def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """``y = x @ weight.T + bias``.

    Shapes: x ``(*, in)``, weight ``(out, in)``, bias ``(out,)`` -> y ``(*, out)``.
    Leading dimensions are flattened into one 2-D GEMM (NumPy's batched matmul would run one
    GEMM per leading index, which is slower); the bias is added in place. A float16/bfloat16 weight
    (or bias, or x) is upcast and y is float32 (``_linear_16bit``).
    """
    out_features, in_features = weight.shape
    if weight.itemsize == 2:  # float16/bfloat16 storage
        return _linear_16bit(x, weight, bias)
    if x.size * out_features >= _threads.switch_macs:  # BLAS threads for this GEMM (threads.py)
        _threads.before_gemm(x.size * out_features)
    ndim = x.ndim
    if ndim == 1:
        y = np.matmul(weight, x)
    else:
        x2 = x if ndim == 2 else _rows(x)
        layout = _gemm.forward_layout(x2.shape[0], in_features, out_features, x2.dtype, weight,
                                      bias)
        if layout is _DOT:
            y = np.dot(x2, weight.T)    # np.matmul's bits (the same BLAS call), cheaper to call
        elif layout is _MATMUL:
            y = np.matmul(x2, weight.T)     # no zeroing pass over a large y
        elif layout is _WEIGHT_FIRST:
            return _gemm.linear_weight_first(x, x2, weight, bias)
        else:
            return _gemm.linear_bias_first(x, x2, weight, bias)
        if ndim != 2:
            y = y.reshape(x.shape[:-1] + (out_features,))
    if bias is not None:
        y += bias
    return y


def linear_backward(
    dy: np.ndarray,
    x: np.ndarray | None,
    weight: np.ndarray,
    need_dx: bool = True,
    need_dw: bool = True,
    need_db: bool = True,
) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """Gradients of ``y = x @ weight.T + bias``: ``dx = dy @ W``, ``dW = dyᵀ x``, ``db = Σ dy``.

    Shapes: dy ``(*, out)``, x ``(*, in)``, weight ``(out, in)`` ->
    dx ``(*, in)``, dW ``(out, in)``, db ``(out,)``. A gradient not asked for is ``None`` and
    its GEMM is never run (``x`` is only read for dW, so it may be None when ``need_dw`` is False).
    Every returned array is freshly allocated (never a view of dy or x). The three parts are
    also available alone (``linear_input_grad``, ``linear_weight_grad``, ``linear_bias_grad``),
    the last two able to write into or add into an existing gradient buffer.
    """
    dx = linear_input_grad(dy, weight) if need_dx else None
    dw = linear_weight_grad(dy, x) if need_dw else None
    db = linear_bias_grad(dy) if need_db else None
    return dx, dw, db


def linear_input_grad(dy: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """``dx = dy @ weight``: dy ``(*, out)``, weight ``(out, in)`` -> dx ``(*, in)``.

    A float16/bfloat16 weight is upcast to float32 in blocks of columns; dx is float32.
    """
    in_features = weight.shape[1]
    if weight.itemsize == 2:  # float16/bfloat16 storage
        return _input_grad_16bit(dy, weight)
    if dy.size * in_features >= _threads.switch_macs:  # BLAS threads for this GEMM (threads.py)
        _threads.before_gemm(dy.size * in_features)
    if dy.ndim == 2:
        return np.matmul(dy, weight)
    return np.matmul(_rows(dy), weight).reshape(dy.shape[:-1] + (in_features,))


# ------------------------------------------------------------- 16-bit stored weights
# A 16-bit weight is upcast for the GEMM block by block: blocks of output rows in the forward
# (y[:, rows] = x @ W[rows].T), of input columns in dx (dx[:, cols] = dy @ W[:, cols]), so no
# float32 copy of the whole weight exists at once and each block's copy is still in cache when
# the GEMM packs it. A weight of at most BLOCK_ELEMENTS_16BIT elements is converted whole.
# Blocking buys memory, not speed (the GEMMs are narrower), so the block is as large as that
# allows: 1M elements, 4 MiB of float32.
BLOCK_ELEMENTS_16BIT = 1 << 20


def _linear_16bit(x, weight, bias):
    """``linear`` for a float16/bfloat16 ``weight``: float32 GEMMs on blocks of its rows."""
    x = _precision.compute_array(x)
    out_features, in_features = weight.shape
    x2 = x.reshape(1, in_features) if x.ndim == 1 else _rows(x)
    up = _precision.compute_array
    if x2.size * out_features >= _threads.switch_macs:
        _threads.before_gemm(x2.size * out_features)
    rows = max(1, BLOCK_ELEMENTS_16BIT // max(in_features, 1))
    if rows >= out_features:  # whole: the very GEMM (or GEMV) a float32 weight gets
        y = np.matmul(up(weight), x) if x.ndim == 1 else np.matmul(x2, up(weight).T)
    else:
        y = np.empty((x2.shape[0], out_features), _precision.compute_dtype(weight.dtype))
        for start in range(0, out_features, rows):
            block = slice(start, start + rows)
            np.matmul(x2, up(weight[block]).T, out=y[:, block])
    if bias is not None:
        y += _precision.compute_array(bias)
    return y.reshape(x.shape[:-1] + (out_features,))


def _input_grad_16bit(dy, weight):
    """``linear_input_grad`` for a float16/bfloat16 ``weight``: GEMMs on blocks of its columns."""
    out_features, in_features = weight.shape
    dy2 = _precision.compute_array(_rows(dy) if dy.ndim != 1 else dy.reshape(1, out_features))
    up = _precision.compute_array
    if dy2.size * in_features >= _threads.switch_macs:
        _threads.before_gemm(dy2.size * in_features)
    cols = max(1, BLOCK_ELEMENTS_16BIT // max(out_features, 1))
    if cols >= in_features:
        dx = np.matmul(dy2, up(weight))
    else:
        dx = np.empty((dy2.shape[0], in_features), _precision.compute_dtype(weight.dtype))
        for start in range(0, in_features, cols):
            block = slice(start, start + cols)
            np.matmul(dy2, up(weight[:, block]), out=dx[:, block])
    return dx.reshape(dy.shape[:-1] + (in_features,))


# Rows of a one-row dW formed per block when accumulating: the block stays in cache and no
# gradient-sized temporary (page faults on every call for a large layer) is allocated.
_OUTER_BLOCK = 64
# A one-row dW of at most this many bytes is accumulated directly (``out += dyᵀ x``, one
# temporary): below glibc's default mmap threshold (128 KiB) the temporary comes from the heap
# without page faults, and the block loop's slicing costs more than it saves; above it the
# blocks win.
_OUTER_DIRECT_BYTES = 1 << 17


def linear_weight_grad(dy: np.ndarray, x: np.ndarray, out: np.ndarray | None = None,
                       accumulate: bool = False) -> np.ndarray:
    """``dW = dyᵀ x`` summed over all leading dims: dy ``(*, out)``, x ``(*, in)`` -> ``(out, in)``.

    Returned fresh when ``out`` is None; otherwise written into ``out``, or added into it when
    ``accumulate`` (for one row, block by block, with no gradient-sized temporary).
    """
    dy2 = _rows(dy)
    x2 = _rows(x)
    if dy2.shape[0] == 1:
        # One row: an outer product (OpenBLAS's GEMM path for a K=1 product is much slower).
        column = dy2.T
        if out is None:
            return np.multiply(column, x2)
        if not accumulate:
            return np.multiply(column, x2, out=out)
        if out.nbytes <= _OUTER_DIRECT_BYTES:
            out += column * x2
            return out
        kernels = _fast.kernels() if _fast.supports(out.dtype) else None
        if (kernels is not None and out.flags.c_contiguous and dy2.dtype == out.dtype
                and x2.dtype == out.dtype):
            kernels.outer_add_(out, dy2[0], x2[0])   # one pass, no temporary (same bits)
            return out
        block = np.empty((min(_OUTER_BLOCK, out.shape[0]), x2.shape[1]), out.dtype)
        for start in range(0, out.shape[0], _OUTER_BLOCK):
            rows = out[start:start + _OUTER_BLOCK]
            rows += np.multiply(column[start:start + _OUTER_BLOCK], x2, out=block[:len(rows)])
        return out
    if dy2.size * x2.shape[1] >= _threads.switch_macs:  # BLAS threads for this GEMM (threads.py)
        _threads.before_gemm(dy2.size * x2.shape[1])
    if out is None:
        return np.matmul(dy2.T, x2)
    if not accumulate:
        return np.matmul(dy2.T, x2, out=out)
    out += np.matmul(dy2.T, x2)
    return out


# Bias gradients of two or more rows as ``ones @ dy`` (a GEMV, one pass over dy) instead of
# ``dy.sum(axis=0)`` (NumPy's axis-0 reduction adds row by row through its iterator): faster up
# to memory-bound sizes, where the two are even; one row keeps its copy, cheaper than either.
# Only for float32/float64 (BLAS); other dtypes keep the reduction. The GEMV runs on the BLAS
# threads the policy (threads.py) chose for the GEMM before it, which is more than one only
# while the machine shows idle cores (OpenBLAS's split GEMV beside a busy process is ~100x
# slower). It sets no count itself: a switch per bias would double a step's thread switches.
def _column_sum(dy2: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``dy2.sum(axis=0)`` for a 2-D dy2, as a GEMV ``ones @ dy2`` when BLAS can run it.

    Through ``np.dot`` (bitwise ``np.matmul`` here, and cheaper to call), which also keeps it
    apart from the dX and dW GEMMs that tests/test_linear.py counts through ``np.matmul``.
    """
    rows = dy2.shape[0]
    dtype = dy2.dtype
    if dtype.char not in "fd" or (out is not None and out.dtype != dtype):
        return np.sum(dy2, axis=0, out=out)
    ones = _gemm.ones_vector(rows, dtype)
    if out is not None and not out.flags.c_contiguous:  # np.dot writes only contiguous outs
        out[...] = np.dot(ones, dy2)
        return out
    return np.dot(ones, dy2, out=out)  # np.dot: less call overhead than np.matmul


def linear_bias_grad(dy: np.ndarray, out: np.ndarray | None = None,
                     accumulate: bool = False) -> np.ndarray:
    """``db = Σ dy`` over all leading dims: dy ``(*, out)`` -> ``(out,)``; ``out`` as above."""
    dy2 = _rows(dy)
    one_row = dy2.shape[0] == 1
    if out is None:
        # One row: its copy *is* the sum (bitwise), at a fraction of a reduction's overhead.
        return dy2[0].copy() if one_row else _column_sum(dy2)
    if accumulate:
        out += dy2[0] if one_row else _column_sum(dy2)
        return out
    if one_row:
        out[...] = dy2[0]
        return out
    return _column_sum(dy2, out)


# ------------------------------------------------------------------------- activations
def relu(x: np.ndarray) -> np.ndarray:
    """``max(x, 0)``, elementwise. NaN propagates, as in PyTorch."""
    return np.maximum(x, 0)


_INT_OF_WIDTH = {2: np.int16, 4: np.int32, 8: np.int64}


def relu_backward(dy: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Gradient of relu from its *output* ``y``: 0 where ``y <= 0``, else ``dy``.

    PyTorch's ``threshold_backward`` exactly: a NaN input (``y`` NaN is not ``<= 0``) passes
    ``dy`` through, and a dead unit (x <= 0, so 0 at x = 0) gives +0 even where ``dy`` is NaN
    or inf (``dy * (y > 0)`` would give NaN there). Computed as a bitwise AND of dy's bits
    with an all-ones / all-zeros mask: no floating-point operation, so no warning, and as fast
    as that multiply (``np.where`` is much slower on a random mask).
    """
    dy = np.asarray(dy)
    dead = np.less_equal(y, 0)
    bits = _INT_OF_WIDTH.get(dy.dtype.itemsize) if dy.dtype.kind == "f" else None
    if bits is None or dy.shape != dead.shape:
        return np.where(dead, 0, dy)
    keep = dead.astype(bits)
    keep -= 1  # dead: 1 - 1 = 0 (no bits kept); alive: 0 - 1 = -1 (every bit kept)
    return np.bitwise_and(dy.view(bits), keep).view(dy.dtype)


def leaky_relu(x: np.ndarray, negative_slope: float = 0.01) -> np.ndarray:
    """``x`` where ``x > 0``, else ``negative_slope * x`` (as PyTorch, so NaN stays NaN)."""
    with np.errstate(over="ignore", invalid="ignore"):  # -inf * 0, or a slope > 1 at -3e38
        return np.where(x > 0, x, x * negative_slope)


def leaky_relu_backward(dy: np.ndarray, x: np.ndarray, negative_slope: float = 0.01) -> np.ndarray:
    """Gradient of leaky_relu: ``dy`` where ``x > 0``, else ``negative_slope * dy`` (at NaN too,
    as PyTorch's ``x > 0 ? dy : dy * slope``)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.where(x > 0, dy, dy * negative_slope)


_scipy_erf = None


def erf(x: np.ndarray) -> np.ndarray:
    """The error function, elementwise, dtype kept.

    NumPy has no ``erf``: SciPy's (exact, vectorized) is used when SciPy is installed,
    otherwise ``math.erf`` element by element (exact, slower).
    """
    global _scipy_erf
    if _scipy_erf is None:
        try:
            from scipy.special import erf as _scipy_erf_impl
        except ImportError:  # pragma: no cover - depends on the environment
            _scipy_erf_impl = np.vectorize(math.erf, otypes=[np.float64])
        _scipy_erf = _scipy_erf_impl
    x = np.asarray(x)
    return np.asarray(_scipy_erf(x), dtype=x.dtype)


_SQRT_HALF = math.sqrt(0.5)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_GELU_TANH_C = 0.044715


# Where |x| >= this, tanh of the GELU-tanh inner argument is exactly ±1 in float32 and float64
# (inner(10) = 43.7), so clipping x there changes no value and keeps x³ from overflowing.
_GELU_TANH_SATURATED = 10.0


def gelu(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    """GELU: ``x Φ(x)`` exactly (``approximate='none'``) or its tanh approximation (``'tanh'``).

    At -inf it is NaN (``-inf * 0``), as in PyTorch; no overflow warning for huge ``|x|``.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        if approximate == "tanh":
            inner = _SQRT_2_OVER_PI * (x + _GELU_TANH_C * x * x * x)
            return 0.5 * x * (1.0 + np.tanh(inner))
        return 0.5 * x * (1.0 + erf(x * _SQRT_HALF))


def gelu_backward(dy: np.ndarray, x: np.ndarray, approximate: str = "none") -> np.ndarray:
    """Gradient of gelu with respect to its input ``x``.

    Finite huge ``|x|`` gives the limit (dy for x > 0, 0 for x < 0), ±inf gives NaN, as PyTorch
    does in float64 (its float32 tanh kernel overflows to NaN from |x| ~ 1e13).
    """
    with np.errstate(over="ignore", invalid="ignore"):
        if approximate == "tanh":
            xc = np.clip(x, -_GELU_TANH_SATURATED, _GELU_TANH_SATURATED)
            x2 = xc * xc
            t = np.tanh(_SQRT_2_OVER_PI * (xc + _GELU_TANH_C * x2 * xc))
            dinner = _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_TANH_C * x2)
            return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dinner)
        cdf = 0.5 * (1.0 + erf(x * _SQRT_HALF))
        pdf = np.exp(-0.5 * x * x) * _INV_SQRT_2PI
        return dy * (cdf + x * pdf)


def tanh(x: np.ndarray) -> np.ndarray:
    """Hyperbolic tangent, elementwise."""
    return np.tanh(x)


def tanh_backward(dy: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Gradient of tanh from its output ``y``: ``dy (1 - y²)`` (NaN for an inf dy where y = ±1,
    silently, as in PyTorch)."""
    with np.errstate(invalid="ignore"):
        return dy * (1.0 - y * y)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic sigmoid ``1 / (1 + e^-x)``, stable for large ``|x|`` (no overflow warning)."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def sigmoid_backward(dy: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Gradient of sigmoid from its output ``y``: ``dy y (1 - y)`` (NaN, silently, for an inf dy
    where y is 0 or 1, as in PyTorch)."""
    with np.errstate(invalid="ignore"):
        return dy * y * (1.0 - y)


def silu(x: np.ndarray) -> np.ndarray:
    """SiLU (swish): ``x σ(x)``. At -inf it is NaN (``-inf * 0``), silently, as in PyTorch."""
    with np.errstate(invalid="ignore"):
        return x * sigmoid(x)


def silu_backward(dy: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Gradient of silu with respect to ``x``: ``dy σ(x) (1 + x (1 - σ(x)))``; NaN at ±inf
    (``inf * 0``), silently, as in PyTorch."""
    s = sigmoid(x)
    with np.errstate(invalid="ignore"):
        return dy * (s * (1.0 + x * (1.0 - s)))


# ----------------------------------------------------------------------------- softmax
def _along(x, dim: int):
    """``(x, axis)`` for a reduction along ``dim``, checked as PyTorch checks it: an axis in
    ``[-n, n)`` with ``n = max(x.ndim, 1)``, so a 0-d input has the one dim 0 (or -1) and is
    computed as one element (softmax 1, log_softmax 0). Out of range: a ``DimError`` (an
    IndexError, as PyTorch raises, and a ShapeError)."""
    x = np.asarray(x)
    n = max(x.ndim, 1)
    if not -n <= dim < n:
        raise DimError(f"dim={dim} is out of range [{-n}, {n - 1}] for an input of shape "
                       f"{x.shape}", hint="softmax over the features is usually dim=-1")
    return (x.reshape(1), 0) if x.ndim == 0 else (x, dim)


def _shifted(x: np.ndarray, dim: int) -> np.ndarray:
    """``x - max(x, dim)``. A slice holding +inf (or only -inf) becomes NaN there (inf - inf),
    which makes its softmax NaN throughout, as in PyTorch."""
    if x.shape[dim] == 0:
        return x.copy()
    return x - np.max(x, axis=dim, keepdims=True)


def softmax(x: np.ndarray, dim: int = -1) -> np.ndarray:
    """``exp(x) / Σ exp(x)`` along ``dim``, computed after subtracting the max (no overflow).

    Shape: any -> same (a 0-d input gives 1, as in PyTorch).
    """
    shape = np.shape(x)
    x, dim = _along(x, dim)
    with np.errstate(over="ignore", invalid="ignore"):  # 3e38 - (-3e38), inf - inf
        e = np.exp(_shifted(x, dim))
        e /= np.sum(e, axis=dim, keepdims=True)
    return e.reshape(shape)


def softmax_backward(dy: np.ndarray, y: np.ndarray, dim: int = -1) -> np.ndarray:
    """Gradient of softmax from its output ``y``: ``y (dy - Σ dy y)``; dy, y and dx alike."""
    shape = np.shape(y)
    y, dim = _along(y, dim)
    dy = np.reshape(dy, y.shape)
    with np.errstate(invalid="ignore"):
        return (y * (dy - np.sum(dy * y, axis=dim, keepdims=True))).reshape(shape)


def log_softmax(x: np.ndarray, dim: int = -1) -> np.ndarray:
    """``x - log Σ exp(x)`` along ``dim``, stable for large logits (0 for a 0-d input)."""
    shape = np.shape(x)
    x, dim = _along(x, dim)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        z = _shifted(x, dim)
        z -= np.log(np.sum(np.exp(z), axis=dim, keepdims=True))
    return z.reshape(shape)


def log_softmax_backward(dy: np.ndarray, y: np.ndarray, dim: int = -1) -> np.ndarray:
    """Gradient of log_softmax from its output ``y``: ``dy - exp(y) Σ dy``; dy, y, dx alike."""
    shape = np.shape(y)
    y, dim = _along(y, dim)
    dy = np.reshape(dy, y.shape)
    with np.errstate(invalid="ignore"):
        return (dy - np.exp(y) * np.sum(dy, axis=dim, keepdims=True)).reshape(shape)


# ----------------------------------------------------------------------- normalization
__all__ += [
    "batch_norm",
    "batch_norm_backward",
    "batch_norm_forward",
    "layer_norm",
    "layer_norm_backward",
    "layer_norm_forward",
]


def _mean(a: np.ndarray, axes: tuple, n: int) -> np.ndarray:
    """Mean over ``axes`` (kept as size-1 dims), accumulated in float64, in ``a``'s dtype.

    float64 accumulation keeps a float32 mean over a long axis-0 reduction (BatchNorm) exact to
    float32 rounding. The mean of an empty reduction is 0 (no warning; the output is empty anyway).
    """
    s = np.sum(a, axis=axes, keepdims=True, dtype=np.float64)
    if n:
        s /= n
    return s.astype(a.dtype)


def _normalize(x: np.ndarray, axes: tuple, eps: float):
    """``xhat = (x - mean) / sqrt(var + eps)`` over ``axes``, var biased; -> xhat, mean, var, rstd.

    Scale-safe: a slice whose ``var + eps`` is not a finite normal number (the squares overflow
    for ``|x - mean|`` beyond ~1.8e19 in float32, 1.3e154 in float64; or they underflow with
    ``eps`` 0) is recomputed exactly by ``_normalize_rescaled``; every other slice is computed
    as it always was, bit for bit. NaN or inf in a slice makes it NaN, as in PyTorch.
    """
    n = math.prod(x.shape[a] for a in axes)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        mean = _mean(x, axes, n)
        xhat = x - mean
        var = _mean(xhat * xhat, axes, n)
        shifted = var + eps
        rstd = 1.0 / np.sqrt(shifted)
        xhat *= rstd
        if n and rstd.size and _out_of_range(rstd, eps):
            bad = (shifted == np.inf) | (shifted < np.finfo(shifted.dtype).tiny)
            mean, xhat, var, rstd = (np.where(bad, new, old) for new, old in zip(
                _normalize_rescaled(x, axes, n, eps), (mean, xhat, var, rstd)))
    return xhat, mean, var, rstd


def _out_of_range(rstd: np.ndarray, eps: float) -> bool:
    """Whether some ``rstd = 1/sqrt(var + eps)`` came from an overflowed variance (rstd 0) or,
    possible only for ``eps`` below the dtype's smallest normal, an underflowed one. NaN is
    ignored (a NaN input stays NaN). One reduction in the common case."""
    if np.fmin.reduce(rstd, axis=None) == 0:
        return True
    tiny = np.finfo(rstd.dtype).tiny
    return eps < tiny and bool(np.fmax.reduce(rstd, axis=None) > 1.0 / math.sqrt(tiny))


def _normalize_rescaled(x: np.ndarray, axes: tuple, n: int, eps: float):
    """``_normalize``'s ``(mean, xhat, var, rstd)`` for slices at the ends of the range, exactly.

    Each slice is scaled by ``s = 2^-e`` with ``2^e`` just above its ``max |x|`` (a power of two,
    so no rounding) and computed in float64: ``xhat = (x's - mean's) / sqrt(var's + eps s²)``,
    ``rstd = s / sqrt(var's + eps s²)``, ``var = var's / s²``. Results are cast back to x's dtype
    (a variance beyond its range becomes inf, which is the truth rounded, not a zero).
    """
    x64 = x.astype(np.float64)
    _, e = np.frexp(np.max(np.abs(x64), axis=axes, keepdims=True))
    np.ldexp(x64, -e, out=x64)
    mean = np.sum(x64, axis=axes, keepdims=True) / n
    x64 -= mean
    var = np.sum(x64 * x64, axis=axes, keepdims=True) / n
    r = 1.0 / np.sqrt(var + np.ldexp(eps, -2 * e))
    x64 *= r
    dtype = x.dtype
    return (np.ldexp(mean, e).astype(dtype), x64.astype(dtype), np.ldexp(var, 2 * e).astype(dtype),
            np.ldexp(r, -e).astype(dtype))


def _scale_shift(xhat: np.ndarray, w, b, inplace: bool) -> np.ndarray:
    """``xhat * w + b`` (either may be None); writes into ``xhat`` when ``inplace``."""
    if w is not None:
        y = np.multiply(xhat, w, out=xhat if inplace else None)
    else:
        y = xhat if inplace else xhat.copy()
    if b is not None:
        y += b
    return y


def _norm_backward(dy, xhat, rstd, w, param_axes, stat_axes, need_dx, need_dw, need_db):
    """Shared backward of ``y = xhat * w + b``, ``xhat = (x - mean) * rstd``.

    ``param_axes``: the axes dw and db are summed over. ``stat_axes``: the axes mean and var were
    taken over (their gradient flows into dx), or None when they were constants (eval mode):
    ``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))`` with ``g = dy * w``, else ``g * rstd``.
    """
    dx = dw = db = None
    if need_dw:
        dw = np.sum(dy * xhat, axis=param_axes, dtype=np.float64).astype(dy.dtype)
    if need_db:
        db = np.sum(dy, axis=param_axes, dtype=np.float64).astype(dy.dtype)
    if need_dx:
        g = dy if w is None else dy * w
        if stat_axes is None:
            dx = g * rstd
        else:
            n = math.prod(dy.shape[a] for a in stat_axes)
            dx = g - _mean(g, stat_axes, n)
            dx -= xhat * _mean(g * xhat, stat_axes, n)
            dx *= rstd
    return dx, dw, db


def _ln_axes(x_ndim: int, normalized_shape) -> tuple:
    k = 1 if isinstance(normalized_shape, (int, np.integer)) else len(normalized_shape)
    return tuple(range(x_ndim - k, x_ndim))


def layer_norm_forward(x, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    """``layer_norm`` that also returns what its backward needs: ``(y, xhat, rstd)``.

    ``xhat`` has x's shape; ``rstd = 1/sqrt(var + eps)`` has x's shape with the normalized dims
    set to 1. ``y`` never aliases ``xhat``.
    """
    xhat, _, _, rstd = _normalize(x, _ln_axes(x.ndim, normalized_shape), eps)
    return _scale_shift(xhat, weight, bias, inplace=False), xhat, rstd


def layer_norm(x, normalized_shape, weight=None, bias=None, eps: float = 1e-5) -> np.ndarray:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the trailing ``normalized_shape`` dims.

    Shapes: x ``(*, *normalized_shape)``; weight and bias ``normalized_shape`` or None -> y like x.
    The variance is biased (divides by the number of normalized elements), as in PyTorch.
    """
    xhat, _, _, _ = _normalize(x, _ln_axes(x.ndim, normalized_shape), eps)
    return _scale_shift(xhat, weight, bias, inplace=True)


def layer_norm_backward(dy, xhat, rstd, normalized_shape, weight=None,
                        need_dx: bool = True, need_dw: bool = True, need_db: bool = True):
    """Gradients ``(dx, dweight, dbias)`` of ``layer_norm`` from ``layer_norm_forward``'s saves.

    dweight and dbias have ``normalized_shape``; a gradient not asked for is None. Every returned
    array is freshly allocated.
    """
    stat_axes = _ln_axes(dy.ndim, normalized_shape)
    param_axes = tuple(range(dy.ndim - len(stat_axes)))
    return _norm_backward(dy, xhat, rstd, weight, param_axes, stat_axes, need_dx, need_dw, need_db)


def _bn_axes(x: np.ndarray):
    return (0,) + tuple(range(2, x.ndim)), (-1,) + (1,) * (x.ndim - 2)


def _batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps, inplace):
    axes, shape = _bn_axes(x)
    n = math.prod(x.shape[a] for a in axes)
    if training:
        if n == 1:
            raise ValueError("Expected more than 1 value per channel when training, got input "
                             f"of shape {x.shape}")
        xhat, mean, var, rstd = _normalize(x, axes, eps)
        if n > 0 and running_mean is not None:
            running_mean *= 1.0 - momentum
            running_mean += momentum * mean.reshape(-1)
        if n > 0 and running_var is not None:
            running_var *= 1.0 - momentum
            running_var += (momentum * n / (n - 1)) * var.reshape(-1)
    else:
        if running_mean is None or running_var is None:
            raise ValueError("batch_norm with training=False needs running_mean and running_var")
        rstd = 1.0 / np.sqrt(running_var.reshape(shape) + eps)
        xhat = x - running_mean.reshape(shape)
        xhat *= rstd
    w = None if weight is None else weight.reshape(shape)
    b = None if bias is None else bias.reshape(shape)
    return _scale_shift(xhat, w, b, inplace), xhat, rstd


def batch_norm_forward(x, running_mean=None, running_var=None, weight=None, bias=None,
                       training: bool = False, momentum: float = 0.1, eps: float = 1e-5):
    """``batch_norm`` that also returns what its backward needs: ``(y, xhat, rstd)``.

    ``rstd`` has shape ``(1, C, 1...)``: from the batch when training, else from running_var.
    ``y`` never aliases ``xhat``.
    """
    return _batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps, False)


def batch_norm(x, running_mean=None, running_var=None, weight=None, bias=None,
               training: bool = False, momentum: float = 0.1, eps: float = 1e-5) -> np.ndarray:
    """Normalize each channel (dim 1) of x ``(N, C, *)``, as ``torch.nn.functional.batch_norm``.

    ``training=True``: batch mean and biased variance over every dim but 1; running_mean and
    running_var (``(C,)``, if given) are updated in place with ``momentum`` and the *unbiased*
    batch variance (unchanged for an empty batch). ``training=False``: the running statistics.
    weight and bias ``(C,)`` or None. A ValueError when training sees one value per channel.
    """
    return _batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps,
                       True)[0]


def batch_norm_backward(dy, xhat, rstd, weight=None, training: bool = True,
                        need_dx: bool = True, need_dw: bool = True, need_db: bool = True):
    """Gradients ``(dx, dweight, dbias)`` of ``batch_norm`` from ``batch_norm_forward``'s saves.

    ``training`` must be the value the forward used: batch statistics pass gradient to dx, running
    statistics are constants. dweight and dbias have shape ``(C,)``; all fresh arrays.
    """
    axes, shape = _bn_axes(dy)
    w = None if weight is None else weight.reshape(shape)
    return _norm_backward(dy, xhat, rstd, w, axes, axes if training else None,
                          need_dx, need_dw, need_db)


# ----------------------------------------------------------------------- rms norm
__all__ += ["rms_norm", "rms_norm_backward", "rms_norm_forward"]


def _trailing_axes(ndim: int, normalized_shape) -> tuple:
    return tuple(range(ndim - len(normalized_shape), ndim))


def _rms_rescaled(x64: np.ndarray, axes: tuple, n: int, eps: float):
    """``(xhat, rstd)`` of float64 ``x64`` computed on ``x64 / 2^e`` (``2^e`` just above each
    slice's ``max |x|``: exact), so ``mean(x²)`` neither overflows nor underflows."""
    _, e = np.frexp(np.max(np.abs(x64), axis=axes, keepdims=True))
    xs = np.ldexp(x64, -e)
    r = 1.0 / np.sqrt(np.sum(xs * xs, axis=axes, keepdims=True) / n + np.ldexp(eps, -2 * e))
    return xs * r, np.ldexp(r, -e)


def rms_norm_forward(x, normalized_shape, weight=None, eps: float | None = None):
    """``rms_norm`` that also returns what its backward needs: ``(y, xhat, rstd)``.

    ``xhat = x * rstd`` has x's shape and dtype; ``rstd = 1/sqrt(mean(x²) + eps)`` is float64,
    x's shape with the normalized dims set to 1. ``y`` never aliases ``xhat``.
    """
    axes = _trailing_axes(x.ndim, normalized_shape)
    n = math.prod(x.shape[a] for a in axes)
    eps = float(np.finfo(x.dtype).eps) if eps is None else float(eps)
    x64 = np.asarray(x, np.float64)  # float32 sums of squares would overflow beyond ~1.8e19
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        shifted = np.sum(x64 * x64, axis=axes, keepdims=True)
        if n:
            shifted /= n
        shifted += eps
        rstd = 1.0 / np.sqrt(shifted)
        xhat = x64 * rstd
        # A slice whose mean square overflowed or underflowed (|x| beyond ~1e154, or eps tiny
        # and x tiny) is recomputed on a scaled copy; NaN and inf inputs stay NaN, as in torch.
        bad = (shifted == np.inf) | (shifted < np.finfo(np.float64).tiny)
        if n and bad.any():
            fixed_xhat, fixed_rstd = _rms_rescaled(x64, axes, n, eps)
            xhat, rstd = np.where(bad, fixed_xhat, xhat), np.where(bad, fixed_rstd, rstd)
    xhat = xhat.astype(x.dtype, copy=False)
    y = xhat if weight is None else xhat * weight
    return (xhat.copy() if y is xhat else y), xhat, rstd


def rms_norm(x, normalized_shape, weight=None, eps: float | None = None) -> np.ndarray:
    """``x / sqrt(mean(x²) + eps) * weight`` over the trailing ``normalized_shape`` dims, as
    ``torch.nn.functional.rms_norm``.

    Shapes: x ``(*, *normalized_shape)``; weight ``normalized_shape`` or None -> y like x.
    ``eps`` None is ``np.finfo(x.dtype).eps``. The mean square is accumulated in float64.
    """
    return rms_norm_forward(x, normalized_shape, weight, eps)[0]


def rms_norm_backward(dy, xhat, rstd, normalized_shape, weight=None, need_dx: bool = True,
                      need_dw: bool = True):
    """Gradients ``(dx, dweight)`` of ``rms_norm`` from ``rms_norm_forward``'s saves.

    ``dx = rstd · (g - xhat · mean(g · xhat))`` with ``g = dy · weight``; ``dweight = Σ dy ·
    xhat`` over the leading dims (``normalized_shape``). A gradient not asked for is None;
    both come in dy's dtype, freshly allocated.
    """
    axes = _trailing_axes(dy.ndim, normalized_shape)
    dx = dw = None
    if need_dw:
        lead = tuple(range(dy.ndim - len(axes)))
        dw = np.sum(dy * xhat, axis=lead, dtype=np.float64).astype(dy.dtype)
    if need_dx:
        g = dy if weight is None else dy * weight
        n = math.prod(dy.shape[a] for a in axes)
        m = np.sum(g * xhat, axis=axes, keepdims=True, dtype=np.float64)
        if n:
            m /= n
        with np.errstate(over="ignore", invalid="ignore"):
            dx = (rstd * (g - xhat * m)).astype(dy.dtype)
    return dx, dw


# ----------------------------------------------------------------------------- bilinear
__all__ += ["bilinear", "bilinear_backward"]


def bilinear(x1: np.ndarray, x2: np.ndarray, weight: np.ndarray,
             bias: np.ndarray | None = None) -> np.ndarray:
    """``y[b, o] = Σ_ij x1[b, i] W[o, i, j] x2[b, j] + bias[o]`` on rows, as
    ``torch.nn.functional.bilinear``.

    Shapes: x1 ``(B, in1)``, x2 ``(B, in2)``, weight ``(out, in1, in2)``, bias ``(out,)`` or
    None -> y ``(B, out)``. Two contractions: ``t = x1 · W`` ``(B, out, in2)`` (one GEMM), then
    each row of ``t`` with its row of ``x2``.
    """
    t = np.tensordot(x1, weight, axes=([1], [1]))     # (B, out, in2)
    y = np.matmul(t, x2[:, :, None])[:, :, 0]         # (B, out)
    if bias is not None:
        y += bias
    return y


def bilinear_backward(dy: np.ndarray, x1: np.ndarray | None, x2: np.ndarray | None,
                      weight: np.ndarray, need_dx: bool = True, need_dw: bool = True,
                      need_db: bool = True):
    """Gradients ``(dx1, dx2, dweight, dbias)`` of ``bilinear`` for ``dy (B, out)``; a gradient
    not asked for is None (its contraction does not run).

    With ``g[b, o, i] = dy[b, o] x1[b, i]``: ``dW = Σ_b g ⊗ x2[b]``, ``dx2 = g · W`` and
    ``dx1[b] = Σ_o dy[b, o] (W x2[b])[o]``; ``db = Σ_b dy``. x1 ``(B, in1)`` and x2 ``(B, in2)``
    may be None when neither dx nor dweight is asked for.
    """
    dx1 = dx2 = dw = db = None
    if need_dw or need_dx:
        g = dy[:, :, None] * x1[:, None, :]                        # (B, out, in1)
        if need_dw:
            dw = np.tensordot(g, x2, axes=([0], [0]))              # (out, in1, in2)
        if need_dx:
            dx2 = np.tensordot(g, weight, axes=([1, 2], [0, 1]))   # (B, in2)
            v = np.tensordot(x2, weight, axes=([1], [2]))          # (B, out, in1)
            dx1 = np.matmul(dy[:, None, :], v)[:, 0, :]            # (B, in1)
    if need_db:
        db = np.sum(dy, axis=0)
    return dx1, dx2, dw, db
