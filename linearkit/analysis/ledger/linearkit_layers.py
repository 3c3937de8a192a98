"""What the ledger knows about a linearkit layer: its rule (``linearkit.rules``), put on a row.

The ledger keeps no per-layer knowledge of its own: the kind, the type text, the cost, the saved
arrays and the findings' inputs all come from ``rule_for(module)``.
"""

from __future__ import annotations

import numpy as np

from ... import precision as P
from ...rules import LayerRule, rule_for

__all__ = ["add_note", "describe", "fill_row", "rule_for"]


def describe(m, rule: LayerRule | None = None) -> str:
    """Compact type: 'Linear(784, 256)', 'LayerNorm((256,))'; the class name without a rule."""
    rule = rule if rule is not None else rule_for(m)
    return type(m).__name__ if rule is None else rule.describe_module(m)


def add_note(row, note: str) -> None:
    if note:
        row.note = f"{row.note}; {note}" if row.note else note


def fill_row(acc, i: int, rule: LayerRule, m, in_shape, need_dx: bool, values=None) -> None:
    """Put what ``rule`` says about ``m`` on row ``i`` of ``acc``.

    Always the kind, the findings' info and weight and the note; with an input shape also the
    cost and, when ``values`` is given (``{'input': x, 'output': y}``: the call's symbolic input
    and output, each with ``.key``, its buffer, and ``.dtype``), the arrays the backward keeps,
    each counted once over the model, in the dtype it is kept in (``kept_as``). A rule without a
    cost or saved rule is recorded as unaccounted.
    """
    row = acc.rows[i]
    row.kind = rule.kind
    if rule.info is not None:
        row.info = dict(rule.info(m, in_shape))
    if rule.weight is not None:
        w = rule.weight(m)
        if w is not None:
            acc.linear_weights[i] = w
    if rule.note is not None:
        add_note(row, rule.note(m, in_shape))
    if in_shape is None:
        return
    if rule.cost is None:
        acc.unaccounted.append(row.path)
    else:
        acc.add_cost(i, rule.cost(m, in_shape, need_dx))
    if values is None:
        return
    saved = None if rule.saved is None else rule.saved(m, in_shape, need_dx)
    if saved is None:
        acc.unsaved.append(row.path)
        return
    if row.saved_bytes is None:
        row.saved_bytes = 0
    for entry in saved:
        key, dtype = kept_as(i, entry, values)
        acc.keep(i, key, int(entry[1]) * dtype.itemsize)


def kept_as(i: int, entry, values) -> tuple:
    """``(buffer key, dtype)`` of one ``saved`` entry ``(what, numel[, dtype])`` of row ``i``.

    'input' and 'output' are those arrays (their key and dtype), another name is the layer's
    own array in its compute dtype (the output's). An explicit dtype other than that, or
    ``'activation'`` under ``precision.policy(activations=...)`` (what
    ``precision.saved_activation`` does: a rounded copy unless the array already has that
    dtype), is a new array of that dtype, this layer's own.
    """
    what = entry[0]
    how = entry[2] if len(entry) > 2 else None
    value = values.get(what)
    if value is not None:
        key, dtype = value.key, value.dtype
    else:
        key, dtype = (what, i), values["output"].dtype
    if how == "activation":
        how = P.current.activations
    if how is not None and np.dtype(how) != dtype:
        key, dtype = (key, np.dtype(how).name, i), np.dtype(how)
    return key, dtype
