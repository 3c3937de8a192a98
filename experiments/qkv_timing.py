"""One fused QKV GEMM against three, timed: the fused-projection numbers of docs/surgery.md.

``time_qkv`` builds three ``Linear(d, d)`` and the ``Linear(d, 3d)`` that ``fuse_qkv`` makes of
them, and times both forwards on the same float32 batch in one run.
"""

from __future__ import annotations

import numpy as np

from linearkit import Linear
from linearkit.analysis.timing import same_run_seconds
from linearkit.backend.threads import num_threads
from linearkit.transforms import fuse_qkv

__all__ = ["time_qkv"]


def time_qkv(d: int, batch: int, repeats: int = 7, *, threads: int | None = None,
             seed: int = 0) -> dict:
    """Seconds per forward of three ``Linear(d, d)`` against one fused ``Linear(d, 3d)`` on a
    float32 batch ``(batch, d)``: ``{'d', 'batch', 'threads', 'three_gemms_s', 'fused_s',
    'ratio'}`` (``ratio`` = three / fused; > 1 means fusing wins). Medians of ``repeats``, the
    two timed round-robin in the same run (``timing.same_run_seconds``). ``threads``: a fixed
    BLAS thread count for the run, or None for linearkit's adaptive policy (which may give the
    fused GEMM more threads than three smaller ones; see ``linearkit.backend.threads``)."""
    rng = np.random.default_rng(seed)
    q, k, v = (Linear(d, d, rng=rng) for _ in range(3))
    fused, _ = fuse_qkv(q, k, v)
    x = rng.standard_normal((batch, d)).astype(np.float32)

    def three():
        return q(x), k(x), v(x)

    with num_threads(threads):
        three_s, fused_s = same_run_seconds([three, lambda: fused(x)], repeats=repeats)
    return {"d": d, "batch": batch, "threads": threads, "three_gemms_s": three_s,
            "fused_s": fused_s, "ratio": three_s / fused_s}
