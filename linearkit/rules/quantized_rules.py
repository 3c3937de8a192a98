"""The rule of ``QuantizedLinear`` (int8 weights, per-channel scales; inference only).

Its kind is ``'quantized-linear'``, not ``'linear'``: the ledger's findings read ``'linear'`` rows
as float ``Linear`` layers that ``merge_linear`` / ``fold_norm`` / ``factorize`` can edit, and
none of them applies to int8 weights (dequantize first). Cost, per call on ``B`` rows
(``rules/cost_rules.py``'s conventions):

* MACs ``B·in·out`` and GEMM FLOPs ``2·B·in·out``, as a Linear; bias ``B·out``;
* elementwise: ``in·out`` (the int8 -> float cast of the weight, once per call) plus ``B·out``
  (the per-channel scale); ``activations='dynamic'`` adds ``4·B·in`` (|x|, the row max, the
  division, the rounding) and ``B·out`` (the row scale);
* backward: none — the layer does not train (its ``vjp`` raises), and its closure keeps nothing.
"""

from __future__ import annotations

from ..layers.quantized import QuantizedLinear
from .cost_rules import lead
from .rebuild import Rebuild
from .registry import LayerRule

__all__ = ["QUANTIZED_LINEAR", "RULES"]


def _describe(m) -> str:
    extra = "" if m.activations is None else f", {m.activations}"
    return (f"QuantizedLinear({m.in_features}, {m.out_features}, int8{extra}"
            + ("" if m.has_bias else ", bias=False") + ")")


def _output_shape(m, shape):
    m.check_input_shape(shape)
    return tuple(shape[:-1]) + (m.out_features,)


def _cost(m, shape, need_dx):
    B, n_in, n_out = lead(shape), m.in_features, m.out_features
    macs = B * n_in * n_out
    elementwise = n_in * n_out + B * n_out
    if m.activations == "dynamic":
        elementwise += 4 * B * n_in + B * n_out
    return macs, 2 * macs, B * n_out if m.has_bias else 0, elementwise, 0, 0


def _args(m) -> dict:
    return {"in_features": m.in_features, "out_features": m.out_features, "bias": m.has_bias,
            "activations": m.activations, "dtype": m.dtype.name}


QUANTIZED_LINEAR = LayerRule(
    kind="quantized-linear",
    describe=_describe,
    output_shape=_output_shape,
    cost=_cost,
    saved=lambda m, shape, need_dx: [],
    note=lambda m, shape: "int8 weights: inference only",
    rebuild=Rebuild(_args),
)

RULES = [(QuantizedLinear, QUANTIZED_LINEAR)]
