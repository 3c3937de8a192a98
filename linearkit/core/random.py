"""The library-wide random generator.

Every init function and layer constructor takes ``rng=`` (a ``numpy.random.Generator``);
when it is omitted they draw from the generator kept here. ``manual_seed`` resets it, so
the same seed gives the same weights. The global ``np.random`` state is never touched.
"""

from __future__ import annotations

import numpy as np

# Made on first use: numpy.random is not imported by ``import numpy`` (NumPy 2 loads it lazily)
# and is slow to import (docs/measurements.md), which ``import linearkit`` then need not pay.
_generator = None


def manual_seed(seed: int) -> np.random.Generator:
    """Reseed the library-wide generator and return it."""
    global _generator
    _generator = np.random.default_rng(seed)
    return _generator


def default_generator() -> np.random.Generator:
    """The generator used when no ``rng=`` is passed (seeded from the OS on first use)."""
    global _generator
    if _generator is None:
        _generator = np.random.default_rng()
    return _generator


def resolve(rng: np.random.Generator | int | None) -> np.random.Generator:
    """``rng`` as a Generator: None -> the library's, an int -> a fresh seeded one."""
    if rng is None:
        return default_generator()
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        return np.random.default_rng(int(rng))
    raise TypeError(
        f"rng must be a numpy.random.Generator, an int seed or None, got {type(rng).__name__}"
    )
