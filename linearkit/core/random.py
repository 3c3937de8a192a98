"""The library-wide random generator, and filling an array from a generator block by block.

Every init function and layer constructor takes ``rng=`` (a ``numpy.random.Generator``);
when it is omitted they draw from the generator kept here. ``manual_seed`` resets it, so
the same seed gives the same weights. The global ``np.random`` state is never touched.

``fill_uniform`` and ``fill_normal`` write draws into an existing array a block at a time: the
values are those of one whole draw in float64, rounded into the array's dtype, but only a block
is held in float64, so initializing an array costs little memory beside it.
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


#: Most values drawn at once into a temporary (float64: 512 KiB), for arrays larger than that.
BLOCK = 1 << 16


def block_size(n: int) -> int:
    """How many of ``n`` values one draw makes: all of up to 4096 (32 KiB of float64), else
    ``n / 64`` values within ``[4096, BLOCK]``. From ``n = 2**18`` on, the float64 temporary
    is then at most an eighth of the array it fills, even of a 16-bit one."""
    return n if n <= 4096 else max(4096, min(BLOCK, n >> 6))


def _fill(out: np.ndarray, draw) -> np.ndarray:
    """Write ``draw(k)`` (``k`` float64 values from the generator) into ``out`` in C order, a
    block at a time. NumPy's generators make the same stream in blocks as in one call, so the
    values are those of ``out[...] = draw(out.size)``, each rounded once into ``out``'s dtype;
    only a block is ever held in float64. A non-contiguous ``out`` is drawn whole."""
    n = out.size
    k = block_size(n)
    if k >= n or not out.flags.c_contiguous:
        out[...] = draw(out.shape)
        return out
    flat = out.reshape(-1)
    for start in range(0, n, k):
        stop = min(start + k, n)
        flat[start:stop] = draw(stop - start)
    return out


def fill_uniform(out: np.ndarray, low: float, high: float, rng: np.random.Generator) -> np.ndarray:
    """``out[...] = rng.uniform(low, high, out.shape)``, drawn block by block (``_fill``)."""
    return _fill(out, lambda size: rng.uniform(low, high, size))


def fill_normal(out: np.ndarray, mean: float, std: float, rng: np.random.Generator) -> np.ndarray:
    """``out[...] = rng.normal(mean, std, out.shape)``, drawn block by block (``_fill``)."""
    return _fill(out, lambda size: rng.normal(mean, std, size))
