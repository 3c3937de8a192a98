"""Two small modules of the kind a user writes around a ModuleList or a ModuleDict, for the case
table (``analysis.cases``): the containers have no forward (as in PyTorch), so the conformance
tests and ``linearkit gradcheck`` reach them through a module whose forward and vjp call their
children. Each is what its torch reference in tests/test_conformance.py computes, with the same
child names.

These are users' modules, not layers: they have no ``LayerRule``, so model files keep their
weights without the architecture and ONNX export refuses them by name.
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np

from .. import layers as L
from ..core.module import Module
from ..layers.container import trains

__all__ = ["HeadsDict", "LoopList"]


class LoopList(Module):
    """``x = tanh(layer(x))`` for each layer of a ModuleList, in order (one shared Tanh).

    Shape: x ``(*, widths[0])`` -> y ``(*, widths[-1])``.
    """

    def __init__(self, widths=(4, 6, 3), *, dtype=np.float32, rng=None):
        super().__init__()
        self.layers = L.ModuleList([L.Linear(a, b, dtype=dtype, rng=rng)
                                    for a, b in pairwise(widths)])
        self.act = L.Tanh()

    def forward(self, x):
        for layer in self.layers:
            x = self.act(layer(x))
        return x

    def vjp(self, x, input_grad: bool = True):
        """The forward and ``backward(dy) -> dx`` through each layer in reverse; a layer gets
        ``input_grad=False`` when nothing before it needs a gradient (as Sequential's rule)."""
        backs, need = [], input_grad
        for layer in self.layers:
            h, back_layer = layer.vjp(x, input_grad=need)
            x, back_act = self.act.vjp(h)
            backs.append((back_layer, back_act))
            need = need or trains(layer)

        def backward(dy):
            for back_layer, back_act in reversed(backs):
                dy = back_layer(back_act(dy))
                if dy is None:
                    return None
            return dy

        return x, backward


class HeadsDict(Module):
    """Each head of a ModuleDict on the same input, their outputs concatenated in key order.

    Shape: x ``(*, in_features)`` -> y ``(*, sum of the heads' out_features)``.
    """

    def __init__(self, in_features=4, outs=(("mean", 2), ("scale", 3)), *, dtype=np.float32,
                 rng=None):
        super().__init__()
        self.heads = L.ModuleDict({name: L.Linear(in_features, n, dtype=dtype, rng=rng)
                                   for name, n in outs})

    def forward(self, x):
        return np.concatenate([head(x) for head in self.heads.values()], axis=-1)

    def vjp(self, x, input_grad: bool = True):
        """The forward and ``backward(dy) -> dx``: ``dy`` split by head, their ``dx`` summed."""
        ys, backs = [], []
        for head in self.heads.values():
            y, back = head.vjp(x, input_grad=input_grad)
            ys.append(y)
            backs.append(back)
        ends = np.cumsum([y.shape[-1] for y in ys])[:-1]

        def backward(dy):
            parts = np.split(dy, ends, axis=-1)
            dxs = [back(np.ascontiguousarray(part)) for back, part in zip(backs, parts)]
            return sum(dxs[1:], dxs[0]) if input_grad else None

        return np.concatenate(ys, axis=-1), backward
