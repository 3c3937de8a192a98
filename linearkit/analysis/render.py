"""Rendering helpers shared by the report writers (``analysis.stats``, ``experiments``).

* :func:`text_table`: an aligned plain-text table, with a dashed rule under the header.
* :func:`markdown_table`: the same rows as a GitHub markdown table.
* :func:`agg_figure`: a matplotlib ``Figure`` on the Agg canvas, so no pyplot state or GUI
  backend is touched; matplotlib is imported only here, when a plot is drawn.
* :func:`terminal_safe`: text that came from a file, with every control character escaped,
  before it is printed.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Container, Sequence

__all__ = ["agg_figure", "markdown_table", "terminal_safe", "text_table"]

# Unicode categories a terminal must never receive raw from a file: Cc holds C0 (ESC, CR, BEL,
# backspace...), DEL and C1 (CSI...); Cf the bidi overrides and isolates (U+202E...) and
# zero-width characters; Zl/Zp the line and paragraph separators; Cs lone surrogates, which
# JSON can encode and which would make print() itself fail.
_UNSAFE = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def _escape(ch: str) -> str:
    code = ord(ch)
    named = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}.get(ch)
    if named:
        return named
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def terminal_safe(text, keep_newlines: bool = False) -> str:
    """``text`` with each control or invisible formatting character written as its Python
    escape (``\\x1b``, ``\\r``, ``\\u202e``), so printing it cannot move the cursor, clear
    the screen, recolour or reorder what follows. Printable Unicode (accents, CJK, emoji) is
    kept as it is; with ``keep_newlines``, so is ``\\n`` (for text made of several lines).

    >>> terminal_safe("w\\x1b[2Jx\\u202e")
    'w\\\\x1b[2Jx\\\\u202e'
    """
    text = str(text)
    if text.isprintable():  # the common case: nothing to escape
        return text
    return "".join(_escape(ch) if unicodedata.category(ch) in _UNSAFE
                   and not (keep_newlines and ch == "\n") else ch for ch in text)


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
