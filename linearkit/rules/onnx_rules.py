"""How each shipped layer is written to ONNX: the ``onnx`` part of its rule.

An emitter is ``emit(m, g, x) -> name``: it adds nodes for layer ``m`` to the graph builder ``g``
(``linearkit.io.onnx_export``) reading the value named ``x``, and returns the name of the layer's
output. It never imports ``onnx``; it only calls the builder:

- ``g.shape(x)``: the value's shape (the batch dim as given to ``export_onnx``);
- ``g.const(array, hint)``: an initializer in the model's dtype, its name;
- ``g.op(op_type, inputs, hint, **attrs)``: a node, the name of its one output;
- ``g.visit(child, name, x)``: a child's output (containers walk their children with it);
- ``g.opset``: the opset being written; ``g.refuse(m, problem, fix)`` raises a clear error.

A layer that is the identity in eval mode (Identity, eval Dropout) returns ``x`` itself.

A ModuleList or ModuleDict has no forward (as in PyTorch), so it has no emitter of its own: the
module holding it writes its children in the order its forward calls them, e.g. for a forward
``for layer in self.layers: x = layer(x)``::

    def emit(m, g, x):
        for i, layer in enumerate(m.layers):
            x = g.visit(layer, f"layers.{i}", x)
        return x

Exporting the container itself is refused with its path (``_held``).
"""

from __future__ import annotations

import math

import numpy as np

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

__all__ = ["BUILTIN_ONNX"]


def _linear(m, g, x):
    w = m.weight.data  # (out, in)
    b = None if m.bias is None else m.bias.data
    if len(g.shape(x)) == 2:  # y = x Wᵀ + b in one Gemm
        inputs = [x, g.const(w, "weight")] + ([] if b is None else [g.const(b, "bias")])
        return g.op("Gemm", inputs, "gemm", transB=1)
    y = g.op("MatMul", [x, g.const(np.ascontiguousarray(w.T), "weight_t")], "matmul")
    return y if b is None else g.op("Add", [y, g.const(b, "bias")], "add_bias")


def _lazy(m, g, x):
    g.refuse(m, "LazyLinear is uninitialized (in_features=?), so it has no weight to write",
             "run one forward pass (model(x)) to materialize it before export_onnx")


def _passthrough(m, g, x):
    return x


def _dropout(m, g, x):
    if m.training and m.p:
        g.refuse(m, f"Dropout(p={m.p}) is in training mode, which ONNX inference cannot run",
                 "call model.eval() before export_onnx")
    return x


def _flatten(m, g, x):
    shape = g.shape(x)
    out = m.output_shape(shape)
    n = max(len(shape), 1)
    start, end = m.start_dim % n, m.end_dim % n
    if start == 1 and end == len(shape) - 1:  # ONNX Flatten(axis=1) is exactly this
        return g.op("Flatten", [x], "flatten", axis=1)
    # Reshape: 0 copies the input's dim (the batch stays dynamic), -1 is the merged run.
    target = [0] * start + [-1] + list(out[start + 1:])
    return g.op("Reshape", [x, g.const(np.array(target, np.int64), "shape", cast=False)],
                "reshape")


def _scalar(g, value, hint):
    return g.const(np.array(value, g.dtype), hint)


def _gelu(m, g, x):
    if g.opset >= 20:
        return g.op("Gelu", [x], "gelu", approximate=m.approximate)
    if m.approximate == "tanh":  # 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))
        x3 = g.op("Mul", [g.op("Mul", [x, x], "gelu_x2"), x], "gelu_x3")
        inner = g.op("Add", [x, g.op("Mul", [x3, _scalar(g, 0.044715, "gelu_c")], "gelu_cx3")],
                     "gelu_inner")
        t = g.op("Tanh", [g.op("Mul", [inner, _scalar(g, math.sqrt(2 / math.pi), "gelu_k")],
                               "gelu_kinner")], "gelu_tanh")
    else:  # 0.5 x (1 + erf(x / √2))
        t = g.op("Erf", [g.op("Div", [x, _scalar(g, math.sqrt(2.0), "gelu_sqrt2")], "gelu_div")],
                 "gelu_erf")
    one_plus = g.op("Add", [t, _scalar(g, 1.0, "gelu_one")], "gelu_add1")
    return g.op("Mul", [g.op("Mul", [x, one_plus], "gelu_mul"), _scalar(g, 0.5, "gelu_half")],
                "gelu")


def _silu(m, g, x):
    return g.op("Mul", [x, g.op("Sigmoid", [x], "silu_sigmoid")], "silu")


def _layer_norm(m, g, x):
    shape = m.normalized_shape
    scale = m.weight.data if m.weight is not None else np.ones(shape, m.dtype)
    inputs = [x, g.const(scale, "scale")]
    if m.bias is not None:
        inputs.append(g.const(m.bias.data, "bias"))
    return g.op("LayerNormalization", inputs, "layernorm", axis=-len(shape),
                epsilon=float(m.eps))


def _rms_norm(m, g, x):
    k = len(m.normalized_shape)
    eps = float(np.finfo(g.dtype).eps) if m.eps is None else float(m.eps)  # torch's default
    scale = None if m.weight is None else g.const(m.weight.data, "scale")
    if g.opset >= 23:  # RMSNormalization normalizes dims axis..-1, then multiplies by scale
        ones = scale if scale is not None else g.const(np.ones(m.normalized_shape), "scale")
        return g.op("RMSNormalization", [x, ones], "rmsnorm", axis=-k, epsilon=eps)
    # x / sqrt(ReduceMean(x * x) + eps) * scale; ReduceMean takes its axes as an input from 18
    axes = list(range(-k, 0))
    square = g.op("Mul", [x, x], "rmsnorm_square")
    if g.opset >= 18:
        mean = g.op("ReduceMean", [square, g.const(np.array(axes, np.int64), "rmsnorm_axes",
                                                    cast=False)], "rmsnorm_mean", keepdims=1)
    else:
        mean = g.op("ReduceMean", [square], "rmsnorm_mean", axes=axes, keepdims=1)
    rms = g.op("Sqrt", [g.op("Add", [mean, _scalar(g, eps, "rmsnorm_eps")], "rmsnorm_add_eps")],
               "rmsnorm_rms")
    y = g.op("Div", [x, rms], "rmsnorm_div")
    return y if scale is None else g.op("Mul", [y, scale], "rmsnorm")


def _bilinear(m, g, x):
    g.refuse(m, "Bilinear takes two inputs (x1, x2), and export_onnx writes a graph with one "
             "input ('input')", "export the rest of the model without it, or write the layer "
             "as an ONNX Einsum node ('...i,oij,...j->...o' on both inputs, plus the bias) in a "
             "graph of your own")


def _batch_norm(m, g, x):
    if m.training or m.running_mean is None or m.running_var is None:
        why = ("is in training mode" if m.training else
               "has no running statistics (track_running_stats=False)")
        g.refuse(m, f"BatchNorm1d {why}; ONNX export writes eval-mode BatchNormalization with "
                 "the running statistics", "call model.eval() (with running statistics) "
                 "before export_onnx")
    c = m.num_features
    scale = m.weight.data if m.weight is not None else np.ones(c, m.dtype)
    bias = m.bias.data if m.bias is not None else np.zeros(c, m.dtype)
    inputs = [x, g.const(scale, "scale"), g.const(bias, "bias"),
              g.const(m.running_mean, "running_mean"), g.const(m.running_var, "running_var")]
    return g.op("BatchNormalization", inputs, "batchnorm", epsilon=float(m.eps))


def _along_dim(op_type):
    return lambda m, g, x: g.op(op_type, [x], op_type.lower(), axis=m.dim)


def _simple(op_type):
    return lambda m, g, x: g.op(op_type, [x], op_type.lower())


def _sequential(m, g, x):
    for name, child in m.named_steps():
        x = g.visit(child, name, x)
    return x


def _held(m, g, x):
    kind = type(m).__name__
    g.refuse(m, f"a {kind} has no forward (as in PyTorch): the order its children run in is the "
             "forward of the module holding it, which export cannot read",
             f"export the module that holds the {kind}, with a rule whose onnx emitter visits "
             "the children in its forward's order (g.visit(child, 'name.0', x), ...; see "
             "linearkit/rules/onnx_rules.py); or hold a chain as lk.Sequential, which exports "
             "as it is")


def _residual(m, g, x):
    fx = g.visit(m.module, "module", x)
    m.check_shapes(g.shape(x), g.shape(fx))
    return g.op("Add", [x, fx], "residual")


BUILTIN_ONNX = {
    Linear: _linear,
    LazyLinear: _lazy,
    Identity: _passthrough,
    Dropout: _dropout,
    Flatten: _flatten,
    ReLU: _simple("Relu"),
    LeakyReLU: lambda m, g, x: g.op("LeakyRelu", [x], "leakyrelu", alpha=m.negative_slope),
    GELU: _gelu,
    Tanh: _simple("Tanh"),
    Sigmoid: _simple("Sigmoid"),
    SiLU: _silu,
    Softmax: _along_dim("Softmax"),
    LogSoftmax: _along_dim("LogSoftmax"),
    LayerNorm: _layer_norm,
    RMSNorm: _rms_norm,
    Bilinear: _bilinear,
    BatchNorm1d: _batch_norm,
    Sequential: _sequential,
    Residual: _residual,
    ModuleList: _held,
    ModuleDict: _held,
}
