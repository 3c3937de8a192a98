"""What the ledger knows about each linearkit layer type: its type text, row kind and cost."""

from __future__ import annotations

from ...layers import (
    GELU,
    BatchNorm1d,
    Dropout,
    Flatten,
    Identity,
    LayerNorm,
    LeakyReLU,
    Linear,
    LogSoftmax,
    ReLU,
    Residual,
    Sequential,
    Sigmoid,
    SiLU,
    Softmax,
    Tanh,
)
from ...layers.container import trains
from .costs import kind_cost
from .report import linear_text

__all__ = ["ACTIVATIONS", "describe", "kind_of", "layer_cost", "linear_info", "trains"]

ACTIVATIONS = (ReLU, LeakyReLU, GELU, Tanh, Sigmoid, SiLU, Softmax, LogSoftmax)

# The row kind of each layer type with a cost rule, most specific first.
_KINDS = ((Linear, "linear"), (ACTIVATIONS, "activation"), (Dropout, "dropout"),
          (Flatten, "flatten"), (Identity, "identity"), (Sequential, "sequential"),
          (Residual, "residual"), (LayerNorm, "layernorm"), (BatchNorm1d, "batchnorm"))


def describe(m) -> str:
    """Compact type: 'Linear(784, 256)', 'LayerNorm((256,))', 'Dropout(p=0.1)'."""
    if isinstance(m, Linear):
        if m.in_features is None:
            bias = "" if m._has_bias else ", bias=False"
            return f"LazyLinear(?, {m.out_features}{bias})"
        return linear_text(m.in_features, m.out_features, m.bias is not None)
    if isinstance(m, LayerNorm):
        return f"LayerNorm({m.normalized_shape})"
    if isinstance(m, BatchNorm1d):
        return f"BatchNorm1d({m.num_features})"
    if isinstance(m, Dropout):
        return f"Dropout(p={m.p})"
    if isinstance(m, Softmax | LogSoftmax):
        return f"{type(m).__name__}(dim={m.dim})"
    return type(m).__name__


def kind_of(m) -> str | None:
    """The row kind of a layer the ledger has a cost rule for; None for any other module."""
    return next((kind for types, kind in _KINDS if isinstance(m, types)), None)


def layer_cost(m, xs, need):
    """The cost of layer ``m`` on an input of shape ``xs`` (see ``costs``); None: no rule."""
    kind = kind_of(m)
    return None if kind is None else kind_cost(m, kind, xs, need)


def linear_info(m: Linear) -> dict:
    """A materialized Linear's sizes, kept on its row for the findings."""
    return {"in": m.in_features, "out": m.out_features, "bias": m.bias is not None,
            "lazy": False}
