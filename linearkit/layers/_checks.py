"""Argument and input validation shared by the layers: clear errors before any arithmetic."""

from __future__ import annotations

import numbers

import numpy as np

from .. import precision
from ..errors import DTypeError


def feature_count(name: str, value, *, lazy_hint: bool = False) -> int:
    """``value`` as a non-negative int, or a ValueError/TypeError that says what is allowed."""
    lazy = (" If the input width is unknown until the first call, use LazyLinear(out_features)."
            if lazy_hint else "")
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{name} must be a non-negative int, got {value!r} ({type(value).__name__}).{lazy}")
    if value < 0:
        raise ValueError(
            f"{name} must be a non-negative int, got {value}. -1 does not infer the size "
            f"(that is a common misconception).{lazy}")
    return int(value)


def float_dtype(dtype) -> np.dtype:
    """``dtype`` as a storage dtype (float32, float64, float16, bfloat16 — ``"bfloat16"`` and
    ``ml_dtypes.bfloat16`` both work), else a TypeError listing them (``precision.storage_dtype``)."""
    return precision.storage_dtype(dtype)


def as_input(module, x, dtype: np.dtype) -> np.ndarray:
    """``x`` as an ndarray of ``dtype``, or a DTypeError naming the module and the fix.

    Policy (deliberate, documented in docs/dtypes.md): an ndarray must already have the
    parameters' dtype — NumPy would silently promote float32 @ float64 to float64 (2x memory,
    and slower) and PyTorch raises, so we raise too. Python lists and scalars have no dtype
    and take the module's. Parameters stored in float16/bfloat16 compute in float32: their
    input is float32 (or the storage dtype itself, returned as it is: the layer upcasts it).
    """
    if isinstance(x, np.ndarray):
        if x.dtype == dtype:
            return x
        if dtype.itemsize == 2 and precision.is_16bit(dtype):
            return _input_16bit(module, x, dtype)
        if x.dtype.kind in "fc" or precision.is_float(x.dtype):
            raise DTypeError(
                f"expected a {dtype} input (the dtype of its parameters), got {x.dtype}",
                module=module,
                hint=f"cast the input with x.astype({_code(dtype)}), or convert the model with "
                     f"model.to({_code(x.dtype)})",
            )
        raise DTypeError(
            f"expected a floating-point {dtype} input, got {x.dtype}",
            module=module,
            hint=f"integer or boolean data must be cast first: x.astype({_code(dtype)})",
        )
    try:
        return np.asarray(x, dtype=precision.compute_dtype(dtype))
    except (TypeError, ValueError) as exc:
        raise DTypeError(f"cannot convert input of type {type(x).__name__} to {dtype}: {exc}",
                         module=module) from None


def _input_16bit(module, x: np.ndarray, storage: np.dtype) -> np.ndarray:
    """An ndarray input of a layer whose parameters are stored in ``storage`` (16-bit): float32
    passes, anything else (float64, the other 16-bit dtype, integers) is a DTypeError."""
    if x.dtype == precision.F32:
        return x
    what = "floating-point " if not precision.is_float(x.dtype) else ""
    raise DTypeError(
        f"expected a {what}float32 input (the compute dtype of its {storage} parameters) or a "
        f"{storage} one, got {x.dtype}", module=module,
        hint="cast the input with x.astype(np.float32); 16-bit parameters are stored in 16 "
             "bits and computed in float32")


def _code(dtype: np.dtype) -> str:
    """How to write ``dtype`` in a fix: ``np.float32``, or ``'bfloat16'`` (NumPy has no name)."""
    return f"np.{dtype}" if dtype.kind == "f" else repr(str(dtype))
