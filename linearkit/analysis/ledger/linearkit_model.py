"""The ledger's linearkit path: a shape-only pass that mirrors what each layer's ``vjp`` does.

No array is computed: each value is a symbolic ``_T`` (a shape, a dtype and the key of the buffer
it lives in). What each layer does to a shape, costs and keeps comes from its rule
(``linearkit.rules``): the rule runs the layer's own shape check, so a bad input raises the
ShapeError the real forward would, located in the model; a container's rule walks its children.
A module type without a rule is run once, for real, on zeros (``custom.run_custom``).

Precision (``linearkit.precision``, read when the pass runs): values are in their compute dtype —
the input in the first parameter's (float32 for 16-bit storage), a layer's output in its own
parameters' compute dtype (a parameter-free layer keeps its input's); an array a rule keeps
``'activation'`` is in the policy's ``activations`` dtype when set (a new copy, not shared with
the layer that made it). ``override`` (``ledger(dtype=...)``) counts every floating parameter
and buffer as if stored in that dtype, values in its compute dtype.
"""

from __future__ import annotations

import math

import numpy as np

from ... import precision as P
from ...core.module import Module
from ...errors import Located
from .accumulator import Acc
from .custom import run_custom
from .linearkit_layers import describe, fill_row, rule_for

__all__ = ["linearkit_pass"]


def linearkit_pass(model: Module, shape, override):
    """-> (acc, sizes) for a linearkit Module.

    ``sizes``: ``weights`` and ``buffers`` (bytes), ``store`` (the first parameter's storage
    dtype name, or the override's), ``params``: ``[(numel, itemsize, grad_itemsize,
    trainable), ...]`` once per parameter (tied ones once), the gradient's dtype as
    ``precision.grad_dtype`` gives it under the policy in force.
    """
    pdtype = next((p.dtype for p in model.parameters()), np.dtype(np.float32))
    store = override or np.dtype(pdtype)
    acc = Acc(store.itemsize)
    lpass = _LinearkitPass(model, acc, override)
    x = None if shape is None else _T(shape, P.compute_dtype(store), key=("input",))
    lpass.visit(model, "", x, False, 0)
    acc.finish_recompute()
    params, seen = [], set()
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        storage = override or p.data.dtype
        params.append((p.numel(), storage.itemsize, P.grad_dtype(storage).itemsize,
                       bool(p.requires_grad)))
    weights = sum(numel * itemsize for numel, itemsize, _, _ in params)
    buffers = sum(b.size * (override.itemsize if override is not None and P.is_float(b.dtype)
                            else b.itemsize) for b in model.buffers())
    note = _policy_note([override or p.data.dtype for p in model.parameters()])
    if note:
        acc.notes.append(note)
    return acc, {"weights": weights, "buffers": buffers, "store": store.name, "params": params}


def _policy_note(storages) -> str:
    """What the precision policy in force made the ledger count ('' when it changes nothing)."""
    policy = P.get_policy()
    parts = []
    if any(P.is_16bit(s) for s in storages):
        where = "float32" if policy.grads == "float32" else "their storage dtype"
        parts.append(f"16-bit parameters compute in float32 (outputs float32) and get "
                     f"gradients in {where} (grads={policy.grads!r})")
    if policy.activations is not None:
        parts.append(f"what layers keep through precision.saved_activation (a Linear's input, "
                     f"a norm's xhat) is a {policy.activations.name} copy "
                     f"(activations={policy.activations.name!r}); other saved arrays stay in "
                     f"the compute dtype")
    if not parts:
        return ""
    return "precision policy (read when the ledger ran): " + "; ".join(parts) + "."


class _T:
    """A symbolic array: its shape, dtype and the key of the buffer it lives in (views share
    it)."""

    __slots__ = ("dtype", "key", "shape")
    _next = 0

    def __init__(self, shape, dtype, key=None):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        if key is None:
            _T._next += 1
            key = ("t", _T._next)
        self.key = key


class _LinearkitPass:
    """A shape-only pass over a linearkit model that mirrors what each ``vjp`` computes/keeps."""

    def __init__(self, model: Module, acc: Acc, override: np.dtype | None):
        self.model = model
        self.acc = acc
        self.override = override

    @staticmethod
    def nbytes(shape, dtype) -> int:
        return math.prod(shape) * np.dtype(dtype).itemsize

    def compute_of(self, m: Module, default: np.dtype) -> np.dtype:
        """The dtype ``m``'s arithmetic (and output) is in: its own first parameter's compute
        dtype (the override's when given), else ``default`` (its input's)."""
        own = next((p.data.dtype for p in m.parameters(recurse=False)), None)
        if own is None:
            return default
        return P.compute_dtype(self.override or own)

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
        except Located as err:
            if err.module is None:
                err.module = m
            err.locate(self.model)
            raise
        row = acc.rows[i]
        if y is not None:
            row.output_shape = y.shape
            row.output_bytes = self.nbytes(y.shape, y.dtype)
        return y

    def _layer(self, rule, m, i, x: _T, need: bool) -> _T:
        """A leaf: the rule's shape-only forward, then its cost and saved arrays."""
        shape = rule.shape_of_output(m, x.shape)  # raises the layer's own ShapeError
        if rule.output_shares_input(m):
            y = _T(shape, x.dtype, key=x.key)
        else:
            y = _T(shape, self.compute_of(m, x.dtype))
        fill_row(self.acc, i, rule, m, x.shape, need, {"input": x, "output": y})
        return y

    def _container(self, rule, m, i, path, x: _T | None, need: bool, depth: int):
        """The rule's ``compose`` walks the children; then the container's own share."""
        acc = self.acc
        acc.containers.add(i)
        children: list[int] = []
        last = [None]  # the latest value a child returned (a new array's dtype follows it)

        def visit(child, name, cx, cneed):
            children.append(len(acc.rows))
            cy = self.visit(child, f"{path}.{name}" if path else name, cx, bool(cneed),
                            depth + 1)
            last[0] = cy
            return cy

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
        if isinstance(out, _T):
            y = out
        else:  # a new array (Residual's x + f(x)): NumPy's promotion of what made it
            dtypes = [x.dtype] + ([last[0].dtype] if last[0] is not None else [])
            y = _T(out, self.compute_of(m, np.result_type(*dtypes)))
        fill_row(acc, i, rule, m, x.shape, need, {"input": x, "output": y})
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
