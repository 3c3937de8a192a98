"""The PNG of ``linearkit sweep --plot FILE.png`` (matplotlib, the ``plot`` extra, imported only
when drawing, on the Agg canvas).

A batch sweep draws two panels: throughput against batch size, and throughput against latency
(each point labelled with its batch), the knee marked in both. A width sweep draws GFLOP/s per
width as bars.

The x ticks are chosen here, never left to matplotlib's log locators (whose minor labels,
``2×10⁻²`` beside ``2.2×10⁻²``, collide on a narrow range): the swept batches, latencies on a
1-2-5 grid, the widths; then every k-th is kept, k the smallest for which no two labels overlap
once drawn (:func:`fit_x_ticks`).
"""

from __future__ import annotations

import math
from itertools import pairwise
from pathlib import Path

from .layer_sweep import KNEE_FRACTION, SweepResult
from .render import agg_figure

__all__ = ["MISSING", "fit_x_ticks", "plot_sweep", "sweep_figure"]

MISSING = ('linearkit sweep --plot needs matplotlib: pip install "linearkit[plot]" '
           "(or leave out --plot)")


def _overlapping(labels, renderer) -> bool:
    """Whether two of the drawn tick ``labels`` (matplotlib Text) overlap."""
    boxes = sorted((t.get_window_extent(renderer) for t in labels), key=lambda b: b.x0)
    return any(a.overlaps(b) for a, b in pairwise(boxes))


def fit_x_ticks(fig, ax, positions, labels) -> None:
    """Put x ticks at ``positions`` with ``labels`` on ``ax`` (no minor ticks), keeping every
    k-th one, k the smallest for which no two labels overlap when ``fig`` is drawn."""
    from matplotlib.ticker import NullLocator

    ax.xaxis.set_minor_locator(NullLocator())
    renderer = None
    for k in range(1, max(len(positions), 1) + 1):
        ax.set_xticks(list(positions)[::k], labels=list(labels)[::k])
        fig.canvas.draw()
        renderer = renderer or fig.canvas.get_renderer()
        shown = [t for t in ax.xaxis.get_ticklabels() if t.get_visible() and t.get_text()]
        if not _overlapping(shown, renderer):
            return


def _grid_1_2_5(lo: float, hi: float) -> list[float]:
    """Round values in ``[lo, hi]`` for a log axis: 1-2-5 per decade, or a finer grid (1, 1.5,
    2, 3, 5, 7) when that gives fewer than 3."""
    found = []
    for steps in ((1, 2, 5), (1, 1.5, 2, 3, 5, 7), (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9)):
        found = [step * 10.0 ** e for e in range(math.floor(math.log10(lo)),
                                                  math.floor(math.log10(hi)) + 1)
                 for step in steps if lo <= step * 10.0 ** e <= hi]
        if len(found) >= 3:
            break
    return found if found else [float(f"{math.sqrt(lo * hi):.3g}")]  # a range under 1.25x


def _number(v: float) -> str:
    return f"{v:g}"


def sweep_figure(result: SweepResult):
    """The matplotlib ``Figure`` of ``result`` (on the Agg canvas). ImportError without
    matplotlib."""
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
        fig.tight_layout()
        batches = [r.batch for r in rows]
        fit_x_ticks(fig, ax_b, batches, [str(b) for b in batches])
        grid = _grid_1_2_5(*ax_l.get_xlim())
        fit_x_ticks(fig, ax_l, grid, [_number(v) for v in grid])
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
        fit_x_ticks(fig, ax, range(len(names)), names)
    fig.tight_layout()
    return fig


def plot_sweep(result: SweepResult, path) -> Path:
    """Draw ``result`` into the PNG ``path``; returns the path. ImportError without matplotlib."""
    path = Path(path)
    sweep_figure(result).savefig(str(path), dpi=100)
    return path
