"""Flatten: merge a range of dimensions into one."""

from __future__ import annotations

import math

import numpy as np

from ..core.module import Module
from ..errors import ShapeError

__all__ = ["Flatten"]


class Flatten(Module):
    """Flatten dims ``start_dim..end_dim`` into one, as ``torch.nn.Flatten`` (default 1..-1).

    Parameters
    ----------
    start_dim, end_dim : int
        The first and last dimension merged (inclusive; negative counts from the end).

    Shape
    -----
    ``(*head, d_start, ..., d_end, *tail)`` -> ``(*head, d_start * ... * d_end, *tail)``; with
    the defaults ``(N, *rest)`` -> ``(N, prod(rest))``. A view of the input when possible.

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> lk.Flatten()(np.zeros((2, 3, 4))).shape
    (2, 12)
    >>> lk.Flatten(0, 1)(np.zeros((2, 3, 4))).shape
    (6, 4)
    """

    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim = int(start_dim)
        self.end_dim = int(end_dim)

    def output_shape(self, shape: tuple) -> tuple:
        """The output's shape for an input of ``shape``; the forward's ShapeError if it has no
        such dims (tools that propagate shapes without data call this)."""
        shape = tuple(shape)
        ndim = max(len(shape), 1)
        start = self.start_dim + ndim if self.start_dim < 0 else self.start_dim
        end = self.end_dim + ndim if self.end_dim < 0 else self.end_dim
        if not (0 <= start < ndim and 0 <= end < ndim):
            raise ShapeError(
                f"cannot flatten dims {self.start_dim}..{self.end_dim} of an input of shape {shape}",
                module=self)
        if start > end:
            raise ShapeError("flatten() has invalid args: start_dim cannot come after end_dim",
                             module=self)
        if len(shape) == 0:
            return (1,)
        return shape[:start] + (math.prod(shape[start:end + 1]),) + shape[end + 1:]

    def forward(self, x):
        """Merge dims ``start_dim..end_dim`` of ``x``.

        Parameters
        ----------
        x : array_like, shape ``(*head, d_start, ..., d_end, *tail)``

        Returns
        -------
        y : ndarray, shape ``(*head, d_start * ... * d_end, *tail)``
            A view of ``x`` when its strides allow, else a copy; same dtype. A 0-d input
            becomes shape ``(1,)`` with ``start_dim`` 0 or -1, as in PyTorch. A ShapeError if
            ``x`` lacks those dims.
        """
        x = np.asarray(x)
        return x.reshape(self.output_shape(x.shape))

    def vjp(self, x, input_grad: bool = True):
        """The forward plus its closure ``backward(dy) -> dx``.

        Parameters
        ----------
        x : array_like, shape ``(*head, d_start, ..., d_end, *tail)``
        input_grad : bool
            False when the caller needs no ``dx``: ``backward`` then returns None.

        Returns
        -------
        y : ndarray, shape ``(*head, d_start * ... * d_end, *tail)``
            As ``forward(x)``.
        backward : callable
            ``backward(dy) -> dx``: ``dy`` (``y``'s shape) reshaped back to ``x``'s shape (a
            view when possible); None when ``input_grad`` is False. The closure keeps only the
            input's shape, never the input.
        """
        x = np.asarray(x)
        shape = x.shape
        y = x.reshape(self.output_shape(shape))

        def backward(dy):
            return dy.reshape(shape) if input_grad else None

        return y, backward

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"
