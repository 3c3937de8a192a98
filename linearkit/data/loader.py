"""A minimal batch iterator over in-memory arrays."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ..core.random import resolve

__all__ = ["DataLoader"]


class DataLoader:
    """Iterate over ``(xb, yb)`` mini-batches of two arrays with the same first dimension.

    Parameters
    ----------
    x : array_like, shape (N, *)
    y : array_like, shape (N, *)
    batch_size : int
        Rows per batch (>= 1). The last batch is smaller when ``N % batch_size != 0``,
        unless ``drop_last``.
    shuffle : bool
        Draw a fresh permutation of the rows at the start of every epoch (every ``iter``).
    drop_last : bool
        Drop the last, incomplete batch. An epoch must yield at least one batch: iterating
        raises ValueError when ``batch_size > N`` with ``drop_last``, or when ``N == 0``.
    seed : int, numpy.random.Generator or None
        Source of the permutations: an int seeds a private Generator (same seed, same
        sequence of epochs); None uses the library's generator (see ``linearkit.manual_seed``).

    Yields
    ------
    xb : ndarray, shape (B, *)
    yb : ndarray, shape (B, *)
        ``B = batch_size`` except possibly for the last batch. Without ``shuffle`` the
        batches are views of ``x`` and ``y`` (no copy); with it, copies.

    Examples
    --------
    >>> import numpy as np
    >>> loader = DataLoader(np.zeros((10, 3)), np.arange(10), batch_size=4)
    >>> len(loader), [len(yb) for _, yb in loader]
    (3, [4, 4, 2])
    """

    def __init__(
        self,
        x: np.ndarray,
        y: np.ndarray,
        batch_size: int = 1,
        *,
        shuffle: bool = False,
        drop_last: bool = False,
        seed: int | np.random.Generator | None = None,
    ) -> None:
        x = np.asarray(x)
        y = np.asarray(y)
        if x.ndim == 0 or y.ndim == 0:
            raise ValueError(
                f"DataLoader needs arrays with a batch dimension; got x.shape={x.shape}, "
                f"y.shape={y.shape}"
            )
        if len(x) != len(y):
            raise ValueError(
                f"DataLoader: x and y must have the same number of rows; got x.shape={x.shape} "
                f"and y.shape={y.shape}"
            )
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
            raise TypeError(f"batch_size must be an int, got {type(batch_size).__name__}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.x = x
        self.y = y
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self._rng = resolve(seed) if shuffle else None

    def __len__(self) -> int:
        n, b = len(self.x), self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        x, y, b = self.x, self.y, self.batch_size
        if len(self) == 0:  # a `while step < steps: for ... in loader` loop would never end
            raise self._no_batch_error()
        stop = len(self) * b
        if self._rng is None:
            for i in range(0, min(stop, len(x)), b):
                yield x[i : i + b], y[i : i + b]
        else:
            order = self._rng.permutation(len(x))
            for i in range(0, min(stop, len(x)), b):
                idx = order[i : i + b]
                yield x.take(idx, axis=0), y.take(idx, axis=0)  # take: faster than x[idx]

    def _no_batch_error(self) -> ValueError:
        n, b = len(self.x), self.batch_size
        if n == 0:
            return ValueError(f"DataLoader over 0 rows yields no batch (batch_size={b}, "
                              f"drop_last={self.drop_last}); pass at least one row")
        return ValueError(
            f"DataLoader: batch_size={b} is larger than the dataset's {n} rows and "
            f"drop_last=True, so an epoch yields no batch; use batch_size <= {n}, or "
            f"drop_last=False to get one short batch")

    def __repr__(self) -> str:
        return (
            f"DataLoader(n={len(self.x)}, batch_size={self.batch_size}, shuffle={self.shuffle}, "
            f"drop_last={self.drop_last})"
        )
