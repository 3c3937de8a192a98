"""The result of recording: :class:`StatsReport` (per-layer table, flags, markdown, plot).

:meth:`StatsReport.from_records` groups the raw records of :class:`~.stats.StatsRecorder` per
layer call position and averages them over steps; the flags come from :func:`.find_flags`.
"""

from __future__ import annotations

import numpy as np

from .render import markdown_table, text_table
from .stats_flags import Flag, LayerStats, find_flags

__all__ = ["StatsReport"]


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


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
        steps = max((s.steps for s in self.layers), default=0)
        text = text_table(self._HEADER, self.rows(), left={0, 1})
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
        return markdown_table(self._HEADER, self.rows())

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
        from .stats_plot import plot_report

        return plot_report(self, path, title=title)
