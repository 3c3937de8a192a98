"""What the ledger knows about a linearkit layer: its rule (``linearkit.rules``), put on a row.

The ledger keeps no per-layer knowledge of its own: the kind, the type text, the cost, the saved
arrays and the findings' inputs all come from ``rule_for(module)``.
"""

from __future__ import annotations

from ...rules import LayerRule, rule_for

__all__ = ["add_note", "describe", "fill_row", "rule_for"]


def describe(m, rule: LayerRule | None = None) -> str:
    """Compact type: 'Linear(784, 256)', 'LayerNorm((256,))'; the class name without a rule."""
    rule = rule if rule is not None else rule_for(m)
    return type(m).__name__ if rule is None else rule.describe_module(m)


def add_note(row, note: str) -> None:
    if note:
        row.note = f"{row.note}; {note}" if row.note else note


def fill_row(acc, i: int, rule: LayerRule, m, in_shape, need_dx: bool, keys=None) -> None:
    """Put what ``rule`` says about ``m`` on row ``i`` of ``acc``.

    Always the kind, the findings' info and weight and the note; with an input shape also the
    cost and, when ``keys`` is given (``{'input': key, 'output': key}``: the buffer keys of the
    call's input and output), the arrays the backward keeps, each counted once over the model.
    A rule without a cost or saved rule is recorded as unaccounted.
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
    if keys is None:
        return
    saved = None if rule.saved is None else rule.saved(m, in_shape, need_dx)
    if saved is None:
        acc.unsaved.append(row.path)
        return
    if row.saved_bytes is None:
        row.saved_bytes = 0
    for what, numel in saved:
        acc.keep(i, keys.get(what, (what, i)), int(numel) * acc.itemsize)
