"""Write a linearkit model to an ONNX file, layer by layer through the per-layer rules.

Each layer type's rule carries an ``onnx`` emitter (``linearkit/rules/onnx_rules.py``);
``export_onnx`` walks the model with them — containers emit by visiting their children — so a
new layer type becomes exportable by registering a rule with an ``onnx`` field, not by editing
this file. ``onnx`` is imported on first use.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import ShapeError
from ..rules import rule_for
from ..storage.atomic import write_atomically

__all__ = ["OnnxExportError", "export_onnx"]

INSTALL_HINT = 'pip install "linearkit[onnx]" (or pip install onnx onnxruntime)'


class OnnxExportError(ValueError):
    """A model (or one of its modules) cannot be written to ONNX: names the module's path and
    type, the problem and the fix."""


def _onnx():
    try:
        import onnx
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError(f"ONNX export/import needs the 'onnx' package: {INSTALL_HINT}") from None
    return onnx


class _Graph:
    """The builder the rules' ``onnx`` emitters call (see ``linearkit.rules.onnx_rules``)."""

    def __init__(self, onnx, root, dtype: np.dtype, opset: int):
        self._onnx, self._root = onnx, root
        self.dtype, self.opset = dtype, opset
        self.nodes, self.initializers = [], []
        self._shapes: dict[str, tuple] = {}
        self._used: set[str] = set()
        self._path: list[str] = []

    def _fresh(self, hint: str) -> str:
        base = "/".join(self._path + [hint]) if self._path else hint
        name, i = base, 1
        while name in self._used:
            name, i = f"{base}_{i}", i + 1
        self._used.add(name)
        return name

    def shape(self, x: str) -> tuple:
        return self._shapes[x]

    def const(self, array, hint: str, cast: bool = True) -> str:
        array = np.asarray(array, self.dtype if cast else None)
        name = self._fresh(hint)
        self.initializers.append(self._onnx.numpy_helper.from_array(np.ascontiguousarray(array),
                                                                    name))
        return name

    def op(self, op_type: str, inputs: list, hint: str, **attrs) -> str:
        out = self._fresh(hint)
        self.nodes.append(self._onnx.helper.make_node(op_type, list(inputs), [out],
                                                      name=out, **attrs))
        return out

    def where(self, m) -> str:
        path = ".".join(self._path)
        return f"module '{path}' ({type(m).__name__})" if path else f"model ({type(m).__name__})"

    def refuse(self, m, problem: str, fix: str):
        raise OnnxExportError(f"{self.where(m)}: {problem}\n  hint: {fix}")

    def visit(self, m, name: str | None, x: str) -> str:
        """Emit module ``m`` (the child ``name`` of the current one) on input ``x``."""
        if name is not None:
            self._path.append(name)
        try:
            rule = rule_for(m)
            if rule is None or rule.onnx is None:
                self.refuse(m, f"no ONNX rule for layer type {type(m).__module__}."
                            f"{type(m).__qualname__}",
                            "register one: linearkit.rules.register_rule(YourType, "
                            "dataclasses.replace(rule, onnx=emit)) with emit(m, g, x) -> name "
                            "(see linearkit/rules/onnx_rules.py)")
            in_shape = self._shapes[x]
            out_shape = None if rule.compose is not None else rule.shape_of_output(m, in_shape)
            y = rule.onnx(m, self, x)
            if out_shape is None:  # a container: its output is a child's, or new (Residual)
                out_shape = self._shapes.get(y, rule.shape_of_output(m, in_shape))
            self._shapes.setdefault(y, tuple(out_shape))
            return y
        finally:
            if name is not None:
                self._path.pop()


def export_onnx(model, path: str | os.PathLike, input_shape, dynamic_batch: bool = True,
                opset: int = 17) -> str:
    """Write ``model`` (in eval mode) to the ONNX file ``path``, atomically; returns the path.

    Parameters
    ----------
    model : linearkit Module
        Built from layers whose rule has an ``onnx`` emitter: Linear (``Gemm`` with ``transB=1``
        on a 2-D input, ``MatMul`` + ``Add`` on a higher-rank one), the activations, LayerNorm,
        eval-mode BatchNorm1d, Flatten, Softmax/LogSoftmax, Identity, Dropout (both vanish in
        eval), Sequential and Residual (an ``Add``). GELU is the ``Gelu`` op from opset 20, its
        Erf (or tanh) formula below.
    input_shape : tuple of int, ``(N, *, in_features)``
        The input's shape, batch dim first.
    dynamic_batch : bool
        Write the batch dim as the symbol ``'batch'`` so any batch size runs (default True).
    opset : int
        The ONNX operator set (17 or above: LayerNormalization needs 17).

    Notes
    -----
    The graph has one input ``'input'`` and one output ``'output'``, in the model's dtype. The
    file passes ``onnx.checker.check_model(full_check=True)``. It is written to a temp file
    beside ``path`` and renamed over it. An ``OnnxExportError`` (a ValueError) names the module
    that cannot be written and the fix; ``ImportError`` names the ``onnx`` extra.
    """
    onnx = _onnx()
    shape = tuple(int(d) for d in input_shape)
    if not shape or any(d < 1 for d in shape):
        raise OnnxExportError(f"input_shape must be positive dims (batch first), got "
                              f"{tuple(input_shape)}")
    if int(opset) < 17:
        raise OnnxExportError(f"opset {opset} is too old: LayerNormalization needs opset >= 17")
    params = [p.data for p in model.parameters()]
    dtype = np.dtype(params[0].dtype if params else np.float32)
    g = _Graph(onnx, model, dtype, int(opset))
    g._shapes["input"] = shape
    g._used.add("input")
    try:
        y = g.visit(model, None, "input")
    except ShapeError as e:  # input_shape does not fit a layer: name its path in the model
        e.locate(model)
        raise
    out_shape = g.shape(y)
    if y == "input":  # the whole model is the identity in eval mode
        y = g.op("Identity", ["input"], "identity")
    g.nodes.append(onnx.helper.make_node("Identity", [y], ["output"], name="output"))
    elem = onnx.helper.np_dtype_to_tensor_dtype(dtype)
    batch = ["batch"] if dynamic_batch else []

    def value(name, dims):
        dims = batch + list(dims[1:]) if dynamic_batch and dims else list(dims)
        return onnx.helper.make_tensor_value_info(name, elem, dims)

    graph = onnx.helper.make_graph(g.nodes, "linearkit", [value("input", shape)],
                                   [value("output", out_shape)], g.initializers)
    opsets = [onnx.helper.make_opsetid("", int(opset))]
    # The oldest IR version the opset allows, so older runtimes read the file too.
    proto = onnx.helper.make_model(graph, producer_name="linearkit", opset_imports=opsets,
                                   ir_version=onnx.helper.find_min_ir_version_for(opsets))
    onnx.checker.check_model(proto, full_check=True)
    return write_atomically(path, proto.SerializeToString(), suffix=".onnx")
