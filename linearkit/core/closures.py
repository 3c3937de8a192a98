"""The arrays a backward closure keeps alive: one walker for the ledger (what it counts) and
``detect_anomaly`` (what it checks)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from .parameter import Parameter

__all__ = ["kept_arrays", "opaque"]

# Types a walk never enters: their arrays are weights, not what a closure keeps. Module adds
# itself when it is defined (``opaque``): this file sits below module.py and never imports it.
_OPAQUE: tuple[type, ...] = (Parameter,)


def opaque(cls: type) -> type:
    """Make ``kept_arrays`` stop at instances of ``cls`` (returns ``cls``)."""
    global _OPAQUE
    _OPAQUE = (*_OPAQUE, cls)
    return cls


def kept_arrays(fn, stop=None) -> Iterator[np.ndarray]:
    """Every ndarray reachable from the closure ``fn``: through closure cells, the lists,
    tuples, sets and dicts in them, and the functions they hold — never into a Module or a
    Parameter (their arrays are weights), nor into a function whose code is ``stop``. Each
    object is visited once; views are yielded as they are (their base is the caller's to
    follow)."""
    seen: set[int] = set()
    stack = [fn]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _OPAQUE):
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            yield obj
        elif callable(obj) and getattr(obj, "__closure__", None):
            if stop is not None and getattr(obj, "__code__", None) is stop:
                continue
            stack.extend(c.cell_contents for c in obj.__closure__ if _filled(c))
        elif isinstance(obj, list | tuple | set):
            stack.extend(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())


def _filled(cell) -> bool:
    """False for a closure cell whose variable was never assigned."""
    try:
        _ = cell.cell_contents
    except ValueError:
        return False
    return True
