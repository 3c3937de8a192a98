"""The init-depth experiment's two plots: training-loss curves and per-layer statistics at init.

Both draw on the Agg canvas (matplotlib is imported only here, when drawing) and return the path.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from linearkit.analysis.render import agg_figure

from .init_depth import CHANCE, INITS, Result

__all__ = ["plot_curves", "plot_stats"]

_COLORS = {"small": "tab:red", "constant": "tab:purple", "xavier": "tab:blue",
           "kaiming": "tab:green", "default": "tab:orange"}
# Curves that sit on top of each other at chance level stay visible: wide ones drawn first.
_STYLES = {"small": {"lw": 5, "alpha": 0.45, "zorder": 1},
           "constant": {"lw": 3, "ls": "--", "zorder": 2},
           "xavier": {"lw": 1.5, "zorder": 3},
           "kaiming": {"lw": 1.5, "zorder": 4},
           "default": {"lw": 1.5, "ls": ":", "zorder": 5}}


def _figure(rows: int, cols: int, size):
    fig = agg_figure(size, "the init experiment's plots need matplotlib: pip install "
                           "\"linearkit[plot]\" (or skip the page and plots: "
                           "`python -m experiments init-depth --no-write`, or run(write=False))")
    return fig, fig.subplots(rows, cols, squeeze=False)


def plot_curves(result: Result, path: Path) -> Path:
    """Training loss per epoch: one panel per (task, depth), one curve per init."""
    c = result.config
    fig, axes = _figure(len(c.tasks), len(c.depths), (5.2 * len(c.depths), 3.8 * len(c.tasks)))
    for i, task in enumerate(c.tasks):
        for j, depth in enumerate(c.depths):
            ax = axes[i][j]
            for init in c.inits:
                r = result.get(task, depth, init)
                ys = np.array(r.train_loss, dtype=float)
                ys[~np.isfinite(ys)] = np.nan
                label = INITS[init][0] + (" (diverged)" if r.diverged else "")
                ax.plot(np.arange(len(ys)), ys, marker="o", ms=3, color=_COLORS[init],
                        label=label, **_STYLES[init])
            ax.axhline(CHANCE, color="gray", ls=":", lw=1)
            ax.set_yscale("log")
            ax.set_title(f"{task}, {depth} layers", fontsize=10)
            ax.set_xlabel("epoch")
            ax.set_ylabel("training loss")
            ax.grid(True, which="both", alpha=0.3)
            if i == 0 and j == 0:
                ax.legend(fontsize=7, loc="lower left")
    fig.suptitle(f"Deep ReLU MLP (width {c.width}), SGD lr={c.lr} momentum={c.momentum}; "
                 "dotted: chance (ln 10)", fontsize=10)
    fig.tight_layout()
    fig.savefig(str(path), dpi=100)
    return path


def plot_stats(result: Result, path: Path) -> Path:
    """Std of each Linear's output and its weight-gradient norm at init, deepest network, first
    task."""
    c = result.config
    task, depth = c.tasks[0], max(c.depths)
    fig, axes = _figure(1, 2, (11, 3.8))
    for init in c.inits:
        rep = result.get(task, depth, init).stats
        lin = [s for s in rep.layers if s.type == "Linear"]
        xs = np.arange(1, len(lin) + 1)
        std = np.array([s.std if s.std and s.std > 0 else np.nan for s in lin])
        grad = np.array([s.param_grad_norms.get("weight") or np.nan for s in lin])
        for ax, ys in zip(axes[0], (std, grad)):
            ax.plot(xs, ys, marker="o", ms=3, color=_COLORS[init], label=INITS[init][0],
                    **_STYLES[init])
    for ax, title in zip(axes[0], ("std of each Linear's output", "‖∇weight‖ of each Linear")):
        ax.set_yscale("log")
        ax.set_xlabel("layer")
        ax.set_title(f"{title} at init ({task}, {depth} layers)", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(str(path), dpi=100)
    return path
