"""The rule of ``Checkpoint`` (activation checkpointing: ``linearkit.training.checkpointing``).

Its kind, ``'checkpoint'``, tells the ledger that the children's saved arrays are recomputed in
the backward rather than held from the forward, and its ``compose`` walks the wrapped module as
``Checkpoint.vjp``'s recompute does, so every child gets its own row (parameters, FLOPs, the
arrays it keeps while the segment's backward runs). The ledger's convention for a model with
checkpointed segments (``analysis.ledger``'s ``Acc.end_recompute``):

* **held** (saved from the forward to the backward): each segment's input, counted once over the
  model like any saved array (the layer before may already keep it), and the saved arrays of the
  layers outside every segment; the segment's row shows what it holds, its children's rows what
  they keep during its backward;
* **recompute peak**: the segment's backward recomputes its activations, one segment at a time,
  so the largest segment's (with, inside it, the largest segment nested in it) is added once to
  ``memory['activations']``, the memory saved for backward at its peak. The segment's input is
  not counted twice; its output is: the recompute makes a new array beside the one the next layer
  keeps;
* **cost**: the recompute is a second forward of the segment, added to the row's (and the
  totals') backward MACs and FLOPs.

A segment with nothing to train, asked for no input gradient, keeps nothing and recomputes
nothing, as ``Checkpoint.vjp`` does. ONNX export and model files see through the wrapper: the
graph is the wrapped module's, and a model file stores the ``Checkpoint`` and its child.
"""

from __future__ import annotations

import math

from ..layers.container import trains
from ..training.checkpointing import Checkpoint
from .cost_rules import ZERO
from .rebuild import Rebuild
from .registry import LayerRule

__all__ = ["CHECKPOINT", "RULES"]


def _compose(m, x, need_dx, visit):
    y = visit(m.module, "module", x, need_dx)
    if x is None:
        return None
    # The forward's output is the segment's; the recompute makes another (a new array).
    return y if y.key == x.key else tuple(y.shape)


def _saved(m, shape, need_dx):
    if not need_dx and not trains(m.module):
        return []
    return [("input", math.prod(shape))]


def _describe(m) -> str:
    return f"Checkpoint({type(m.module).__name__})"


def _build(cls, args, children):
    if list(children) != ["module"]:
        raise ValueError(f"a Checkpoint has one child, 'module'; got {', '.join(children) or 'none'}")
    return cls(children["module"])


CHECKPOINT = LayerRule(
    kind="checkpoint",
    describe=_describe,
    compose=_compose,
    cost=lambda m, shape, need_dx: ZERO,  # its own share; the ledger adds the recompute
    saved=_saved,
    note=lambda m, shape: "recomputed in backward",
    onnx=lambda m, g, x: g.visit(m.module, "module", x),
    rebuild=Rebuild(lambda m: {}, _build),
)

RULES = [(Checkpoint, CHECKPOINT)]
