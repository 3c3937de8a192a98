"""Rendering helpers shared by the report writers (``analysis.stats``, ``experiments``).

* :func:`text_table`: an aligned plain-text table, with a dashed rule under the header.
* :func:`markdown_table`: the same rows as a GitHub markdown table.
* :func:`agg_figure`: a matplotlib ``Figure`` on the Agg canvas, so no pyplot state or GUI
  backend is touched; matplotlib is imported only here, when a plot is drawn.
"""

from __future__ import annotations

from collections.abc import Container, Sequence

__all__ = ["agg_figure", "markdown_table", "text_table"]


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]],
               left: Container[int]) -> list[str]:
    """Lines of an aligned table: columns in ``left`` are left-aligned, the others right."""
    rows = [tuple(header)] + [tuple(r) for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]

    def line(r):
        return "  ".join(c.ljust(w) if i in left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    return [line(rows[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in rows[1:]]


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]],
                   left: Container[int] | None = None) -> str:
    """A GitHub markdown table; with ``left``, columns in it align left and the others right."""
    if left is None:
        sep = "|" + "|".join("---" for _ in header) + "|"
    else:
        sep = "|" + "|".join(":---" if i in left else "---:" for i in range(len(header))) + "|"
    head = "| " + " | ".join(header) + " |"
    return "\n".join([head, sep] + ["| " + " | ".join(r) + " |" for r in rows])


def agg_figure(figsize, missing: str):
    """A ``Figure`` of size ``figsize`` on an Agg canvas; ``ImportError(missing)`` without
    matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(missing) from err
    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig
