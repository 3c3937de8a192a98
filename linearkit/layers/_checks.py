"""Argument and input validation shared by the layers: clear errors before any arithmetic."""

from __future__ import annotations

import numbers

import numpy as np

from ..errors import DTypeError

_FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


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
    """``dtype`` as a floating NumPy dtype (float16, float32 or float64), else TypeError."""
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be a NumPy floating dtype, got {dtype!r}") from None
    if dtype not in _FLOAT_DTYPES:
        raise TypeError(
            f"dtype must be float16, float32 or float64, got {dtype}; parameters are stored "
            "in a floating dtype (float32 is the default, as in PyTorch)")
    return dtype


def as_input(module, x, dtype: np.dtype) -> np.ndarray:
    """``x`` as an ndarray of ``dtype``, or a DTypeError naming the module and the fix.

    Policy (deliberate, documented in docs/dtypes.md): an ndarray must already have the
    parameters' dtype — NumPy would silently promote float32 @ float64 to float64 (2x memory,
    ~3x slower) and PyTorch raises, so we raise too. Python lists and scalars have no dtype
    and take the module's.
    """
    if isinstance(x, np.ndarray):
        if x.dtype == dtype:
            return x
        if x.dtype.kind in "fc":
            raise DTypeError(
                f"expected a {dtype} input (the dtype of its parameters), got {x.dtype}",
                module=module,
                hint=f"cast the input with x.astype(np.{dtype}), or convert the model with "
                     f"model.to(np.{x.dtype})",
            )
        raise DTypeError(
            f"expected a floating-point {dtype} input, got {x.dtype}",
            module=module,
            hint=f"integer or boolean data must be cast first: x.astype(np.{dtype})",
        )
    try:
        return np.asarray(x, dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise DTypeError(f"cannot convert input of type {type(x).__name__} to {dtype}: {exc}",
                         module=module) from None
