"""The per-layer statistics plot behind ``StatsReport.plot`` (matplotlib loads only here)."""

from __future__ import annotations

import numpy as np

from .render import agg_figure

__all__ = ["plot_report", "report_figure"]


def plot_report(report, path, *, title: str | None = None) -> str:
    """Write ``report`` (a ``StatsReport``) as a PNG (``report_figure``); returns ``str(path)``."""
    report_figure(report, title=title).savefig(str(path), dpi=110)
    return str(path)


def report_figure(report, *, title: str | None = None):
    """The matplotlib ``Figure`` of ``report``: activation std and max |y| (top) and gradient
    norms (bottom) per layer, log scale, each axis labelled with what it shows. Zeros, which a
    log axis cannot show, are left out; layers with a flag are shaded."""

    def positive(values):
        return [v if v is not None and v > 0 else np.nan for v in values]

    names = [s.name for s in report.layers]
    xs = np.arange(len(names))
    fig = agg_figure((max(6.0, 0.45 * len(names) + 2), 6.5),
                     "StatsReport.plot needs matplotlib: pip install 'linearkit[plot]'")
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    ax1.plot(xs, positive([s.std for s in report.layers]), "o-", label="activation std")
    ax1.plot(xs, positive([s.max_abs for s in report.layers]), ".--", alpha=0.6,
             label="max |y|")
    ax1.set_yscale("log")
    ax1.set_ylabel("forward: std, max |y|\n(log scale)")
    ax1.legend(loc="best", fontsize=8)
    ax1.grid(True, which="both", alpha=0.3)
    ax2.plot(xs, positive([s.grad_out_norm for s in report.layers]), "o-",
             label="‖dy‖ (into layer output)")
    ax2.plot(xs, positive([s.param_grad_norm for s in report.layers]), "s", label="‖∇params‖")
    ax2.set_yscale("log")
    ax2.set_ylabel("backward: gradient norm\n(log scale)")
    ax2.set_xlabel("layer (path, type)")
    ax2.legend(loc="best", fontsize=8)
    ax2.grid(True, which="both", alpha=0.3)
    ax2.set_xticks(xs)
    ax2.set_xticklabels([f"{n}\n{s.type}" for n, s in zip(names, report.layers)], fontsize=7,
                        rotation=90)
    flagged = {f.layer for f in report.flags}
    for i, n in enumerate(names):
        if n in flagged or any(f.startswith(n + ".") for f in flagged):
            ax1.axvspan(i - 0.4, i + 0.4, color="red", alpha=0.08)
    ax1.set_title(title or f"per-layer statistics ({len(report.flags)} flag(s))")
    fig.tight_layout()
    return fig
