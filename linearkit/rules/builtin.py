"""The rules of every shipped layer, in one place (registered when ``linearkit.rules`` loads).

Each rule reads only the layer's public attributes and methods (``in_features``, ``has_bias``,
``check_input_shape``, ``saves``, ``output_shape``, ``check_shapes``, ``named_steps``, …), and
the costs read only what a PyTorch twin has too, so the ledger's torch path counts with them.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from .. import precision as P
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
from ..layers.container import trains
from ..layers.norm import check_batch_norm_input
from .cost_rules import (
    ZERO,
    bilinear_cost,
    elementwise_cost,
    lead,
    linear_cost,
    norm_module_cost,
    rms_norm_cost,
)
from .onnx_rules import BUILTIN_ONNX
from .rebuild import BUILTIN_REBUILDS
from .registry import LayerRule, register_rule
from .text import bilinear_text, linear_text
from .torch_rules import BUILTIN_TORCH

__all__ = ["ACTIVATIONS", "linear_text"]

#: The parameter-free elementwise layers (and softmaxes), each with its own rule.
ACTIVATIONS = (ReLU, LeakyReLU, GELU, Tanh, Sigmoid, SiLU, Softmax, LogSoftmax)


def _nothing(m, shape, need_dx) -> list:
    return []


def _zero(m, shape, need_dx) -> tuple:
    return ZERO


# ---------------------------------------------------------------- Linear, LazyLinear
def _linear_out(m, shape):
    m.check_input_shape(shape)
    return shape[:-1] + (m.out_features,)


def _linear_cost(m, shape, need_dx):
    bias = m.bias is not None
    return linear_cost(lead(shape), m.in_features, m.out_features, bias, need_dx,
                       m.weight.requires_grad, bias and m.bias.requires_grad)


def _linear_info(m, shape) -> dict:
    return {"in": m.in_features, "out": m.out_features, "bias": m.bias is not None,
            "lazy": False}


def _linear_saved(trains: bool, storage, weight_numel: int, shape, need_dx) -> list:
    # The closure holds x (for dW = dyᵀx) only when the weight trains, through
    # precision.saved_activation; a float16 weight also keeps its float32 copy for dx
    # (Linear._vjp_policy: NumPy's float16 upcast is too slow to do twice).
    saved = [("input", math.prod(shape), "activation")] if trains else []
    if need_dx and storage == P.F16:
        saved.append(("weight_float32", weight_numel, P.F32))
    return saved


LINEAR = LayerRule(
    kind="linear",
    describe=lambda m: linear_text(m.in_features, m.out_features, m.bias is not None),
    output_shape=_linear_out,
    cost=_linear_cost,
    saved=lambda m, shape, need_dx: _linear_saved(m.weight.requires_grad, m.weight.data.dtype,
                                                  m.weight.data.size, shape, need_dx),
    info=_linear_info,
    weight=lambda m: m.weight.data,
    # A dense (out, in) weight and an (out,) bias the transforms may rewrite; a subclass of
    # Linear inherits none of them (transforms_inherited=False): its forward may differ.
    transforms=("merge_linear", "fold_norm", "factorize", "add_lora", "extract_lora",
                "quantize", "prune", "to_sparse", "fuse_qkv", "split_qkv", "shard_linear"),
    transposable_keys=("weight",),
)


def _lazy_note(m, shape) -> str:
    note = "uninitialized (in_features=?)"
    if shape is not None:
        params = shape[-1] * m.out_features + (m.out_features if m.has_bias else 0)
        note += f"; {params:,} params once materialized by this input"
    return note


# A LazyLinear is costed as the Linear the input would make, and never materialized here.
LAZY_LINEAR = LayerRule(
    kind="linear",
    describe=lambda m: f"LazyLinear(?, {m.out_features}{'' if m.has_bias else ', bias=False'})",
    output_shape=_linear_out,
    cost=lambda m, shape, need_dx: linear_cost(lead(shape), shape[-1], m.out_features,
                                               m.has_bias, need_dx, True, m.has_bias),
    saved=lambda m, shape, need_dx: _linear_saved(True, m.dtype, shape[-1] * m.out_features,
                                                  shape, need_dx),
    info=lambda m, shape: {} if shape is None else {
        "in": shape[-1], "out": m.out_features, "bias": m.has_bias, "lazy": True},
    note=_lazy_note,
    lazy=True,
    transposable_keys=("weight",),
)


# ---------------------------------------------------------------- Bilinear
def _bilinear_cost(m, shape, need_dx):
    # shape is the first input's; the second has the same leading dims and in2_features
    bias = m.bias is not None
    return bilinear_cost(lead(shape), m.in1_features, m.in2_features, m.out_features, bias,
                         need_dx, m.weight.requires_grad, bias and m.bias.requires_grad)


def _bilinear_saved(m, shape, need_dx) -> list:
    # Both inputs (through precision.saved_activation), when dW or dx needs them.
    if not (m.weight.requires_grad or need_dx):
        return []
    return [("input", math.prod(shape), "activation"),
            ("input2", lead(shape) * m.in2_features, "activation")]


BILINEAR = LayerRule(
    kind="bilinear",
    describe=lambda m: bilinear_text(m.in1_features, m.in2_features, m.out_features,
                                     m.bias is not None),
    output_shape=_linear_out,  # checks the first input (the one a shape-only pass follows)
    cost=_bilinear_cost,
    saved=_bilinear_saved,
)


# ---------------------------------------------------------------- pass-through layers
IDENTITY = LayerRule(kind="identity", shares_input=True, cost=_zero, saved=_nothing,
                     transforms=("merge_linear",),  # removed between merged Linears
                     transforms_inherited=True)

FLATTEN = LayerRule(kind="flatten", output_shape=lambda m, shape: m.output_shape(shape),
                    shares_input=True, cost=_zero, saved=_nothing)


def _drops(m) -> bool:
    return bool(m.training and m.p)


DROPOUT = LayerRule(
    kind="dropout",
    describe=lambda m: f"Dropout(p={m.p})",
    shares_input=lambda m: not _drops(m),
    cost=lambda m, shape, need_dx: (elementwise_cost("Dropout", math.prod(shape), need_dx)
                                    if _drops(m) else ZERO),
    saved=lambda m, shape, need_dx: [("mask", math.prod(shape))] if _drops(m) else [],
    note=lambda m, shape: "" if m.training else "identity (eval mode)",
    transforms=("merge_linear",),
    transforms_inherited=True,
)


# ---------------------------------------------------------------- activations
def _activation(cls) -> LayerRule:
    name = cls.__name__  # the key of ELEMENTWISE_FLOPS; a subclass is costed as its base
    along_dim = cls in (Softmax, LogSoftmax)

    def output_shape(m, shape):
        m.check_input_shape(shape)  # dim in range
        return shape

    return LayerRule(
        kind="activation",
        describe=(lambda m: f"{type(m).__name__}(dim={m.dim})") if along_dim else None,
        output_shape=output_shape if along_dim else None,
        cost=lambda m, shape, need_dx: elementwise_cost(name, math.prod(shape), need_dx),
        saved=lambda m, shape, need_dx: [("output" if m.saves == "y" else "input",
                                          math.prod(shape))],
    )


# ---------------------------------------------------------------- normalizations
def _check_layer_norm(m, shape):
    m.check_input_shape(shape)
    return shape


LAYER_NORM = LayerRule(
    kind="layernorm",
    describe=lambda m: f"LayerNorm({m.normalized_shape})",
    output_shape=_check_layer_norm,
    cost=lambda m, shape, need_dx: norm_module_cost(m, math.prod(shape), need_dx),
    # xhat (through precision.saved_activation), and 1/sqrt(var + eps) per normalized row
    saved=lambda m, shape, need_dx: [
        ("xhat", math.prod(shape), "activation"),
        ("rstd", math.prod(shape[:len(shape) - len(m.normalized_shape)]))],
    transforms=("fold_norm",),
)


RMS_NORM = LayerRule(
    kind="rmsnorm",  # not 'layernorm': it subtracts no mean, so a bias before it is not cancelled
    describe=lambda m: f"RMSNorm({m.normalized_shape})",
    output_shape=_check_layer_norm,
    cost=lambda m, shape, need_dx: rms_norm_cost(
        math.prod(shape), m.weight is not None, need_dx,
        m.weight is not None and m.weight.requires_grad),
    # xhat (through precision.saved_activation), and the float64 1/sqrt(mean(x²) + eps) per row
    saved=lambda m, shape, need_dx: [
        ("xhat", math.prod(shape), "activation"),
        ("rstd", math.prod(shape[:len(shape) - len(m.normalized_shape)]), np.float64)],
    transforms=("fold_norm",),
)


def _batch_stats(m) -> bool:
    """BatchNorm normalizes with the batch's statistics (training, or no running ones)."""
    return m.training or m.running_mean is None or m.running_var is None


def _check_batch_norm(m, shape):
    check_batch_norm_input(m, shape)
    return shape


BATCH_NORM = LayerRule(
    kind="batchnorm",
    describe=lambda m: f"BatchNorm1d({m.num_features})",
    output_shape=_check_batch_norm,
    cost=lambda m, shape, need_dx: norm_module_cost(m, math.prod(shape), need_dx,
                                                    eval_mode=not _batch_stats(m)),
    saved=lambda m, shape, need_dx: [("xhat", math.prod(shape), "activation"),
                                     ("rstd", m.num_features)],
    info=lambda m, shape: {"c": m.num_features},
    note=lambda m, shape: "" if _batch_stats(m) else "eval: running statistics",
    transforms=("fold_norm",),
)


# ---------------------------------------------------------------- containers
def _compose_sequential(m, x, need_dx, visit):
    # Sequential.vjp's rule: a child needs dX once the caller or an earlier child trains.
    for name, child in m.named_steps():
        x = visit(child, name, x, need_dx)
        need_dx = need_dx or trains(child)
    return x


def _compose_residual(m, x, need_dx, visit):
    fx = visit(m.module, "module", x, need_dx)
    if x is None:
        return None
    m.check_shapes(x.shape, fx.shape)
    return tuple(x.shape)  # x + f(x): a new array


# merge_linear and fold_norm edit a plain Sequential's steps and rebuild it (not a subclass's:
# it may call its steps differently).
SEQUENTIAL = LayerRule(kind="sequential", compose=_compose_sequential, cost=_zero,
                       saved=_nothing, transforms=("merge_linear", "fold_norm"))

RESIDUAL = LayerRule(
    kind="residual", compose=_compose_residual,
    cost=lambda m, shape, need_dx: elementwise_cost("Residual", math.prod(shape), need_dx),
    saved=_nothing)


def _compose_held(m, x, need_dx, visit):
    # A ModuleList/ModuleDict is never called: its children are walked for their rows and
    # parameters only (no input shape); given one, say what its parent must do instead.
    for name, child in m.named_children():
        visit(child, name, None, need_dx)
    if x is not None:
        raise TypeError(f"{type(m).__name__} has no forward (its parent calls its children), so "
                        "the ledger cannot run it on an input shape; pass the module that holds "
                        "it, or call ledger without an input shape")
    return None


#: ModuleList / ModuleDict: held children, no arithmetic of their own.
HELD = LayerRule(kind="container", compose=_compose_held, cost=_zero, saved=_nothing)


def register_builtin_rules() -> None:
    """Register the rule of every shipped layer (done once, when ``linearkit.rules`` loads),
    each with how a model file rebuilds it (``rebuild.BUILTIN_REBUILDS``), how ONNX export
    writes it (``onnx_rules.BUILTIN_ONNX``; LazyLinear has none: materialize it first) and its
    PyTorch twin (``torch_rules.BUILTIN_TORCH``)."""
    rules = [(Linear, LINEAR), (LazyLinear, LAZY_LINEAR), (Identity, IDENTITY),
             (Flatten, FLATTEN), (Dropout, DROPOUT), (LayerNorm, LAYER_NORM),
             (RMSNorm, RMS_NORM), (Bilinear, BILINEAR),
             (BatchNorm1d, BATCH_NORM), (Sequential, SEQUENTIAL), (Residual, RESIDUAL),
             (ModuleList, HELD), (ModuleDict, HELD)]
    rules += [(cls, _activation(cls)) for cls in ACTIVATIONS]
    for layer_type, rule in rules:
        register_rule(layer_type, replace(rule, rebuild=BUILTIN_REBUILDS[layer_type],
                                          onnx=BUILTIN_ONNX.get(layer_type),
                                          torch=BUILTIN_TORCH.get(layer_type)))
