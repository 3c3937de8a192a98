"""The rule of ``LoRALinear`` (a frozen Linear plus a trainable low-rank update).

It is a container-ish layer: ``compose`` walks its four children as ``LoRALinear.vjp`` calls
them — ``base_layer(x)``, ``lora_dropout(x)``, ``lora_A`` on that, ``lora_B`` on A's output — so
the ledger counts each child with its own rule: the frozen base's parameters as frozen, with no
saved activation and no dW GEMM; ``lora_A``/``lora_B`` trainable, ``lora_A`` keeping its input
(the same array as the layer's input when there is no dropout). The layer's own share is the
update's scale and add: ``2·B·out`` elementwise FLOPs forward, ``B·out`` (``dy·scaling``) plus
``B·in`` (summing the two input gradients, when dX is needed) backward; its closure keeps nothing
of its own.

Its kind is ``'lora'``, not ``'linear'``: the findings read ``'linear'`` rows as plain Linears
that ``merge_linear`` / ``factorize`` may edit; merge the adapter first (``merge_lora``).
A model file stores ``rank``, ``alpha`` and ``dropout`` and the four children (their weights in
the tensors), so ``linearkit.save`` / ``linearkit.load_model`` round-trip an adapted model.
"""

from __future__ import annotations

import numpy as np

from ..layers.container import trains
from ..layers.linear import Identity, Linear
from ..layers.lora import LoRALinear
from .cost_rules import lead
from .rebuild import Rebuild
from .registry import LayerRule

__all__ = ["LORA_LINEAR", "RULES"]


def _describe(m) -> str:
    return f"LoRALinear({m.in_features}, {m.out_features}, r={m.rank})"


def _compose(m, x, need_dx, visit):
    y = visit(m.base_layer, "base_layer", x, need_dx)
    d = visit(m.lora_dropout, "lora_dropout", x, need_dx)
    a = visit(m.lora_A, "lora_A", d, need_dx)
    visit(m.lora_B, "lora_B", a, need_dx or trains(m.lora_A))
    return None if x is None else tuple(y.shape)  # y + B(A(x))·scaling: a new array


def _output_shape(m, shape):
    m.base_layer.check_input_shape(shape)
    return tuple(shape[:-1]) + (m.out_features,)


def _cost(m, shape, need_dx):
    rows = lead(shape)
    backward = rows * m.out_features + (rows * m.in_features if need_dx else 0)
    return 0, 0, 0, 2 * rows * m.out_features, 0, backward


def _args(m) -> dict:
    return {"rank": m.rank, "alpha": m.alpha, "dropout": m.dropout}


def _build(cls, args, children):
    """A LoRALinear around the rebuilt base, holding the rebuilt children (weights load next)."""
    names = ("base_layer", "lora_dropout", "lora_A", "lora_B")
    if sorted(children) != sorted(names):
        raise ValueError(f"a LoRALinear has the children {', '.join(names)}; got "
                         f"{', '.join(children) or 'none'}")
    base, a, b = children["base_layer"], children["lora_A"], children["lora_B"]
    m = cls(base, **args)
    for name, child, want in (("lora_A", a, (m.in_features, m.rank)),
                              ("lora_B", b, (m.rank, m.out_features))):
        if type(child) is not Linear or child.has_bias \
                or (child.in_features, child.out_features) != want:
            raise ValueError(f"{name} must be Linear({want[0]}, {want[1]}, bias=False) for "
                             f"rank={m.rank} around {base!r}, got {child!r}")
        setattr(m, name, child)
    drop = children["lora_dropout"]
    if not isinstance(drop, Identity) and getattr(drop, "p", None) != m.dropout:
        raise ValueError(f"lora_dropout {drop!r} does not match dropout={m.dropout}")
    m.lora_dropout = drop
    return m


def _onnx(m, g, x):
    y = g.visit(m.base_layer, "base_layer", x)
    a = g.visit(m.lora_A, "lora_A", g.visit(m.lora_dropout, "lora_dropout", x))
    b = g.visit(m.lora_B, "lora_B", a)
    scaled = g.op("Mul", [b, g.const(np.array(m.scaling, g.dtype), "scaling")], "lora_scale")
    return g.op("Add", [y, scaled], "lora_add")


LORA_LINEAR = LayerRule(
    kind="lora",
    describe=_describe,
    output_shape=_output_shape,
    compose=_compose,
    cost=_cost,
    saved=lambda m, shape, need_dx: [],
    info=lambda m, shape: {"in": m.in_features, "out": m.out_features,
                           "bias": m.base_layer.has_bias, "rank": m.rank},
    note=lambda m, shape: f"scaling {m.scaling:g}",
    onnx=_onnx,
    rebuild=Rebuild(_args, _build),
    transforms=("merge_lora",),
    transforms_inherited=True,  # merge_lora reads base_layer, lora_A, lora_B and scaling only
)

RULES = [(LoRALinear, LORA_LINEAR)]
