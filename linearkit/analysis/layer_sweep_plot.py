"""The PNG of ``linearkit sweep --plot FILE.png`` (matplotlib, the ``plot`` extra, imported only
when drawing, on the Agg canvas).

A batch sweep draws two panels: throughput against batch size, and throughput against latency
(each point labelled with its batch), the knee marked in both. A width sweep draws GFLOP/s per
width as bars.
"""

from __future__ import annotations

from pathlib import Path

from .layer_sweep import KNEE_FRACTION, SweepResult
from .render import agg_figure

__all__ = ["MISSING", "plot_sweep"]

MISSING = ('linearkit sweep --plot needs matplotlib: pip install "linearkit[plot]" '
           "(or leave out --plot)")


def plot_sweep(result: SweepResult, path) -> Path:
    """Draw ``result`` into the PNG ``path``; returns the path. ImportError without matplotlib."""
    path = Path(path)
    rows = result.rows
    if result.kind == "batch":
        fig = agg_figure((11, 4), MISSING)
        ax_b, ax_l = fig.subplots(1, 2)
        series = [("forward", "forward_samples_s", "forward_ms", result.knee, "tab:blue")]
        if result.backward:
            series.append(("forward+backward", "train_samples_s", "train_ms",
                           result.knee_backward, "tab:orange"))
        for label, tput, lat, knee, color in series:
            bs = [r.batch for r in rows]
            ts = [getattr(r, tput) for r in rows]
            ls = [getattr(r, lat) for r in rows]
            ax_b.plot(bs, ts, marker="o", color=color, label=label)
            ax_l.plot(ls, ts, marker="o", color=color, label=label)
            for b, t, lt in zip(bs, ts, ls):
                ax_l.annotate(str(b), (lt, t), fontsize=7, xytext=(3, -9),
                              textcoords="offset points")
            k = bs.index(knee)
            ax_b.plot([knee], [ts[k]], marker="*", ms=16, color=color, ls="none",
                      label=f"knee ({label}): batch {knee}")
            ax_l.plot([ls[k]], [ts[k]], marker="*", ms=16, color=color, ls="none")
        ax_b.set_xscale("log", base=2)
        ax_b.set_xlabel("batch size")
        ax_l.set_xscale("log")
        ax_l.set_xlabel("latency (ms per call)")
        for ax in (ax_b, ax_l):
            ax.set_yscale("log")
            ax.set_ylabel("throughput (samples/s)")
            ax.grid(True, which="both", alpha=0.3)
        ax_b.legend(fontsize=8)
        first = rows[0]
        fig.suptitle(f"Linear({first.in_features}, {first.out_features}), {result.dtype}: "
                     f"knee = smallest batch reaching {KNEE_FRACTION:.0%} of the best "
                     "throughput", fontsize=10)
    else:
        fig = agg_figure((max(5, 1.2 * len(rows) + 2), 4), MISSING)
        ax = fig.subplots()
        names = [str(r.in_features) for r in rows]
        ax.bar(names, [r.forward_gflops for r in rows], color="tab:blue", label="forward")
        if result.backward:
            ax.plot(names, [r.train_gflops for r in rows], marker="o", color="tab:orange",
                    ls="none", label="forward+backward")
        ax.set_xlabel("width d of Linear(d, d)")
        ax.set_ylabel("GFLOP/s")
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
        fig.suptitle(f"square layers at batch {rows[0].batch}, {result.dtype}", fontsize=10)
    fig.tight_layout()
    fig.savefig(str(path), dpi=100)
    return path
