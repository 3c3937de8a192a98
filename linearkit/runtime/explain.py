"""``explain(model, x)``: which route each module of a model takes on ``x``, and why not a
faster one — computed by the same decisions the runtime runs by (``thin_path.blocker``,
``thin_path.child_routes``, ``compiled_chain.plan_for``, ``compiled_step.prepare``,
``backend.gemm.forward_layout``), never by a second copy of their conditions.

A ``Sequential`` decides for its children from the input it receives, so ``explain`` first runs
one forward of a copy of the model to see each Sequential's input (the model itself is not
called: its statistics, gradients and random state are left as they are). Then, per module:

* ``forward`` — the route of ``model(x)``; ``vjp`` — the route of ``model.vjp(x)`` (a training
  step's forward and backward); ``why_forward`` / ``why_vjp`` — the first condition that
  excluded the next faster route (None when the fastest was taken);
* ``gemm`` — for a ``Linear``, the forward GEMM's layout on its input.

Routes, fastest first: ``compiled_step`` (only with ``loss_fn`` and ``optimizer``: the whole
``loop.step``), ``compiled_chain``, ``fused_linear_relu``, ``unguarded`` (vjp) / ``direct``
(forward), ``guarded``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np

from ..backend import fast
from ..backend import gemm as _gemm
from ..layers.container import Sequential, trains
from ..layers.linear import Linear
from . import compiled_chain as _chain
from . import compiled_step as _step
from . import switches as _switches
from . import thin_path as _thin

__all__ = ["RouteReport", "RouteRow", "explain"]

COMPILED_CHAIN = "compiled_chain"
COMPILED_STEP = "compiled_step"


@dataclass
class RouteRow:
    """One module's routes (see the module docstring)."""

    path: str
    module: str
    forward: str
    vjp: str
    why_forward: str | None = None
    why_vjp: str | None = None
    gemm: str | None = None


@dataclass
class RouteReport:
    """What ``explain`` found: a row per module (the model's own row first, path ``""``), and
    for a training step (``loss_fn`` and ``optimizer`` given) its route and why."""

    rows: list[RouteRow]
    x_shape: tuple
    x_dtype: str
    step: str | None = None
    why_step: str | None = None
    notes: list[str] = field(default_factory=list)

    def routes(self, kind: str = "vjp") -> list[str]:
        """The route of each direct child of the model (or of the model itself when it has
        none), for ``kind`` ``"vjp"`` or ``"forward"``."""
        children = [r for r in self.rows if r.path and "." not in r.path]
        return [getattr(r, kind) for r in (children or self.rows[:1])]

    def row(self, path: str) -> RouteRow:
        """The row of the module at ``path`` (``""``: the model)."""
        for r in self.rows:
            if r.path == path:
                return r
        raise KeyError(f"no module at {path!r}; the paths are "
                       f"{', '.join(repr(r.path) for r in self.rows)}")

    def text(self) -> str:
        """A table: path, module, forward route, vjp route, GEMM layout, and the reasons."""
        head = (f"Routes for x of shape {self.x_shape} ({self.x_dtype})"
                + (f"; training step: {self.step}" if self.step else ""))
        lines = [head]
        if self.why_step:
            lines.append(f"  compiled step: no — {self.why_step}")
        lines += [f"  {note}" for note in self.notes]
        table = [("path", "module", "forward", "vjp", "gemm")]
        table += [(r.path or "(model)", r.module, r.forward, r.vjp, r.gemm or "")
                  for r in self.rows]
        widths = [max(len(row[i]) for row in table) for i in range(5)]
        for row in table:
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        reasons: dict[str, list[str]] = {}      # reason -> where it applies, in order
        for r in self.rows:
            where = r.path or "(model)"
            if r.why_forward and r.why_forward == r.why_vjp:
                reasons.setdefault(r.why_forward, []).append(where)
                continue
            if r.why_forward:
                reasons.setdefault(r.why_forward, []).append(where + " (forward)")
            if r.why_vjp:
                reasons.setdefault(r.why_vjp, []).append(where + " (vjp)")
        if reasons:
            lines.append("why not faster:")
            lines += [f"  {', '.join(where)}: {why}" for why, where in reasons.items()]
        return "\n".join(lines)

    __str__ = text


def explain(model, x, *, loss_fn=None, optimizer=None, y=None) -> RouteReport:
    """Which route each module of ``model`` takes on ``x`` (``(B, *in)``), and why.

    With ``loss_fn``, ``optimizer`` and the targets ``y``, also whether ``loop.step`` runs as
    one compiled call. Runs one forward of a copy of the model; changes nothing.

    >>> import numpy as np, linearkit as lk
    >>> model = lk.Sequential(lk.Linear(4, 8), lk.ReLU(), lk.Linear(8, 2))
    >>> model[2].register_forward_hook(lambda module, args, y: None)  # doctest: +ELLIPSIS
    <...>
    >>> report = lk.runtime.explain(model, np.ones((3, 4), np.float32))
    >>> report.routes("forward")
    ['fused_linear_relu', 'fused_linear_relu', 'guarded']
    >>> report.row("2").why_forward
    'thin path: no — a call hook is registered on it'
    """
    x = np.asarray(x) if not isinstance(x, np.ndarray) else x
    inputs = _inputs(model, x)
    paths = {id(m): name for name, m in model.named_modules()}
    rows: dict[str, RouteRow] = {}
    for name, module in model.named_modules():
        rows[name] = RouteRow(name, _label(module), "guarded", "guarded")
        if name:
            rows[name].why_forward = rows[name].why_vjp = "called by its parent module"
    if not isinstance(model, Sequential):
        rows[""].why_forward = rows[""].why_vjp = (
            "not a Sequential: the runtime routes a Sequential's children; any other module "
            "runs its own forward and vjp")
    claimed = {"forward": set(), "vjp": set()}     # paths a compiled chain above runs
    for name, module in model.named_modules():
        if type(module) is Sequential and name in inputs:
            _decide(module, name, inputs[name], rows, paths, claimed)
    for name, module in model.named_modules():
        if isinstance(module, Linear) and name in inputs:
            rows[name].gemm = _layout(module, inputs[name])
    report = RouteReport(list(rows.values()), tuple(x.shape), str(x.dtype))
    if loss_fn is not None and optimizer is not None:
        ready = _step.prepare(model, loss_fn, optimizer, x, y)
        if ready.__class__ is str:
            report.step, report.why_step = "parts", ready
        else:
            report.step = COMPILED_STEP
    return report


def _decide(seq: Sequential, name: str, x, rows: dict, paths: dict, claimed: dict) -> None:
    """Fill the rows of ``seq``'s children (and, under a compiled chain, their descendants,
    which ``claimed`` then records so that no nested Sequential decides for them again)."""
    steps = seq.steps()
    blocked = _thin.blocker()
    children = []
    for child, module in seq.named_steps():
        path = _join(name, child)
        children.append(path)
        if path not in rows:            # a module listed twice: its second name
            rows[path] = RouteRow(path, _label(module), "guarded", "guarded")
    for kind in ("forward", "vjp"):
        if name in claimed[kind]:
            continue
        if blocked is not None:
            for child in children:
                _set(rows[child], kind, "guarded", "thin path: no — " + blocked)
            continue
        routes = _thin.child_routes(steps, kind == "vjp")
        why_chain = _chain_reason(steps, x, kind == "vjp", paths)
        for child, (route, why) in zip(children, routes):
            row = rows[child]
            if why_chain is None:
                _set(row, kind, COMPILED_CHAIN, None)
                for sub, sub_row in rows.items():
                    if sub.startswith(child + "."):
                        _set(sub_row, kind, COMPILED_CHAIN, None)
                        claimed[kind].add(sub)
                continue
            chain_no = "compiled chain: no — " + why_chain
            if route == _thin.UNGUARDED or route == _thin.DIRECT:
                why = chain_no if why is None else f"{chain_no}; fused: no — {why}"
            elif route == _thin.FUSED:
                linear = seq_linear(steps, children.index(child))
                if linear is not None and not _thin.fuses_now(linear):
                    route = _thin.UNGUARDED if kind == "vjp" else _thin.DIRECT
                    why = f"{chain_no}; fused: no — 16-bit storage runs Linear's own path"
                else:
                    why = chain_no
            else:
                why = f"thin path: no — {why}"
            _set(row, kind, route, why)


def seq_linear(steps: list, index: int):
    """The Linear of the fused pair the module at ``index`` of ``steps`` belongs to."""
    for i in (index, index - 1):
        if 0 <= i < len(steps) and isinstance(steps[i], Linear) and steps[i].weight is not None:
            return steps[i]
    return None


def _chain_reason(steps: list, x, training: bool, paths: dict) -> str | None:
    """Why the compiled chain does not take ``steps`` on ``x`` (None: it does)."""
    if not _switches.on["compiled_chain"]:
        return _chain.OFF
    if training:
        if not fast.available():
            return _chain.NO_KERNELS
    elif fast.loaded() is None:
        return _chain.NOT_LOADED
    plan = _chain.plan_for(steps, x, training, trains, None, min_rows=2 if training else 1)
    if plan.__class__ is not _chain.Plan:
        return _chain.describe(plan, paths)
    from ..backend.fast import blas

    if blas.functions(x.dtype) is None:
        return _chain.NO_BLAS
    return None


def _set(row: RouteRow, kind: str, route: str, why: str | None) -> None:
    setattr(row, kind, route)
    setattr(row, "why_" + kind, why)


def _layout(linear: Linear, x) -> str:
    """The forward GEMM's layout for ``linear`` on ``x`` (``backend.gemm.forward_layout``)."""
    w, b = linear.weight, linear.bias
    if w is None:
        return ""
    if w.data.itemsize == 2:
        return "16-bit blocks"
    if x.ndim == 1:
        return "gemv"
    rows = int(np.prod(x.shape[:-1]))
    return _gemm.forward_layout(rows, w.data.shape[1], w.data.shape[0], x.dtype, w.data,
                                None if b is None else b.data)


def _inputs(model, x) -> dict:
    """The input each module of ``model`` gets on ``x`` (its first call), by path: one forward
    of a deep copy, observed through forward pre-hooks on the copy."""
    twin = copy.deepcopy(model)
    seen: dict = {}
    handles = []
    for name, module in twin.named_modules():
        def record(mod, args, name=name):
            if name not in seen and args and isinstance(args[0], np.ndarray):
                seen[name] = args[0]
        handles.append(module.register_forward_pre_hook(record))
    try:
        twin(x)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _label(module) -> str:
    extra = module.extra_repr()
    return f"{type(module).__name__}({extra})" if extra else type(module).__name__
