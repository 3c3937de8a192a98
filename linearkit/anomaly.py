"""``linearkit.detect_anomaly()``: name the first module that produces a NaN or Inf.

Off by default (IEEE propagation, as in PyTorch). Inside the context every module's forward
output, and in backward every input gradient and parameter gradient it writes, is checked;
the first non-finite value raises ``AnomalyError`` naming the module and the pass.
"""

from __future__ import annotations

import contextlib

import numpy as np

enabled = False


@contextlib.contextmanager
def detect_anomaly(enable: bool = True):
    """Context manager: raise ``AnomalyError`` at the first module producing NaN/Inf.

    Example::

        with linearkit.detect_anomaly():
            pred, back = model.vjp(x)
            back(loss_back())
    """
    global enabled
    previous, enabled = enabled, enable
    try:
        yield
    finally:
        enabled = previous


def first_nonfinite(value) -> str | None:
    """Describe the first non-finite entry of an array (or tuple of arrays), or None."""
    arrays = value if isinstance(value, tuple) else (value,)
    for k, a in enumerate(arrays):
        if a is None:
            continue
        a = np.asarray(a)
        if a.dtype.kind not in "fc" or a.size == 0:
            continue
        bad = ~np.isfinite(a)
        if bad.any():
            index = tuple(int(i) for i in np.argwhere(bad)[0])
            label = f"[{k}]" if len(arrays) > 1 else ""
            return f"output{label} of shape {a.shape} has {int(bad.sum())} non-finite value(s), first {a[index]} at index {index}"
    return None
