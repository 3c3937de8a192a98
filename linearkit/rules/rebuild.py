"""How each shipped layer is rebuilt from a model file: the ``rebuild`` part of its rule.

A model file's architecture is a tree of ``{"type", "args", "children"}`` nodes (see
``linearkit.io.spec``). ``Rebuild.args(m)`` gives a layer's constructor arguments as JSON values;
``Rebuild.build(cls, args, children)`` makes the layer again (default: ``cls(**args)``, for a
layer without children). Nothing in a file is ever executed: a type is looked up among the
registered rules by name, and its constructor gets plain JSON values.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..layers import (
    GELU,
    BatchNorm1d,
    Bilinear,
    Dropout,
    Flatten,
    Identity,
    LayerNorm,
    LazyLinear,
    LeakyReLU,
    Linear,
    LogSoftmax,
    ModuleDict,
    ModuleList,
    ReLU,
    Residual,
    RMSNorm,
    Sequential,
    Sigmoid,
    SiLU,
    Softmax,
    Tanh,
)

__all__ = ["BUILTIN_REBUILDS", "Rebuild"]


@dataclass(frozen=True)
class Rebuild:
    """What a model file stores about a layer type, and how the type is made again.

    Attributes
    ----------
    args : ``args(m) -> dict``
        The constructor's keyword arguments as JSON values (numbers, strings, bools, None,
        lists); a dtype as its name ('float32').
    build : ``build(cls, args, children) -> Module``, optional
        For a layer with children (``children``: name -> rebuilt child, in order). Default:
        ``cls(**args)``.
    """

    args: Callable[[Any], dict]
    build: Callable[[type, dict, dict], Any] | None = None

    def make(self, cls: type, args: dict, children: dict):
        if self.build is not None:
            return self.build(cls, args, children)
        return cls(**args)


def _none(m) -> dict:
    return {}


def _linear(m) -> dict:
    return {"in_features": m.in_features, "out_features": m.out_features, "bias": m.has_bias,
            "dtype": m.dtype.name}


def _lazy(m) -> dict:
    return {"out_features": m.out_features, "bias": m.has_bias, "dtype": m.dtype.name}


def _layer_norm(m) -> dict:
    return {"normalized_shape": list(m.normalized_shape), "eps": m.eps,
            "elementwise_affine": m.elementwise_affine, "bias": m.bias is not None,
            "dtype": m.dtype.name}


def _rms_norm(m) -> dict:
    return {"normalized_shape": list(m.normalized_shape), "eps": m.eps,
            "elementwise_affine": m.elementwise_affine, "dtype": m.dtype.name}


def _bilinear(m) -> dict:
    return {"in1_features": m.in1_features, "in2_features": m.in2_features,
            "out_features": m.out_features, "bias": m.bias is not None, "dtype": m.dtype.name}


def _batch_norm(m) -> dict:
    return {"num_features": m.num_features, "eps": m.eps, "momentum": m.momentum,
            "affine": m.affine, "track_running_stats": m.track_running_stats,
            "bias": m.bias is not None, "dtype": m.dtype.name}


def _sequential(cls, args, children):
    return cls(OrderedDict(children))


def _residual(cls, args, children):
    return cls(children["module"])


def _module_list(cls, args, children):
    return cls(list(OrderedDict(children).values()))  # renumbered 0..n, as the names were


BUILTIN_REBUILDS = {
    Linear: Rebuild(_linear),
    LazyLinear: Rebuild(_lazy),
    Identity: Rebuild(_none),
    ReLU: Rebuild(_none),
    LeakyReLU: Rebuild(lambda m: {"negative_slope": m.negative_slope}),
    GELU: Rebuild(lambda m: {"approximate": m.approximate}),
    Tanh: Rebuild(_none),
    Sigmoid: Rebuild(_none),
    SiLU: Rebuild(_none),
    Softmax: Rebuild(lambda m: {"dim": m.dim}),
    LogSoftmax: Rebuild(lambda m: {"dim": m.dim}),
    Dropout: Rebuild(lambda m: {"p": m.p}),
    LayerNorm: Rebuild(_layer_norm),
    RMSNorm: Rebuild(_rms_norm),
    Bilinear: Rebuild(_bilinear),
    BatchNorm1d: Rebuild(_batch_norm),
    Flatten: Rebuild(lambda m: {"start_dim": m.start_dim, "end_dim": m.end_dim}),
    Sequential: Rebuild(_none, _sequential),
    Residual: Rebuild(_none, _residual),
    ModuleList: Rebuild(_none, _module_list),
    ModuleDict: Rebuild(_none, _sequential),  # cls(OrderedDict of the named children)
}
