"""Move between a plain ``Linear`` and its tensor-parallel shards: ``shard_linear``,
``gather_linear``, and the parallel MLP block ``parallel_mlp``.

Which layers they take is the layer rules' answer: a layer whose own rule lists
'shard_linear' (a plain, materialized Linear), and one whose rule lists 'gather_linear' (a
``ColumnParallelLinear`` or ``RowParallelLinear``; ``linearkit.rules.transforms_for``).
"""

from __future__ import annotations

import numpy as np

from ..layers.container import Sequential
from ..layers.linear import Linear, linear_from
from ..rules.registry import transforms_for  # importing it registers the shipped rules
from . import comm as _comm
from .parallel_linear import ColumnParallelLinear, RowParallelLinear

__all__ = ["gather_linear", "parallel_mlp", "shard_linear"]

_MODES = {"column": ColumnParallelLinear, "row": RowParallelLinear}


def shard_linear(linear: Linear, rank: int | None = None, world_size: int | None = None,
                 mode: str = "column", *, comm=None, gather_output: bool = True,
                 input_is_parallel: bool = False):
    """This rank's shard of ``linear``: a ``ColumnParallelLinear`` (``mode='column'``, rows of
    the weight) or a ``RowParallelLinear`` (``mode='row'``, columns), holding copies.

    No communication: every rank slices its own copy of the same ``linear`` (build it with the
    same seed everywhere, or ``broadcast_parameters`` it first). ``rank``/``world_size``
    default to ``comm``'s. The input ``linear`` is not modified.

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> from linearkit.distributed import shard_linear
    >>> full = lk.Linear(4, 5, rng=np.random.default_rng(0))
    >>> shard = shard_linear(full, rank=1, world_size=2, mode="column")
    >>> shard.weight.shape, (shard.lo, shard.hi)  # array_split: 3 rows on rank 0, 2 on rank 1
    ((2, 4), (3, 5))
    """
    if mode not in _MODES:
        raise ValueError(f"shard_linear: mode must be 'column' (split out_features) or 'row' "
                         f"(split in_features), got {mode!r}")
    if "shard_linear" not in transforms_for(linear):  # a plain Linear: a subclass may differ
        raise TypeError(f"shard_linear takes a materialized Linear, got {type(linear).__name__}")
    dtype = linear.weight.data.dtype
    extra = {"gather_output": gather_output} if mode == "column" else \
        {"input_is_parallel": input_is_parallel}
    shard = _MODES[mode](linear.in_features, linear.out_features, linear.bias is not None,
                         rank=rank, world_size=world_size, comm=comm, dtype=dtype,
                         rng=np.random.default_rng(0), **extra)
    lo, hi = shard.lo, shard.hi
    w = linear.weight.data
    shard.weight.data[...] = w[lo:hi] if mode == "column" else w[:, lo:hi]
    shard.weight.requires_grad = linear.weight.requires_grad
    if linear.bias is not None:
        shard.bias.data[...] = linear.bias.data[lo:hi] if mode == "column" else linear.bias.data
        shard.bias.requires_grad = linear.bias.requires_grad
    return shard


def gather_linear(shard: ColumnParallelLinear | RowParallelLinear) -> Linear:
    """The full ``Linear`` whose shards the ranks hold: a collective (every rank calls it and
    gets the same layer). Inverse of :func:`shard_linear`."""
    if "gather_linear" not in transforms_for(shard):
        raise TypeError(f"gather_linear takes a ColumnParallelLinear or RowParallelLinear, got "
                        f"{type(shard).__name__}")
    running = _comm.world_size(shard.comm)
    if running != shard.world_size:
        raise RuntimeError(f"gather_linear: the shard is one of {shard.world_size} but the group "
                           f"has {running} rank(s); call it on every rank of the job")
    w, b = shard.weight.data, None if shard.bias is None else shard.bias.data
    if shard.split_dim == 0:  # a column shard: rows lo:hi of the weight and the bias
        weight = _comm.allgather_rows(w, shard.comm)
        bias = None if b is None else _comm.allgather_rows(b, shard.comm)
    else:
        weight = _comm.allgather_rows(np.ascontiguousarray(w.T), shard.comm).T
        bias = b
    return linear_from(weight, bias, w.dtype)


def parallel_mlp(fc1: Linear, activation, fc2: Linear, *, rank: int | None = None,
                 world_size: int | None = None, comm=None) -> Sequential:
    """The tensor-parallel ``fc2(activation(fc1(x)))``: ``Sequential(ColumnParallelLinear(
    gather_output=False), activation, RowParallelLinear(input_is_parallel=True))``.

    The hidden activations stay sharded (an elementwise activation needs no communication):
    the forward all-reduces once (``(*, out)``, in the row layer), the backward once
    (``dx (*, in)``, in the column layer; none when called with ``input_grad=False``).

    Shape: x ``(*, fc1.in_features)`` -> y ``(*, fc2.out_features)`` on every rank.
    """
    if fc1.out_features != fc2.in_features:
        raise ValueError(f"parallel_mlp: fc1 gives {fc1.out_features} features but fc2 takes "
                         f"{fc2.in_features}")
    return Sequential(
        shard_linear(fc1, rank, world_size, "column", comm=comm, gather_output=False),
        activation,
        shard_linear(fc2, rank, world_size, "row", comm=comm, input_is_parallel=True))
