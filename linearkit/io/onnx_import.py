"""Read an ONNX file made of the operators linearkit has into an ``lk.Sequential`` (eval mode).

The graph must be a chain from its one float32/float64 tensor input to its one output — each
node reads the value the previous ones produced — with weights as initializers (or
``Constant`` nodes); a residual ``Add(x, f(x))`` of two chain values becomes a ``Residual``.
A node is imported only when the modules compute exactly what the operator means at the
model's opset (the default domain's entry in ``opset_import``); otherwise it is refused by
name. Operators (``onnx_ops.VERSIONS`` lists the versions read): ``Gemm`` (``transB`` either
way, ``alpha``/``beta`` folded into the weight and bias, a ``C`` the same for every row;
``transA=1`` refused), ``MatMul`` by a 2-D weight (+ ``Add`` of a bias the same for every row),
Relu, LeakyRelu, Gelu (the op, or the Erf/tanh formula that ``export_onnx`` writes before
opset 20), Tanh, Sigmoid, SiLU (``x * Sigmoid(x)``), Softmax and LogSoftmax (one axis from
opset 13; before it, only where the flattened softmax is a one-axis one), LayerNormalization,
BatchNormalization (inference, ``(N, C)`` or ``(N, C, L)``), Flatten and Reshape (when they
merge runs of neighbouring dims, checked against the shapes the graph declares), Identity
and inference Dropout. Anything else is a ``FormatError`` naming the file and the node.

External data is read only from files inside the model's folder (after resolving symlinks),
and the model passes ``onnx.checker`` (full check) before anything is built.
"""

from __future__ import annotations

import itertools
import math
import os

import numpy as np

from .. import layers as L
from ..errors import FormatError
from . import onnx_file
from . import onnx_ops as ops
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
_DTYPES = {1: np.dtype(np.float32), 11: np.dtype(np.float64)}  # TensorProto FLOAT, DOUBLE
_DEFAULT_DOMAINS = onnx_file.DEFAULT_DOMAINS
_READ_HINT = ("import_onnx reads Gemm, MatMul(+Add), Relu, LeakyRelu, Gelu, Tanh, Sigmoid, "
              "Softmax, LogSoftmax, LayerNormalization, BatchNormalization, Flatten, Reshape, "
              "Identity, Dropout, a residual Add and the GELU/SiLU formulas")
_TOO_OLD = {
    "Gemm": "its 'broadcast' attribute decides how C is added",
    "Add": "its 'broadcast'/'axis' attributes decide how the operands line up",
    "Mul": "its 'broadcast'/'axis' attributes decide how the operands line up",
    "Div": "its 'broadcast'/'axis' attributes decide how the operands line up",
    "BatchNormalization": "its 'is_test'/'spatial' attributes decide whether it trains",
    "Dropout": "its 'is_test' attribute decides whether it drops",
    "Reshape": "its target shape is an attribute",
}


def _onnx():
    try:
        import onnx
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError(f"import_onnx needs the 'onnx' package: {INSTALL_HINT}") from None
    return onnx


# ----------------------------------------------------------------------------- the graph


class _Reader:
    """The vetted graph: its nodes (with their operator versions), constants, the one input
    (name, dtype, shape) and output, and the shapes the graph declares for its values."""

    def __init__(self, onnx, proto, path: str):
        self.onnx, self.path = onnx, path
        graph = proto.graph
        self.opset = self._opset(proto)
        onnx_file.canonical_domain(proto)
        for f in proto.functions:
            if f.domain in _DEFAULT_DOMAINS:
                self.fail(f"the model defines a local function '{f.name}' in the default "
                          "domain, where it would stand in for an ONNX operator")
        nodes = list(graph.node)
        self._versions = {id(n): self._vet(n) for n in nodes}
        onnx_file.check(onnx, proto, path)
        self.dtype = np.dtype(np.float32)  # until the input is read: attributes of constants
        self.consts = {}
        for t in graph.initializer:
            self.consts[t.name] = self._array(t, f"initializer '{t.name}'")
        self.nodes = []
        for node in nodes:
            if node.op_type == "Constant":
                self.consts[node.output[0]] = self._constant(node)
            else:
                self.nodes.append(node)
        self._graph_io(graph)
        self.declared = {}
        for v in (*graph.value_info, *graph.output):
            if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape"):
                self.declared[v.name] = self._dims(v.type.tensor_type.shape)

    # -- vetting
    def _opset(self, proto) -> int:
        versions = [o.version for o in proto.opset_import if o.domain in _DEFAULT_DOMAINS]
        if not versions:
            self.fail("the model imports no opset of the default ONNX domain (opset_import "
                      "has no entry with domain '' or 'ai.onnx')",
                      hint="make the model with onnx.helper.make_model(..., opset_imports="
                           "[onnx.helper.make_opsetid('', 17)])")
        if len(set(versions)) > 1:
            self.fail(f"opset_import names the default domain twice, as opsets {versions}",
                      hint="keep one entry for the default domain")
        newest = self.onnx.defs.onnx_opset_version()
        if versions[0] > newest:
            self.fail(f"opset {versions[0]} is newer than the installed onnx knows (up to "
                      f"{newest}), so what its operators mean cannot be checked",
                      hint="upgrade onnx, or export with an older opset")
        return versions[0]

    def _vet(self, node) -> int:
        """The operator version (schema since_version) of a node import_onnx can read, else a
        FormatError naming it: outside the default domain, unknown, or a version not read."""
        op = node.op_type
        if node.domain not in _DEFAULT_DOMAINS:
            self.fail(f"its domain is '{node.domain}'; import_onnx reads operators of the "
                      "default ONNX domain ('' or 'ai.onnx') only, and a same-named operator "
                      "of another domain may mean anything", node,
                      "re-export without custom operators")
        if op not in ops.READ_OPS:
            self.fail("unsupported operator: linearkit has no layer for it", node, _READ_HINT)
        try:
            version = self.onnx.defs.get_schema(op, self.opset, "").since_version
        except self.onnx.defs.SchemaError:
            self.fail(f"{op} is not an operator of opset {self.opset}", node,
                      f"{op} exists from opset {min(ops.VERSIONS[op])}")
        if version not in ops.VERSIONS[op]:
            why = _TOO_OLD.get(op, "import_onnx does not know what this version means")
            self.fail(f"{op}-{version} (opset {self.opset}) is not read: {why}", node,
                      "convert the model to a newer opset: onnx.version_converter."
                      "convert_version(model, 17)")
        return version

    def version(self, node) -> int:
        return self._versions[id(node)]

    def _array(self, tensor, what: str, node=None) -> np.ndarray:
        try:
            return self.onnx.numpy_helper.to_array(tensor)
        except Exception as e:  # noqa: BLE001 - a raw_data of the wrong size, an unknown type
            self.fail(f"{what} cannot be read ({type(e).__name__}: {e})", node)

    def _constant(self, node) -> np.ndarray:
        if len(node.attribute) != 1:
            self.fail("expected exactly one value attribute", node)
        a = node.attribute[0]
        if a.name == "value":
            return self._array(a.t, f"its value '{node.output[0]}'", node)
        if a.name in ("value_float", "value_floats"):
            return np.array(self.onnx.helper.get_attribute_value(a), np.float32)
        if a.name in ("value_int", "value_ints"):
            return np.array(self.onnx.helper.get_attribute_value(a), np.int64)
        self.fail(f"a constant given as '{a.name}': import_onnx reads numeric tensors", node)

    def _producer(self, name: str):
        return next((n for n in self.graph.node if name in n.output), None)

    def _graph_io(self, graph) -> None:
        """The one tensor input and one output, or a FormatError naming the node at fault."""
        self.graph = graph
        inputs = [v for v in graph.input if v.name not in self.consts]
        summary = (f"expected a graph with one input and one output, got inputs "
                   f"{[v.name for v in inputs]} and outputs {[v.name for v in graph.output]}")
        if not inputs:
            self.fail(f"{summary}: it computes its output from constants alone",
                      self._producer(graph.output[0].name) if graph.output else None)
        if len(inputs) > 1:
            reader = next((n for n in graph.node if inputs[1].name in n.input), None)
            self.fail(f"{summary}: '{inputs[1].name}' is a second input", reader,
                      "store weights as initializers (onnx.numpy_helper.from_array)")
        if len(graph.output) != 1:
            extra = graph.output[1].name if len(graph.output) > 1 else None
            self.fail(f"{summary}" + (f": '{extra}' is a second output" if extra else ""),
                      None if extra is None else self._producer(extra))
        v = inputs[0]
        self.input, self.output = v.name, graph.output[0].name
        first = next((n for n in graph.node if v.name in n.input), None)
        elem = v.type.tensor_type.elem_type if v.type.HasField("tensor_type") else None
        if elem not in _DTYPES:
            kind = (self.onnx.helper.tensor_dtype_to_string(elem) if elem is not None
                    else v.type.WhichOneof("value"))
            self.fail(f"the graph input '{v.name}' is a {kind}; expected a float32 or float64 "
                      "tensor (linearkit computes in those)", first)
        self.dtype = _DTYPES[elem]
        shape = v.type.tensor_type.shape if v.type.tensor_type.HasField("shape") else None
        self.input_shape = None if shape is None else self.symbolic(self._dims(shape))

    @staticmethod
    def _dims(shape) -> tuple:
        """A declared shape: per dim an int (dim_value), a str (dim_param) or None."""
        return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                     for d in shape.dim)

    def symbolic(self, dims) -> tuple:
        """Declared dims as monomials; an unnamed open dim gets a fresh symbol."""
        out = []
        for d in dims:
            if isinstance(d, int):
                out.append(ops.dim_of(d))
            else:
                out.append((1, (d if d else f"?{next(_fresh)}",)))
        return tuple(out)

    def merge(self, shape, name: str, node):
        """The chain's shape for value ``name``, refined by what the graph declares for it (a
        declared number replaces an open dim), or a FormatError when the two disagree."""
        declared = self.declared.get(name)
        if declared is None:
            return shape
        if shape is None:
            return self.symbolic(declared)
        if len(declared) != len(shape) or any(
                isinstance(d, int) and ops.known(s) not in (None, d)
                for s, d in zip(shape, declared)):
            shown = tuple("?" if d is None else d for d in declared)
            self.fail(f"it gives '{name}' the shape {ops.shape_str(shape)}, the graph declares "
                      f"{shown}", node, "fix or drop the value_info the graph declares")
        return tuple(ops.dim_of(d) if isinstance(d, int) else s
                     for s, d in zip(shape, declared))

    # -- reading nodes
    def fail(self, problem: str, node=None, hint: str | None = None):
        if node is not None:
            problem = f"node '{node.name or '?'}' ({node.op_type}): {problem}"
        raise FormatError(problem, path=self.path, hint=hint)

    def attr(self, node, name, default):
        for a in node.attribute:
            if a.name == name:
                value = self.onnx.helper.get_attribute_value(a)
                if isinstance(value, float):
                    # stored as float32: a float32 model computes with it as 1e-05 (the
                    # shortest repr), a float64 one with its exact value, as ONNX engines do
                    return (float(value) if self.dtype == np.float64
                            else float(str(np.float32(value))))
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

    def weight(self, node, i, what: str, optional: bool = False, cast: bool = False):
        """A constant float input in the chain's dtype (``cast``: converted to it)."""
        w = self.const(node, i, what, optional)
        if w is None:
            return None
        if w.dtype.kind != "f" or (w.dtype != self.dtype and not cast):
            self.fail(f"its {what} has dtype {w.dtype}; expected {self.dtype}, the graph "
                      "input's", node)
        return w.astype(self.dtype, copy=False)

    def match(self, i: int, x: str, shape):
        """The name, output and length of a multi-node pattern starting at node i, else None."""
        for name, pattern in _PATTERNS:
            nodes = self.nodes[i:i + len(pattern)]
            if len(nodes) < len(pattern) or [n.op_type for n in nodes] != [p[0] for p in pattern]:
                continue
            if all(self._args(n, args, nodes, x, shape) for n, (_, args) in zip(nodes, pattern)):
                return name, nodes[-1].output[0], len(pattern)
        return None

    def _args(self, node, args, nodes, x, shape) -> bool:
        got = list(node.input)
        if len(got) != len(args):
            return False
        orders = [got, got[::-1]] if node.op_type in ("Add", "Mul") else [got]  # they commute
        return any(all(self._is(g, a, nodes, x, shape) for g, a in zip(order, args))
                   for order in orders)

    def _is(self, name, arg, nodes, x, shape) -> bool:
        if arg == "x":
            return name == x
        if isinstance(arg, int):
            return name == nodes[arg].output[0]
        value = self.consts.get(name)
        rank = None if shape is None else len(shape)
        # a one-element constant of more dims than x would broadcast the output to them
        fits = value is not None and value.size == 1 and (
            value.ndim == 0 or (rank is not None and value.ndim <= rank))
        rtol = 1e-12 if self.dtype == np.float64 else 1e-6
        return fits and bool(np.isclose(value, arg, rtol=rtol, atol=0))


_fresh = itertools.count()  # names for open dims: '?0', '?1', ... (shown as '?')


def import_onnx(path: str | os.PathLike):
    """Rebuild the model in the ONNX file ``path`` as an ``lk.Sequential`` in eval mode.

    Returns
    -------
    model : Sequential
        ``model(x)`` equals the graph's output for an input ``x`` of the graph's input shape
        (float32 or float64). A ``Gemm`` ``Y = alpha A B' + beta C`` on ``A (M, K)`` becomes a
        ``Linear`` with ``weight = alpha B'ᵀ`` ``(N, K)`` and ``bias = beta C`` reduced to
        ``(N,)``; a ``MatMul`` by ``W (K, N)`` has ``weight = Wᵀ``.

    Raises ``FormatError`` (a ValueError) naming the file, and the node and its op type, for a
    file that is not ONNX or fails the ONNX checker, external data outside the model's folder,
    a node outside the default domain or of an operator (or operator version) linearkit has no
    layer for, a ``transA=1`` Gemm, a bias that varies by row, a softmax before opset 13
    over more than one axis, a Reshape or Flatten that is not a merge of neighbouring dims, a
    training-mode BatchNormalization or Dropout, or a graph that is not a chain. Nothing is
    built when it raises. ``FileNotFoundError`` for a missing file.
    """
    onnx = _onnx()
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such ONNX file: {path}")
    r = _Reader(onnx, onnx_file.load(onnx, path), path)
    modules, x, shape = [], r.input, r.merge(r.input_shape, r.input, None)
    marks = {x: 0}  # a chain value -> how many modules came before it (for a residual Add)
    shapes = {x: shape}
    i = 0
    while i < len(r.nodes):
        node = r.nodes[i]
        op, step, new = node.op_type, 1, []
        found = r.match(i, x, shape)
        if found is not None:
            kind, out, step = found
            new = [_PATTERN_MODULES[kind]()]
        elif op == "Add" and len(node.input) == 2 and all(v not in r.consts for v in node.input):
            skip = node.input[1] if node.input[0] == x else node.input[0]
            k = marks.get(skip)
            if x not in node.input or k is None or k >= len(modules):
                r.fail(f"adds '{node.input[0]}' and '{node.input[1]}'; import_onnx reads a "
                       "residual x + f(x) of the chain's value and an earlier one", node)
            _same_shape(r, node, shapes[skip], shape)
            inner = modules[k:]
            modules[k:] = [L.Residual(inner[0] if len(inner) == 1 else L.Sequential(*inner))]
            marks = {v: n for v, n in marks.items() if n <= k}
            out = node.output[0]
        else:
            if not node.input or node.input[0] != x:
                r.fail(f"reads {list(node.input)}, not the chain's value '{x}'; import_onnx "
                       "reads graphs where each node takes the previous node's output", node)
            out = node.output[0]
            converted = ops.convert(r, node, shape)
            if converted is None:
                article = "an" if op[0] in "AEIOU" else "a"
                r.fail(f"{article} {op} outside the patterns import_onnx knows (a residual Add, a "
                       "MatMul's bias Add, the GELU and SiLU formulas): linearkit has no "
                       "layer for it", node, _READ_HINT)
            new, shape = converted
            if op == "MatMul":
                new, shape, out, step = _fuse_bias(r, i, new, shape, out)
        modules.extend(new)
        x = out
        shape = r.merge(shape, x, r.nodes[i + step - 1])
        marks[x], shapes[x] = len(modules), shape
        i += step
    if x != r.output:
        r.fail(f"the chain ends at '{x}', not at the graph's output '{r.output}'")
    return L.Sequential(*modules).eval()


def _same_shape(r, node, a, b) -> None:
    """A residual's two operands must have one shape: linearkit's Residual does not broadcast."""
    if a is None or b is None:
        return
    if len(a) != len(b) or any(None not in (ops.known(p), ops.known(q)) and p != q
                               for p, q in zip(a, b)):
        r.fail(f"adds values of shapes {ops.shape_str(a)} and {ops.shape_str(b)}; linearkit's "
               "Residual needs them equal", node)


def _fuse_bias(r, i, new, shape, out):
    """A MatMul followed by an Add of a constant: the constant becomes the Linear's bias."""
    nxt = r.nodes[i + 1] if i + 1 < len(r.nodes) else None
    if (nxt is None or nxt.op_type != "Add" or len(nxt.input) != 2 or out not in nxt.input
            or all(v == out for v in nxt.input)):
        return new, shape, out, 1
    other = next(v for v in nxt.input if v != out)
    if other not in r.consts:
        return new, shape, out, 1
    shape = r.merge(shape, out, r.nodes[i])
    linear = new[0]
    bias = r.weight(nxt, list(nxt.input).index(other), "bias")
    b = ops.row_bias(r, nxt, bias, linear.out_features, None if shape is None else len(shape),
                     "bias")
    return [ops.linear(r, linear.weight.data, b)], shape, nxt.output[0], 2
