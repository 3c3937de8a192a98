"""BLAS threads: ``set_num_threads`` / ``get_num_threads`` as in PyTorch, and a default policy
that stays fast when another process is using a core.

Why a policy: on a shared machine, a BLAS GEMM split over every core waits at each barrier for
a thread the OS has handed to someone else. Beside other busy processes a training step at the
BLAS default (every core) gets many times slower, and on one BLAS thread it barely notices; on
an idle machine two threads pay off only on large GEMMs. docs/threads.md has the measurements
(``python -m benchmarks --only busy``, and the figures from when this policy was written).

The default policy (``get_policy() == "adaptive"``), decided before each GEMM of
``linearkit.functional`` (``linear``, ``linear_input_grad``, ``linear_weight_grad``):

* a GEMM under ``SMALL_GEMM_MACS`` multiply-adds runs on **one** thread (threads cost more in
  hand-offs than they save there, idle machine or not);
* a larger GEMM may use up to the BLAS's own thread count (``OPENBLAS_NUM_THREADS`` etc., else
  every core) **only while the machine shows idle cores**: at most every ``SAMPLE_S`` seconds
  the CPU time of the process's cores (``/proc/stat``, restricted to the CPUs this process may
  run on) minus this process's own (``time.process_time``) says how busy other processes kept
  them; a core more than ``BUSY_CORE`` busy with others is not used;
* it backs off at once, on the first sample that shows contention, and goes back up only after
  ``UP_SAMPLES`` calm samples in a row. On a system without ``/proc/stat`` every GEMM runs on
  one thread.

``set_num_threads(n)`` replaces the policy by a fixed count for every GEMM (and every other BLAS
call of the process) until ``reset_num_threads()``; ``num_threads(n)`` does the same inside a
``with`` block. The count is process-wide, as BLAS libraries keep it.

It covers every BLAS library the process has loaded (NumPy's OpenBLAS, SciPy's own OpenBLAS,
MKL, BLIS, FlexiBLAS), found once through ``threadpoolctl`` on the first GEMM (not at
``import linearkit``) and again when a library may have been loaded since (``sys.modules``
grew). Each switch is one direct call into the library's own setter (``openblas_set_num_threads``
through ctypes, far cheaper than a ``threadpool_limits`` context), made only when the count
changes. Without ``threadpoolctl``, BLAS keeps its own default (every core) and
``set_num_threads`` raises ``ImportError``.
"""

from __future__ import annotations

import math
import os
import sys
import time
from contextlib import contextmanager

from .cpuload import LoadMeter, cpu_ids

__all__ = [
    "BUSY_CORE",
    "SAMPLE_S",
    "SMALL_GEMM_MACS",
    "UP_SAMPLES",
    "get_num_threads",
    "get_policy",
    "info",
    "num_threads",
    "reset_num_threads",
    "set_num_threads",
]

# Below this many multiply-adds a GEMM always runs on one thread. The recipe's GEMMs (at most
# 100x100x100, 1M) run no faster on two threads on an idle machine and slower still beside a
# busy process (docs/threads.md, table 9b, measures the sizes around it).
SMALL_GEMM_MACS = 1 << 22
# Seconds between two looks at the machine's load (a look reads /proc/stat: docs/threads.md,
# "What it costs").
SAMPLE_S = 0.2
# A core that other processes kept busier than this (fraction of the last sample) is not used.
BUSY_CORE = 0.2
# Calm samples in a row before a large GEMM may use more threads again.
UP_SAMPLES = 2

# ---- read by linearkit.functional on every GEMM: a GEMM with at least this many multiply-adds
# calls before_gemm(). 0 until the first GEMM (which finds the libraries); afterwards
# SMALL_GEMM_MACS while the libraries run one thread or a fixed count (large GEMMs still look in
# every SAMPLE_S: the load, newly loaded libraries), 0 while the policy runs them on more (so
# that the next small GEMM switches back), inf when there is nothing to switch (no
# threadpoolctl).
switch_macs: float = 0

_setters: list | None = None   # one callable per BLAS library, found lazily
_paths: frozenset = frozenset()
_modules_seen = 0              # len(sys.modules) when the libraries were last looked up
_blas_default = 1              # the libraries' own thread count when first found (the ceiling)
_user: int | None = None       # set_num_threads(n); None = the adaptive policy
_current: int | None = None    # what the libraries were last set to by us
_unavailable: str | None = None  # why there is no control (threadpoolctl missing)
# the adaptive policy's state
_meter: LoadMeter | None = None
_allowed = 1                   # threads a large GEMM may use now
_calm = 0                      # calm samples in a row that would allow more threads
_others: float | None = None   # cores other processes kept busy in the last sample
_next_sample = -math.inf       # time.monotonic() after which the next sample is taken
_backoffs = 0                  # samples that took threads away (for info())


def set_num_threads(n: int) -> None:
    """Use ``n`` BLAS threads for every GEMM (and every BLAS call of this process) from now on.

    As ``torch.set_num_threads``: process-wide, until changed. ``reset_num_threads()`` returns to
    the default adaptive policy. Applied to every loaded BLAS library at once.

    Parameters
    ----------
    n : int
        Number of threads, ``n >= 1``.

    Raises
    ------
    TypeError
        ``n`` is not an int (a bool, float or string).
    ValueError
        ``n < 1``.
    ImportError
        ``threadpoolctl`` is not installed, so the BLAS threads cannot be changed.

    Examples
    --------
    >>> import linearkit as lk
    >>> lk.set_num_threads(1)
    >>> lk.get_num_threads()
    1
    >>> lk.threads.reset_num_threads()
    """
    n = _check(n, "set_num_threads")
    global _user
    _require()
    _user = n
    _apply(n)


def get_num_threads() -> int:
    """The number of BLAS threads linearkit's GEMMs may use.

    ``set_num_threads(n)``'s ``n`` when one is set; under the default adaptive policy the most a
    large GEMM uses on an idle machine (the BLAS's own count: ``OPENBLAS_NUM_THREADS`` or
    equivalent, else the number of cores) — small GEMMs, and every GEMM while other processes
    keep the cores busy, use one. Without ``threadpoolctl``, the BLAS's own default.
    """
    if _user is not None:
        return _user
    _ensure()
    return _blas_default


def get_policy() -> str:
    """``"fixed"`` (after ``set_num_threads``), ``"adaptive"`` (the default) or
    ``"blas-default"`` (no ``threadpoolctl``: BLAS decides, every core)."""
    if _user is not None:
        return "fixed"
    _ensure()
    return "blas-default" if _unavailable else "adaptive"


def reset_num_threads() -> None:
    """Return to the default adaptive policy (undoes ``set_num_threads``)."""
    global _user
    _user = None
    _refresh()
    if _setters:
        _apply(1)


@contextmanager
def num_threads(n: int | None):
    """``with num_threads(n):`` — ``set_num_threads(n)`` inside the block (``None``: the default
    policy), the previous setting restored afterwards, even on error."""
    if n is not None:
        n = _check(n, "num_threads")
    previous = _user
    if n is None:
        reset_num_threads()
    else:
        set_num_threads(n)
    try:
        yield
    finally:
        if previous is None:
            reset_num_threads()
        else:
            set_num_threads(previous)


def info() -> dict:
    """The policy's state, for reports: policy, threads (fixed count or adaptive ceiling), the
    count the libraries run now, what a large GEMM may use, the last load sample (cores other
    processes used), how often a sample took threads away, and each library's path."""
    _refresh()
    return {
        "policy": get_policy(),
        "num_threads": get_num_threads(),
        "current": _current,
        "allowed_large": _allowed if _user is None else _user,
        "small_gemm_macs": SMALL_GEMM_MACS,
        "other_busy_cores": _others,
        "backoffs": _backoffs,
        "libraries": sorted(_paths),
        "unavailable": _unavailable,
    }


# ------------------------------------------------------------------------------ the hot path
def before_gemm(macs: int) -> None:
    """Set the BLAS threads for a GEMM of ``macs`` multiply-adds (called by functional.py when
    ``macs >= switch_macs``; a few hundred ns when nothing changes)."""
    if _setters is None:
        _ensure()
        if _unavailable:
            return
    now = time.monotonic()
    if now >= _next_sample:
        _tick(now)
    if _user is not None:
        want = _user
    elif macs < SMALL_GEMM_MACS:
        want = 1
    else:
        want = _allowed
    if want != _current:
        _apply(want)


def _tick(now: float) -> None:
    """Every SAMPLE_S: pick up newly loaded libraries, re-read the machine's load."""
    global _next_sample
    _next_sample = now + SAMPLE_S
    if len(sys.modules) != _modules_seen:
        _find()
        if _current is not None:
            _apply(_current)
    if _user is None and _blas_default > 1:
        _sample()


def _sample() -> None:
    """Update ``_allowed`` from how busy other processes kept this process's cores: down at
    once, up after UP_SAMPLES calm samples in a row."""
    global _meter, _allowed, _calm, _others, _backoffs
    if _meter is None:
        _meter = LoadMeter()
    others = _meter.others()
    if others is None:
        _allowed = 1 if not _meter.available else _allowed
        return
    _others = others
    ncpu = len(_meter.cpus)
    cap = max(1, min(_blas_default, int(ncpu - others + BUSY_CORE)))
    if cap < _allowed:
        _allowed, _calm = cap, 0
        _backoffs += 1
    elif cap > _allowed:
        _calm += 1
        if _calm >= UP_SAMPLES:
            _allowed, _calm = cap, 0
    else:
        _calm = 0


# ---------------------------------------------------------------------------- the libraries
def _ensure() -> None:
    if _setters is None and _unavailable is None:
        _find()


def _refresh() -> None:
    """Find the libraries if not done yet, or again when modules were imported since."""
    if _setters is None or (_unavailable is None and len(sys.modules) != _modules_seen):
        _find()


def _require() -> None:
    _refresh()
    if _unavailable:
        raise ImportError(f"linearkit cannot change the BLAS threads: {_unavailable}. "
                          "Install it with `pip install threadpoolctl` (a dependency of "
                          "linearkit); without it BLAS uses its own default (every core)")


def _find() -> None:
    """Find every loaded BLAS library and its thread setter (once, and when modules grew)."""
    global _setters, _paths, _modules_seen, _blas_default, _unavailable, switch_macs
    _modules_seen = len(sys.modules)
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError as err:
        _unavailable = f"threadpoolctl is not installed ({err})"
        _blas_default = _default_guess()
        _setters = []
        switch_macs = math.inf
        return
    libs = ThreadpoolController().select(user_api="blas").lib_controllers
    paths = frozenset(lib.filepath for lib in libs)
    if _setters is not None and paths == _paths:
        return
    if _setters is None:  # the ceiling: what the libraries chose before linearkit touched them
        counts = [lib.num_threads for lib in libs if lib.num_threads]
        _blas_default = max(1, min(max(counts, default=1), len(cpu_ids())))
    _setters = [_setter(lib) for lib in libs]
    _paths = paths
    if _current is None:
        _apply(_user or 1)


def _default_guess() -> int:
    """What OpenBLAS/MKL pick by themselves: their environment variable, else every core."""
    for var in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(var, "").split(",")[0].strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return len(cpu_ids())


def _setter(lib):
    """The cheapest call that sets ``lib``'s threads: OpenBLAS's own C function (pthreads
    build, process-wide), else the threadpoolctl controller's method (OpenMP builds, MKL, BLIS,
    FlexiBLAS keep their own per-thread semantics there)."""
    if getattr(lib, "internal_api", None) == "openblas" and \
            getattr(lib, "threading_layer", None) != "openmp":
        fn = lib._get_symbol("openblas_set_num_threads")
        if fn is not None:
            return fn
    return lib.set_num_threads


def _apply(n: int) -> None:
    global _current, switch_macs
    for set_threads in _setters or ():
        set_threads(n)
    _current = n
    switch_macs = SMALL_GEMM_MACS if n == 1 or _user is not None else 0


def _check(n, where: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) and not _is_np_int(n):
        raise TypeError(f"{where} expects an int >= 1 (the number of BLAS threads), got "
                        f"{n!r} of type {type(n).__name__}; e.g. {where}(1)")
    if n < 1:
        raise ValueError(f"{where} expects an int >= 1 (the number of BLAS threads), got {n}; "
                         f"use 1 for one thread, or linearkit.backend.threads.reset_num_threads() for "
                         "the default policy")
    return int(n)


def _is_np_int(n) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(n, np.integer)
