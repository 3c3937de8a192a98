"""A popular claim, measured: "rank-64 factorization takes a 100 MB layer under 10 MB and
runs 3x faster".

``measure_factorization_claim`` builds a float32 ``Linear(n, n)`` (n = 5000: 100 MB of weight),
factorizes it with ``factorize`` and times both forwards on random batches, the two timed in
turn (same-run medians). The weight is the default init (uniform, full rank): the claim is about
size and speed, which do not depend on the values; the energy a random weight keeps at rank 64
is small (a trained weight keeps far more), and the result says so.

The SVD of a 5000 x 5000 weight takes about a minute on two cores.
"""

from __future__ import annotations

import os
import time

import numpy as np

from linearkit import Linear, get_num_threads
from linearkit.analysis.timing import same_run_seconds
from linearkit.transforms import factorize

__all__ = ["CLAIM", "measure_factorization_claim"]

CLAIM = "rank-64 factorization takes a 100 MB layer under 10 MB and runs 3x faster"


def measure_factorization_claim(n: int = 5000, rank: int = 64, batch=(64, 256),
                                repeats: int = 5, *, seed: int = 0) -> dict:
    """Factorize a float32 ``Linear(n, n)`` at ``rank`` and measure its size and speed.

    Parameters
    ----------
    n : int
        The layer's width (``n * n * 4`` bytes of weight: 100 MB at 5000).
    rank : int
        The factorization's rank.
    batch : int or sequence of int
        Batch sizes ``(B, n)`` the forward speed-up is measured at.
    repeats : int
        Timed samples per model and batch (medians reported).
    seed : int
        Seeds the layer's init and the random batches.

    Returns
    -------
    dict
        ``claim`` (the text), ``n``, ``rank``, ``bytes_before`` / ``bytes_after`` (the state
        dicts', bias included), ``size_ratio``, ``under_10MB`` (``bytes_after < 10e6``),
        ``energy_kept`` and ``rel_error`` of the factorized weight, ``svd_seconds`` (the
        whole ``factorize`` call), ``batches``: ``{B: {"ms_before", "ms_after",
        "speedup"}}``, ``threads`` (BLAS threads the GEMMs may use) and ``load_average``
        (``os.getloadavg()`` before and after the timings).
    """
    batches = [batch] if isinstance(batch, (int, np.integer)) else list(batch)
    layer = Linear(n, n, rng=np.random.default_rng(seed))
    start = time.perf_counter()
    pair, report = factorize(layer, rank=rank, timing=False)
    svd_seconds = time.perf_counter() - start
    if not report.layers:
        raise ValueError(f"rank {rank} does not save on Linear({n}, {n}): {report.left[0]}")
    load_before = os.getloadavg()
    rng = np.random.default_rng(seed + 1)
    timings = {}
    for b in batches:
        x = rng.standard_normal((int(b), n)).astype(np.float32)
        t_old, t_new = same_run_seconds([lambda x=x: layer(x), lambda x=x: pair(x)], repeats)
        timings[int(b)] = {"ms_before": t_old * 1e3, "ms_after": t_new * 1e3,
                           "speedup": t_old / t_new}
    entry = report.layers[0]
    return {"claim": CLAIM, "n": n, "rank": rank,
            "bytes_before": report.bytes_before, "bytes_after": report.bytes_after,
            "size_ratio": report.bytes_before / report.bytes_after,
            "under_10MB": report.bytes_after < 10e6,
            "energy_kept": entry["energy_kept"], "rel_error": entry["rel_error"],
            "svd_seconds": svd_seconds, "batches": timings, "threads": get_num_threads(),
            "load_average": (load_before, os.getloadavg())}
