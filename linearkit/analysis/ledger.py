"""The ledger: what goes in and out of each layer, what it costs, and what is redundant.

``ledger(model, input_shape)`` answers, for a linearkit model, a PyTorch ``nn.Module`` or a
``.safetensors`` file, in one report whose every number can be checked by hand:

* one row per module: path, type, input and output shape, parameters (all / trainable), MACs,
  forward and backward FLOPs, output bytes, and the bytes its backward keeps alive;
* totals and a memory budget for one training step: weights, buffers, gradients, optimizer
  states, a float32 master copy under mixed precision, saved activations;
* findings: redundant linear structure, each with the fix and what it saves.

Counting conventions (printed with every table, see ``CONVENTIONS``):

* **MACs** are the multiply-adds of the matmuls: ``B·in·out`` for a ``Linear(in, out)``, where
  ``B`` is the product of the input's leading dimensions.
* **FLOPs** = 2 per multiply-add, plus one add per output element for each bias
  (``Linear``: ``2·B·in·out + B·out``), plus a nominal per-element cost for nonlinearities and
  normalizations (``ELEMENTWISE_FLOPS``).
* **Backward FLOPs**: the dX GEMM (``2·B·in·out``) only when something before the layer needs a
  gradient (not for the first layer or a frozen prefix — the rule of ``Sequential.vjp``), the dW
  GEMM (``2·B·in·out``) only for a trainable weight, ``B·out`` for a trainable bias, and the
  nominal elementwise backward costs.
* **Saved bytes** are what the backward closures really hold (a Linear its input, ReLU its
  output, Dropout its mask, a norm its normalized input and statistics); an array held by two
  closures (a ReLU's output is the next Linear's input) is counted once, at the first.
"""

from __future__ import annotations

import copy
import math
import os
import re
import textwrap
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..errors import ShapeError, _Located
from ..layers import (
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
from ..module import Module, Parameter

__all__ = [
    "CONVENTIONS",
    "ELEMENTWISE_FLOPS",
    "OPTIMIZER_STATES",
    "PRESETS",
    "Finding",
    "Ledger",
    "Row",
    "human_bytes",
    "ledger",
    "preset",
]

#: Optimizer states kept per trainable parameter.
OPTIMIZER_STATES = {"adam": 2, "adamw": 2, "sgd-momentum": 1, "sgd": 0}

#: Nominal (forward, backward) FLOPs per element for the non-GEMM layers. No standard exists
#: (fvcore and thop ignore these layers, ptflops counts 1 per element); a transcendental
#: function (exp, tanh, erf) counts as one FLOP. Backward counts only the input gradient.
ELEMENTWISE_FLOPS = {
    "ReLU": (1, 1), "LeakyReLU": (2, 2), "Tanh": (1, 3), "Sigmoid": (3, 3), "SiLU": (4, 6),
    "GELU": (5, 8), "Softmax": (4, 4), "LogSoftmax": (4, 4), "Dropout": (1, 1),
    "Residual": (1, 1),
    # Normalization: statistics and normalizing 5/elt (mean, subtract, square, sum, scale), +1
    # each for weight and bias; backward dx 7/elt (+1 with a weight), dweight 2, dbias 1.
    # In eval mode BatchNorm is a per-channel scale and shift: 2/elt forward, 1 backward.
    "norm": (5, 7), "norm-eval": (2, 1),
}

CONVENTIONS = (
    "MACs = multiply-adds of the matmuls (Linear: B*in*out, B = product of the leading dims). "
    "FLOPs = 2 per multiply-add + 1 per output element for each bias (Linear: 2*B*in*out + "
    "B*out) + nominal elementwise costs (ReLU 1/elt, norms 5-7/elt, see ELEMENTWISE_FLOPS). "
    "Backward = dX GEMM 2*B*in*out (skipped for the first layer / a frozen prefix) + dW GEMM "
    "2*B*in*out (skipped for a frozen weight) + B*out per trainable bias + elementwise. "
    "torch FlopCounterMode = 2*MACs (it counts 2*M*N*K per matmul and no bias adds); "
    "fvcore/thop 'FLOPs' = MACs. Saved = bytes the backward closures hold for this batch, "
    "each array once, parameters excluded."
)


# ================================================================================ the report
@dataclass
class Row:
    """One module of the ledger. Containers show the sums over their children.

    ``saved_bytes`` is what this module's backward keeps alive (an array shared with an earlier
    module is counted there). Values are None where they are unavailable (no input shape, a
    weights file, a module type the ledger does not know).
    """

    path: str
    type: str
    depth: int = 0
    input_shape: tuple | None = None
    output_shape: tuple | None = None
    params: int = 0
    trainable_params: int = 0
    macs: int | None = None
    flops: int | None = None
    backward_macs: int | None = None
    backward_flops: int | None = None
    output_bytes: int | None = None
    saved_bytes: int | None = None
    note: str = ""
    kind: str = field(default="module", repr=False)
    info: dict = field(default_factory=dict, repr=False)


@dataclass
class Finding:
    """A redundancy or inefficiency, the fix, and what it saves (negative = costs)."""

    kind: str
    paths: tuple
    message: str
    fix: str
    saving_params: int = 0
    saving_flops: int = 0

    def __str__(self) -> str:
        saving = []
        if self.saving_params:
            saving.append(f"{self.saving_params:,} params")
        if self.saving_flops:
            saving.append(f"{self.saving_flops:,} FLOPs/forward")
        tail = f" Saves {', '.join(saving)}." if saving else ""
        if self.saving_params < 0 or self.saving_flops < 0:
            tail = tail.replace("Saves", "Changes").replace(" -", " +")
        return f"[{self.kind}] {', '.join(self.paths)}: {self.message} Fix: {self.fix}.{tail}"


def human_bytes(n: int | None) -> str:
    """``n`` bytes in binary units: '512 B', '513.0 KiB', '64.0 MiB', '1.50 GiB'."""
    if n is None:
        return "n/a"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}" if unit == "GiB" else f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _num(v) -> str:
    return "?" if v is None else f"{v:,}"


def _shape(s) -> str:
    return "-" if s is None else "(" + ", ".join(map(str, s)) + ")"


class Ledger:
    """The report ``ledger()`` returns: ``rows``, ``totals``, ``memory``, ``findings``.

    ``totals``: ``params``, ``trainable_params``, ``macs``, ``flops`` (forward),
    ``backward_macs``, ``backward_flops``, and the forward split ``gemm_flops`` (= 2·macs),
    ``bias_flops``, ``elementwise_flops``; FLOP entries are None for a weights file.
    ``memory`` (bytes): ``weights``, ``buffers``, ``grads``, ``master`` (float32 copy under mixed
    precision), ``optimizer``, ``training_state`` (weights + grads + master + optimizer),
    ``activations`` (saved for backward; None without an input shape) and ``total``.
    """

    def __init__(self, *, source, model_name, input_shape, dtype, optimizer, rows, totals,
                 memory, findings, notes):
        self.source = source
        self.model_name = model_name
        self.input_shape = input_shape
        self.dtype = dtype
        self.optimizer = optimizer
        self.rows: list[Row] = rows
        self.totals: dict[str, Any] = totals
        self.memory: dict[str, Any] = memory
        self.findings: list[Finding] = findings
        self.notes: list[str] = notes
        self.conventions = CONVENTIONS

    # ------------------------------------------------------------------ convenience
    def __getitem__(self, path: str) -> Row:
        """The row of the module at ``path`` ('' is the whole model)."""
        for row in self.rows:
            if row.path == path:
                return row
        raise KeyError(f"no module {path!r} in this ledger; paths: {[r.path for r in self.rows]}")

    def to_dict(self) -> dict:
        """Everything as plain JSON-able Python (ints, strings, lists, None)."""
        rows = []
        for row in self.rows:
            d = asdict(row)
            for k in ("input_shape", "output_shape"):
                d[k] = None if d[k] is None else list(d[k])
            rows.append(d)
        return {
            "source": self.source, "model": self.model_name,
            "input_shape": None if self.input_shape is None else list(self.input_shape),
            "dtype": self.dtype, "optimizer": self.optimizer, "conventions": self.conventions,
            "rows": rows, "totals": dict(self.totals), "memory": dict(self.memory),
            "findings": [dict(asdict(f), paths=list(f.paths), text=str(f))
                         for f in self.findings],
            "notes": list(self.notes),
        }

    # ------------------------------------------------------------------ printing
    _COLUMNS = ("path", "type", "input", "output", "params", "trainable", "MACs", "FLOPs",
                "bwd FLOPs", "out bytes", "saved", "note")
    _NUMERIC = range(4, 11)

    def _cells(self) -> list[list[str]]:
        out = []
        for row in self.rows:
            out.append(["  " * row.depth + (row.path or "(model)"), row.type,
                        _shape(row.input_shape), _shape(row.output_shape), _num(row.params),
                        _num(row.trainable_params), _num(row.macs), _num(row.flops),
                        _num(row.backward_flops), _num(row.output_bytes), _num(row.saved_bytes),
                        row.note])
        return out

    def _summary_lines(self) -> list[str]:
        t, m = self.totals, self.memory
        lines = [
            f"params {t['params']:,}  (trainable {t['trainable_params']:,})",
            (f"forward: {_num(t['macs'])} MACs, {_num(t['flops'])} FLOPs "
            f"(= 2*MACs {_num(t['gemm_flops'])} + bias {_num(t['bias_flops'])} + elementwise "
            f"{_num(t['elementwise_flops'])})"),
            f"backward: {_num(t['backward_macs'])} MACs, {_num(t['backward_flops'])} FLOPs",
            f"memory ({self.optimizer or 'inference'}, {self.dtype}):",
        ]
        for key in ("weights", "buffers", "grads", "master", "optimizer", "training_state",
                    "activations", "total"):
            value = m[key]
            if key in ("buffers", "master") and not value:
                continue
            label = {"training_state": "training state (weights+grads+states)",
                     "activations": "activations saved for backward",
                     "optimizer": "optimizer states"}.get(key, key)
            lines.append(f"  {label:<40} {_num(value):>16} B  {human_bytes(value):>10}")
        return lines

    def __str__(self) -> str:
        cells = self._cells()
        widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(self._COLUMNS)]
        numeric = set(self._NUMERIC)

        def fmt(r):
            return "  ".join(c.rjust(w) if i in numeric else c.ljust(w)
                             for i, (c, w) in enumerate(zip(r, widths))).rstrip()

        shape = "none" if self.input_shape is None else _shape(self.input_shape)
        lines = [f"Ledger of {self.model_name} ({self.source}), input {shape}", fmt(self._COLUMNS),
                 fmt(["-" * w for w in widths])]
        lines += [fmt(r) for r in cells]
        lines += [""] + self._summary_lines()
        lines += [""] + textwrap.wrap("Conventions: " + self.conventions, 100)
        for n in self.notes:
            lines += textwrap.wrap("Note: " + n, 100, subsequent_indent="  ")
        if self.findings:
            lines += ["", "Findings:"]
            for f in self.findings:
                lines += textwrap.wrap(str(f), 100, initial_indent="  - ", subsequent_indent="    ")
        else:
            lines += ["", "Findings: none."]
        return "\n".join(lines)

    def to_markdown(self) -> str:
        """The same report as Markdown: a table, the memory budget, conventions, findings."""
        def esc(s):
            return s.replace("|", "\\|")

        cells = self._cells()
        shape = "none" if self.input_shape is None else _shape(self.input_shape)
        lines = [f"**Ledger of `{self.model_name}`** ({self.source}), input `{shape}`", "",
                 "| " + " | ".join(self._COLUMNS) + " |",
                 "|" + "|".join("---:" if i in self._NUMERIC else "---"
                                for i in range(len(self._COLUMNS)))
                 + "|"]
        for r in cells:
            r = [f"`{r[0].strip()}`"] + r[1:]
            lines.append("| " + " | ".join(esc(c) for c in r) + " |")
        t, m = self.totals, self.memory
        lines += ["", "| total | value |", "|---|---:|",
                  f"| params | {t['params']:,} |", f"| trainable params | {t['trainable_params']:,} |",
                  f"| MACs (forward) | {_num(t['macs'])} |", f"| FLOPs (forward) | {_num(t['flops'])} |",
                  f"| MACs (backward) | {_num(t['backward_macs'])} |",
                  f"| FLOPs (backward) | {_num(t['backward_flops'])} |"]
        lines += ["", f"| memory ({self.optimizer or 'inference'}, {self.dtype}) | bytes | |",
                  "|---|---:|---:|"]
        for key in ("weights", "buffers", "grads", "master", "optimizer", "training_state",
                    "activations", "total"):
            if key in ("buffers", "master") and not m[key]:
                continue
            lines.append(f"| {key.replace('_', ' ')} | {_num(m[key])} | {human_bytes(m[key])} |")
        lines += ["", "Conventions: " + self.conventions]
        lines += [f"Note: {n}" for n in self.notes]
        lines += ["", "**Findings**", ""]
        lines += [f"- {esc(str(f))}" for f in self.findings] or ["none."]
        return "\n".join(lines) + "\n"

    def __repr__(self) -> str:
        t = self.totals
        return (f"<Ledger {self.model_name}: {t['params']:,} params, {_num(t['flops'])} FLOPs, "
                f"{human_bytes(self.memory['total'])} for one training step>")


# ================================================================================ helpers
def _fake(shape: tuple, dtype) -> np.ndarray:
    """A zero array of ``shape`` that takes no memory (stride 0), to run the layers' own checks."""
    return np.broadcast_to(np.zeros((), dtype), shape)


def _lead(shape: tuple) -> int:
    """B: the product of the leading dimensions (1 for a 1-D input)."""
    return math.prod(shape[:-1])


def _linear_cost(B, n_in, n_out, bias, need_dx, w_grad, b_grad):
    """(macs, gemm, bias, elementwise, bwd_macs, bwd_flops) of a Linear on B rows."""
    macs = B * n_in * n_out
    bias_flops = B * n_out if bias else 0
    bwd_macs = macs * (int(need_dx) + int(w_grad))
    return macs, 2 * macs, bias_flops, 0, bwd_macs, 2 * bwd_macs + (B * n_out if b_grad else 0)


def _norm_cost(numel, affine_w, affine_b, need_dx, w_grad, b_grad, eval_mode=False):
    fwd, bwd = ELEMENTWISE_FLOPS["norm-eval" if eval_mode else "norm"]
    f = numel * (fwd + int(affine_w) + int(affine_b))
    b = numel * (bwd + int(affine_w)) if need_dx else 0
    b += numel * (2 if w_grad else 0) + numel * (1 if b_grad else 0)
    return 0, 0, 0, f, 0, b


def _elementwise_cost(name, numel, need_dx):
    fwd, bwd = ELEMENTWISE_FLOPS[name]
    return 0, 0, 0, numel * fwd, 0, numel * bwd if need_dx else 0


def _natural_key(s: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


class _Acc:
    """Accumulates rows, first-wins parameter counting and once-only saved arrays."""

    def __init__(self, itemsize: int):
        self.itemsize = itemsize
        self.rows: list[Row] = []
        self.param_owner: dict[int, str] = {}
        self.kept: set = set()
        self.cost = {"macs": 0, "gemm": 0, "bias": 0, "elem": 0, "bwd_macs": 0, "bwd": 0}
        self.unaccounted: list[str] = []
        self.chains: list[tuple] = []  # (Sequential row, its children's rows), for findings
        self.linear_weights: dict[int, np.ndarray] = {}  # row index -> weight (for findings)
        self.notes: list[str] = []
        self.saved_total = 0

    def row(self, path, type_, depth, kind="module", **kw) -> int:
        self.rows.append(Row(path=path, type=type_, depth=depth, kind=kind, **kw))
        return len(self.rows) - 1

    def own_params(self, index: int, params) -> None:
        """Count ``params`` [(Parameter-like, numel, trainable)] at row ``index``, first wins."""
        row = self.rows[index]
        tied = []
        for key, numel, trainable in params:
            if key in self.param_owner:
                tied.append(self.param_owner[key])
                continue
            self.param_owner[key] = row.path
            row.params += numel
            row.trainable_params += numel if trainable else 0
        if tied:
            row.note = (row.note + " " if row.note else "") + \
                f"tied with {', '.join(sorted({p or '(model)' for p in tied}))}"

    def add_cost(self, index: int, cost) -> None:
        macs, gemm, bias, elem, bwd_macs, bwd = cost
        row = self.rows[index]
        row.macs = (row.macs or 0) + macs
        row.flops = (row.flops or 0) + gemm + bias + elem
        row.backward_macs = (row.backward_macs or 0) + bwd_macs
        row.backward_flops = (row.backward_flops or 0) + bwd
        for k, v in zip(("macs", "gemm", "bias", "elem", "bwd_macs", "bwd"), cost):
            self.cost[k] += v

    def keep(self, index: int, key, nbytes: int) -> None:
        """Row ``index``'s backward holds the array ``key`` (counted once over the model)."""
        row = self.rows[index]
        if row.saved_bytes is None:
            row.saved_bytes = 0
        if key not in self.kept:
            self.kept.add(key)
            row.saved_bytes += nbytes
            self.saved_total += nbytes

    def roll_up(self, index: int, children: list[int]) -> None:
        """Add the children's figures into container row ``index``."""
        row = self.rows[index]
        for c in children:
            child = self.rows[c]
            row.params += child.params
            row.trainable_params += child.trainable_params
            for k in ("macs", "flops", "backward_macs", "backward_flops", "saved_bytes"):
                v = getattr(child, k)
                if v is not None:
                    setattr(row, k, (getattr(row, k) or 0) + v)


# ================================================================================ linearkit
_ACTIVATIONS = (ReLU, LeakyReLU, GELU, Tanh, Sigmoid, SiLU, Softmax, LogSoftmax)


def _trains(module: Module) -> bool:
    return any(p.requires_grad for p in module.parameters())


def _describe(m) -> str:
    """Compact type: 'Linear(784, 256)', 'LayerNorm((256,))', 'Dropout(p=0.1)'."""
    if isinstance(m, Linear):
        if m.in_features is None:
            bias = "" if m._has_bias else ", bias=False"
            return f"LazyLinear(?, {m.out_features}{bias})"
        return f"Linear({m.in_features}, {m.out_features}" + \
            ("" if m.bias is not None else ", bias=False") + ")"
    if isinstance(m, LayerNorm):
        return f"LayerNorm({m.normalized_shape})"
    if isinstance(m, BatchNorm1d):
        return f"BatchNorm1d({m.num_features})"
    if isinstance(m, Dropout):
        return f"Dropout(p={m.p})"
    if isinstance(m, Softmax | LogSoftmax):
        return f"{type(m).__name__}(dim={m.dim})"
    return type(m).__name__


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

    def __init__(self, model: Module, acc: _Acc, itemsize: int):
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
        i = acc.row(path, _describe(m), depth, input_shape=None if x is None else x.shape)
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
                need = need or _trains(child)
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
            acc.add_cost(i, _elementwise_cost("Residual", math.prod(x.shape), need))
            return _T(x.shape)
        if x is None:  # parameters only
            row.kind = "container" if m._modules else row.kind
            if isinstance(m, Linear):
                row.kind = "linear"
                self._lazy_note(m, row, None)
                if m.weight is not None:
                    acc.linear_weights[i] = m.weight.data
                    row.info = {"in": m.in_features, "out": m.out_features,
                                "bias": m.bias is not None, "lazy": False}
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
        numel = math.prod(x.shape)
        if isinstance(m, _ACTIVATIONS):
            row.kind = "activation"
            if isinstance(m, Softmax | LogSoftmax):
                m._axis(_fake(x.shape, np.float32))
            acc.add_cost(i, _elementwise_cost(type(m).__name__, numel, need))
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
            acc.add_cost(i, _elementwise_cost("Dropout", numel, need))
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
        return self._unknown(m, i, path, x, need, depth)

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
        acc.add_cost(i, _linear_cost(_lead(x.shape), n_in, n_out, bias, need, w_grad, b_grad))
        if w_grad:
            acc.keep(i, x.key, self.nbytes(x.shape))  # the closure holds x (for dW) only then
        return _T(x.shape[:-1] + (n_out,))

    def _layernorm(self, m, i, x, need):
        acc, row = self.acc, self.acc.rows[i]
        row.kind = "layernorm"
        m._input(_fake(x.shape, m.dtype))
        w, b = m.weight, m.bias
        acc.add_cost(i, _norm_cost(math.prod(x.shape), w is not None, b is not None, need,
                                   w is not None and w.requires_grad,
                                   b is not None and b.requires_grad))
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
        w, b = m.weight, m.bias
        row.info = {"c": c}
        acc.add_cost(i, _norm_cost(math.prod(shape), w is not None, b is not None, need,
                                   w is not None and w.requires_grad,
                                   b is not None and b.requires_grad, eval_mode=not batch_stats))
        if not batch_stats:
            row.note = "eval: running statistics"
        acc.keep(i, ("xhat", i), self.nbytes(shape))
        acc.keep(i, ("rstd", i), c * self.itemsize)
        return _T(shape)

    # ------------------------------------------------------------------ unknown modules
    def _unknown(self, m, i, path, x, need, depth):
        """A module type the ledger has no rule for: run its real vjp once, on a copy.

        The copy shares the parameters (nothing is copied but buffers), the library's random
        generator is restored afterwards, so the model is left exactly as it was. Known layers
        called inside are recorded and costed by their rules; the bytes the returned closure
        holds are measured by walking it.
        """
        from .. import random as lk_random

        acc, row = self.acc, self.acc.rows[i]
        row.kind = "custom"
        memo = {id(p): p for p in m.parameters()}
        clone = copy.deepcopy(m, memo)
        records, originals = [], dict(m.named_modules())
        dtype = next((p.dtype for p in m.parameters()), np.dtype(np.float32))
        for sub_path, sub in clone.named_modules():
            if sub is not clone:
                self._record(sub, sub_path, records)
        gen = lk_random.default_generator()
        state = gen.bit_generator.state
        x0 = np.zeros(x.shape, dtype)
        try:
            try:
                y, back = clone.vjp(x0, input_grad=need)
            except NotImplementedError:
                back, y = None, clone(x0)
                row.note = "no vjp(): forward only"
        except _Located as err:
            sub_path = next((p for p, s in clone.named_modules() if s is err.module), None)
            if sub_path is not None:
                err.module = originals.get(sub_path, m)
            raise
        finally:
            gen.bit_generator.state = state
        y = np.asarray(y)
        for rec in records:
            sub_path, xs, ys, ig = rec["path"], rec["x"], rec["y"], rec["need"]
            orig = originals[sub_path]
            if ys is None:
                continue
            cost = self._cost_of(orig, xs, ys, ig)
            if any(True for _ in orig.children()):  # containers: only their own arithmetic
                if cost is not None:
                    acc.add_cost(i, cost)
                continue
            full = f"{path}.{sub_path}" if path else sub_path
            if cost is None:
                acc.unaccounted.append(full)
                continue
            j = acc.row(full, _describe(orig), depth + 1 + sub_path.count("."),
                        kind="linear" if isinstance(orig, Linear) else "layer", input_shape=xs,
                        output_shape=ys, output_bytes=self.nbytes(ys),
                        note="saved bytes counted at the custom parent")
            if isinstance(orig, Linear):
                acc.rows[j].info = {"in": orig.in_features, "out": orig.out_features,
                                    "bias": orig.bias is not None, "lazy": False}
                acc.linear_weights[j] = orig.weight.data
            acc.own_params(j, self.params_of(orig))
            acc.add_cost(j, cost)
            acc.roll_up(i, [j])
        acc.own_params(i, [(id(p), p.numel(), p.requires_grad) for p in m.parameters()
                           if id(p) not in acc.param_owner])  # those no recorded layer owns
        if back is not None:
            exclude = {id(p.data) for p in m.parameters()} | {id(b) for b in m.buffers()}
            ratio = self.itemsize / dtype.itemsize
            for arr in _closure_arrays(back, exclude):
                key = x.key if arr is x0 else ("custom", i, id(arr))
                acc.keep(i, key, int(arr.nbytes * ratio))
        row.note = (row.note + "; " if row.note else "") + "custom module: run once on zeros"
        return _T(y.shape, key=x.key if y is x0 else None)

    @staticmethod
    def _record(sub, sub_path, records):
        """Record each call of ``sub`` (pre-order: the entry is made before the call runs)."""
        orig_vjp, orig_fwd = sub.vjp, sub.forward

        def call(method, x, need, args, kwargs):
            rec = {"path": sub_path, "x": np.shape(x), "y": None, "need": need}
            records.append(rec)
            out = method(x, *args, **kwargs)
            rec["y"] = np.shape(out[0] if method is orig_vjp else out)
            return out

        def vjp(x, input_grad=True, *args, **kwargs):
            return call(orig_vjp, x, input_grad, (input_grad,) + args, kwargs)

        def forward(x, *args, **kwargs):
            return call(orig_fwd, x, False, args, kwargs)

        object.__setattr__(sub, "vjp", vjp)
        object.__setattr__(sub, "forward", forward)

    @staticmethod
    def _cost_of(m, xs, ys, need):
        numel = math.prod(xs)
        if isinstance(m, Linear):
            bias = m.bias is not None
            return _linear_cost(_lead(xs), m.in_features, m.out_features, bias, need,
                                m.weight.requires_grad, bias and m.bias.requires_grad)
        if isinstance(m, _ACTIVATIONS):
            return _elementwise_cost(type(m).__name__, numel, need)
        if isinstance(m, Dropout):
            return _elementwise_cost("Dropout", numel, need) if m.training and m.p else (0,) * 6
        if isinstance(m, Flatten | Identity | Sequential):
            return (0,) * 6
        if isinstance(m, Residual):
            return _elementwise_cost("Residual", numel, need)
        if isinstance(m, LayerNorm | BatchNorm1d):
            w, b = m.weight, m.bias
            ev = isinstance(m, BatchNorm1d) and not m.training and m.running_var is not None
            return _norm_cost(numel, w is not None, b is not None, need,
                              w is not None and w.requires_grad, b is not None and b.requires_grad,
                              eval_mode=ev)
        return None


def _closure_arrays(fn, exclude=frozenset()) -> list[np.ndarray]:
    """The distinct arrays (by underlying buffer) a closure keeps alive, parameters excluded."""
    found: dict[int, np.ndarray] = {}
    seen: set[int] = set()
    stack = [fn]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, Module | Parameter):
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            root = obj
            while isinstance(root.base, np.ndarray):
                root = root.base
            if id(root) not in exclude and id(obj) not in exclude:
                found[id(root)] = root
        elif callable(obj) and getattr(obj, "__closure__", None):
            stack.extend(c.cell_contents for c in obj.__closure__ if _filled(c))
        elif isinstance(obj, list | tuple | set):
            stack.extend(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
    return list(found.values())


def _filled(cell) -> bool:
    """False for a closure cell whose variable was never assigned."""
    try:
        _ = cell.cell_contents
    except ValueError:
        return False
    return True


# ================================================================================ safetensors
_BUFFER_NAMES = ("running_mean", "running_var", "num_batches_tracked")
_ST_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8,
             "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1, "U16": 2, "U32": 4, "U64": 8}


def _safetensors(path: str, override):
    """Rows (one per module prefix) and sizes from a file's header; weights read for findings."""
    try:
        from safetensors import safe_open
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("reading a .safetensors file needs the 'safetensors' package: "
                          "pip install 'linearkit[cli]' (or pip install safetensors)") from None
    groups: dict[str, list] = {}
    with safe_open(path, framework="numpy") as f:
        for key in sorted(f.keys(), key=_natural_key):
            sl = f.get_slice(key)
            shape, st_dtype = tuple(sl.get_shape()), sl.get_dtype()
            prefix, _, name = key.rpartition(".")
            arr = None
            if name == "weight" and len(shape) == 2 and st_dtype in ("F64", "F32", "F16"):
                arr = f.get_tensor(key)
            groups.setdefault(prefix, []).append((name, shape, st_dtype, arr))
    acc = _Acc(override.itemsize if override is not None else 4)
    root = acc.rows[acc.row("", "safetensors file", 0, kind="container")]
    weights = buffers = trainable = 0
    dtypes = set()
    for prefix, tensors in groups.items():
        names = {n: s for n, s, _, _ in tensors}
        w = names.get("weight")
        kind, info = "tensors", {}
        if w is not None and len(w) == 2:
            kind, info = "linear", {"in": w[1], "out": w[0], "bias": "bias" in names}
            type_ = f"Linear({w[1]}, {w[0]}" + ("" if "bias" in names else ", bias=False") + ")"
        elif "running_mean" in names:
            type_ = f"BatchNorm1d({names['running_mean'][0]})"
        elif w is not None and len(w) == 1:
            type_ = f"norm-like({w[0]},)"
        else:
            type_ = "tensors: " + ", ".join(sorted(names))
        i = acc.row(prefix, type_, 1, kind=kind, info=info)
        for name, shape, st_dtype, arr in tensors:
            numel = math.prod(shape)
            nbytes = numel * (override.itemsize if override is not None
                              else _ST_BYTES.get(st_dtype, 4))
            if name in _BUFFER_NAMES or st_dtype[0] in "IUB":
                buffers += nbytes
                continue
            dtypes.add(st_dtype)
            weights += nbytes
            trainable += nbytes
            acc.own_params(i, [((prefix, name), numel, True)])
            if arr is not None:
                acc.linear_weights[i] = arr
        root.params += acc.rows[i].params
        root.trainable_params += acc.rows[i].trainable_params
    names = sorted(dtypes) or ["F32"]
    store = override.name if override is not None else "/".join(
        {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}.get(d, d)
        for d in names)
    half = override.itemsize == 2 if override is not None else all(
        d in ("F16", "BF16") for d in names)
    return acc, {"weights": weights, "trainable": trainable, "buffers": buffers, "store": store,
                     "half": half}


# ================================================================================ findings
def _findings(acc: _Acc, rank_check: bool) -> list[Finding]:
    rows, out = acc.rows, []
    nested = {j for _, chain in acc.chains for j in chain}
    for seq, chain in acc.chains:
        if seq in nested:
            continue  # a Sequential inside a Sequential is part of its parent's chain
        for a, b, between in _pairs(rows, _flatten_chain(rows, chain, acc.chains)):
            ra, rb = rows[a], rows[b]
            if ra.kind != "linear" or "in" not in ra.info:  # not a Linear, or still lazy
                continue
            if rb.kind == "linear" and "out" in rb.info:
                out.append(_merge_finding(ra, rb, between))
            elif rb.kind == "batchnorm" and not between:
                c, B = ra.info["out"], _lead(ra.output_shape) if ra.output_shape else 0
                if ra.info["bias"]:
                    out.append(Finding(
                        "bias-before-batchnorm", (ra.path, rb.path),
                        "the Linear's bias is cancelled exactly by the BatchNorm1d that follows "
                        "(the batch mean removes any per-feature constant).",
                        "construct the Linear with bias=False; for a trained model also subtract "
                        "the bias from running_mean so eval mode is unchanged",
                        saving_params=c, saving_flops=B * c))
                out.append(Finding(
                    "fold-batchnorm", (ra.path, rb.path),
                    "in eval mode the BatchNorm1d is a fixed per-feature affine map that can be "
                    "folded into the preceding Linear for inference.",
                    "W' = W * s[:, None], b' = (b - running_mean) * s + beta with s = gamma / "
                    "sqrt(running_var + eps) (a bias appears if the Linear had none); keep the "
                    "BatchNorm for training",
                    saving_params=rb.params - (0 if ra.info["bias"] else c),
                    saving_flops=(rb.flops or 0) - (0 if ra.info["bias"] else B * c)))
    unaligned, where, cost = [], [], 0
    for i, w in acc.linear_weights.items():
        row = rows[i]
        n_out, n_in = w.shape
        if n_in % 8 or n_out % 8:
            p_in, p_out = -(-n_in // 8) * 8, -(-n_out // 8) * 8
            where.append(row.path or "(model)")
            unaligned.append(f"{where[-1]}: {n_in}x{n_out} -> {p_in}x{p_out}")
            cost += p_in * p_out - n_in * n_out
        if rank_check:
            f = _rank_finding(row, w)
            if f is not None:
                out.append(f)
    if unaligned:
        out.append(Finding(
            "alignment", tuple(where),
            "Linear sizes (in x out) that are not multiples of 8: GEMM kernels (tensor cores, "
            "vectorized BLAS) run best on multiples of 8 (fp16), 16 or 64 — "
            + "; ".join(unaligned) + ".",
            "pad the hot layers (zero rows/columns, slice the output) — a first layer's input and "
            "a classifier's output are fixed by the data, so pad those only if they dominate",
            saving_params=-cost))
    return out


def _flatten_chain(rows, chain, chains):
    inner = dict(chains)
    flat = []
    for i in chain:
        if rows[i].kind == "sequential" and i in inner:
            flat.extend(_flatten_chain(rows, inner[i], chains))
        else:
            flat.append(i)
    return flat


def _pairs(rows, flat):
    """Adjacent (a, b, [types between]) with only shape-keeping pass-through layers between."""
    for n, a in enumerate(flat):
        between = []
        for b in flat[n + 1:]:
            r = rows[b]
            passthrough = r.kind in ("identity", "dropout") or (
                r.kind == "flatten" and r.input_shape == r.output_shape)
            if not passthrough:
                yield a, b, between
                break
            between.append(r.type)


def _merge_finding(ra: Row, rb: Row, between) -> Finding:
    n_in, h, b1 = ra.info["in"], ra.info["out"], ra.info["bias"]
    n_out, b2 = rb.info["out"], rb.info["bias"]
    before = n_in * h + h * b1 + h * n_out + n_out * b2
    after = n_in * n_out + (n_out if (b1 or b2) else 0)
    B = _lead(ra.input_shape) if ra.input_shape else 0
    fl_before = 2 * B * (n_in * h + h * n_out) + B * (h * b1 + n_out * b2)
    fl_after = 2 * B * n_in * n_out + (B * n_out if (b1 or b2) else 0)
    via = ""
    if between:
        via = f" (only {', '.join(between)} between"
        via += ", and Dropout is the identity at inference)" if any(
            t.startswith("Dropout") for t in between) else ")"
    msg = (f"two linear maps with no nonlinearity between them{via} are one affine map, "
           f"y = x (W2 W1)^T + (W2 b1 + b2) (W2 W1, not W1 W2), of rank <= {min(h, n_in, n_out)}.")
    if after <= before:
        fix = (f"merge them into one Linear({n_in}, {n_out}) with weight W2 @ W1 and bias "
               "W2 @ b1 + b2 — or add the nonlinearity that was meant to be there")
    else:
        fix = (f"nothing to merge for size: this is a rank-{h} factorization of a {n_out}x{n_in} "
               f"map and cheaper than one Linear ({before:,} vs {after:,} params); keep it if "
               "intended, else add the missing nonlinearity")
    return Finding("mergeable-linear", (ra.path, rb.path), msg, fix,
                   saving_params=before - after, saving_flops=fl_before - fl_after)


def _rank_finding(row: Row, w: np.ndarray, max_elements: int = 1 << 20) -> Finding | None:
    """Rank-deficient or 99%-energy-in-rank-r weights, where factorizing saves parameters."""
    n_out, n_in = w.shape
    k = min(n_out, n_in)
    if k < 2 or w.size > max_elements:
        return None
    # Singular values from the eigenvalues of the k x k Gram matrix, in float64: ~10x cheaper
    # than an SVD and exact enough for these thresholds (it resolves s down to ~1e-8 * s_max).
    w64 = np.asarray(w, dtype=np.float64)
    gram = w64 @ w64.T if n_out <= n_in else w64.T @ w64
    if not np.all(np.isfinite(gram)):
        return None
    s = np.sqrt(np.clip(np.linalg.eigvalsh(gram)[::-1], 0.0, None))
    if s[0] == 0:
        return None
    tol = s[0] * max(max(n_out, n_in) * np.finfo(w.dtype).eps, 1e-7)
    rank = int(np.sum(s > tol))
    energy = np.cumsum(s**2)
    r99 = int(np.searchsorted(energy, 0.99 * energy[-1]) + 1)
    full = n_out * n_in
    if rank < k and rank * (n_in + n_out) < full:
        r, what = rank, f"rank-deficient: rank {rank} of {k} (singular values below {tol:.1e})"
        err = "exactly (up to rounding)"
    elif r99 * (n_in + n_out) <= full // 2:
        r, what = r99, f"low effective rank: 99% of the energy (sum of s^2) in rank {r99} of {k}"
        err = "with relative Frobenius error <= 10%"
    else:
        return None
    return Finding(
        "low-rank", (row.path,), f"weight {n_out}x{n_in} is {what}.",
        f"factorize W ~= U_r diag(s_r) V_r^T into Linear({n_in}, {r}, bias=False) then "
        f"Linear({r}, {n_out}) (truncated SVD), which reproduces it {err}",
        saving_params=full - r * (n_in + n_out),
        saving_flops=2 * _lead(row.input_shape) * (full - r * (n_in + n_out))
        if row.input_shape else 0)


# ================================================================================ presets
def _mlp_mnist():
    return Sequential(Linear(784, 256), ReLU(), Linear(256, 256), ReLU(), Linear(256, 10))


def _mnist1d():
    return Sequential(Linear(40, 100), ReLU(), Residual(Sequential(Linear(100, 100), ReLU())),
                      Linear(100, 10))


#: name -> (factory, default input shape, description)
PRESETS = {
    "mlp-mnist": (_mlp_mnist, (64, 784), "MLP 784-256-256-10 with ReLU (MNIST)"),
    "mnist1d": (_mnist1d, (64, 40), "MLP 40-100-residual(100)-10 with ReLU (MNIST-1D)"),
    "linear-4096": (lambda: Linear(4096, 4096), (1, 4096), "one Linear(4096, 4096)"),
    "linear-512-256": (lambda: Linear(512, 256), (64, 512), "one Linear(512, 256)"),
    "linear-1024-4096": (lambda: Linear(1024, 4096), (64, 128, 1024),
                         "one Linear(1024, 4096) on (batch 64, sequence 128)"),
}


def preset(name: str) -> Module:
    """A fresh example model by name (see ``PRESETS``): 'mlp-mnist', 'mnist1d', 'linear-4096', …

    Its default input shape is ``PRESETS[name][1]``.
    """
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name][0]()


# ================================================================================ entry
def _as_shape(input_shape, batch) -> tuple | None:
    if input_shape is None:
        if batch is not None:
            raise ValueError("batch= needs an input_shape (the shape of one sample)")
        return None
    if isinstance(input_shape, int | np.integer):
        input_shape = (input_shape,)
    try:
        shape = tuple(int(d) for d in input_shape)
    except TypeError:
        raise TypeError(f"input_shape must be a tuple of ints, got {input_shape!r}") from None
    if any(d < 0 for d in shape) or any(not float(d).is_integer() for d in input_shape):
        raise ValueError(f"input_shape must hold non-negative ints, got {input_shape!r}")
    if batch is not None:
        shape = (int(batch),) + shape
    return shape


def _is_torch_module(model) -> bool:
    mod = type(model).__module__ or ""
    if not mod.startswith("torch") and not any(
            (c.__module__ or "").startswith("torch.nn") for c in type(model).__mro__):
        return False
    return hasattr(model, "named_modules") and hasattr(model, "register_forward_hook")


def ledger(model, input_shape=None, *, dtype=None, optimizer: str | None = "adam",
           batch: int | None = None, master_dtype="auto", rank_check: bool = True) -> Ledger:
    """Parameters, FLOPs, memory of one training step, and redundant structure, per module.

    Parameters
    ----------
    model : linearkit Module, torch ``nn.Module``, path to a ``.safetensors`` file, or a preset
        name (``PRESETS``). A file gives parameters and memory only (no graph, so no FLOPs).
    input_shape : tuple of ints, optional
        The input's shape, batch included: ``(64, 784)``. Shapes are propagated without running
        the model (a ShapeError names the layer an input does not fit). Without it only
        parameters and weight memory are reported.
    dtype : NumPy dtype, optional
        The storage dtype to count bytes in (default: the model's parameter dtype).
    optimizer : 'adam', 'adamw' (2 states per trainable parameter), 'sgd-momentum' (1),
        'sgd' (0), or None for inference (no grads, no states, no saved activations).
    batch : int, optional
        When given, ``input_shape`` is one sample's shape and ``batch`` is prepended.
    master_dtype : 'auto', dtype or None
        Mixed precision: a master copy of the trainable weights kept in this dtype (optimizer
        states too). 'auto' = float32 when the storage dtype is 16-bit, else none.
    rank_check : bool
        Compute singular values of each weight (up to 2**20 elements) for the low-rank finding.

    Returns
    -------
    Ledger
        ``print()`` it for the table; ``.totals``, ``.memory``, ``.findings``, ``.rows``,
        ``.to_markdown()``, ``.to_dict()``.

    Examples
    --------
    >>> import linearkit as lk
    >>> L = lk.analysis.ledger(lk.Linear(512, 256), (64, 512))
    >>> L.totals["params"], L.memory["weights"], L.memory["training_state"]
    (131328, 525312, 2101248)
    """
    if optimizer is not None:
        optimizer = str(optimizer).lower()
        if optimizer not in OPTIMIZER_STATES:
            raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZER_STATES)} or None "
                             f"(inference), got {optimizer!r}")
    shape = _as_shape(input_shape, batch)
    override = None if dtype is None else np.dtype(dtype)
    notes: list[str] = []
    if isinstance(model, str | os.PathLike):
        path = os.fspath(model)
        if os.path.isfile(path):
            return _finish(*_safetensors(path, override), "safetensors", os.path.basename(path),
                           None, optimizer, master_dtype, rank_check,
                           [("a weights file has no graph: FLOPs and activations are unavailable; "
                            "every floating tensor but BatchNorm running statistics is counted "
                            "as a trainable parameter.")])
        if path not in PRESETS:
            raise FileNotFoundError(f"{path!r} is neither a file nor a preset name "
                                    f"({', '.join(PRESETS)})")
        model, name = preset(path), path
    else:
        name = type(model).__name__
    if isinstance(model, Module):
        pdtype = next((p.dtype for p in model.parameters()), np.dtype(np.float32))
        store = override or np.dtype(pdtype)
        acc = _Acc(store.itemsize)
        _LinearkitPass(model, acc, store.itemsize).visit(
            model, "", None if shape is None else _T(shape, key=("input",)), False, 0)
        buffers = sum(b.size * (store.itemsize if b.dtype.kind == "f" else b.itemsize)
                      for b in model.buffers())
        source = "linearkit"
        store_name, itemsize = store.name, store.itemsize
    elif _is_torch_module(model):
        from ._ledger_torch import torch_pass

        acc, store_name, itemsize, buffers = torch_pass(model, shape, override)
        source = "torch"
    else:
        raise TypeError(f"ledger() takes a linearkit Module, a torch nn.Module, a .safetensors "
                        f"path or a preset name, got {type(model).__name__}")
    root = acc.rows[0]
    sizes = {"weights": root.params * itemsize, "trainable": root.trainable_params * itemsize,
                 "buffers": buffers, "store": store_name, "half": itemsize == 2}
    if shape is None:
        notes.append("no input_shape: FLOPs and activations are unavailable.")
    return _finish(acc, sizes, source, name, shape, optimizer, master_dtype, rank_check, notes)


def _finish(acc, sizes, source, name, shape, optimizer, master_dtype, rank_check, notes):
    """Totals, the memory budget and the findings, common to every source."""
    root = acc.rows[0]
    params, trainable = root.params, root.trainable_params
    if master_dtype == "auto":
        master = np.dtype(np.float32) if sizes["half"] else None
    else:
        master = None if master_dtype is None else np.dtype(master_dtype)
    training = optimizer is not None
    grads = sizes["trainable"] if training else 0
    master_bytes = trainable * master.itemsize if training and master is not None else 0
    per_state = master.itemsize if master is not None else (
        sizes["trainable"] // trainable if trainable else 0)
    states = OPTIMIZER_STATES[optimizer] * trainable * per_state if training else 0
    graph = shape is not None
    activations = (acc.saved_total if training else 0) if graph else None
    weights = sizes["weights"]
    memory = {"weights": weights, "buffers": sizes["buffers"], "grads": grads,
              "master": master_bytes, "optimizer": states,
              "training_state": weights + grads + master_bytes + states,
              "activations": activations}
    memory["total"] = memory["training_state"] + sizes["buffers"] + (activations or 0)
    c = acc.cost
    leaf = [r for r in acc.rows if r.kind not in ("sequential", "residual", "container", "custom")]
    totals = {
        "params": params, "trainable_params": trainable,
        "macs": c["macs"], "flops": c["gemm"] + c["bias"] + c["elem"], "gemm_flops": c["gemm"],
        "bias_flops": c["bias"], "elementwise_flops": c["elem"], "backward_macs": c["bwd_macs"],
        "backward_flops": c["bwd"], "output_bytes": sum(r.output_bytes or 0 for r in leaf)}
    if graph:  # layers without arithmetic (Flatten, Identity, eval Dropout) cost 0, not "?"
        for r in acc.rows:
            if r.macs is None and r.kind != "unused" and r.path not in acc.unaccounted:
                r.macs = r.flops = r.backward_macs = r.backward_flops = 0
    else:
        totals.update(dict.fromkeys(("macs", "flops", "gemm_flops", "bias_flops",
                                     "elementwise_flops", "backward_macs", "backward_flops",
                                     "output_bytes")))
        for r in acc.rows:
            r.macs = r.flops = r.backward_macs = r.backward_flops = None
    notes = list(notes) + acc.notes
    if acc.unaccounted:
        notes.append(f"no FLOP rule for {', '.join(acc.unaccounted)}: their FLOPs are missing "
                     "from the totals.")
    if master_bytes:
        notes.append(f"mixed precision: {master.name} master weights and optimizer states, "
                     f"{sizes['store']} weights and grads.")
    if not training:
        notes.append("optimizer=None: inference, so no grads, optimizer states or saved "
                     "activations.")
        for r in acc.rows:
            r.saved_bytes = None if r.saved_bytes is None else 0
    return Ledger(source=source, model_name=name, input_shape=shape, dtype=sizes["store"],
                  optimizer=optimizer, rows=acc.rows, totals=totals, memory=memory,
                  findings=_findings(acc, rank_check), notes=notes)

