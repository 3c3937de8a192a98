"""Medians over repeats after warm-up.

A case is a ``prepare(n) -> run`` pair: ``prepare`` does any per-repeat setup outside the timed
region (e.g. building the backward closures that a backward-only case consumes) and returns
``run()``, which performs ``n`` iterations and waits for their results. ``measure`` picks ``n`` so
one repeat lasts about ``min_time`` seconds, warms up, and reports the median time per iteration.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable

Prepare = Callable[[int], Callable[[], None]]


def _timed(run: Callable[[], None], gc_off: bool) -> float:
    if gc_off:
        gc.collect()
        gc.disable()
    try:
        start = time.perf_counter()
        run()
        return time.perf_counter() - start
    finally:
        if gc_off:
            gc.enable()


def calibrate(prepare: Prepare, *, min_time: float, warmup: int = 1, gc_off: bool = True,
              max_n: int = 1_000_000) -> int:
    """Warm ``prepare`` up and return the iteration count ``n`` for which one repeat
    (``prepare(n)()``) lasts about ``min_time`` seconds."""
    # first calls: compilation, lazy allocation, caches; two, since the second may take a path
    # the first did not (a backward accumulating into the gradient the first one created, which
    # loads the compiled kernels: ~0.3 s that would otherwise land in the calibration)
    _timed(prepare(2), gc_off)
    n, dt = 1, 0.0
    while True:
        dt = _timed(prepare(n), gc_off)
        if dt >= min_time / 4 or n >= max_n:
            break
        n = min(max_n, n * max(2, int(min_time / 4 / max(dt, 1e-9))))
    n = max(1, min(max_n, math.ceil(n * min_time / max(dt, 1e-9)))) if dt < min_time else n
    if dt < min_time:  # calibration already warmed a case whose one call lasts >= min_time
        for _ in range(warmup):
            _timed(prepare(n), gc_off)
    return n


def repeat(prepare: Prepare, n: int, gc_off: bool = True) -> float:
    """Seconds per iteration of one repeat of ``n`` iterations."""
    return _timed(prepare(n), gc_off) / n


def summary(times: list[float], n: int) -> dict:
    """The statistics ``measure`` reports, from per-iteration repeat times."""
    return {"median_s": statistics.median(times), "min_s": min(times), "n": n,
            "repeats_s": times}


def run_stats(times: list[float], steps: int) -> dict:
    """Statistics of whole runs of ``steps`` training steps (seconds per run)."""
    med = statistics.median(times)
    return {"median_s": med, "min_s": min(times), "repeats_s": times, "steps": steps,
            "ms_per_step": 1e3 * med / steps}


def measure(prepare: Prepare, *, repeats: int, min_time: float, warmup: int = 1,
            gc_off: bool = True, max_n: int = 1_000_000) -> dict:
    """Median seconds per iteration of ``prepare(n)()`` over ``repeats`` repeats.

    ``gc_off`` disables the cyclic garbage collector inside the timed region (as ``timeit``
    does) for micro-benchmarks; training loops keep it on, since collection is part of the cost.
    """
    n = calibrate(prepare, min_time=min_time, warmup=warmup, gc_off=gc_off, max_n=max_n)
    return summary([repeat(prepare, n, gc_off) for _ in range(repeats)], n)


def loop(n: int, step: Callable[[], object]) -> Callable[[], None]:
    """A ``run`` that calls ``step`` ``n`` times."""
    def run() -> None:
        for _ in range(n):
            step()
    return run
