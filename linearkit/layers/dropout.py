"""Dropout: zero each element with probability p in training, scale the rest by 1/(1-p)."""

from __future__ import annotations

import numbers

import numpy as np

from ..module import Module
from ..random import resolve

__all__ = ["Dropout"]


class Dropout(Module):
    """Inverted dropout, as ``torch.nn.Dropout``: identity in eval mode.

    Parameters: ``p`` in [0, 1] (the drop probability), ``rng`` (the mask's generator; the
    library's by default). Shape: any -> same. ``p=1`` zeroes everything (no division by 0).
    """

    def __init__(self, p: float = 0.5, *, rng: np.random.Generator | None = None):
        super().__init__()
        if not isinstance(p, numbers.Real) or isinstance(p, bool) or not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p!r}")
        self.p = float(p)
        # An int seed becomes one Generator now: resolving it per call would reseed every call
        # and draw the same mask each step. None stays None (the library's generator, per call).
        self._rng = None if rng is None else resolve(rng)

    def _mask(self, x: np.ndarray) -> np.ndarray:
        """Keep-mask already scaled by 1/(1-p), in x's dtype."""
        keep = resolve(self._rng).random(x.shape) >= self.p
        scale = 0.0 if self.p == 1.0 else 1.0 / (1.0 - self.p)
        return keep.astype(x.dtype) * np.asarray(scale, dtype=x.dtype)

    def forward(self, x):
        x = np.asarray(x)
        if not self.training or self.p == 0.0:
            return x
        return x * self._mask(x)

    def vjp(self, x, input_grad: bool = True):
        x = np.asarray(x)
        if not self.training or self.p == 0.0:
            return x, (lambda dy: dy if input_grad else None)
        mask = self._mask(x)

        def backward(dy):
            return dy * mask if input_grad else None

        return x * mask, backward

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace=False"
