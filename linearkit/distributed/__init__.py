"""Scale-out over MPI: data-parallel training that equals single-process training, and
tensor-parallel Linear layers. Every byte between ranks goes through MPI (mpi4py).

Importing this package does not import mpi4py; the first collective in a job of several ranks
does (``pip install "linearkit[mpi]"``). Outside ``mpirun`` the world is one rank: every helper
works and every collective returns at once. See docs/distributed.md.

- ranks: :func:`rank`, :func:`world_size`, :func:`is_initialized`, :func:`launched`,
  :func:`is_available`, :func:`barrier`; failures: :func:`abort_on_error`, the collective
  timeout ``LINEARKIT_MPI_TIMEOUT`` (:data:`DEFAULT_TIMEOUT` seconds).
- data parallel: :func:`broadcast_parameters`, :class:`GradientReducer` /
  :func:`allreduce_gradients` (one flat buffer per dtype, bucketed), :func:`step`,
  :func:`shard_batch`, :class:`DistributedSampler`.
- tensor parallel: :class:`ColumnParallelLinear`, :class:`RowParallelLinear`,
  :func:`shard_linear`, :func:`gather_linear`, :func:`parallel_mlp`.
"""

from .comm import (
    DEFAULT_TIMEOUT,
    abort,
    abort_on_error,
    allgather_rows,
    allreduce_,
    barrier,
    broadcast_,
    is_available,
    is_initialized,
    launched,
    rank,
    timeout,
    world_size,
)
from .data_parallel import shard_batch, step
from .parallel_linear import ColumnParallelLinear, RowParallelLinear, split_range
from .reducer import (
    DEFAULT_BUCKET_BYTES,
    GradientReducer,
    allreduce_gradients,
    broadcast_parameters,
)
from .rules import register_rules as _register_rules
from .sampler import DistributedSampler, shard_indices
from .sharding import gather_linear, parallel_mlp, shard_linear

_register_rules()

__all__ = ["DEFAULT_BUCKET_BYTES", "DEFAULT_TIMEOUT", "ColumnParallelLinear",
           "DistributedSampler", "GradientReducer", "RowParallelLinear", "abort",
           "abort_on_error", "allgather_rows", "allreduce_", "allreduce_gradients", "barrier",
           "broadcast_", "broadcast_parameters", "gather_linear", "is_available",
           "is_initialized", "launched", "parallel_mlp", "rank", "shard_batch", "shard_indices",
           "shard_linear", "split_range", "step", "timeout", "world_size"]
