"""``linearkit.detect_anomaly()``: name the first module that produces a NaN or Inf.

Off by default (IEEE propagation, as in PyTorch). Inside the context every module's forward
output and every 16-bit array its backward closure keeps (``check_kept``), and in backward every
input gradient and parameter gradient it writes, is checked; the first non-finite value raises
``AnomalyError`` naming the module's path and the pass.

16-bit runs (``linearkit.precision``): outputs are float32, but what a layer keeps for its
backward may be a float16/bfloat16 copy (``precision.policy(activations=...)``) and gradients
may be stored in float16/bfloat16 (``grads="storage"``). A float32 value beyond ±65504 is
finite, yet its float16 copy is inf: the kept 16-bit arrays are checked at forward time, so the
layer that kept the inf is named there — not a later layer whose weight gradient the inf reaches
first in backward (which runs in reverse), nor the layer where the loss turns NaN steps later.
(Kept float32/float64 arrays are the outputs already checked, or things a module may hold on
purpose, such as a -inf attention mask: they are not checked.) bfloat16 arrays (NumPy dtype
kind ``'V'``) are cast to float32 for the check (exactly).

Cost: one ``isfinite`` pass over each output, kept array and gradient — a debugging mode.
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


def _float_view(a: np.ndarray) -> np.ndarray | None:
    """``a`` as an array ``np.isfinite`` takes (bfloat16 cast to float32), None when it has no
    non-finite values to look for (integers, booleans, empty)."""
    if a.size == 0:
        return None
    if a.dtype.kind in "fc":
        return a
    if a.dtype.kind == "V" and a.dtype.itemsize == 2 and a.dtype.name == "bfloat16":
        return a.astype(np.float32)  # exact; np.isfinite may not take kind 'V'
    return None


def _describe(a: np.ndarray, what: str) -> str | None:
    """``what`` has ... non-finite value(s), first ... — or None when ``a`` is all finite."""
    checked = _float_view(a)
    if checked is None:
        return None
    bad = ~np.isfinite(checked)
    if not bad.any():
        return None
    index = tuple(int(i) for i in np.argwhere(bad)[0])
    return (f"{what} of shape {a.shape} has {int(bad.sum())} non-finite value(s), first "
            f"{checked[index]} at index {index}")


def first_nonfinite(value) -> str | None:
    """Describe the first non-finite entry of an array (or tuple of arrays), or None.

    float16, float32, float64, complex and bfloat16 arrays are checked; others are skipped.
    """
    arrays = value if isinstance(value, tuple) else (value,)
    for k, a in enumerate(arrays):
        if a is None:
            continue
        label = f"[{k}]" if len(arrays) > 1 else ""
        problem = _describe(np.asarray(a), f"output{label}")
        if problem is not None:
            return problem
    return None


def first_nonfinite_kept(backward, stop=None) -> str | None:
    """Describe the first non-finite 16-bit array the closure ``backward`` keeps, or None.

    Walks the closure cells (and the lists, tuples and dicts in them) of ``backward`` and of
    the functions it holds, not into modules or parameters (their arrays are weights), nor into
    functions whose code is ``stop`` (another module's guarded backward: checked at its own
    forward). A 16-bit kept copy names its dtype and the policy that made it.
    """
    from .. import precision
    from .closures import kept_arrays

    for obj in kept_arrays(backward, stop):
        if obj.itemsize != 2 or not precision.is_16bit(obj.dtype):
            continue
        problem = _describe(obj, f"an array kept for the backward ({obj.dtype})")
        if problem is not None:
            return problem + _kept_hint(obj)
    return None


def _kept_hint(a: np.ndarray) -> str:
    from .. import precision

    keep = precision.get_policy().activations
    if keep is None or a.dtype != keep:
        return ""
    return (f" — a {keep} copy kept under precision.policy(activations={keep.name!r}): its "
            f"input is finite in float32 but beyond {keep}'s range; "
            f"linearkit.analysis.range_check(model, x, dtype={_code(keep)}) shows which layer "
            f"made it")


def _code(dtype: np.dtype) -> str:
    return f"np.{dtype.name}" if dtype.kind == "f" else repr(dtype.name)


def check_kept(module, backward, stop=None) -> None:
    """Raise ``AnomalyError`` (located at ``module``) when ``module``'s backward closure keeps a
    non-finite 16-bit array (``first_nonfinite_kept``); called by the vjp wrapper under
    ``detect_anomaly()``, after the output is checked."""
    problem = first_nonfinite_kept(backward, stop)
    if problem is not None:
        from ..errors import AnomalyError

        err = AnomalyError(f"detect_anomaly: forward {problem}", module=module)
        err.locate(module)
        raise err
