"""``Parameter``: a trainable array, and the one way a backward writes its gradient (``add_grad``)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .. import precision as _precision

__all__ = ["Parameter"]


class Parameter:
    """A trainable array: ``.data`` (ndarray), ``.grad`` (ndarray or None), ``.requires_grad``.

    ``np.asarray(p)`` returns ``p.data``. Backward adds into ``.grad`` (allocating it on first
    use); ``zero_grad()`` resets it. ``data`` is stored in float32, float64, float16 or
    bfloat16 (``linearkit.precision``); the ``.grad`` of a 16-bit parameter is float32 unless
    the precision policy says ``grads="storage"``.
    """

    __slots__ = ("__weakref__", "_zeroed", "data", "grad", "requires_grad")

    def __init__(self, data, requires_grad: bool = True):
        data = np.asarray(data)
        if not _precision.is_float(data.dtype):
            raise TypeError(
                f"Parameter data must be a floating-point array (float32, float64, float16 or "
                f"bfloat16), got dtype {data.dtype}; cast it first, e.g. "
                "np.asarray(data, dtype=np.float32)"
            )
        self.data = data
        self.grad: np.ndarray | None = None
        self.requires_grad = bool(requires_grad)
        # The array zero_grad(set_to_none=False) zeroed; while it is still ``grad``, the next
        # backward may overwrite it instead of adding into it (saving a temporary and a pass).
        self._zeroed: np.ndarray | None = None

    shape = property(lambda self: self.data.shape, doc="Shape of ``data``.")
    dtype = property(lambda self: self.data.dtype, doc="dtype of ``data``.")
    ndim = property(lambda self: self.data.ndim, doc="Number of dimensions of ``data``.")
    size = property(lambda self: self.data.size, doc="Number of elements of ``data``.")
    # ``x @ layer.weight.T`` as in PyTorch: weight is (out, in), so x (N, in) -> (N, out)
    T = property(lambda self: self.data.T,
                 doc="``data.T``, a view (no copy): shape reversed, e.g. (out, in) -> (in, out).")

    def numel(self) -> int:
        """Number of elements, as ``torch.Tensor.numel``."""
        return self.data.size

    def add_grad(self, grad: np.ndarray | None = None, *,
                 write: Callable[[np.ndarray | None, bool], np.ndarray] | None = None,
                 dtype: np.dtype | None = None) -> None:
        """Add one gradient contribution into ``.grad``: the one way a backward writes a gradient.

        Pass either ``grad``, an array of ``data``'s shape that the caller will not touch again
        (it may become ``.grad`` itself), or ``write(out, accumulate) -> array``, a function that
        computes the contribution straight into a buffer: called with ``out=None`` it returns a
        new array; with ``accumulate=False`` it overwrites ``out`` (a buffer zeroed in place by
        ``zero_grad(set_to_none=False)``); with ``accumulate=True`` it adds into ``out``.
        ``functional.linear_weight_grad(dy, x, out, accumulate)`` has exactly that signature.

        Every layer with parameters (Linear, LayerNorm, BatchNorm1d, a user's) writes through
        here, so buffer reuse and accumulation live in one place. A backward must only call it
        for a parameter whose ``requires_grad`` was True when its forward ran.

        ``dtype`` (given by the layers of 16-bit parameters: ``precision.grad_dtype(p.dtype)``,
        read when their forward ran) is the dtype a new ``.grad`` is kept in; ``write``
        computes in the parameter's compute dtype (float32 for 16-bit storage). A contribution
        of another dtype than ``.grad``'s is computed whole, then rounded into ``.grad``'s dtype
        (an existing ``.grad`` keeps its dtype). None: the contribution's own dtype, as before.
        """
        current = self.grad
        if dtype is not None and (grad is not None or write is not None):
            if current is not None:
                dtype = current.dtype
            made = grad.dtype if write is None else _precision.compute_dtype(self.data.dtype)
            if made != dtype:
                if write is not None:
                    grad, write = write(None, False), None
                grad = grad.astype(dtype)
        if write is None:
            if grad is None:
                raise TypeError("add_grad() needs a gradient array or write=")
            if current is None:
                self.grad = grad
            elif self._zeroed is current:
                current[...] = grad
            else:
                current += grad
        elif current is None:
            self.grad = write(None, False)
        else:
            write(current, self._zeroed is not current)
        self._zeroed = None

    def grad_buffer(self) -> tuple[np.ndarray, bool] | None:
        """``add_grad(write=...)`` for a caller that writes into memory itself (a compiled
        kernel): ``(buffer, accumulate)``, the ``.grad`` to overwrite (``accumulate`` False: it
        was None, now a new uninitialized array, or zeroed in place) or to add into.

        None, touching nothing, when ``.grad`` is not a C-contiguous, aligned, writeable array
        of ``data``'s shape and dtype (or ``data`` is 16-bit): compute the contribution apart
        and pass it to ``add_grad(grad)``. Otherwise the caller must write the whole buffer.
        """
        current, data = self.grad, self.data
        if data.itemsize == 2:
            return None
        if current is None:
            current = self.grad = np.empty(data.shape, data.dtype)
            accumulate = False
        elif (type(current) is np.ndarray and current.dtype == data.dtype
              and current.shape == data.shape and current.flags.c_contiguous
              and current.flags.aligned and current.flags.writeable):
            accumulate = self._zeroed is not current
        else:
            return None
        self._zeroed = None
        return current, accumulate

    def zero_grad(self, set_to_none: bool = True) -> None:
        """``grad = None``, or (``set_to_none=False``) fill it with zeros in place and reuse it."""
        if set_to_none:
            self.grad = None
        elif self.grad is not None:
            self.grad.fill(0)
            self.mark_zeroed()

    def mark_zeroed(self) -> None:
        """Record that ``.grad`` holds zeros put there in place, so the next ``add_grad``
        overwrites it instead of adding (an optimizer that zeroes one flat buffer calls this)."""
        self._zeroed = self.grad

    def __array__(self, dtype=None, copy=None):
        """``np.asarray(p)``: ``data`` itself (same shape), cast when ``dtype`` differs. NumPy 2
        passes ``copy``: True copies; False refuses (ValueError) when a cast would need one."""
        if dtype is None or np.dtype(dtype) == self.data.dtype:
            return self.data.copy() if copy else self.data
        if copy is False:
            raise ValueError(f"np.asarray(Parameter, dtype={np.dtype(dtype)}, copy=False): "
                             f"data is {self.data.dtype}, so a copy is needed")
        return self.data.astype(dtype)

    def __repr__(self) -> str:
        flag = "" if self.requires_grad else ", requires_grad=False"
        return f"Parameter(shape={self.data.shape}, dtype={self.data.dtype}{flag})"
