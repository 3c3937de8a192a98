"""Per-layer activation and gradient statistics: "print every layer, find where it goes wrong".

Two entry points:

* ``record_stats(model, x, target, loss_fn, steps=1)`` runs ``steps`` forward/backward passes on
  one batch and returns a :class:`StatsReport`; the model's parameters, ``.grad`` arrays and
  buffers are as they were before the call (unless you pass an ``optimizer``, which then trains).
* ``StatsRecorder(model)`` is the same machinery as a context manager for your own training loop::

      with StatsRecorder(model) as rec:
          for xb, yb in loader:
              pred, back = model.vjp(xb, input_grad=False)
              loss, loss_back = loss_fn.vjp(pred, yb)
              back(loss_back())
              opt.step(); opt.zero_grad()
              rec.next_step()
      print(rec.report())

How it works: on entry, every *leaf* module of the tree (a module without children: ``Linear``,
``ReLU``, ...) gets an instance attribute ``vjp`` that calls the real one, measures the output
``y`` and wraps the returned ``backward`` so that it measures ``dy`` (the gradient flowing into
the layer's output), ``dx`` (the gradient it passes to its input) and the gradient this call
added to each of the layer's parameters (``.grad`` after minus ``.grad`` before, so accumulation
from earlier calls does not count). On exit the instance attributes are removed (or the previous
ones put back): no layer class is modified and nothing is left on the model. Only ``vjp`` calls
are recorded; a plain ``model(x)`` runs ``forward`` and is not seen.

Statistics, all computed in float64 over every element of the array:

========================  ==================================================================
``mean``, ``std``         mean and population standard deviation (``ddof=0``) of ``y``
``max_abs``               ``max |y|``
``zero_fraction``         fraction of elements of ``y`` that are exactly 0 (dead units after ReLU)
``grad_out_norm``         ``‖dy‖₂`` (Frobenius), the gradient flowing into the layer's output
``grad_in_norm``          ``‖dx‖₂``; None when the caller asked for no input gradient
``param_grad_norms``      ``{name: ‖∇p‖₂}`` for each parameter that received a gradient
``param_norms``           ``{name: ‖p‖₂}`` at the time of the call
========================  ==================================================================

Flags (see :func:`find_flags`; thresholds are arguments of ``report()``/``record_stats``):

* ``vanishing_activation`` / ``exploding_activation``: a layer's output std is more than
  ``ratio`` (default 10) times smaller / larger than the std of the first recorded layer's output.
* ``vanishing_gradient`` / ``exploding_gradient``: ``‖dy‖`` of a layer is more than ``ratio``
  times smaller / larger than ``‖dy‖`` of the last layer (the one nearest the loss).
* ``small_param_grad``: ``‖∇p‖ / ‖p‖ < grad_rtol`` (default 1e-5): even at learning rate 1 a
  step would change the parameter by less than a 1e-5 fraction (a parameter that is all zeros
  is flagged only when its gradient is exactly zero).
* ``dead_units``: at least ``dead_fraction`` (default 0.99) of a layer's outputs are exactly 0.

Statistics of a layer are averaged over the recorded steps (``max_abs``: the maximum); every
single call is kept in ``report.records``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..module import Module

__all__ = ["Flag", "LayerStats", "StatsRecorder", "StatsReport", "find_flags", "record_stats"]

_MISSING = object()


# ---------------------------------------------------------------------------- measuring
def _norm(a) -> float | None:
    """Frobenius norm in float64; a tuple (multi-input module) counts all its arrays."""
    if a is None:
        return None
    if isinstance(a, (tuple, list)):
        parts = [_norm(v) for v in a if v is not None]
        return None if not parts else math.sqrt(sum(p * p for p in parts))
    a = np.asarray(a)
    if a.size == 0:
        return 0.0
    return float(np.sqrt(np.sum(np.square(a, dtype=np.float64))))


def _moments(y) -> dict[str, Any]:
    if not isinstance(y, np.ndarray) or y.dtype.kind != "f":
        return {"shape": getattr(y, "shape", None), "mean": None, "std": None,
                "max_abs": None, "zero_fraction": None}
    if y.size == 0:
        return {"shape": y.shape, "mean": 0.0, "std": 0.0, "max_abs": 0.0, "zero_fraction": 0.0}
    y64 = y.astype(np.float64, copy=False)
    return {
        "shape": y.shape,
        "mean": float(y64.mean()),
        "std": float(y64.std()),
        "max_abs": float(np.abs(y64).max()),
        "zero_fraction": float(np.count_nonzero(y == 0) / y.size),
    }


def _leaves(model: Module) -> list[tuple[str, Module]]:
    """Leaf modules (no children) under ``model`` with their paths, each instance once."""
    leaves = [(path, m) for path, m in model.named_modules() if not any(True for _ in m.children())]
    return [(path or type(m).__name__, m) for path, m in leaves]


# ---------------------------------------------------------------------------- recorder
class StatsRecorder:
    """Context manager that records statistics of every leaf module's ``vjp`` call.

    Parameters
    ----------
    model : Module
        The model to watch. Its leaf modules get a temporary instance attribute ``vjp``.
    keep_arrays : bool
        Also keep the raw ``y``, ``dy`` and ``dx`` arrays of every call in ``records`` (under
        ``"y"``, ``"dy"``, ``"dx"``). Off by default: it holds every activation in memory.

    Attributes
    ----------
    records : list of dict
        One dict per call, in call order: ``path``, ``type``, ``step``, ``call`` (occurrence of
        this path within its step; a module reused in one forward has calls 0, 1, ...),
        the statistics listed in the module docstring.
    step : int
        Current step number; ``next_step()`` advances it.
    """

    def __init__(self, model: Module, *, keep_arrays: bool = False):
        if not isinstance(model, Module):
            raise TypeError(f"StatsRecorder needs a linearkit Module, got {type(model).__name__}")
        self.model = model
        self.keep_arrays = bool(keep_arrays)
        self.records: list[dict[str, Any]] = []
        self.step = 0
        self._seen: dict[str, int] = {}
        self._saved: list[tuple[Module, Any]] = []

    # -- install / restore
    def __enter__(self):
        if self._saved:
            raise RuntimeError("this StatsRecorder is already active")
        for path, module in _leaves(self.model):
            previous = module.__dict__.get("vjp", _MISSING)
            self._saved.append((module, previous))
            object.__setattr__(module, "vjp", self._wrap(path, module, module.vjp))
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Remove every wrapper (restoring any instance ``vjp`` that was there before)."""
        while self._saved:
            module, previous = self._saved.pop()
            if previous is _MISSING:
                module.__dict__.pop("vjp", None)
            else:
                object.__setattr__(module, "vjp", previous)

    def next_step(self) -> None:
        """Mark the end of a training step (statistics are averaged per layer over steps)."""
        self.step += 1
        self._seen = {}

    # -- the wrapper
    def _wrap(self, path: str, module: Module, vjp: Callable) -> Callable:
        recorder = self

        def recording_vjp(*args, **kwargs):
            y, backward = vjp(*args, **kwargs)
            call = recorder._seen.get(path, 0)
            recorder._seen[path] = call + 1
            record: dict[str, Any] = {"path": path, "type": type(module).__name__,
                                      "step": recorder.step, "call": call}
            record.update(_moments(y))
            record.update(grad_out_norm=None, grad_in_norm=None, param_grad_norms={},
                          param_norms={name: _norm(p.data)
                                       for name, p in module.named_parameters(recurse=False)})
            if recorder.keep_arrays:
                record["y"] = y
            recorder.records.append(record)

            def recording_backward(*grad):
                params = [(n, p) for n, p in module.named_parameters(recurse=False)
                          if p.requires_grad]
                before = {n: (None if p.grad is None else p.grad.copy()) for n, p in params}
                dx = backward(*grad)
                if grad:
                    record["grad_out_norm"] = _norm(grad[0])
                    if recorder.keep_arrays:
                        record["dy"] = grad[0]
                record["grad_in_norm"] = _norm(dx)
                if recorder.keep_arrays:
                    record["dx"] = dx
                for n, p in params:
                    if p.grad is None:
                        continue
                    added = p.grad if before[n] is None else p.grad - before[n]
                    record["param_grad_norms"][n] = _norm(added)
                return dx

            return y, recording_backward

        return recording_vjp

    # -- results
    def report(self, *, ratio: float = 10.0, grad_rtol: float = 1e-5,
               dead_fraction: float = 0.99) -> StatsReport:
        """Aggregate the records per layer and compute the flags (thresholds: module docstring)."""
        return StatsReport.from_records(self.records, ratio=ratio, grad_rtol=grad_rtol,
                                        dead_fraction=dead_fraction)


# ---------------------------------------------------------------------------- report
@dataclass
class LayerStats:
    """Statistics of one layer (one call position), averaged over the recorded steps."""

    path: str
    type: str
    call: int
    shape: tuple | None
    steps: int
    mean: float | None
    std: float | None
    max_abs: float | None
    zero_fraction: float | None
    grad_out_norm: float | None
    grad_in_norm: float | None
    param_grad_norms: dict[str, float] = field(default_factory=dict)
    param_norms: dict[str, float] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The path, with ``#k`` appended for the k-th reuse of a module within a step."""
        return self.path if self.call == 0 else f"{self.path}#{self.call}"

    @property
    def param_grad_norm(self) -> float | None:
        """Norm of all this layer's parameter gradients together (None without any)."""
        if not self.param_grad_norms:
            return None
        return math.sqrt(sum(v * v for v in self.param_grad_norms.values()))


@dataclass
class Flag:
    """One finding: ``kind`` (see module docstring), the layer, the measured value, a message."""

    kind: str
    layer: str
    value: float
    message: str

    def __str__(self) -> str:
        return self.message


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def find_flags(layers: list[LayerStats], *, ratio: float = 10.0, grad_rtol: float = 1e-5,
               dead_fraction: float = 0.99) -> list[Flag]:
    """The flags for a list of layer statistics (thresholds as in the module docstring)."""
    flags: list[Flag] = []
    with_std = [s for s in layers if s.std is not None]
    ref = next((s for s in with_std if s.std > 0), None)
    if ref is not None:
        for s in with_std:
            r = s.std / ref.std
            if r < 1.0 / ratio:
                flags.append(Flag("vanishing_activation", s.name, r,
                                  f"{s.name}: activation std {s.std:.3g} is {1 / r:.3g}x smaller "
                                  f"than at the first layer {ref.name} ({ref.std:.3g})"
                                  if r > 0 else
                                  f"{s.name}: activation std is 0 (first layer {ref.name}: "
                                  f"{ref.std:.3g})"))
            elif r > ratio:
                flags.append(Flag("exploding_activation", s.name, r,
                                  f"{s.name}: activation std {s.std:.3g} is {r:.3g}x larger than "
                                  f"at the first layer {ref.name} ({ref.std:.3g})"))
    with_grad = [s for s in layers if s.grad_out_norm is not None]
    last = next((s for s in reversed(with_grad) if s.grad_out_norm > 0), None)
    if last is not None:
        for s in with_grad:
            r = s.grad_out_norm / last.grad_out_norm
            if r < 1.0 / ratio:
                flags.append(Flag("vanishing_gradient", s.name, r,
                                  f"{s.name}: gradient norm at the output {s.grad_out_norm:.3g} is "
                                  f"{1 / r:.3g}x smaller than at the last layer {last.name} "
                                  f"({last.grad_out_norm:.3g})" if r > 0 else
                                  f"{s.name}: gradient at the output is exactly 0"))
            elif r > ratio:
                flags.append(Flag("exploding_gradient", s.name, r,
                                  f"{s.name}: gradient norm at the output {s.grad_out_norm:.3g} is "
                                  f"{r:.3g}x larger than at the last layer {last.name} "
                                  f"({last.grad_out_norm:.3g})"))
    for s in layers:
        for n, g in s.param_grad_norms.items():
            p = s.param_norms.get(n)
            if p is None:
                continue
            rel = g / p if p > 0 else (0.0 if g == 0 else math.inf)
            if rel < grad_rtol:
                flags.append(Flag("small_param_grad", f"{s.name}.{n}", rel,
                                  f"{s.name}.{n}: ‖grad‖/‖param‖ = {rel:.3g} < {grad_rtol:g} "
                                  f"(‖grad‖ = {g:.3g}); this parameter will barely move"))
        if s.zero_fraction is not None and s.zero_fraction >= dead_fraction:
            flags.append(Flag("dead_units", s.name, s.zero_fraction,
                              f"{s.name}: {100 * s.zero_fraction:.1f}% of the outputs are "
                              "exactly 0"))
    return flags


def _fmt(v: float | None, digits: int = 3) -> str:
    if v is None:
        return "-"
    if v == 0:
        return "0"
    return f"{v:.{digits}g}" if 1e-3 <= abs(v) < 1e4 else f"{v:.{digits - 1}e}"


class StatsReport:
    """Per-layer statistics, the flags, and every raw record.

    Attributes
    ----------
    layers : list of LayerStats
        One entry per layer call position, in forward order.
    flags : list of Flag
        What looks wrong (empty when nothing does).
    records : list of dict
        Every recorded call (see ``StatsRecorder.records``).
    losses : list of float
        The loss of each step (``record_stats`` with a ``loss_fn`` only).
    """

    def __init__(self, layers: list[LayerStats], flags: list[Flag], records: list[dict],
                 losses: list[float] | None = None, thresholds: dict | None = None):
        self.layers = layers
        self.flags = flags
        self.records = records
        self.losses = list(losses or [])
        self.thresholds = dict(thresholds or {})

    @classmethod
    def from_records(cls, records: list[dict], *, ratio: float = 10.0, grad_rtol: float = 1e-5,
                     dead_fraction: float = 0.99, losses: list[float] | None = None
                     ) -> StatsReport:
        groups: dict[tuple[str, int], list[dict]] = {}
        for r in records:
            groups.setdefault((r["path"], r["call"]), []).append(r)
        layers = []
        for (path, call), rs in groups.items():
            names = {n for r in rs for n in r["param_grad_norms"]}
            layers.append(LayerStats(
                path=path, type=rs[0]["type"], call=call, shape=rs[0]["shape"], steps=len(rs),
                mean=_mean([r["mean"] for r in rs]),
                std=_mean([r["std"] for r in rs]),
                max_abs=max((r["max_abs"] for r in rs if r["max_abs"] is not None), default=None),
                zero_fraction=_mean([r["zero_fraction"] for r in rs]),
                grad_out_norm=_mean([r["grad_out_norm"] for r in rs]),
                grad_in_norm=_mean([r["grad_in_norm"] for r in rs]),
                param_grad_norms={n: _mean([r["param_grad_norms"].get(n) for r in rs])
                                  for n in sorted(names)},
                param_norms={n: _mean([r["param_norms"].get(n) for r in rs])
                             for n in rs[0]["param_norms"]},
            ))
        thresholds = {"ratio": ratio, "grad_rtol": grad_rtol, "dead_fraction": dead_fraction}
        flags = find_flags(layers, **thresholds)
        return cls(layers, flags, records, losses, thresholds)

    # -- text
    _HEADER = ("layer", "type", "shape", "mean", "std", "max|y|", "zeros", "‖dy‖", "‖dx‖",
               "‖∇params‖")

    def rows(self) -> list[tuple[str, ...]]:
        """The table as strings, one tuple per layer (header not included)."""
        out = []
        for s in self.layers:
            shape = "x".join(str(d) for d in s.shape) if s.shape is not None else "-"
            zeros = "-" if s.zero_fraction is None else f"{100 * s.zero_fraction:.1f}%"
            out.append((s.name, s.type, shape, _fmt(s.mean), _fmt(s.std), _fmt(s.max_abs), zeros,
                        _fmt(s.grad_out_norm), _fmt(s.grad_in_norm), _fmt(s.param_grad_norm)))
        return out

    def __str__(self) -> str:
        rows = [self._HEADER] + self.rows()
        widths = [max(len(r[i]) for r in rows) for i in range(len(self._HEADER))]
        left = {0, 1}

        def line(r):
            return "  ".join(c.ljust(w) if i in left else c.rjust(w)
                             for i, (c, w) in enumerate(zip(r, widths))).rstrip()

        steps = max((s.steps for s in self.layers), default=0)
        text = [line(rows[0]), "  ".join("-" * w for w in widths)]
        text += [line(r) for r in rows[1:]]
        text.append(f"({steps} step(s); mean/std/zeros averaged over steps, max|y| is the max; "
                    "norms are Frobenius ‖·‖₂; ‖dy‖ flows into the layer's output, ‖dx‖ out of "
                    "its input)")
        text.append(self.summary())
        return "\n".join(text)

    def summary(self, limit: int = 3) -> str:
        """The flags, grouped by kind: up to ``limit`` messages each, else the worst and a list."""
        if not self.flags:
            return "flags: none"
        kinds: dict[str, list[Flag]] = {}
        for f in self.flags:
            kinds.setdefault(f.kind, []).append(f)
        lines = [f"flags ({len(self.flags)}):"]
        for kind, fs in kinds.items():
            if len(fs) <= limit:
                lines += [f"  [{kind}] {f.message}" for f in fs]
                continue
            small = kind.startswith("vanishing") or kind == "small_param_grad"
            worst = (min if small else max)(fs, key=lambda f: f.value)
            names = [f.layer for f in fs]
            shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
            lines.append(f"  [{kind}] {len(fs)} layers ({shown}); worst: {worst.message}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"StatsReport(layers={len(self.layers)}, flags={len(self.flags)}, "
                f"records={len(self.records)})")

    def to_markdown(self) -> str:
        """The table as GitHub markdown (no flags)."""
        head = "| " + " | ".join(self._HEADER) + " |"
        sep = "|" + "|".join("---" for _ in self._HEADER) + "|"
        return "\n".join([head, sep] + ["| " + " | ".join(r) + " |" for r in self.rows()])

    def flagged(self, kind: str | None = None) -> list[Flag]:
        """Flags of one kind (all when ``kind`` is None)."""
        return [f for f in self.flags if kind is None or f.kind == kind]

    # -- plot
    def plot(self, path, *, title: str | None = None) -> str:
        """Write a PNG: activation std (top) and gradient norms (bottom) per layer, log scale.

        Needs matplotlib (``pip install linearkit[plot]``); uses the Agg canvas directly, so no
        pyplot state or GUI backend is touched. Zeros, which a log axis cannot show, are left
        out. Returns ``str(path)``.
        """
        try:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure
        except ImportError as err:  # pragma: no cover - depends on the environment
            raise ImportError("StatsReport.plot needs matplotlib: pip install "
                              "'linearkit[plot]'") from err

        def positive(values):
            return [v if v is not None and v > 0 else np.nan for v in values]

        names = [s.name for s in self.layers]
        xs = np.arange(len(names))
        fig = Figure(figsize=(max(6.0, 0.45 * len(names) + 2), 6.5))
        FigureCanvasAgg(fig)
        ax1, ax2 = fig.subplots(2, 1, sharex=True)
        ax1.plot(xs, positive([s.std for s in self.layers]), "o-", label="activation std")
        ax1.plot(xs, positive([s.max_abs for s in self.layers]), ".--", alpha=0.6,
                 label="max |y|")
        ax1.set_yscale("log")
        ax1.set_ylabel("forward")
        ax1.legend(loc="best", fontsize=8)
        ax1.grid(True, which="both", alpha=0.3)
        ax2.plot(xs, positive([s.grad_out_norm for s in self.layers]), "o-",
                 label="‖dy‖ (into layer output)")
        ax2.plot(xs, positive([s.param_grad_norm for s in self.layers]), "s", label="‖∇params‖")
        ax2.set_yscale("log")
        ax2.set_ylabel("backward")
        ax2.legend(loc="best", fontsize=8)
        ax2.grid(True, which="both", alpha=0.3)
        ax2.set_xticks(xs)
        ax2.set_xticklabels([f"{n}\n{s.type}" for n, s in zip(names, self.layers)], fontsize=7,
                            rotation=90)
        flagged = {f.layer for f in self.flags}
        for i, n in enumerate(names):
            if n in flagged or any(f.startswith(n + ".") for f in flagged):
                ax1.axvspan(i - 0.4, i + 0.4, color="red", alpha=0.08)
        ax1.set_title(title or f"per-layer statistics ({len(self.flags)} flag(s))")
        fig.tight_layout()
        fig.savefig(str(path), dpi=110)
        return str(path)


# ---------------------------------------------------------------------------- one call
def record_stats(model: Module, x, target=None, loss_fn=None, steps: int = 1, *,
                 optimizer=None, ratio: float = 10.0, grad_rtol: float = 1e-5,
                 dead_fraction: float = 0.99, keep_arrays: bool = False) -> StatsReport:
    """Run ``steps`` forward/backward passes on ``x`` and report per-layer statistics.

    Parameters
    ----------
    model : Module
        Any linearkit model; its leaf modules are watched (see the module docstring).
    x : ndarray ``(N, *)``
        One input batch, used for every step.
    target, loss_fn : optional
        ``loss, back = loss_fn.vjp(model_output, target)``; ``back()`` gives the output's
        gradient. Without ``loss_fn`` the output's gradient is all ones (``out.sum().backward()``
        in PyTorch terms).
    steps : int
        How many passes to record. Without an optimizer every step sees the same weights (useful
        to average over Dropout masks); with one, ``optimizer.step()`` runs after each backward.
    optimizer : optional
        Anything with ``step()``; when given, the model trains during recording.
    ratio, grad_rtol, dead_fraction : float
        Flag thresholds (module docstring).
    keep_arrays : bool
        Keep the raw arrays in ``report.records``.

    Returns
    -------
    StatsReport
        ``str(report)`` is an aligned table; ``report.flags``; ``report.plot("stats.png")``.

    Without an optimizer, nothing is left behind: parameter values are never written, every
    parameter's ``.grad`` and every buffer (BatchNorm running statistics) are put back as they
    were, and the ``vjp`` wrappers are removed. The model's mode (train/eval) is used as is.

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> from linearkit.analysis.stats import record_stats
    >>> model = lk.Sequential(lk.Linear(4, 8, rng=np.random.default_rng(0)), lk.ReLU(),
    ...                       lk.Linear(8, 2, rng=np.random.default_rng(1)))
    >>> report = record_stats(model, np.ones((3, 4), np.float32))
    >>> [s.name for s in report.layers]
    ['0', '1', '2']
    """
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if loss_fn is not None and target is None:
        raise ValueError("loss_fn was given without a target")
    params = list(model.parameters())
    saved_grads = [p.grad for p in params]
    saved_grad_values = [None if g is None else g.copy() for g in saved_grads]
    saved_buffers = [] if optimizer is not None else [
        (m, n, b, None if b is None else b.copy())
        for m in model.modules() for n, b in m._buffers.items()]
    losses: list[float] = []
    recorder = StatsRecorder(model, keep_arrays=keep_arrays)
    try:
        with recorder:
            for _ in range(steps):
                for p in params:
                    p.grad = None
                pred, back = model.vjp(x, input_grad=False)
                if loss_fn is not None:
                    loss, loss_back = loss_fn.vjp(pred, target)
                    losses.append(float(np.asarray(loss)))
                    back(loss_back())
                else:
                    back(np.ones_like(pred))
                if optimizer is not None:
                    optimizer.step()
                recorder.next_step()
    finally:
        for p, g, v in zip(params, saved_grads, saved_grad_values):
            if g is not None:
                g[...] = v  # the same array object, with its old values
            p.grad = g
        for m, n, b, v in saved_buffers:
            if b is not None:
                b[...] = v
            setattr(m, n, b)
    report = recorder.report(ratio=ratio, grad_rtol=grad_rtol, dead_fraction=dead_fraction)
    report.losses = losses
    return report

