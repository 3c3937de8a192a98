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

This module does the recording; :class:`LayerStats`, :class:`Flag` and :func:`find_flags` live in
:mod:`.stats_flags`, :class:`StatsReport` in :mod:`.stats_report` and its plot in
:mod:`.stats_plot`; all of them are importable from here.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..core.module import Module
from ..training.loop import step
from .stats_flags import Flag, LayerStats, find_flags
from .stats_report import StatsReport

__all__ = ["Flag", "LayerStats", "StatsRecorder", "StatsReport", "find_flags", "record_stats"]



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
        The model to watch: call hooks on its leaf modules record their ``vjp`` calls.
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
        self._paths: dict[int, str] = {}
        # Per module, the records of vjp calls whose backward has not run yet (last in, first
        # out: a backward runs the closures in the reverse order of the forward).
        self._pending: dict[int, list[dict[str, Any]]] = {}
        # Per module, the backwards running now: (record, parameters, their grads before).
        self._running: dict[int, list[tuple]] = {}
        self._handles: list = []

    # -- install / remove (call hooks: the modules themselves are not touched)
    def __enter__(self):
        if self._handles:
            raise RuntimeError("this StatsRecorder is already active")
        for path, module in _leaves(self.model):
            self._paths[id(module)] = path
            self._handles += [
                module.register_forward_hook(self._on_forward, with_kwargs=True),
                module.register_full_backward_pre_hook(self._on_backward_pre),
                module.register_full_backward_hook(self._on_backward),
            ]
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Remove the recorder's hooks; the model is as it was before ``__enter__``."""
        while self._handles:
            self._handles.pop().remove()

    def next_step(self) -> None:
        """Mark the end of a training step (statistics are averaged per layer over steps)."""
        self.step += 1
        self._seen = {}
        self._pending = {}
        self._running = {}

    # -- the hooks
    def _on_forward(self, module: Module, args, kwargs, y) -> None:
        if "input_grad" not in kwargs:  # module(x): only vjp calls (training passes) count
            return
        path = self._paths[id(module)]
        call = self._seen.get(path, 0)
        self._seen[path] = call + 1
        record: dict[str, Any] = {"path": path, "type": type(module).__name__,
                                  "step": self.step, "call": call}
        record.update(_moments(y))
        record.update(grad_out_norm=None, grad_in_norm=None, param_grad_norms={},
                      param_norms={name: _norm(p.data)
                                   for name, p in module.named_parameters(recurse=False)})
        if self.keep_arrays:
            record["y"] = y
        self.records.append(record)
        self._pending.setdefault(id(module), []).append(record)

    def _on_backward_pre(self, module: Module, grad_output) -> None:
        pending = self._pending.get(id(module))
        if not pending:
            return
        record = pending.pop()
        params = [(n, p) for n, p in module.named_parameters(recurse=False) if p.requires_grad]
        before = {n: (None if p.grad is None else p.grad.copy()) for n, p in params}
        self._running.setdefault(id(module), []).append((record, params, before))
        if grad_output:
            record["grad_out_norm"] = _norm(grad_output[0])
            if self.keep_arrays:
                record["dy"] = grad_output[0]

    def _on_backward(self, module: Module, grad_input, grad_output) -> None:
        running = self._running.get(id(module))
        if not running:
            return
        record, params, before = running.pop()
        dx = grad_input[0] if len(grad_input) == 1 else grad_input
        record["grad_in_norm"] = _norm(dx)
        if self.keep_arrays:
            record["dx"] = dx
        for n, p in params:
            if p.grad is None:
                continue
            added = p.grad if before[n] is None else p.grad - before[n]
            record["param_grad_norms"][n] = _norm(added)

    # -- results
    def report(self, *, ratio: float = 10.0, grad_rtol: float = 1e-5,
               dead_fraction: float = 0.99) -> StatsReport:
        """Aggregate the records per layer and compute the flags (thresholds: module docstring)."""
        return StatsReport.from_records(self.records, ratio=ratio, grad_rtol=grad_rtol,
                                        dead_fraction=dead_fraction)


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
    were, and the recorder's hooks are removed. The model's mode (train/eval) is used as is.

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
        (m, n, b, b.copy()) for m in model.modules()
        for n, b in m.named_buffers(recurse=False, remove_duplicate=False)]
    losses: list[float] = []
    recorder = StatsRecorder(model, keep_arrays=keep_arrays)
    try:
        with recorder:
            for _ in range(steps):
                for p in params:
                    p.grad = None
                if optimizer is not None and loss_fn is not None:  # the library's training step
                    losses.append(step(model, loss_fn, optimizer, x, target, set_to_none=True))
                    recorder.next_step()
                    continue
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
            b[...] = v
            setattr(m, n, b)
    report = recorder.report(ratio=ratio, grad_rtol=grad_rtol, dead_fraction=dead_fraction)
    report.losses = losses
    return report

