"""``DistributedSampler``: each rank's share of every epoch, with PyTorch's padding and striding."""

from __future__ import annotations

import math

import numpy as np

from . import comm as _comm

__all__ = ["DistributedSampler", "shard_indices"]


def _count(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"DistributedSampler: {name} must be an int >= {minimum}, got "
                         f"{value!r}")
    return int(value)


def shard_indices(order, num_replicas: int, rank: int, drop_last: bool = False) -> list[int]:
    """Rank ``rank``'s indices of one epoch's ``order`` (a sequence of ``n`` indices).

    ``torch.utils.data.DistributedSampler``'s rule: without ``drop_last`` the order is padded
    to a multiple of ``num_replicas`` by repeating its head (the whole order again as often as
    needed when it is shorter than the padding); with ``drop_last`` it is cut to
    ``num_replicas · floor(n / num_replicas)``. Rank ``r`` then takes every
    ``num_replicas``-th entry starting at ``r``.

    Examples
    --------
    >>> from linearkit.distributed import shard_indices
    >>> [shard_indices(range(5), 2, r) for r in (0, 1)]
    [[0, 2, 4], [1, 3, 0]]
    >>> [shard_indices(range(5), 2, r, drop_last=True) for r in (0, 1)]
    [[0, 2], [1, 3]]
    """
    indices = [int(i) for i in order]
    n = len(indices)
    if drop_last and n % num_replicas != 0:
        num_samples = math.ceil((n - num_replicas) / num_replicas)
    else:
        num_samples = math.ceil(n / num_replicas)
    total = num_samples * num_replicas
    if not drop_last:
        padding = total - n
        if padding <= n:
            indices += indices[:padding]
        else:
            indices += (indices * math.ceil(padding / n))[:padding]
    else:
        indices = indices[:total]
    return indices[rank:total:num_replicas]


class DistributedSampler:
    """The indices of a dataset of ``n`` rows that rank ``rank`` of ``num_replicas`` reads.

    PyTorch's ``DistributedSampler`` semantics: every epoch all ranks draw the same order (a
    permutation seeded by ``seed + epoch`` when ``shuffle``; the generator is NumPy's
    ``default_rng``, not torch's, so the permutations differ from torch's while the padding,
    dropping and striding rules are the same — :func:`shard_indices`). Each rank gets
    ``len(sampler)`` indices, disjoint from the other ranks' apart from the padding.

    Parameters
    ----------
    n : int
        Rows in the dataset (>= 0).
    num_replicas, rank : int, optional
        Default: the world size and this process's rank (``linearkit.distributed``).
    shuffle : bool
        A new permutation every epoch (default True); False: ``0, 1, ..., n-1``.
    seed : int
        Seeds the permutations; the same on every rank.
    drop_last : bool
        Drop the tail that does not divide evenly instead of padding with repeated indices.

    Notes
    -----
    With ``shuffle=False``, batch ``k`` of ``b`` rows on rank ``r`` is rows ``r::N`` of batch
    ``k`` of ``N·b`` rows of one process reading the same order, so ``N`` ranks with batch ``b``
    see exactly the single-process batches of ``N·b`` (``shard_batch`` slices the same way).

    Examples
    --------
    >>> from linearkit.distributed import DistributedSampler
    >>> s = DistributedSampler(10, num_replicas=3, rank=1, shuffle=False)
    >>> list(s), len(s)
    ([1, 4, 7, 0], 4)
    >>> s.set_epoch(1)
    """

    def __init__(self, n: int, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False):
        self.n = _count("n", n, 0)
        self.num_replicas = _count("num_replicas", _comm.world_size() if num_replicas is None
                                   else num_replicas, 1)
        self.rank = _count("rank", _comm.rank() if rank is None else rank, 0)
        if self.rank >= self.num_replicas:
            raise ValueError(f"DistributedSampler: rank must be in [0, {self.num_replicas - 1}] "
                             f"for num_replicas={self.num_replicas}, got {self.rank}")
        self.shuffle = bool(shuffle)
        self.seed = _count("seed", seed, 0)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        if self.drop_last and self.n % self.num_replicas != 0:
            self.num_samples = math.ceil((self.n - self.num_replicas) / self.num_replicas)
        else:
            self.num_samples = math.ceil(self.n / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s permutation next (call it at every epoch start, on every rank)."""
        self.epoch = _count("epoch", epoch, 0)

    def order(self) -> np.ndarray:
        """This epoch's order of all ``n`` rows (the same on every rank), ``(n,)`` int64."""
        if self.shuffle:
            return np.random.default_rng(self.seed + self.epoch).permutation(self.n)
        return np.arange(self.n)

    def __iter__(self):
        if self.n == 0:
            return iter([])
        return iter(shard_indices(self.order(), self.num_replicas, self.rank, self.drop_last))

    def __len__(self) -> int:
        return self.num_samples

    def __repr__(self) -> str:
        return (f"DistributedSampler(n={self.n}, num_replicas={self.num_replicas}, "
                f"rank={self.rank}, shuffle={self.shuffle}, seed={self.seed}, "
                f"drop_last={self.drop_last})")
