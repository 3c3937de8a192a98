"""Where the step kernel (backend/fast/step_kernel.py) finds its scratch memory: per batch size,
one int64 ``layout``, one ``work`` array of the compute dtype and one float64 ``sums`` array,
made once by runtime/compiled_step.py and reused by every step of that size. No numba here:
the runtime plans with it before any kernel is loaded.

``work`` holds, each region starting on a 64-byte boundary: GEMM's alpha and beta (1 and 0 in
the dtype), the chain's workspace ``ws`` (``chain_flags.workspace_per_row`` elements a row),
the logits ``out (B, C)``, the loss's exponentials and then its gradient ``exps (B, C)``, and
the bias GEMV's ``ones (B,)``. ``sums`` holds the loss's row sums and target gaps, ``(B,)``
each.

``layout`` is ``[start of ws, out, exps, ones, end | flags (n,) | adam (n, 2)]`` for a
chain of ``n`` layers: ``flags`` as ``compiled_chain.Plan.flags_for`` gives them for ``B``
rows, ``adam[i]`` where layer ``i``'s weight and bias start in Adam's flat arrays (-1: not
stepped).
"""

from __future__ import annotations

import numpy as np

__all__ = ["ALPHA", "BETA", "END", "EXPS", "HEADER", "ONES", "OUT", "WS", "arrays"]

WS, OUT, EXPS, ONES, END = range(5)              # layout[k]: where region k starts in work
HEADER = 5                                       # layout[HEADER:]: the flags, then adam
ALPHA, BETA = 0, 1                               # work[ALPHA] = 1, work[BETA] = 0
_ALIGN = 64                                      # bytes


def arrays(weights, flags, ws_per_row: int, rows: int, dtype, adam) -> tuple:
    """``(layout, work, sums)`` for a batch of ``rows``: ``weights`` the chain's ``(out, in)``
    arrays, ``flags (n,)`` for this many rows, ``adam (n, 2)`` int64 (above)."""
    dtype = np.dtype(dtype)
    step = _ALIGN // dtype.itemsize

    def up(n):
        return -(-n // step) * step

    classes = weights[-1].shape[0]
    starts = [step]                                  # the header: alpha, beta
    for size in (rows * ws_per_row, rows * classes, rows * classes, rows):
        starts.append(starts[-1] + up(size))
    n = len(weights)
    layout = np.empty(HEADER + 3 * n, np.int64)
    layout[:HEADER] = starts
    layout[HEADER:HEADER + n] = flags
    layout[HEADER + n:] = np.asarray(adam, np.int64).reshape(-1)
    work = _aligned(starts[END], dtype)
    work[ALPHA], work[BETA] = 1, 0
    work[starts[ONES]:starts[ONES] + rows] = 1
    return layout, work, np.empty(2 * rows)


def _aligned(n: int, dtype) -> np.ndarray:
    """``np.empty(n, dtype)`` starting on a 64-byte boundary."""
    raw = np.empty(n * dtype.itemsize + _ALIGN, np.uint8)
    skip = -raw.ctypes.data % _ALIGN
    return raw[skip:skip + n * dtype.itemsize].view(dtype)
