"""Wall-clock timing for the measurements the library reports (``factorize``'s speed-ups,
``linearkit sweep``, the docs pages): medians of repeats, the candidates interleaved so that a
change in the machine's load hits all of them alike and their ratio stays honest."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["median_seconds", "same_run_seconds"]


def _loops(fn: Callable[[], object], min_seconds: float) -> int:
    """How many calls make one timed sample last at least ``min_seconds`` (one warm-up call)."""
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    return max(1, int(min_seconds / once))


def same_run_seconds(fns: Sequence[Callable[[], object]], repeats: int = 7,
                     min_seconds: float = 0.002) -> list[float]:
    """Median seconds per call of each of ``fns``, timed round-robin: every repeat times each
    candidate once (in turn), so all share the same moments of the machine's load."""
    loops = [_loops(fn, min_seconds) for fn in fns]
    samples = [[] for _ in fns]
    for _ in range(max(1, repeats)):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            for _ in range(loops[i]):
                fn()
            samples[i].append((time.perf_counter() - start) / loops[i])
    return [float(np.median(s)) for s in samples]


def median_seconds(fn: Callable[[], object], repeats: int = 7, min_seconds: float = 0.002
                   ) -> float:
    """Median seconds per call of ``fn`` over ``repeats`` samples."""
    return same_run_seconds([fn], repeats, min_seconds)[0]
