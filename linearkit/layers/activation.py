"""Elementwise activations and (log-)softmax. Shape: any -> same shape (dtype kept)."""

from __future__ import annotations

import numpy as np

from .. import functional as F
from ..core.module import Module

__all__ = ["GELU", "LeakyReLU", "LogSoftmax", "ReLU", "SiLU", "Sigmoid", "Softmax", "Tanh"]


class _Elementwise(Module):
    """An activation without parameters: ``forward`` and a ``vjp`` whose closure keeps one array.

    Subclasses set ``_fn(self, x)`` and ``_grad(self, dy, x, y)``; ``saves`` says which of
    x or y the backward needs (so the closure holds only that one).
    """

    #: The array the backward keeps: "y" (the output) or "x" (the input). Tools read it.
    saves = "y"

    def _fn(self, x):
        raise NotImplementedError

    def _grad(self, dy, saved):
        raise NotImplementedError

    def forward(self, x):
        return self._fn(np.asarray(x))

    def vjp(self, x, input_grad: bool = True):
        x = np.asarray(x)
        y = self._fn(x)
        saved = y if self.saves == "y" else x

        def backward(dy):
            return self._grad(dy, saved) if input_grad else None

        return y, backward


class ReLU(_Elementwise):
    """``max(x, 0)``. Gradient 0 at x = 0, as in PyTorch."""

    def _fn(self, x):
        return F.relu(x)

    def _grad(self, dy, y):
        return F.relu_backward(dy, y)


class LeakyReLU(_Elementwise):
    """``x`` for x > 0, else ``negative_slope * x`` (default 0.01)."""

    saves = "x"

    def __init__(self, negative_slope: float = 0.01):
        super().__init__()
        self.negative_slope = float(negative_slope)

    def _fn(self, x):
        return F.leaky_relu(x, self.negative_slope)

    def _grad(self, dy, x):
        return F.leaky_relu_backward(dy, x, self.negative_slope)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}"


class GELU(_Elementwise):
    """``x Φ(x)`` (``approximate='none'``) or the tanh approximation (``'tanh'``)."""

    saves = "x"

    def __init__(self, approximate: str = "none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def _fn(self, x):
        return F.gelu(x, self.approximate)

    def _grad(self, dy, x):
        return F.gelu_backward(dy, x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate='{self.approximate}'"


class Tanh(_Elementwise):
    """Hyperbolic tangent."""

    def _fn(self, x):
        return F.tanh(x)

    def _grad(self, dy, y):
        return F.tanh_backward(dy, y)


class Sigmoid(_Elementwise):
    """Logistic sigmoid, stable for large |x|."""

    def _fn(self, x):
        return F.sigmoid(x)

    def _grad(self, dy, y):
        return F.sigmoid_backward(dy, y)


class SiLU(_Elementwise):
    """``x σ(x)`` (swish)."""

    saves = "x"

    def _fn(self, x):
        return F.silu(x)

    def _grad(self, dy, x):
        return F.silu_backward(dy, x)


class _AlongDim(_Elementwise):
    def __init__(self, dim: int | None = None):
        super().__init__()
        if dim is None:
            raise TypeError(f"{type(self).__name__} needs dim=...; PyTorch's implicit dim choice "
                            "is deprecated, so linearkit asks for it explicitly (usually dim=-1)")
        self.dim = int(dim)

    def check_input_shape(self, shape: tuple) -> int:
        """The axis ``dim`` names in an input of ``shape``, checked as PyTorch does: in
        ``[-n, n)`` with ``n = max(ndim, 1)``, so a 0-d input has the one dim 0 (or -1). Else
        the forward's DimError: a ShapeError, and an IndexError as torch raises."""
        n = max(len(shape), 1)
        if not -n <= self.dim < n:
            from ..errors import DimError

            raise DimError(f"dim={self.dim} is out of range [{-n}, {n - 1}] for an input of "
                           f"shape {tuple(shape)}", module=self,
                           hint="softmax over the features is usually dim=-1")
        return self.dim

    def _axis(self, x) -> int:
        return self.check_input_shape(x.shape)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Softmax(_AlongDim):
    """``exp(x) / Σ exp(x)`` along ``dim``, computed stably."""

    def _fn(self, x):
        return F.softmax(x, self._axis(x))

    def _grad(self, dy, y):
        return F.softmax_backward(dy, y, self.dim)


class LogSoftmax(_AlongDim):
    """``x - log Σ exp(x)`` along ``dim``, computed stably."""

    def _fn(self, x):
        return F.log_softmax(x, self._axis(x))

    def _grad(self, dy, y):
        return F.log_softmax_backward(dy, y, self.dim)
