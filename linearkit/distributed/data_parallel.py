"""The data-parallel training step: ``accumulation.accumulated_step`` with the average inside."""

from __future__ import annotations

import numpy as np

from . import comm as _comm

__all__ = ["shard_batch", "step"]


def shard_batch(*arrays, rank: int | None = None, num_replicas: int | None = None, comm=None):
    """This rank's rows of a global batch: ``a[rank::num_replicas]`` of each array.

    Every rank draws the same global batch of ``B = num_replicas · b`` rows (the same seeded
    loader) and keeps the rows a ``DistributedSampler`` with ``shuffle=False`` would stride to
    it, so the ranks' batches together are exactly the single-process batch.

    Parameters
    ----------
    *arrays : ndarray, each of shape ``(B, *)``
    rank, num_replicas : int, optional
        Default: this process's rank and the world size (``comm``'s).

    Returns
    -------
    One array ``(b, *)`` (C-contiguous) for one input, else a tuple of them.

    Raises
    ------
    ValueError
        ``B`` is not a multiple of ``num_replicas`` (unequal shards would weight the ranks'
        mean losses unequally), or the arrays' row counts differ.
    """
    num_replicas = _comm.world_size(comm) if num_replicas is None else int(num_replicas)
    rank = _comm.rank(comm) if rank is None else int(rank)
    rows = {len(a) for a in arrays}
    if len(rows) != 1:
        raise ValueError(f"shard_batch: the arrays have different row counts {sorted(rows)}")
    (n,) = rows
    if n % num_replicas:
        raise ValueError(f"shard_batch: a global batch of {n} rows does not split into "
                         f"{num_replicas} equal shards; use a batch size that is a multiple of "
                         f"{num_replicas} (e.g. {max(num_replicas, n - n % num_replicas)})")
    out = tuple(np.ascontiguousarray(a[rank::num_replicas]) for a in arrays)
    return out[0] if len(out) == 1 else out


def step(model, loss_fn, optimizer, x, y, *, reducer, micro_batches: int = 1, scaler=None,
         clip: float | None = None, set_to_none: bool = False) -> float:
    """One data-parallel optimizer step on this rank's rows ``(x, y)``; every rank calls it.

    Exactly :func:`linearkit.training.accumulation.accumulated_step` with the gradient average placed
    where it belongs::

        loss = accumulate(model, loss_fn, x, y, micro_batches=k, scaler=scaler)
        loss = reducer.synchronize(loss)     # the mean over the ranks, once per window
        if scaler: scaler.unscale_(optimizer) # after the average
        if clip: clip_grad_norm_(params, clip)
        scaler.step(optimizer); scaler.update()   # or optimizer.step()
        optimizer.zero_grad(set_to_none=set_to_none)

    Every rank ends with the same averaged gradients, so clipping, the optimizer and the scaler
    take the same decisions everywhere. An inf/NaN gradient on any rank makes that element of
    the sum inf/NaN on every rank, so every rank's scaler skips the step and backs off.

    Parameters
    ----------
    model, loss_fn, optimizer, micro_batches, scaler, clip, set_to_none
        As ``accumulated_step``; ``loss_fn`` must reduce by 'mean' over rows (or 'sum').
    x : ndarray (b, *in), y : ndarray (b, *target)
        This rank's rows (:func:`shard_batch`); the same ``b`` on every rank, so the mean of the
        ranks' mean gradients is the global batch's.
    reducer : GradientReducer
        Over ``model``'s parameters. With ``overlap=True`` and one micro-batch its buckets start
        during the backward; with several, inside ``reducer.no_sync()`` and all at the end.

    Returns
    -------
    float
        The global batch's loss (the mean of the ranks' losses), before the update.
    """
    from ..training.accumulation import accumulate, check_clip, finish_step

    check_clip(clip, "linearkit.distributed.step")
    if micro_batches == 1:
        loss = accumulate(model, loss_fn, x, y, micro_batches=1, scaler=scaler)
    else:
        with reducer.no_sync():
            loss = accumulate(model, loss_fn, x, y, micro_batches=micro_batches, scaler=scaler)
    loss = reducer.synchronize(loss)     # the average, before the scaler unscales it
    return finish_step(optimizer, loss, scaler=scaler, clip=clip, set_to_none=set_to_none)
