"""The tests' own count of what a backward closure keeps alive, independent of the ledger (and
of ``linearkit.core.closures``, which the ledger uses): the oracle the ledger's memory is checked
against in test_ledger, test_ledger_precision and test_rules."""

from __future__ import annotations

import numpy as np

from linearkit.core.module import Module, Parameter


def closure_bytes(backward, model) -> int:
    """Bytes a backward closure keeps alive: walk ``__closure__`` cells recursively, sum
    distinct arrays by underlying buffer, skip parameters and buffers (they are counted as
    weights)."""
    owned = {id(p.data) for p in model.parameters()} | {id(b) for b in model.buffers()}
    seen, found, stack = set(), {}, [backward]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, Module | Parameter):
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            root = obj
            while isinstance(root.base, np.ndarray):
                root = root.base
            if id(root) not in owned:
                found[id(root)] = root.nbytes
        elif getattr(obj, "__closure__", None):
            stack.extend(c.cell_contents for c in obj.__closure__)
        elif isinstance(obj, list | tuple):
            stack.extend(obj)
    return sum(found.values())
