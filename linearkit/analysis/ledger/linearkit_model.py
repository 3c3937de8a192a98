"""The ledger's linearkit path: a shape-only pass that mirrors what each layer's ``vjp`` does.

No array is computed: each value is a symbolic ``_T`` (a shape and the key of the buffer it lives
in), and each layer's own shape check runs on a zero-stride stand-in, so a bad input raises the
ShapeError the real forward would, located in the model. A module type without a rule is run
once, for real, on zeros (``custom.run_custom``).
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import ShapeError, _Located
from ...layers import (
    BatchNorm1d,
    Dropout,
    Flatten,
    Identity,
    LayerNorm,
    Linear,
    LogSoftmax,
    Residual,
    Sequential,
    Softmax,
)
from ...module import Module
from .accumulator import Acc
from .costs import kind_cost, lead, linear_cost, norm_module_cost
from .custom import run_custom
from .linearkit_layers import ACTIVATIONS, describe, linear_info, trains

__all__ = ["linearkit_pass"]


def linearkit_pass(model: Module, shape, override):
    """-> (acc, storage dtype name, bytes per element, buffer bytes) for a linearkit Module."""
    pdtype = next((p.dtype for p in model.parameters()), np.dtype(np.float32))
    store = override or np.dtype(pdtype)
    acc = Acc(store.itemsize)
    _LinearkitPass(model, acc, store.itemsize).visit(
        model, "", None if shape is None else _T(shape, key=("input",)), False, 0)
    buffers = sum(b.size * (store.itemsize if b.dtype.kind == "f" else b.itemsize)
                  for b in model.buffers())
    return acc, store.name, store.itemsize, buffers


def _fake(shape: tuple, dtype) -> np.ndarray:
    """A zero array of ``shape`` that takes no memory (stride 0), to run the layers' own checks."""
    return np.broadcast_to(np.zeros((), dtype), shape)


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
        i = acc.row(path, describe(m), depth, input_shape=None if x is None else x.shape)
        acc.own_params(i, self.params_of(m))
        try:
            y = self._dispatch(m, i, path, x, need, depth)
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

    def _dispatch(self, m, i, path, x, need, depth):
        acc, row = self.acc, self.acc.rows[i]
        if isinstance(m, Sequential):
            row.kind = "sequential"
            children, chain = [], []
            for name, child in m._modules.items():
                if child is None:
                    continue
                cpath = f"{path}.{name}" if path else name
                start = len(acc.rows)
                x = self.visit(child, cpath, x, need, depth + 1)
                children.append(start)
                chain.append(start)
                need = need or trains(child)
            acc.chains.append((i, chain))
            acc.roll_up(i, children)
            return x
        if isinstance(m, Residual):
            row.kind = "residual"
            start = len(acc.rows)
            fx = self.visit(m.module, f"{path}.module" if path else "module", x, need, depth + 1)
            acc.roll_up(i, [start])
            if x is None:
                return None
            if fx.shape != x.shape:
                m._check(_fake(x.shape, np.float32), _fake(fx.shape, np.float32))
            acc.add_cost(i, kind_cost(m, "residual", x.shape, need))
            return _T(x.shape)
        if x is None:  # parameters only
            row.kind = "container" if m._modules else row.kind
            if isinstance(m, Linear):
                row.kind = "linear"
                self._lazy_note(m, row, None)
                if m.weight is not None:
                    acc.linear_weights[i] = m.weight.data
                    row.info = linear_info(m)
            elif isinstance(m, BatchNorm1d):
                row.kind, row.info = "batchnorm", {"c": m.num_features}
            children = []
            for name, child in m.named_children():
                children.append(len(acc.rows))
                self.visit(child, f"{path}.{name}" if path else name, None, need, depth + 1)
            acc.roll_up(i, children)
            return None
        if isinstance(m, Linear):
            return self._linear(m, i, x, need)
        if isinstance(m, ACTIVATIONS):
            row.kind = "activation"
            if isinstance(m, Softmax | LogSoftmax):
                m._axis(_fake(x.shape, np.float32))
            acc.add_cost(i, kind_cost(m, "activation", x.shape, need))
            y = _T(x.shape)
            saved = y if getattr(m, "_keeps", "y") == "y" else x
            acc.keep(i, saved.key, self.nbytes(x.shape))
            return y
        if isinstance(m, Dropout):
            row.kind = "dropout"
            if not m.training or m.p == 0.0:
                row.note = "identity (eval mode)" if not m.training else ""
                row.saved_bytes = 0
                return x
            acc.add_cost(i, kind_cost(m, "dropout", x.shape, need))
            acc.keep(i, ("mask", i), self.nbytes(x.shape))
            return _T(x.shape)
        if isinstance(m, Flatten):
            row.kind = "flatten"
            row.saved_bytes = 0
            return _T(m._target(x.shape), key=x.key)
        if isinstance(m, Identity):
            row.kind = "identity"
            row.saved_bytes = 0
            return x
        if isinstance(m, LayerNorm):
            return self._layernorm(m, i, x, need)
        if isinstance(m, BatchNorm1d):
            return self._batchnorm(m, i, x, need)
        return _T(*run_custom(self, m, i, path, x, need, depth))  # no rule: run it once

    @staticmethod
    def _lazy_note(m, row, n_in):
        if m.in_features is None:
            would = ""
            if n_in is not None:
                would = (f"; {n_in * m.out_features + (m.out_features if m._has_bias else 0):,} "
                         f"params once materialized by this input")
            row.note = f"uninitialized (in_features=?){would}"

    def _linear(self, m, i, x, need):
        acc, row = self.acc, self.acc.rows[i]
        row.kind = "linear"
        if m.in_features is None:  # LazyLinear: never materialize it here
            if len(x.shape) == 0:
                raise ShapeError(f"expected input of shape (*, in_features), got {x.shape}",
                                 module=m, hint="a 0-d input (a scalar) has no feature dimension")
            n_in, bias, w_grad, b_grad = x.shape[-1], m._has_bias, True, m._has_bias
            self._lazy_note(m, row, n_in)
        else:
            m._input(_fake(x.shape, m.weight.data.dtype))  # the layer's own shape check
            n_in, bias = m.in_features, m.bias is not None
            w_grad, b_grad = m.weight.requires_grad, bias and m.bias.requires_grad
            acc.linear_weights[i] = m.weight.data
        n_out = m.out_features
        row.info = {"in": n_in, "out": n_out, "bias": bool(bias), "lazy": m.in_features is None}
        acc.add_cost(i, linear_cost(lead(x.shape), n_in, n_out, bias, need, w_grad, b_grad))
        if w_grad:
            acc.keep(i, x.key, self.nbytes(x.shape))  # the closure holds x (for dW) only then
        return _T(x.shape[:-1] + (n_out,))

    def _layernorm(self, m, i, x, need):
        acc, row = self.acc, self.acc.rows[i]
        row.kind = "layernorm"
        m._input(_fake(x.shape, m.dtype))
        acc.add_cost(i, norm_module_cost(m, math.prod(x.shape), need))
        rows = math.prod(x.shape[:len(x.shape) - len(m.normalized_shape)])
        acc.keep(i, ("xhat", i), self.nbytes(x.shape))  # xhat
        acc.keep(i, ("rstd", i), rows * self.itemsize)  # 1/sqrt(var + eps) per row
        return _T(x.shape)

    def _batchnorm(self, m, i, x, need):
        acc, row = self.acc, self.acc.rows[i]
        row.kind = "batchnorm"
        c, shape = m.num_features, x.shape
        if len(shape) not in (2, 3) or shape[1] != c:
            hint = None
            if len(shape) == 1 and shape[0] == c:
                hint = "a single sample: add a batch dimension with x[None]"
            elif len(shape) == 3 and shape[2] == c:
                hint = "channels go in dim 1: x.transpose(0, 2, 1) turns (N, L, C) into (N, C, L)"
            raise ShapeError(f"expected input of shape (N, {c}) or (N, {c}, L), got {shape}",
                             module=m, hint=hint)
        batch_stats = m.training or m.running_mean is None or m.running_var is None
        if batch_stats and math.prod(shape) // max(c, 1) == 1:
            raise ShapeError(f"Expected more than 1 value per channel when training, got input "
                             f"of shape {shape}", module=m,
                             hint="use a batch of at least 2 samples, or call .eval() first "
                                  "to normalize with the running statistics")
        row.info = {"c": c}
        acc.add_cost(i, norm_module_cost(m, math.prod(shape), need, eval_mode=not batch_stats))
        if not batch_stats:
            row.note = "eval: running statistics"
        acc.keep(i, ("xhat", i), self.nbytes(shape))
        acc.keep(i, ("rstd", i), c * self.itemsize)
        return _T(shape)
