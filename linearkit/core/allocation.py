"""Allocating a layer's arrays: a ``MemoryError`` becomes an ``AllocationError`` that names the
layer, the array, its shape and dtype and the bytes asked for.

Layers get their parameter and buffer arrays from :func:`empty` and :func:`filled`, and wrap
any other allocation of theirs (the blocks ``reset_parameters`` draws) in :func:`allocating`.
A size no address space holds (more bytes than ``sys.maxsize``) is refused before NumPy is
asked, with the same error.
"""

from __future__ import annotations

import contextlib
import math
import sys

import numpy as np

from ..errors import AllocationError

__all__ = ["allocating", "empty", "filled", "layer_name"]


def layer_name(owner) -> str:
    """How the error names ``owner``: its signature (``Linear(in_features=3, ...)``) when it is
    complete enough to print one, else its type's name (a constructor still running)."""
    if isinstance(owner, str):
        return owner
    try:
        return owner._signature()
    except Exception:  # noqa: BLE001 - a half-built module: its extra_repr may need attributes
        return type(owner).__name__


def _error(owner, array: str, shape: tuple, dtype: np.dtype, nbytes: int,
           purpose: str = "") -> AllocationError:
    return AllocationError(layer_name(owner), array, shape, dtype, nbytes,
                           module=None if isinstance(owner, str) else owner, purpose=purpose)


@contextlib.contextmanager
def allocating(owner, array: str, shape: tuple, dtype, nbytes: int | None = None,
               purpose: str = ""):
    """Inside, a ``MemoryError`` becomes the ``AllocationError`` naming ``owner`` (a module or
    its description), ``array`` (``'weight'``), ``shape``, ``dtype`` and ``nbytes`` (default
    the array's own bytes; ``purpose`` says what smaller allocation it was, e.g. a draw)."""
    dtype = np.dtype(dtype)
    try:
        yield
    except AllocationError:
        raise
    except MemoryError:
        size = math.prod(shape) * dtype.itemsize if nbytes is None else nbytes
        raise _error(owner, array, tuple(shape), dtype, size, purpose) from None


def empty(owner, array: str, shape, dtype) -> np.ndarray:
    """``np.empty(shape, dtype)`` for ``owner``'s ``array``, or the ``AllocationError``."""
    return _allocate(owner, array, shape, dtype, np.empty)


def filled(owner, array: str, shape, dtype, value) -> np.ndarray:
    """``shape`` of ``dtype`` holding ``value`` everywhere (zeros from ``np.zeros``, whose pages
    the system gives on first touch), or the ``AllocationError``."""
    if value == 0:
        return _allocate(owner, array, shape, dtype, np.zeros)
    return _allocate(owner, array, shape, dtype, lambda s, d: np.full(s, value, d))


def _allocate(owner, array: str, shape, dtype, make) -> np.ndarray:
    shape = (int(shape),) if np.ndim(shape) == 0 else tuple(int(s) for s in shape)
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > sys.maxsize:  # NumPy would raise a ValueError ("array is too big")
        raise _error(owner, array, shape, dtype, nbytes)
    with allocating(owner, array, shape, dtype, nbytes):
        return make(shape, dtype)
