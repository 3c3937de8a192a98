"""Read an ONNX file made of the operators linearkit has into an ``lk.Sequential`` (eval mode).

The graph must be a chain from its one input to its one output — each node reads the value the
previous ones produced — with weights as initializers (or ``Constant`` nodes); a residual
``Add(x, f(x))`` of two chain values becomes a ``Residual``. Operators: ``Gemm`` (``transB``
either way, any ``alpha``/``beta``, folded into the weight and bias; ``transA=1`` refused),
``MatMul`` (+ ``Add`` of a bias), Relu, LeakyRelu, Gelu (the op, or the Erf/tanh formula that
``export_onnx`` writes for opset 17), Tanh, Sigmoid, SiLU (``x * Sigmoid(x)``), Softmax,
LogSoftmax, LayerNormalization, BatchNormalization (inference), Flatten, Reshape (merging a run
of dims), Identity and Dropout (dropped). Anything else is a ``FormatError`` naming the node.
"""

from __future__ import annotations

import math
import os

import numpy as np

from .. import layers as L
from ..errors import FormatError
from .onnx_export import INSTALL_HINT

__all__ = ["import_onnx"]

_SQ2, _K = math.sqrt(2.0), math.sqrt(2 / math.pi)
# Multi-node patterns, tried before single nodes: (op, args); an arg is "x" (the chain's
# value), k (the output of the pattern's k-th node) or a float (a scalar constant).
_PATTERNS = [
    ("gelu_tanh", [("Mul", ["x", "x"]), ("Mul", [0, "x"]), ("Mul", [1, 0.044715]),
                   ("Add", ["x", 2]), ("Mul", [3, _K]), ("Tanh", [4]), ("Add", [5, 1.0]),
                   ("Mul", ["x", 6]), ("Mul", [7, 0.5])]),
    ("gelu", [("Div", ["x", _SQ2]), ("Erf", [0]), ("Add", [1, 1.0]), ("Mul", ["x", 2]),
              ("Mul", [3, 0.5])]),
    ("silu", [("Sigmoid", ["x"]), ("Mul", ["x", 0])]),
]
_PATTERN_MODULES = {"gelu_tanh": lambda: L.GELU("tanh"), "gelu": L.GELU, "silu": L.SiLU}
_SIMPLE = {"Relu": L.ReLU, "Tanh": L.Tanh, "Sigmoid": L.Sigmoid}


class _Reader:
    def __init__(self, onnx, proto, path: str):
        self.onnx, self.path = onnx, path
        graph = proto.graph
        self.consts = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
        self.nodes = []
        for node in graph.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                self.consts[node.output[0]] = onnx.numpy_helper.to_array(node.attribute[0].t)
            else:
                self.nodes.append(node)
        inputs = [v for v in graph.input if v.name not in self.consts]
        if len(inputs) != 1 or len(graph.output) != 1:
            self.fail(f"expected a graph with one input and one output, got inputs "
                      f"{[v.name for v in inputs]} and outputs {[v.name for v in graph.output]}")
        self.input, self.output = inputs[0].name, graph.output[0].name
        dims = inputs[0].type.tensor_type.shape.dim
        self.rank = len(dims) if inputs[0].type.tensor_type.HasField("shape") else None

    def fail(self, problem: str, node=None, hint: str | None = None):
        if node is not None:
            problem = f"node '{node.name or '?'}' ({node.op_type}): {problem}"
        raise FormatError(problem, path=self.path, hint=hint)

    def attr(self, node, name, default):
        for a in node.attribute:
            if a.name == name:
                value = self.onnx.helper.get_attribute_value(a)
                if isinstance(value, float):  # stored as float32: 1e-05, not 9.99999974e-06
                    return float(str(np.float32(value)))
                return value.decode() if isinstance(value, bytes) else value
        return default

    def const(self, node, i, what: str, optional: bool = False):
        if i >= len(node.input) or not node.input[i]:
            if optional:
                return None
            self.fail(f"missing its {what} input", node)
        name = node.input[i]
        if name not in self.consts:
            self.fail(f"its {what} '{name}' is computed, not an initializer; import_onnx reads "
                      "weights stored as initializers or Constant nodes", node)
        return self.consts[name]

    def match(self, i: int, x: str):
        """The name and output of a multi-node pattern starting at node i, else None."""
        for name, pattern in _PATTERNS:
            nodes = self.nodes[i:i + len(pattern)]
            if len(nodes) < len(pattern) or [n.op_type for n in nodes] != [p[0] for p in pattern]:
                continue
            if all(self._args(n, args, nodes, x) for n, (_, args) in zip(nodes, pattern)):
                return name, nodes[-1].output[0], len(pattern)
        return None

    def _args(self, node, args, nodes, x) -> bool:
        got = list(node.input)
        if len(got) != len(args):
            return False
        orders = [got, got[::-1]] if node.op_type in ("Add", "Mul") else [got]  # they commute
        return any(all(self._is(g, a, nodes, x) for g, a in zip(order, args))
                   for order in orders)

    def _is(self, name, arg, nodes, x) -> bool:
        if arg == "x":
            return name == x
        if isinstance(arg, int):
            return name == nodes[arg].output[0]
        value = self.consts.get(name)
        return value is not None and value.size == 1 and bool(np.isclose(value, arg, rtol=1e-6))


def _linear(w_out_in: np.ndarray, b) -> L.Linear:
    n_out, n_in = w_out_in.shape
    dtype = w_out_in.dtype if w_out_in.dtype in (np.float32, np.float64) else np.float32
    m = L.Linear(n_in, n_out, bias=b is not None, dtype=dtype)
    m.weight.data[...] = w_out_in
    if b is not None:
        m.bias.data[...] = np.broadcast_to(b, (n_out,))
    return m


def _bias(reader, node, b, n_out):
    try:
        return None if b is None else np.broadcast_to(b, (n_out,))
    except ValueError:
        reader.fail(f"its bias of shape {b.shape} does not broadcast to ({n_out},)", node)


def import_onnx(path: str | os.PathLike):
    """Rebuild the model in the ONNX file ``path`` as an ``lk.Sequential`` in eval mode.

    Returns
    -------
    model : Sequential
        ``model(x)`` equals the graph's output for an input ``x`` of the graph's input shape.
        A ``Gemm`` ``Y = alpha A B' + beta C`` becomes ``Linear`` with ``weight = alpha B'ᵀ``
        ``(out, in)`` and ``bias = beta C``; a ``MatMul`` by ``W (in, out)`` has ``weight = Wᵀ``.

    Raises ``FormatError`` (a ValueError) naming the file, and the node and its op type, for a
    file that is not ONNX, a node linearkit has no layer for, a ``transA=1`` Gemm, a training-mode
    BatchNormalization, or a graph that is not a chain.
    """
    try:
        import onnx
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError(f"import_onnx needs the 'onnx' package: {INSTALL_HINT}") from None
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such ONNX file: {path}")
    from google.protobuf.message import DecodeError  # onnx's own dependency

    try:
        proto = onnx.load(path)
    except (DecodeError, ValueError, RuntimeError) as e:
        raise FormatError(f"not an ONNX model ({type(e).__name__}: {e})", path=path) from None
    r = _Reader(onnx, proto, path)
    modules, x, rank = [], r.input, r.rank
    marks = {x: 0}  # a chain value -> how many modules came before it (for a residual Add)
    i = 0
    while i < len(r.nodes):
        node = r.nodes[i]
        op, step, new = node.op_type, 1, []
        found = r.match(i, x)
        if found is not None:
            kind, out, step = found
            new = [_PATTERN_MODULES[kind]()]
        elif op == "Add" and len(node.input) == 2 and all(v not in r.consts for v in node.input):
            skip = node.input[1] if node.input[0] == x else node.input[0]
            k = marks.get(skip)
            if x not in node.input or k is None or k >= len(modules):
                r.fail(f"adds '{node.input[0]}' and '{node.input[1]}'; import_onnx reads a "
                       "residual x + f(x) of the chain's value and an earlier one", node)
            inner = modules[k:]
            modules[k:] = [L.Residual(inner[0] if len(inner) == 1 else L.Sequential(*inner))]
            marks = {v: n for v, n in marks.items() if n <= k}
            out = node.output[0]
        else:
            if not node.input or node.input[0] != x:
                r.fail(f"reads {list(node.input)}, not the chain's value '{x}'; import_onnx "
                       "reads graphs where each node takes the previous node's output", node)
            out = node.output[0]
            if op == "Gemm":
                if r.attr(node, "transA", 0):
                    r.fail("transA=1 (the input transposed) has no Linear equivalent", node,
                           "export the model with the input as (batch, features) and transA=0")
                b = r.const(node, 1, "weight B")
                w = b if r.attr(node, "transB", 0) else b.T
                w = r.attr(node, "alpha", 1.0) * w
                c = r.const(node, 2, "bias C", optional=True)
                c = None if c is None else r.attr(node, "beta", 1.0) * c
                new = [_linear(w.astype(b.dtype), _bias(r, node, c, w.shape[0]))]
            elif op == "MatMul":
                w = r.const(node, 1, "weight")
                if w.ndim != 2:
                    r.fail(f"its weight has shape {w.shape}; a Linear needs 2-D (in, out)", node)
                b, nxt = None, r.nodes[i + 1] if i + 1 < len(r.nodes) else None
                if (nxt is not None and nxt.op_type == "Add" and out in nxt.input
                        and any(v in r.consts for v in nxt.input)):
                    b = r.consts[next(v for v in nxt.input if v != out)]
                    b = _bias(r, nxt, b.astype(w.dtype), w.shape[1])
                    out, step = nxt.output[0], 2
                new = [_linear(np.ascontiguousarray(w.T), b)]
            elif op in _SIMPLE:
                new = [_SIMPLE[op]()]
            elif op == "LeakyRelu":
                new = [L.LeakyReLU(r.attr(node, "alpha", 0.01))]
            elif op == "Gelu":
                new = [L.GELU(r.attr(node, "approximate", "none"))]
            elif op in ("Softmax", "LogSoftmax"):
                new = [(L.Softmax if op == "Softmax" else L.LogSoftmax)(r.attr(node, "axis", -1))]
            elif op == "LayerNormalization":
                new = [_layer_norm(r, node, rank)]
            elif op == "BatchNormalization":
                new = [_batch_norm(r, node)]
            elif op in ("Flatten", "Reshape"):
                new, rank = _flatten(r, node, rank)
            elif op not in ("Identity", "Dropout"):
                r.fail("unsupported operator: linearkit has no layer for it", node,
                       "import_onnx reads Gemm, MatMul(+Add), the activations, Softmax, "
                       "LogSoftmax, LayerNormalization, BatchNormalization, Flatten, Reshape "
                       "and a residual Add")
        modules.extend(new)
        x = out
        marks[x] = len(modules)
        i += step
    if x != r.output:
        r.fail(f"the chain ends at '{x}', not at the graph's output '{r.output}'")
    return L.Sequential(*modules).eval()


def _layer_norm(r, node, rank):
    scale = r.const(node, 1, "scale")
    bias = r.const(node, 2, "bias B", optional=True)
    axis = r.attr(node, "axis", -1)
    k = -axis if axis < 0 else (None if rank is None else rank - axis)
    if k != scale.ndim:
        r.fail(f"axis={axis} with a scale of shape {scale.shape}: a LayerNorm needs the scale "
               "to have the normalized dims' shape", node)
    m = L.LayerNorm(scale.shape, eps=r.attr(node, "epsilon", 1e-5), bias=bias is not None,
                    dtype=scale.dtype)
    m.weight.data[...] = scale
    if bias is not None:
        m.bias.data[...] = bias
    return m


def _batch_norm(r, node):
    if r.attr(node, "training_mode", 0):
        r.fail("training_mode=1: import_onnx reads inference BatchNormalization", node)
    scale, bias, mean, var = (r.const(node, i, w) for i, w in
                              enumerate(("scale", "bias B", "mean", "var"), 1))
    m = L.BatchNorm1d(scale.shape[0], eps=r.attr(node, "epsilon", 1e-5), dtype=scale.dtype)
    m.weight.data[...], m.bias.data[...] = scale, bias
    m.running_mean[...], m.running_var[...] = mean, var
    return m


def _flatten(r, node, rank):
    """(modules, new rank) for a Flatten or a Reshape that merges one run of dims."""
    if node.op_type == "Flatten":
        axis = r.attr(node, "axis", 1)
        if axis == 1:
            return [L.Flatten(1, -1)], 2
        if rank is not None and 1 < axis < rank:
            return [L.Flatten(0, axis - 1), L.Flatten(1, -1)], 2
        r.fail(f"axis={axis} on an input of rank {rank}: only a Flatten keeping dims before "
               "axis together maps to linearkit's Flatten", node)
    target = [int(v) for v in r.const(node, 1, "shape")]
    start = next((j for j, v in enumerate(target) if v != 0), len(target))
    if (rank is None or r.attr(node, "allowzero", 0) or start == len(target)
            or any(v <= 0 for v in target[start + 1:]) or target[start] == 0):
        r.fail(f"reshape to {target} (input rank {rank}): import_onnx reads a Reshape that "
               "keeps leading dims (0) and merges one run of dims (-1)", node)
    end = rank - 1 - (len(target) - start - 1)
    if end < start:
        r.fail(f"reshape to {target} splits dims; linearkit's Flatten only merges", node)
    return [L.Flatten(start, end)], len(target)
