"""The busy-machine group's machinery: one background process spinning on a core, and how busy
other processes kept the cores while a case ran.

A ``Plan`` times each case twice, on the machine as it is ("idle") and with a ``Spinner``
running ("busy"), and records beside each median the cores other processes used meanwhile
(``other_cores``: the spinner alone is ~1.0; more than ~0.2 in an "idle" row means someone
else was competing and that row is pessimistic).

An "idle" measurement starts ``SETTLE_S`` after the previous case's spinner stopped: "idle"
means idle for as long as a thread policy looks before it trusts the quiet (linearkit's goes back
to two threads after two calm samples 0.2 s apart: 0.46 s measured). Without the pause the
idle row of the case after a busy one timed the policy still on one thread for its first half
second (mlp128: 1.98 ms, its 1-thread time, against 1.55 ms at two threads).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from typing import Self

SETTLE_S = 0.6   # seconds of quiet before each "idle" measurement

# The spinner: a busy loop that also exits by itself when its parent is gone (a worker killed
# by the parent's timeout cannot run its ``finally``) or after ``limit`` seconds.
_SPIN = """
import os, sys, time
parent, stop = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
while os.getppid() == parent and time.monotonic() < stop:
    for _ in range(200_000):
        pass
"""


class Spinner:
    """``with Spinner():`` — one process spinning on a core for the duration of the block.

    Started here, killed here by its PID (SIGKILL) in ``__exit__`` whatever happened inside.
    """

    def __init__(self, limit_s: float = 900.0):
        self.limit_s = limit_s
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Self:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SPIN, str(os.getpid()), str(self.limit_s)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.3)  # interpreter start-up: let it reach its loop before timing starts
        if self.proc.poll() is not None:
            raise RuntimeError(f"the spinner exited at once (code {self.proc.returncode})")
        return self

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # SIGKILL to self.proc.pid
        if self.proc is not None:
            self.proc.wait()


def _cpu_lines() -> tuple:
    try:
        ids = sorted(os.sched_getaffinity(0))
    except AttributeError:
        ids = range(os.cpu_count() or 1)
    return tuple(f"cpu{i} ".encode() for i in ids)


_CPUS = _cpu_lines()
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def busy_seconds() -> float | None:
    """Busy CPU seconds of this process's cores since boot (/proc/stat), None without it."""
    try:
        with open("/proc/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    busy = 0
    for line in text.split(b"\n"):
        if line.startswith(_CPUS):
            v = line.split()
            busy += sum(int(x) for x in v[1:4]) + sum(int(x) for x in v[6:9])
    return busy / _TICK


class OtherLoad:
    """``with OtherLoad() as load:`` then ``load.cores``: the cores other processes kept busy
    during the block, on average (this process's own CPU time subtracted)."""

    cores: float | None = None

    def __enter__(self) -> Self:
        self._start = (time.monotonic(), busy_seconds(), time.process_time())
        return self

    def __exit__(self, *exc) -> None:
        t0, b0, p0 = self._start
        b1 = busy_seconds()
        if b0 is None or b1 is None:
            return
        dt = time.monotonic() - t0
        if dt > 0:
            self.cores = max(0.0, (b1 - b0) - (time.process_time() - p0)) / dt


class Plan:
    """The busy group of one framework: ``add`` its cases, then ``run`` them.

    Each case is timed as a pair: idle, then at once with one ``Spinner`` (so a drift of the
    machine's speed over minutes does not enter its ratio). ``cfg["busy_rounds"]`` rounds run
    every pair, in reversed order every other round; each (case, state) keeps its least
    disturbed round (the lowest median, as ``--rounds`` does), with every round's median under
    ``round_medians_s``. Results land under ``{name}:idle`` and ``{name}:busy``, each with
    ``other_cores`` (the cores other processes used meanwhile).
    """

    def __init__(self, rec):
        self.rec = rec
        self.cases: list[tuple] = []

    def add(self, name: str, build, *args, setting=contextlib.nullcontext, train: bool = True,
            **meta) -> None:
        """``build(*args)`` returns a ``prepare`` (benchmarks.timing); ``setting()`` is a
        context held around both measurements (e.g. a thread count); ``train`` selects the
        training steps' timing (garbage collector on, longer repeats)."""
        self.cases.append((name, build, args, setting, train, meta))

    def run(self) -> None:
        rec = self.rec
        if self.cases:  # the process's first second runs slow (allocation, clocks): not timed
            name, build, args, setting, _, _ = self.cases[0]
            with setting():
                _warm(build(*args))
        found: dict[str, list[dict]] = {}
        for r in range(max(1, rec.cfg.get("busy_rounds", 1))):
            for name, build, args, setting, train, meta in \
                    (self.cases if r % 2 == 0 else self.cases[::-1]):
                for state in ("idle", "busy"):
                    key = f"{name}:{state}"
                    if state == "idle":
                        time.sleep(SETTLE_S)
                    spin = Spinner() if state == "busy" else contextlib.nullcontext()
                    with setting(), spin, OtherLoad() as load:
                        rec.time(key, build, *args, train=train, **meta)
                    if key in rec.results:
                        found.setdefault(key, []).append(
                            {**rec.results.pop(key), "other_cores": load.cores})
        for key, results in found.items():
            best = dict(min(results, key=lambda res: res["median_s"]))
            best["round_medians_s"] = [res["median_s"] for res in results]
            rec.results[key] = best
            rec.errors.pop(key, None)


def _warm(prepare, seconds: float = 1.0) -> None:
    start, n = time.perf_counter(), 1
    while time.perf_counter() - start < seconds:
        prepare(n)()
        n *= 2
