"""Compile the kernels in a background process, for the next run, when this one ran without them.

numba compiles a kernel the first time it runs on a machine (several seconds for a training
step's kernels) and keeps it in its on-disk cache for every later process. So that a first
run does not wait for the compiler, ``compile_in_background(key, job)`` asks whether the
kernels of ``key`` are in numba's cache (``cache_marker.status``: one small file, no numba
import). When they are, it changes nothing. When they are not, the block runs with the kernels
held (``fast.held()``: the NumPy path, numba never imported in this process), and when it ends
a detached process, at the lowest priority, runs ``job()`` with the kernels on, which compiles
them into the cache, then runs ``job()`` once more in a fresh process that must load every
kernel and compile none. Only then is ``key`` marked warm, so the next run takes the compiled
path from its first step. Nothing waits for the background process: it outlives this one.

This process does not switch to the kernels when they become ready: the NumPy path and the
kernels do not give the same bits everywhere (the fused cross-entropy rounds once from float64:
docs/fast.md), so a run that switched would land where the moment of the switch put it.
The held run gives exactly the bits of a ``LINEARKIT_FAST=0`` run.

``LINEARKIT_BACKGROUND_COMPILE=0`` turns this off (the block runs as if it were not there: the
kernels compile on first use); so do ``LINEARKIT_FAST=0`` and a missing numba. The background
process compiles whatever ``job`` makes numba compile: it knows no list of kernels.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import subprocess
import sys
import tempfile
import time

from . import cache_marker

__all__ = ["ENV", "compile_in_background", "wanted"]

ENV = "LINEARKIT_BACKGROUND_COMPILE"
LOCK = "linearkit-compiling.lock"
STALE_SECONDS = 1800          # a lock this old is a background process that died
NICENESS = 19                 # where SCHED_IDLE is missing: the lowest priority
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
_children: list = []          # the background processes this one started (reaped when done)
# The background processes' program. It lowers its priority first, before numpy starts
# OpenBLAS's threads (a thread keeps the policy it was created with): Linux's SCHED_IDLE, so
# that it runs only on a CPU with nothing else to run, else the lowest nice level.
_ENTRY = """import os, sys
try:
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
except (AttributeError, OSError):
    try:
        os.nice({niceness})
    except (AttributeError, OSError):
        pass
sys.path.insert(0, {root!r})
from linearkit.backend.fast import background
sys.exit(background.{name}(sys.argv[1]))
"""


def wanted() -> bool:
    """Whether a cold cache would be compiled in the background here: ``LINEARKIT_BACKGROUND_COMPILE``
    is not 0, the kernels are enabled and numba is installed, and this process has not loaded
    the kernels already."""
    from . import available, loaded

    return (os.environ.get(ENV, "1").strip() != "0" and available() and loaded() is None)


@contextlib.contextmanager
def compile_in_background(key: str, job):
    """Run the block on the NumPy path, then compile the kernels in the background, when the
    kernels of ``key`` are not in numba's cache yet; yields whether it does.

    Parameters
    ----------
    key : str
        Names the job's kernels, e.g. ``"train model=mlp precision=fp32 batch=100"``: what
        makes numba compile other kernels (model depth, dtypes, batch-size routes) belongs in
        it; widths and learning rates do not.
    job : callable
        Picklable (a module-level function, or a ``functools.partial`` of one, with picklable
        arguments), taking no argument: a short run (a few steps) that uses the kernels the
        block would. Run only in the background processes.
    """
    where = cache_marker.cache_dir() if wanted() else None
    stamp = cache_marker.fingerprint() if where is not None else None
    if stamp is None or cache_marker.status(where, key, stamp) != "cold":
        yield False
        return
    payload = pickle.dumps({"key": key, "fingerprint": stamp, "cache_dir": where, "job": job})
    from . import held

    with held():
        yield True
    # Started only now: a compile beside the run slowed it where the machine had a CPU to
    # spare (docs/fast.md, "The first run"); an error in the block starts none.
    if not _start(where, payload):
        with contextlib.suppress(OSError):     # the next run compiles in the foreground
            cache_marker.record(where, key, stamp, "the background process could not start")


def _start(where: str, payload: bytes) -> bool:
    """Start the background compile of ``payload`` (the pickled job) unless one is running
    already, for any key: True when one runs now, False when none could start."""
    try:
        os.makedirs(where, exist_ok=True)
        lock = _take_lock(where)
    except OSError:
        return False
    if lock is None:
        return True        # another process compiles now (this key's next run starts one)
    path = None
    try:
        fd, path = tempfile.mkstemp(prefix="linearkit-compile-", suffix=".pickle")
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        child = subprocess.Popen(
            [sys.executable, "-c", _entry("_compile_job"), path],
            env=_child_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, close_fds=True, start_new_session=True)
    except OSError:
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)
        _release(lock, None)
        return False
    with open(lock, "w", encoding="utf-8") as f:       # the lock now names the compiler
        f.write(f"{child.pid} {time.time()}")
    _children[:] = [c for c in _children if c.poll() is None] + [child]   # never waited for
    return True


def _entry(name: str) -> str:
    return _ENTRY.format(niceness=NICENESS, root=_PACKAGE_ROOT, name=name)


def _child_env() -> dict:
    env = dict(os.environ)
    env[ENV] = "0"                     # the background process never starts another
    return env


def _take_lock(where: str) -> str | None:
    """The lock file's path once created, or None while a live background process holds it (a
    stale one, whose process is gone or which is older than ``STALE_SECONDS``, is replaced)."""
    path = os.path.join(where, LOCK)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if not _stale(path):
                return None
            with contextlib.suppress(OSError):
                os.unlink(path)
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(f"{os.getpid()} {time.time()}")
        return path
    return None


def _stale(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            pid, started = f.read().split()
        pid, started = int(pid), float(started)
    except (OSError, ValueError):
        try:                           # being written right now, or garbage: judge by age
            return time.time() - os.stat(path).st_mtime > STALE_SECONDS
        except OSError:
            return True
    if time.time() - started > STALE_SECONDS:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:                    # alive, someone else's
        return False
    return False


def _release(lock: str, pid: int | None) -> None:
    """Remove the lock (only if ``pid``, when given, still holds it)."""
    try:
        if pid is not None:
            with open(lock, encoding="utf-8") as f:
                if int(f.read().split()[0]) != pid:
                    return
        os.unlink(lock)
    except (OSError, ValueError, IndexError):
        pass


def _load(path: str) -> dict:
    """The job the parent wrote: its own file (``tempfile.mkstemp``: mode 0600, a new name),
    never a file from elsewhere, so unpickling it trusts nothing the parent did not."""
    with open(path, "rb") as f:
        return pickle.load(f)


def _compile_job(path: str) -> int:
    """The background process: run the job (numba compiles into its cache), check the cache in
    a fresh process, record the result in the marker. Returns the exit status."""
    job = _load(path)
    where, key, stamp = job["cache_dir"], job["key"], job["fingerprint"]
    lock = os.path.join(where, LOCK)
    try:
        try:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                job["job"]()
            result = _check_in_fresh_process(path)
        except Exception as err:  # noqa: BLE001 -- any failure is recorded: no run retries it
            result = f"the job raised {type(err).__name__}: {err}"
        if cache_marker.fingerprint() == stamp:     # the sources did not change meanwhile
            cache_marker.record(where, key, stamp, result,
                                cache_marker.index_files(where) if result == "ok" else ())
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        _release(lock, os.getpid())
    return 0 if result == "ok" else 1


def _check_in_fresh_process(path: str) -> str:
    """``"ok"`` when a new process runs the job compiling nothing (every kernel loaded from
    numba's cache), else why not."""
    run = subprocess.run(
        [sys.executable, "-c", _entry("_fresh_process"), path],
        env=_child_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900,
        check=False)
    if run.returncode == 0:
        return "ok"
    lines = (run.stdout + run.stderr).strip().splitlines()
    return f"a fresh process {lines[-1] if lines else f'exited with {run.returncode}'}"


def _fresh_process(path: str) -> int:
    """Run the job and say which kernels numba compiled (none, when the cache is complete)."""
    import warnings

    from numba.core import event

    job = _load(path)
    with event.install_recorder("numba:compile") as compiles, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        job["job"]()
    names = sorted({e.data["dispatcher"].py_func.__qualname__ for _, e in compiles.buffer})
    if names:
        print(f"compiled {', '.join(names)} again: numba's cache did not keep them")
        return 3
    return 0
