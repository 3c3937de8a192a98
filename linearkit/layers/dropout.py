"""Dropout: zero each element with probability p in training, scale the rest by 1/(1-p)."""

from __future__ import annotations

import numbers

import numpy as np

from ..core.module import Module
from ..core.random import resolve

__all__ = ["Dropout"]


class Dropout(Module):
    """Inverted dropout, as ``torch.nn.Dropout``: identity in eval mode.

    In training mode each element is zeroed with probability ``p`` and the survivors are scaled
    by ``1/(1 - p)``, so the expected output equals the input; in eval mode (and at ``p=0``)
    the input is returned as it is.

    Parameters
    ----------
    p : float
        The drop probability, in [0, 1] (default 0.5). ``p=1`` zeroes everything (no division
        by 0).
    rng : numpy.random.Generator or int, optional
        Where the masks come from: a Generator, an int seed (one Generator made now, so every
        call draws a new mask), or None for the library's (``linearkit.manual_seed``).

    Shape
    -----
    x ``(*)`` -> y ``(*)``: any shape, dtype kept.

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> drop = lk.Dropout(0.5, rng=0)
    >>> y = drop(np.ones((2, 4), np.float32))
    >>> y.shape, set(np.unique(y).tolist()) <= {0.0, 2.0}
    ((2, 4), True)
    >>> x = np.ones(3, np.float32)
    >>> drop.eval()(x) is x
    True
    """

    def __init__(self, p: float = 0.5, *, rng: np.random.Generator | None = None):
        super().__init__()
        if not isinstance(p, numbers.Real) or isinstance(p, bool) or not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p!r}")
        self.p = float(p)
        # An int seed becomes one Generator now: resolving it per call would reseed every call
        # and draw the same mask each step. None stays None (the library's generator, per call).
        self._rng = None if rng is None else resolve(rng)

    @property
    def rng(self) -> np.random.Generator | None:
        """The Generator the masks are drawn from; None: the library's, per call
        (``linearkit.manual_seed``). Assign a Generator (or None) to change it: the way a tool
        pins the masks (``analysis.gradcheck`` draws the same mask for every evaluation)."""
        return self._rng

    @rng.setter
    def rng(self, generator: np.random.Generator | None) -> None:
        if generator is not None and not isinstance(generator, np.random.Generator):
            raise TypeError(f"Dropout.rng takes a numpy.random.Generator or None, got "
                            f"{type(generator).__name__}; make one with "
                            "numpy.random.default_rng(seed)")
        self._rng = generator

    def _mask(self, x: np.ndarray) -> np.ndarray:
        """Keep-mask already scaled by 1/(1-p), in x's dtype."""
        keep = resolve(self._rng).random(x.shape) >= self.p
        scale = 0.0 if self.p == 1.0 else 1.0 / (1.0 - self.p)
        return keep.astype(x.dtype) * np.asarray(scale, dtype=x.dtype)

    def forward(self, x):
        """Apply dropout (training mode) or pass ``x`` through (eval mode, or ``p=0``).

        Parameters
        ----------
        x : array_like, shape ``(*)``
            Any shape; a float dtype.

        Returns
        -------
        y : ndarray, shape ``(*)``
            ``x * mask / (1 - p)`` with a fresh keep-mask (each element kept with probability
            ``1 - p``) in training mode; ``x`` itself, not a copy, in eval mode or at ``p=0``.
            Same dtype as ``x``.
        """
        x = np.asarray(x)
        if not self.training or self.p == 0.0:
            return x
        return x * self._mask(x)

    def vjp(self, x, input_grad: bool = True):
        """The forward plus its closure ``backward(dy) -> dx``.

        Parameters
        ----------
        x : array_like, shape ``(*)``
        input_grad : bool
            False when the caller needs no ``dx``: ``backward`` then returns None.

        Returns
        -------
        y : ndarray, shape ``(*)``
            As ``forward(x)``; in training mode the mask drawn for ``y`` is the one the closure
            keeps (and the only array it keeps).
        backward : callable
            ``backward(dy (*)) -> dx (*)``: ``dy * mask / (1 - p)`` in training mode, ``dy``
            in eval mode or at ``p=0``; None when ``input_grad`` is False. Dropout has no
            parameters, so nothing is accumulated.
        """
        x = np.asarray(x)
        if not self.training or self.p == 0.0:
            return x, (lambda dy: dy if input_grad else None)
        mask = self._mask(x)

        def backward(dy):
            return dy * mask if input_grad else None

        return x * mask, backward

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace=False"
