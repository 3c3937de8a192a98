"""Data parallelism: average the gradients over the ranks, in one flat buffer per dtype.

Every rank runs the same model on its own rows; :class:`GradientReducer` then replaces each
trainable parameter's ``.grad`` by the mean over the ranks. The gradients are packed into
contiguous buckets, one dtype each (float64 gradients in float64, every other float dtype in
float32: MPI has no 16-bit float type, and a float32 sum does not overflow where a float16 one
would), each bucket reduced by ONE ``Iallreduce`` — not one call per parameter — and unpacked
in place (an optimizer's flat gradient views stay its views). A bucket holds at most
``bucket_bytes`` (default 25 MiB, PyTorch DDP's ``bucket_cap_mb``), so a large model streams.

Which parameters take part is the same on every rank by construction: those with
``requires_grad`` (frozen ones are excluded, and cost nothing). A trainable parameter without a
gradient on some rank (its branch did not run there) contributes zeros; one without a gradient
on every rank keeps ``grad = None`` everywhere. One small float64 all-reduce carries these
presence flags (and the loss, for the caller's log) next to the buckets.
"""

from __future__ import annotations

import contextlib
import itertools
import zlib

import numpy as np

from .. import precision as _precision
from . import comm as _comm

__all__ = ["DEFAULT_BUCKET_BYTES", "GradientReducer", "allreduce_gradients",
           "broadcast_parameters"]

#: PyTorch DDP's default bucket size (``bucket_cap_mb=25``).
DEFAULT_BUCKET_BYTES = 25 * 2**20


def _reduce_dtype(p) -> np.dtype:
    return np.dtype(np.float64) if p.dtype == np.float64 else np.dtype(np.float32)


class _Bucket:
    """A flat buffer ``(N,)`` of one dtype and the parameters packed into it, in order."""

    __slots__ = ("buffer", "indices", "launched", "params", "ready", "request", "slices")

    def __init__(self, dtype: np.dtype, entries: list):
        self.params = [p for _, p in entries]
        self.indices = [i for i, _ in entries]  # positions in the reducer's parameter list
        bounds = np.cumsum([0] + [p.size for p in self.params]).tolist()
        self.slices = [slice(a, b) for a, b in itertools.pairwise(bounds)]
        self.buffer = np.empty(bounds[-1], dtype)
        self.ready = 0
        self.launched = False
        self.request = None

    def pack(self) -> None:
        for p, s in zip(self.params, self.slices):
            if p.grad is None:
                self.buffer[s] = 0
            else:
                self.buffer[s] = p.grad.reshape(-1)


class GradientReducer:
    """Average the gradients of a model's (or a list's) trainable parameters over the ranks.

    Parameters
    ----------
    params : Module or iterable of Parameter
        What to average; a Module's ``parameters()`` (each once). Only those with
        ``requires_grad`` take part, re-read at every call.
    comm : mpi4py communicator, optional
        Default ``MPI.COMM_WORLD``; with one rank every call returns at once (no mpi4py).
    bucket_bytes : int
        Most bytes per flat buffer (>= 1; a parameter larger than that gets a bucket alone).
    overlap : bool
        Start each bucket's ``Iallreduce`` during the backward, as soon as the backward of
        every module owning its parameters has run (call hooks, ``linearkit.core.hooks``) — needs a
        Module. Buckets launch in bucket order, so every rank issues the same collectives in the
        same order. See docs/distributed.md for what it buys on CPU MPI.

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> from linearkit.distributed import GradientReducer
    >>> model = lk.Linear(3, 2, rng=np.random.default_rng(0))
    >>> reducer = GradientReducer(model)
    >>> pred, back = model.vjp(np.ones((4, 3), np.float32), input_grad=False)
    >>> loss, loss_back = lk.MSELoss().vjp(pred, np.zeros((4, 2), np.float32))
    >>> back(loss_back())
    >>> reducer.synchronize(float(loss)) == float(loss)  # one rank: nothing to average
    True
    """

    def __init__(self, params, *, comm=None, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 overlap: bool = False):
        from ..core.module import Module

        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, (int, np.integer)) \
                or bucket_bytes < 1:
            raise ValueError(f"GradientReducer: bucket_bytes must be an int >= 1 (bytes per "
                             f"flat all-reduce buffer), got {bucket_bytes!r}")
        self.model = params if isinstance(params, Module) else None
        seen, self._all = set(), []
        for p in (params.parameters() if self.model is not None else params):
            if id(p) not in seen:
                seen.add(id(p))
                self._all.append(p)
        self.comm = comm
        self.bucket_bytes = int(bucket_bytes)
        self.overlap = bool(overlap)
        self._key = None
        self._buckets: list[_Bucket] = []
        self._trainable: list = []
        self._meta = np.zeros(0)
        self._synced = True   # False inside no_sync()
        self._pending: dict[int, int] = {}
        self._ready: set[int] = set()
        self._handles = []
        #: Running totals: ``calls`` (synchronize), ``bytes`` (gradient payload all-reduced),
        #: ``buckets`` (gradient Iallreduce calls), ``early`` (of those, started during the
        #: backward by the overlap hooks).
        self.stats = {"calls": 0, "bytes": 0, "buckets": 0, "early": 0}
        if self.overlap:
            if self.model is None:
                raise ValueError("GradientReducer(overlap=True) hooks the modules that own the "
                                 "parameters: pass the model, not a parameter list")
            self._install_hooks()

    # ------------------------------------------------------------------ layout
    @property
    def world_size(self) -> int:
        return _comm.world_size(self.comm)

    @property
    def bytes_per_step(self) -> int:
        """Gradient bytes each rank contributes to one :meth:`synchronize` (its buckets)."""
        self._layout()
        return sum(b.buffer.nbytes for b in self._buckets)

    def _layout(self) -> list[_Bucket]:
        """The buckets for the current trainable set (rebuilt when ``requires_grad`` changed)."""
        key = tuple(p.requires_grad for p in self._all)
        if key == self._key:
            return self._buckets
        trainable = [p for p in self._all if p.requires_grad]
        # Reverse registration order: the order a Sequential's backward produces gradients.
        order = list(enumerate(trainable))[::-1]
        open_: dict[np.dtype, list] = {}
        buckets = []
        for i, p in order:
            dtype = _reduce_dtype(p)
            entries = open_.setdefault(dtype, [])
            if entries and (sum(q.size for _, q in entries) + p.size) * dtype.itemsize \
                    > self.bucket_bytes:
                buckets.append(_Bucket(dtype, entries))
                entries = open_[dtype] = []
            entries.append((i, p))
        buckets += [_Bucket(dtype, entries) for dtype, entries in open_.items() if entries]
        self._buckets, self._trainable, self._key = buckets, trainable, key
        self._meta = np.zeros(len(trainable) + 1)
        self._owner_of = {id(p): b for b in buckets for p in b.params}
        if self.world_size > 1:
            self._check_same_layout()
        return buckets

    def _check_same_layout(self) -> None:
        """Every rank must pack the same parameters (shapes, dtypes, order) into its buckets."""
        text = repr([(p.shape, p.dtype.str) for p in self._trainable]).encode()
        h = zlib.crc32(text)
        seen = _comm.allreduce_(np.array([h, -h], np.int64), "max", self.comm,
                                what="GradientReducer's check that every rank has the same "
                                     "trainable parameters")
        if seen[0] != h or -seen[1] != h:
            raise RuntimeError(
                f"GradientReducer (rank {_comm.rank(self.comm)}): the ranks hold different "
                f"trainable parameters ({len(self._trainable)} here, layout checksum {h}); "
                "every rank must build the same model and freeze the same parameters")

    # ------------------------------------------------------------------ averaging
    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside the block start no all-reduce (overlap off), as DDP's
        ``no_sync``: accumulate micro-batches, then call :meth:`synchronize` once."""
        before, self._synced = self._synced, False
        try:
            yield
        finally:
            self._synced = before

    def synchronize(self, loss: float | None = None) -> float | None:
        """Replace every trainable parameter's ``.grad`` by its mean over the ranks.

        Call it once per optimizer step, after the backward (after the last micro-batch), and
        before unscaling, clipping or stepping. Every rank must call it. Returns ``loss``
        averaged over the ranks (None for None): with equal rows per rank and a mean loss, the
        full batch's loss.
        """
        self.stats["calls"] += 1
        if self.world_size == 1:
            self._reset()
            return loss
        buckets = self._layout()
        for bucket in buckets:
            if not bucket.launched:
                self._launch(bucket)
        meta = self._meta
        for j, p in enumerate(self._trainable):
            meta[j] = p.grad is not None
        meta[-1] = 0.0 if loss is None else float(loss)
        requests = [b.request for b in buckets] + [_comm.start_allreduce(meta, "sum", self.comm)]
        _comm.wait(requests, f"gradient all-reduce ({len(buckets)} bucket(s), "
                   f"{sum(b.buffer.nbytes for b in buckets):,} bytes)", self.comm)
        n = self.world_size
        for bucket in buckets:
            np.divide(bucket.buffer, n, out=bucket.buffer)
            for i, p, s in zip(bucket.indices, bucket.params, bucket.slices):
                if meta[i] == 0:      # no rank has a gradient: keep None, as a single process
                    continue
                value = bucket.buffer[s].reshape(p.shape)
                if p.grad is None:
                    p.grad = value.astype(_precision.grad_dtype(p.dtype))
                else:
                    p.grad[...] = value
                    p._zeroed = None  # holds the mean now, not zeros: the next backward adds
            self.stats["bytes"] += bucket.buffer.nbytes
        self.stats["buckets"] += len(buckets)
        self._reset()
        return None if loss is None else float(meta[-1] / n)

    def _launch(self, bucket: _Bucket) -> None:
        bucket.pack()
        bucket.request = _comm.start_allreduce(bucket.buffer, "sum", self.comm)
        bucket.launched = True

    def _reset(self) -> None:
        for bucket in self._buckets:
            bucket.launched, bucket.ready, bucket.request = False, 0, None
        self._pending.clear()
        self._ready.clear()

    # ------------------------------------------------------------------ overlap
    def _install_hooks(self) -> None:
        owners: dict[int, list] = {}
        for m in self.model.modules():
            own = [p for _, p in m.named_parameters(recurse=False, remove_duplicate=False)]
            for p in own:
                owners.setdefault(id(p), []).append(m)
            if own:
                self._handles.append(m.register_forward_hook(self._on_forward,
                                                             with_kwargs=True))
                self._handles.append(m.register_full_backward_hook(self._on_backward))
        self._owners = owners

    def _on_forward(self, module, args, kwargs, output) -> None:
        if self._synced and "input_grad" in kwargs:  # a vjp call: a backward will follow
            self._pending[id(module)] = self._pending.get(id(module), 0) + 1

    def _on_backward(self, module, grad_input, grad_output) -> None:
        if not self._synced or self.world_size == 1:
            return
        left = max(self._pending.get(id(module), 0) - 1, 0)
        self._pending[id(module)] = left
        if left:
            return
        buckets = self._layout()
        for _, p in module.named_parameters(recurse=False, remove_duplicate=False):
            if not p.requires_grad:
                continue
            if any(self._pending.get(id(m), 0) > 0 for m in self._owners[id(p)]):
                continue      # a tied parameter whose other owner's backward is still to come
            if id(p) not in self._ready:
                self._ready.add(id(p))
                self._owner_of[id(p)].ready += 1
        for bucket in buckets:  # launch in bucket order only: the same sequence on every rank
            if bucket.launched:
                continue
            if bucket.ready < len(bucket.params):
                break
            self._launch(bucket)
            self.stats["early"] += 1
        from mpi4py import MPI  # already imported: world_size > 1

        MPI.Request.Testall([b.request for b in buckets if b.request is not None])  # progress

    def remove_hooks(self) -> None:
        """Unregister the overlap hooks (the reducer then averages only in synchronize)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.overlap = False


def allreduce_gradients(params, *, comm=None, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
    """Average the ``.grad`` of ``params`` (a Module or Parameters) over the ranks, once.

    A one-shot :class:`GradientReducer` (its buffers are made per call; keep a reducer for a
    training loop). Every rank must call it with the same parameters.
    """
    GradientReducer(params, comm=comm, bucket_bytes=bucket_bytes).synchronize()


def broadcast_parameters(model, root: int = 0, *, comm=None) -> None:
    """Overwrite every parameter and buffer of ``model`` with rank ``root``'s values.

    All of them travel in ONE byte buffer (any dtype, bfloat16 and int64 counters included).
    A model whose parameter/buffer names, shapes or dtypes differ between ranks raises the same
    RuntimeError on every rank, before anything is sent. One rank: nothing happens.
    """
    if _comm.world_size(comm) == 1:
        return
    arrays = [(name, p.data) for name, p in model.named_parameters()]
    arrays += [(name, b) for name, b in model.named_buffers() if isinstance(b, np.ndarray)]
    text = repr([(name, a.shape, a.dtype.str) for name, a in arrays]).encode()
    h = zlib.crc32(text)
    seen = _comm.allreduce_(np.array([h, -h], np.int64), "max", comm,
                            what="broadcast_parameters' check that every rank has the same model")
    if seen[0] != h or -seen[1] != h:
        raise RuntimeError("broadcast_parameters: the ranks hold different models (parameter "
                           "and buffer names, shapes or dtypes differ); build the same model on "
                           "every rank before broadcasting")
    sizes = [a.nbytes for _, a in arrays]
    flat = np.empty(sum(sizes), np.uint8)
    offset = 0
    for (_, a), n in zip(arrays, sizes):
        flat[offset:offset + n] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        offset += n
    _comm.broadcast_(flat, root, comm)
    offset = 0
    for (_, a), n in zip(arrays, sizes):
        a[...] = flat[offset:offset + n].view(a.dtype).reshape(a.shape)
        offset += n
