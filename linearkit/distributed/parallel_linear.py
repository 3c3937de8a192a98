"""Tensor parallelism (Megatron-style): a Linear split across the ranks of a communicator.

``ColumnParallelLinear`` splits ``out_features``: rank ``r`` holds rows ``lo:hi`` of the weight
``(out, in)`` and of the bias, computes ``y[..., lo:hi]``, and either keeps its shard or
all-gathers the full output. Its input is replicated, so in the backward each rank's
``dx = dy[..., lo:hi] @ W_r`` is a partial sum: one all-reduce gives ``dx``.

``RowParallelLinear`` splits ``in_features``: rank ``r`` holds columns ``lo:hi`` of the weight,
multiplies its slice of the input, and the partial outputs are all-reduced; the bias is
replicated and added once, after the sum. ``dx`` is this rank's slice (``input_is_parallel``)
or, all-gathered, the full one.

Column(gather_output=False) → activation → Row(input_is_parallel=True) is the parallel MLP
block: one all-reduce in the forward (Row's sum), one in the backward (Column's dx).

Uneven splits are allowed: the sizes are ``numpy.array_split``'s (the first ``n % size`` ranks
hold one row/column more), so any width splits over any number of ranks up to the width.
Parameters are float32 or float64 (16-bit storage is not supported here).
"""

from __future__ import annotations

import math

import numpy as np

from .. import functional as F
from ..core.module import Module, Parameter
from ..core.random import block_size, resolve
from ..errors import ShapeError
from ..layers._checks import as_input, feature_count
from . import comm as _comm

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "split_range"]


def split_range(n: int, parts: int, rank: int) -> tuple[int, int]:
    """``(lo, hi)`` of part ``rank`` of ``n`` split into ``parts`` as ``numpy.array_split``."""
    size, extra = divmod(n, parts)
    lo = rank * size + min(rank, extra)
    return lo, lo + size + (rank < extra)


def _gather_last(y: np.ndarray, comm) -> np.ndarray:
    """Concatenate every rank's ``y (*, n_r)`` along the last axis -> ``(*, Σ n_r)``."""
    rows = np.ascontiguousarray(np.moveaxis(y, -1, 0))
    return np.ascontiguousarray(np.moveaxis(_comm.allgather_rows(rows, comm), 0, -1))


class _ParallelLinear(Module):
    """What both splits share: the group, the split, the dtype, PyTorch's init of the full layer."""

    split_dim = None  # 0: out_features (column), 1: in_features (row)

    def __init__(self, in_features, out_features, bias, *, rank, world_size, comm, dtype, rng):
        super().__init__()
        self.in_features = feature_count("in_features", in_features)
        self.out_features = feature_count("out_features", out_features)
        self.comm = comm
        self.world_size = _comm.world_size(comm) if world_size is None else int(world_size)
        self.rank = _comm.rank(comm) if rank is None else int(rank)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"{type(self).__name__}: rank must be in [0, {self.world_size - 1}]"
                             f", got {self.rank}")
        full = (self.out_features, self.in_features)[self.split_dim]
        if full < self.world_size:
            side = ("out_features", "in_features")[self.split_dim]
            raise ValueError(f"{type(self).__name__}: {side}={full} cannot be split over "
                             f"{self.world_size} ranks (every rank needs at least one); use at "
                             f"most {full} ranks")
        self.lo, self.hi = split_range(full, self.world_size, self.rank)
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float64):
            raise TypeError(f"{type(self).__name__}: dtype must be float32 or float64, got "
                            f"{self.dtype}")
        shape = [self.out_features, self.in_features]
        shape[self.split_dim] = self.hi - self.lo
        self.weight = Parameter(np.empty(shape, self.dtype))
        b_len = self.hi - self.lo if self.split_dim == 0 else self.out_features
        if bias:
            self.bias = Parameter(np.empty(b_len, self.dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters(rng)

    def reset_parameters(self, rng=None) -> None:
        """The full Linear's init, U(-k, k) with k = 1/sqrt(in_features) for weight and bias,
        drawn in Linear's order and sliced: ranks given equally seeded generators hold the shards
        of one ``Linear(in, out, rng=...)``. The full matrix is drawn a block of rows at a time
        (the generator's stream is the same in blocks), so a rank holds only its shard and one
        float64 block, never the whole float64 matrix."""
        rng = resolve(rng)
        bound = 1.0 / math.sqrt(self.in_features) if self.in_features > 0 else 0.0
        rows = max(1, block_size(self.out_features * self.in_features) // max(1, self.in_features))
        for start in range(0, self.out_features, rows):
            stop = min(start + rows, self.out_features)
            block = rng.uniform(-bound, bound, (stop - start, self.in_features))
            if self.split_dim == 1:
                self.weight.data[start:stop] = block[:, self.lo:self.hi]
            elif stop > self.lo and start < self.hi:   # the rows of this block that are ours
                lo, hi = max(start, self.lo), min(stop, self.hi)
                self.weight.data[lo - self.lo:hi - self.lo] = block[lo - start:hi - start]
        if self.bias is not None:
            b = rng.uniform(-bound, bound, self.out_features)
            self.bias.data[...] = b[self.lo:self.hi] if self.split_dim == 0 else b

    def _input(self, x, width: int) -> np.ndarray:
        running = _comm.world_size(self.comm)
        if running != self.world_size:
            raise RuntimeError(
                f"{type(self).__name__} (rank {self.rank}) holds a shard for {self.world_size} "
                f"ranks but runs in a group of {running}; run it under mpirun -n "
                f"{self.world_size}, or rebuild the full layer with gather_linear")
        x = as_input(self, x, self.weight.data.dtype)
        if x.ndim == 0 or x.shape[-1] != width:
            raise ShapeError(f"expected input of shape (*, {width}), got {x.shape}",
                             module=self, hint=self._width_hint(x.shape))
        return x

    def _width_hint(self, shape) -> str | None:
        return None

    def extra_repr(self) -> str:
        side = ("out", "in")[self.split_dim]
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, rank={self.rank}/{self.world_size}, "
                f"{side}[{self.lo}:{self.hi}]")


class ColumnParallelLinear(_ParallelLinear):
    """``y = x @ W.T + b`` with ``W``'s rows (``out_features``) split across the ranks.

    Parameters
    ----------
    in_features, out_features : int
    bias : bool
        Each rank holds the bias entries of its rows.
    gather_output : bool
        True: all-gather the outputs, every rank returns ``(*, out_features)``; False: return
        this rank's shard ``(*, hi - lo)`` (feed it to ``RowParallelLinear(input_is_parallel=
        True)``).
    rank, world_size, comm
        The group: default ``comm``'s (``MPI.COMM_WORLD``); with one rank nothing is sent.
    dtype : float32 (default) or float64
    rng : numpy.random.Generator, optional
        Seed it equally on every rank: the shards are those of ``Linear(..., rng=rng)``.

    Shape
    -----
    x ``(*, in_features)`` (the same on every rank) -> y ``(*, out_features)`` or
    ``(*, hi - lo)``.

    Attributes
    ----------
    weight : Parameter ``(hi - lo, in_features)``: rows ``lo:hi`` of the full weight
    bias : Parameter ``(hi - lo,)`` or None
    lo, hi : int — this rank's rows (``split_range(out_features, world_size, rank)``)
    """

    split_dim = 0

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 gather_output: bool = True, rank: int | None = None,
                 world_size: int | None = None, comm=None, dtype=np.float32,
                 rng: np.random.Generator | None = None):
        super().__init__(in_features, out_features, bias, rank=rank, world_size=world_size,
                         comm=comm, dtype=dtype, rng=rng)
        self.gather_output = bool(gather_output)

    def _local(self, x):
        b = self.bias
        return F.linear(x, self.weight.data, None if b is None else b.data)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """``(*, in) -> (*, out)`` (gathered) or ``(*, hi - lo)``."""
        y = self._local(self._input(x, self.in_features))
        return _gather_last(y, self.comm) if self.gather_output else y

    def vjp(self, x: np.ndarray, input_grad: bool = True):
        """Forward plus ``backward(dy) -> dx (*, in)``: dW, db from this rank's columns of
        ``dy``; ``dx`` all-reduced over the ranks (the partial sums of every rank's rows)."""
        x = self._input(x, self.in_features)
        w, b = self.weight, self.bias
        y = self._local(x)
        gathered = self.gather_output
        need_dw, need_db = w.requires_grad, b is not None and b.requires_grad
        saved_x = x if need_dw else None
        lo, hi, comm = self.lo, self.hi, self.comm

        def backward(dy: np.ndarray):
            dy = np.ascontiguousarray(dy[..., lo:hi]) if gathered else dy
            if need_dw:
                w.add_grad(write=lambda out, acc: F.linear_weight_grad(dy, saved_x, out, acc))
            if need_db:
                b.add_grad(write=lambda out, acc: F.linear_bias_grad(dy, out, acc))
            if not input_grad:
                return None
            return _comm.allreduce_(np.ascontiguousarray(F.linear_input_grad(dy, w.data)),
                                    "sum", comm)

        return (_gather_last(y, comm) if gathered else y), backward

    def extra_repr(self) -> str:
        return super().extra_repr() + f", gather_output={self.gather_output}"


class RowParallelLinear(_ParallelLinear):
    """``y = x @ W.T + b`` with ``W``'s columns (``in_features``) split across the ranks.

    Parameters
    ----------
    in_features, out_features, bias, rank, world_size, comm, dtype, rng
        As :class:`ColumnParallelLinear`; the bias ``(out_features,)`` is replicated on every
        rank and added once, after the partial outputs are summed.
    input_is_parallel : bool
        True: the input is already this rank's slice ``(*, hi - lo)`` (a
        ``ColumnParallelLinear(gather_output=False)``'s output) and ``dx`` is that slice's
        gradient; False: the input is the full ``(*, in_features)``, each rank takes its slice,
        and ``dx`` is all-gathered back to ``(*, in_features)``.

    Shape
    -----
    x ``(*, hi - lo)`` or ``(*, in_features)`` -> y ``(*, out_features)`` (all-reduced: the
    same on every rank).

    Attributes
    ----------
    weight : Parameter ``(out_features, hi - lo)``: columns ``lo:hi`` of the full weight
    bias : Parameter ``(out_features,)`` or None (replicated)
    lo, hi : int — this rank's columns
    """

    split_dim = 1

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 input_is_parallel: bool = False, rank: int | None = None,
                 world_size: int | None = None, comm=None, dtype=np.float32,
                 rng: np.random.Generator | None = None):
        super().__init__(in_features, out_features, bias, rank=rank, world_size=world_size,
                         comm=comm, dtype=dtype, rng=rng)
        self.input_is_parallel = bool(input_is_parallel)

    def _width_hint(self, shape) -> str | None:
        if self.input_is_parallel and len(shape) and shape[-1] == self.in_features:
            return ("input_is_parallel=True takes this rank's slice of the input; pass "
                    f"x[..., {self.lo}:{self.hi}] or build the layer with input_is_parallel=False")
        if not self.input_is_parallel and len(shape) and shape[-1] == self.hi - self.lo:
            return "is the input already this rank's slice? build with input_is_parallel=True"
        return None

    def _slice(self, x):
        if self.input_is_parallel:
            return self._input(x, self.hi - self.lo)
        return np.ascontiguousarray(self._input(x, self.in_features)[..., self.lo:self.hi])

    def _sum(self, partial):
        y = _comm.allreduce_(np.ascontiguousarray(partial), "sum", self.comm)
        if self.bias is not None:
            y += self.bias.data
        return y

    def forward(self, x: np.ndarray) -> np.ndarray:
        """``(*, hi - lo)`` or ``(*, in)`` -> ``(*, out)``: partial GEMM, all-reduce, + bias."""
        return self._sum(F.linear(self._slice(x), self.weight.data))

    def vjp(self, x: np.ndarray, input_grad: bool = True):
        """Forward plus ``backward(dy (*, out)) -> dx``: dW from this rank's input slice, db
        (the same on every rank), ``dx`` this rank's slice (all-gathered unless
        ``input_is_parallel``)."""
        xs = self._slice(x)
        w, b = self.weight, self.bias
        y = self._sum(F.linear(xs, w.data))
        need_dw, need_db = w.requires_grad, b is not None and b.requires_grad
        saved_x = xs if need_dw else None
        parallel, comm = self.input_is_parallel, self.comm

        def backward(dy: np.ndarray):
            if need_dw:
                w.add_grad(write=lambda out, acc: F.linear_weight_grad(dy, saved_x, out, acc))
            if need_db:
                b.add_grad(write=lambda out, acc: F.linear_bias_grad(dy, out, acc))
            if not input_grad:
                return None
            dx = F.linear_input_grad(dy, w.data)
            return dx if parallel else _gather_last(dx, comm)

        return y, backward

    def extra_repr(self) -> str:
        return super().extra_repr() + f", input_is_parallel={self.input_is_parallel}"
