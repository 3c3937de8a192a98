"""``range_check(model, x, dtype)``: will this model's activations fit a 16-bit dtype?

The usual advice after switching precision — "run one forward and print each layer's output
range" — done for the user: one forward on a copy of the model (so BatchNorm's
running statistics and the random streams of the original are untouched), and for every layer
the largest |value| of its output, parameters and buffers (a BatchNorm's running variance of
1e10 is inf once stored in float16), and the fraction of its nonzero outputs that
fall below the dtype's smallest normal number (they lose precision as subnormals, and those below
half the smallest subnormal round to zero), flagged against the dtype's limits with the layer's
path:

* ``overflow``: a value beyond the dtype's largest finite number (it becomes inf);
* ``headroom``: a value within ``headroom`` (default 2**4) of it — a loss scale or the next layer
  will overflow it;
* ``underflow``: more than ``underflow_limit`` (default 1%) of the nonzero values below the
  smallest normal.

Examples
--------
>>> import numpy as np, linearkit as lk
>>> model = lk.Sequential(lk.Linear(4, 3), lk.ReLU())
>>> model[0].weight.data[:] = 3e4  # fine in float32, inf in float16 once summed
>>> report = lk.analysis.range_check(model, np.ones((2, 4), np.float32), np.float16)
>>> report.first_problem.path, report.first_problem.flag
('0', 'overflow')
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np

from .render import markdown_table

__all__ = ["RangeReport", "RangeRow", "dtype_limits", "range_check"]


def dtype_limits(dtype) -> tuple[np.dtype, float, float, float]:
    """``(dtype, max, smallest_normal, smallest_subnormal)`` of a float dtype; 'bfloat16' (and
    ml_dtypes' bfloat16) is read from ml_dtypes."""
    if str(dtype) == "bfloat16" or getattr(dtype, "__name__", None) == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise ImportError('bfloat16 needs ml_dtypes: pip install "linearkit[cli]"') from None
        dt = np.dtype(ml_dtypes.bfloat16)
        info = ml_dtypes.finfo(ml_dtypes.bfloat16)
    else:
        dt = np.dtype(dtype)
        if dt.kind != "f":
            raise TypeError(f"range_check() checks against a floating dtype (float16, bfloat16, "
                            f"float32, float64), got {dt}")
        info = np.finfo(dt)
    return dt, float(info.max), float(info.smallest_normal), float(info.smallest_subnormal)


@dataclass
class RangeRow:
    """One layer: its output's ``max_abs``, the fraction of nonzero output values below the
    smallest normal (``subnormal``) and of those that round to zero (``flushed``), the largest
    |value| among the layer's own parameters and float buffers (``param_max_abs``: weights,
    BatchNorm's running statistics; 0 without any), and ``flag``:
    '' | 'headroom' | 'underflow' | 'overflow'."""

    path: str
    type: str
    shape: tuple
    max_abs: float
    subnormal: float
    flushed: float
    param_max_abs: float
    flag: str = ""


@dataclass
class RangeReport:
    """``rows`` in the order the layers finished their forward (children before their
    container), the dtype's limits, and ``first_problem`` (the first flagged row or None)."""

    dtype: str
    max: float
    smallest_normal: float
    rows: list = field(default_factory=list)

    @property
    def first_problem(self) -> RangeRow | None:
        return next((r for r in self.rows if r.flag), None)

    @property
    def ok(self) -> bool:
        return self.first_problem is None

    def __str__(self) -> str:
        head = (f"range check against {self.dtype} (max {self.max:.4g}, smallest normal "
                f"{self.smallest_normal:.3g}):")
        lines = [head]
        for r in self.rows:
            lines.append(f"  {r.path or '(model)':<20} {r.type:<24} max|y| {r.max_abs:<10.4g} "
                         f"subnormal {r.subnormal:6.1%}  |w| {r.param_max_abs:<9.4g} {r.flag}")
        problem = self.first_problem
        lines.append("  ok: every output fits" if problem is None else
                     f"  first problem: '{problem.path}' ({problem.type}): {problem.flag}")
        return "\n".join(lines)

    def to_markdown(self) -> str:
        rows = [(r.path or "(model)", r.type, f"{r.max_abs:.4g}", f"{r.subnormal:.2%}",
                 f"{r.flushed:.2%}", f"{r.param_max_abs:.4g}", r.flag or "-") for r in self.rows]
        return markdown_table(("layer", "type", "max abs output", "below smallest normal",
                               "rounds to 0", "max abs parameter", "flag"), rows, left={0, 1, 6})


def _stats(y: np.ndarray, normal: float, tiny: float) -> tuple[float, float, float]:
    a = np.abs(np.asarray(y, dtype=np.float64)).ravel()
    if a.size == 0:
        return 0.0, 0.0, 0.0
    finite = a[np.isfinite(a)]
    max_abs = float(a.max()) if finite.size == a.size else float("inf")
    nonzero = finite[finite > 0]
    if nonzero.size == 0:
        return max_abs, 0.0, 0.0
    return (max_abs, float(np.mean(nonzero < normal)), float(np.mean(nonzero < tiny / 2)))


def _type(m) -> str:
    from ..rules import rule_for

    rule = rule_for(m)
    return rule.describe_module(m) if rule is not None else type(m).__name__


def range_check(model, x, dtype=np.float16, *, headroom: float = 16.0,
                underflow_limit: float = 0.01) -> RangeReport:
    """One forward of a copy of ``model`` on ``x``; each layer's output and parameter range
    against ``dtype``'s limits (see the module docstring).

    Parameters
    ----------
    model : Module
        Run in its own mode (training: BatchNorm uses batch statistics, as in a training step);
        never modified (a deep copy runs).
    x : array ``(N, *in)``
        A real batch: the ranges are the data's.
    dtype : float16 (default), 'bfloat16', float32, float64
        The dtype to check against.
    headroom : float
        Flag outputs within this factor of the dtype's max.
    underflow_limit : float
        Flag a layer when more than this fraction of its nonzero outputs is subnormal.

    Returns
    -------
    RangeReport
    """
    from ..core.hooks import observe
    from ..core.module import Module

    if not isinstance(model, Module):
        raise TypeError(f"range_check() takes a linearkit Module, got {type(model).__name__}")
    dt, top, normal, tiny = dtype_limits(dtype)
    twin = copy.deepcopy(model)
    paths = {id(m): p for p, m in twin.named_modules()}
    report = RangeReport(str(dt), top, normal)

    def seen(m, args, y):
        if not isinstance(y, np.ndarray) or id(m) not in paths:
            return
        max_abs, subnormal, flushed = _stats(y, normal, tiny)
        arrays = [p.data for p in m.parameters(recurse=False)]
        arrays += [b for _, b in m.named_buffers(recurse=False)
                   if isinstance(b, np.ndarray) and b.dtype.kind in "fV"]  # running stats
        own = [np.abs(np.asarray(a, dtype=np.float64)).max() for a in arrays if a.size]
        param_max = float(max(own)) if own else 0.0
        flag = ""
        if max_abs > top or param_max > top:
            flag = "overflow"
        elif max_abs > top / headroom or param_max > top / headroom:
            flag = "headroom"
        elif subnormal > underflow_limit:
            flag = "underflow"
        report.rows.append(RangeRow(paths[id(m)], _type(m), tuple(y.shape), max_abs, subnormal,
                                    flushed, param_max, flag))

    with observe(twin, forward=seen):
        twin(x)
    return report
