"""The ledger's linearkit path: a shape-only pass that mirrors what each layer's ``vjp`` does.

No array is computed: each value is a symbolic ``_T`` (a shape and the key of the buffer it lives
in). What each layer does to a shape, costs and keeps comes from its rule (``linearkit.rules``):
the rule runs the layer's own shape check, so a bad input raises the ShapeError the real forward
would, located in the model; a container's rule walks its children. A module type without a rule
is run once, for real, on zeros (``custom.run_custom``).
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import _Located
from ...module import Module
from .accumulator import Acc
from .custom import run_custom
from .linearkit_layers import describe, fill_row, rule_for

__all__ = ["linearkit_pass"]


def linearkit_pass(model: Module, shape, override):
    """-> (acc, storage dtype name, bytes per element, buffer bytes) for a linearkit Module."""
    pdtype = next((p.dtype for p in model.parameters()), np.dtype(np.float32))
    store = override or np.dtype(pdtype)
    acc = Acc(store.itemsize)
    _LinearkitPass(model, acc, store.itemsize).visit(
        model, "", None if shape is None else _T(shape, key=("input",)), False, 0)
    acc.finish_recompute()
    buffers = sum(b.size * (store.itemsize if b.dtype.kind == "f" else b.itemsize)
                  for b in model.buffers())
    return acc, store.name, store.itemsize, buffers


class _T:
    """A symbolic array: its shape and the key of the buffer it lives in (views share it)."""

    __slots__ = ("key", "shape")
    _next = 0

    def __init__(self, shape, key=None):
        self.shape = tuple(shape)
        if key is None:
            _T._next += 1
            key = ("t", _T._next)
        self.key = key


class _LinearkitPass:
    """A shape-only pass over a linearkit model that mirrors what each ``vjp`` computes/keeps."""

    def __init__(self, model: Module, acc: Acc, itemsize: int):
        self.model = model
        self.acc = acc
        self.itemsize = itemsize

    def nbytes(self, shape) -> int:
        return math.prod(shape) * self.itemsize

    def params_of(self, m: Module, recurse=False):
        plist = m.parameters(recurse=recurse)
        return [(id(p), p.numel(), p.requires_grad) for p in plist]

    def visit(self, m: Module, path: str, x: _T | None, need: bool, depth: int) -> _T | None:
        acc = self.acc
        rule = rule_for(m)
        i = acc.row(path, describe(m, rule), depth, input_shape=None if x is None else x.shape)
        acc.own_params(i, self.params_of(m))
        try:
            if rule is not None and rule.compose is not None:
                y = self._container(rule, m, i, path, x, need, depth)
            elif x is None:
                y = self._tree(rule, m, i, path, need, depth)
            elif rule is None:
                y = _T(*run_custom(self, m, i, path, x, need, depth))  # no rule: run it once
            else:
                y = self._layer(rule, m, i, x, need)
        except _Located as err:
            if err.module is None:
                err.module = m
            err.locate(self.model)
            raise
        row = acc.rows[i]
        if y is not None:
            row.output_shape = y.shape
            row.output_bytes = self.nbytes(y.shape)
        return y

    def _layer(self, rule, m, i, x: _T, need: bool) -> _T:
        """A leaf: the rule's shape-only forward, then its cost and saved arrays."""
        shape = rule.shape_of_output(m, x.shape)  # raises the layer's own ShapeError
        y = _T(shape, key=x.key if rule.output_shares_input(m) else None)
        fill_row(self.acc, i, rule, m, x.shape, need, {"input": x.key, "output": y.key})
        return y

    def _container(self, rule, m, i, path, x: _T | None, need: bool, depth: int):
        """The rule's ``compose`` walks the children; then the container's own share."""
        acc = self.acc
        acc.containers.add(i)
        children: list[int] = []

        def visit(child, name, cx, cneed):
            children.append(len(acc.rows))
            return self.visit(child, f"{path}.{name}" if path else name, cx, bool(cneed),
                              depth + 1)

        recompute = acc.begin_recompute() if rule.kind == "checkpoint" else None
        out = rule.compose(m, x, need, visit)
        if rule.kind == "sequential":
            acc.chains.append((i, children))  # adjacent children, for the findings
        acc.roll_up(i, children)
        if recompute is not None:  # the children's saved arrays are recomputed in backward
            acc.end_recompute(i, recompute, None if x is None else x.key)
        if x is None:
            fill_row(acc, i, rule, m, None, need)
            return None
        if out is None:
            raise TypeError(f"the rule of {type(m).__name__} returned None from compose() for an "
                            f"input of shape {x.shape}; return the value visit() gave for the "
                            "output, or the output's shape")
        y = out if isinstance(out, _T) else _T(out)
        fill_row(acc, i, rule, m, x.shape, need, {"input": x.key, "output": y.key})
        return y

    def _tree(self, rule, m, i, path, need: bool, depth: int) -> None:
        """No input shape: the row's kind and findings' info, then the children's parameters."""
        acc = self.acc
        if rule is not None:
            fill_row(acc, i, rule, m, None, need)
        elif any(True for _ in m.children()):
            acc.rows[i].kind = "container"
        children = []
        for name, child in m.named_children():
            children.append(len(acc.rows))
            self.visit(child, f"{path}.{name}" if path else name, None, need, depth + 1)
        acc.roll_up(i, children)
        return None
