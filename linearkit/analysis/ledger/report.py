"""The ledger's report: ``Row`` and ``Finding`` records, and ``Ledger`` with its text table,
Markdown and plain-dict forms. Nothing here computes a number; it only lays them out.

Names in the text and Markdown forms can come from a file (module paths, the source); each is
passed through ``terminal_safe`` there, so a control character in a file reaches the terminal
escaped. ``to_dict`` keeps them as they are (JSON escapes them itself).
"""

from __future__ import annotations

import textwrap
from dataclasses import asdict, dataclass, field
from typing import Any

from ...rules.builtin import linear_text  # the type column of a Linear, as its rule writes it
from ..render import terminal_safe
from .costs import CONVENTIONS

__all__ = ["Finding", "Ledger", "Row", "human_bytes", "linear_text"]


@dataclass
class Row:
    """One module of the ledger. Containers show the sums over their children.

    ``saved_bytes`` is what this module's backward keeps alive (an array shared with an earlier
    module is counted there). Values are None where they are unavailable (no input shape, a
    weights file, a module type the ledger does not know).
    """

    path: str
    type: str
    depth: int = 0
    input_shape: tuple | None = None
    output_shape: tuple | None = None
    params: int = 0
    trainable_params: int = 0
    macs: int | None = None
    flops: int | None = None
    backward_macs: int | None = None
    backward_flops: int | None = None
    output_bytes: int | None = None
    saved_bytes: int | None = None
    note: str = ""
    kind: str = field(default="module", repr=False)
    info: dict = field(default_factory=dict, repr=False)


@dataclass
class Finding:
    """A redundancy or inefficiency, the fix, and what it saves (negative = costs).

    ``transform``: the ``linearkit.transforms`` call that applies the fix and proves it on probe
    inputs (with the ``linearkit compress`` flag), or '' when no transform does it.
    """

    kind: str
    paths: tuple
    message: str
    fix: str
    saving_params: int = 0
    saving_flops: int = 0
    transform: str = ""

    def __str__(self) -> str:
        saving = []
        if self.saving_params:
            saving.append(f"{self.saving_params:,} params")
        if self.saving_flops:
            saving.append(f"{self.saving_flops:,} FLOPs/forward")
        tail = f" Saves {', '.join(saving)}." if saving else ""
        if self.saving_params < 0 or self.saving_flops < 0:
            tail = tail.replace("Saves", "Changes").replace(" -", " +")
        apply = f" Apply: {self.transform}." if self.transform else ""
        return (f"[{self.kind}] {', '.join(self.paths)}: {self.message} Fix: {self.fix}.{tail}"
                f"{apply}")


def human_bytes(n: int | None) -> str:
    """``n`` bytes in binary units: '512 B', '513.0 KiB', '64.0 MiB', '1.50 GiB'."""
    if n is None:
        return "n/a"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}" if unit == "GiB" else f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _num(v) -> str:
    return "?" if v is None else f"{v:,}"


def _shape(s) -> str:
    return "-" if s is None else "(" + ", ".join(map(str, s)) + ")"


class Ledger:
    """The report ``ledger()`` returns: ``rows``, ``totals``, ``memory``, ``findings``.

    ``totals``: ``params``, ``trainable_params``, ``macs``, ``flops`` (forward),
    ``backward_macs``, ``backward_flops``, and the forward split ``gemm_flops`` (= 2·macs),
    ``bias_flops``, ``elementwise_flops``; FLOP entries are None for a weights file.
    ``memory`` (bytes): ``weights``, ``buffers``, ``grads``, ``master`` (float32 copy of 16-bit
    trainable parameters), ``optimizer``, ``training_state`` (weights + grads + master +
    optimizer), ``activations`` (saved for backward; None without an input shape) and ``total``.
    """

    def __init__(self, *, source, model_name, input_shape, dtype, optimizer, rows, totals,
                 memory, findings, notes):
        self.source = source
        self.model_name = model_name
        self.input_shape = input_shape
        self.dtype = dtype
        self.optimizer = optimizer
        self.rows: list[Row] = rows
        self.totals: dict[str, Any] = totals
        self.memory: dict[str, Any] = memory
        self.findings: list[Finding] = findings
        self.notes: list[str] = notes
        self.conventions = CONVENTIONS

    # ------------------------------------------------------------------ convenience
    def __getitem__(self, path: str) -> Row:
        """The row of the module at ``path`` ('' is the whole model)."""
        for row in self.rows:
            if row.path == path:
                return row
        raise KeyError(f"no module {path!r} in this ledger; paths: {[r.path for r in self.rows]}")

    def to_dict(self) -> dict:
        """Everything as plain JSON-able Python (ints, strings, lists, None)."""
        rows = []
        for row in self.rows:
            d = asdict(row)
            for k in ("input_shape", "output_shape"):
                d[k] = None if d[k] is None else list(d[k])
            rows.append(d)
        return {
            "source": self.source, "model": self.model_name,
            "input_shape": None if self.input_shape is None else list(self.input_shape),
            "dtype": self.dtype, "optimizer": self.optimizer, "conventions": self.conventions,
            "rows": rows, "totals": dict(self.totals), "memory": dict(self.memory),
            "findings": [dict(asdict(f), paths=list(f.paths), text=str(f))
                         for f in self.findings],
            "notes": list(self.notes),
        }

    # ------------------------------------------------------------------ printing
    _COLUMNS = ("path", "type", "input", "output", "params", "trainable", "MACs", "FLOPs",
                "bwd FLOPs", "out bytes", "saved", "note")
    _NUMERIC = range(4, 11)

    def _cells(self) -> list[list[str]]:
        out = []
        for row in self.rows:
            out.append(["  " * row.depth + terminal_safe(row.path or "(model)"),
                        terminal_safe(row.type), _shape(row.input_shape),
                        _shape(row.output_shape), _num(row.params),
                        _num(row.trainable_params), _num(row.macs), _num(row.flops),
                        _num(row.backward_flops), _num(row.output_bytes), _num(row.saved_bytes),
                        terminal_safe(row.note)])
        return out

    def _memory_items(self):
        """(key, bytes) of the memory budget in print order; no buffers or master: left out."""
        for key in ("weights", "buffers", "grads", "master", "optimizer", "training_state",
                    "activations", "total"):
            if key in ("buffers", "master") and not self.memory[key]:
                continue
            yield key, self.memory[key]

    def _title(self) -> str:
        return f"{terminal_safe(self.model_name)} ({terminal_safe(self.source)})"

    def _input_text(self) -> str:
        return "none" if self.input_shape is None else _shape(self.input_shape)

    def _summary_lines(self) -> list[str]:
        t = self.totals
        lines = [
            f"params {t['params']:,}  (trainable {t['trainable_params']:,})",
            (f"forward: {_num(t['macs'])} MACs, {_num(t['flops'])} FLOPs "
            f"(= 2*MACs {_num(t['gemm_flops'])} + bias {_num(t['bias_flops'])} + elementwise "
            f"{_num(t['elementwise_flops'])})"),
            f"backward: {_num(t['backward_macs'])} MACs, {_num(t['backward_flops'])} FLOPs",
            f"memory ({self.optimizer or 'inference'}, {self.dtype}):",
        ]
        for key, value in self._memory_items():
            label = {"training_state": "training state (weights+grads+states)",
                     "activations": "activations saved for backward",
                     "optimizer": "optimizer states"}.get(key, key)
            lines.append(f"  {label:<40} {_num(value):>16} B  {human_bytes(value):>10}")
        return lines

    def __str__(self) -> str:
        cells = self._cells()
        widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(self._COLUMNS)]
        numeric = set(self._NUMERIC)

        def fmt(r):
            return "  ".join(c.rjust(w) if i in numeric else c.ljust(w)
                             for i, (c, w) in enumerate(zip(r, widths))).rstrip()

        shape = self._input_text()
        lines = [f"Ledger of {self._title()}, input {shape}", fmt(self._COLUMNS),
                 fmt(["-" * w for w in widths])]
        lines += [fmt(r) for r in cells]
        lines += [""] + self._summary_lines()
        lines += [""] + textwrap.wrap("Conventions: " + self.conventions, 100)
        for n in self.notes:
            lines += textwrap.wrap("Note: " + terminal_safe(n), 100, subsequent_indent="  ")
        if self.findings:
            lines += ["", "Findings:"]
            for f in self.findings:
                lines += textwrap.wrap(terminal_safe(f), 100, initial_indent="  - ",
                                       subsequent_indent="    ")
        else:
            lines += ["", "Findings: none."]
        return "\n".join(lines)

    def to_markdown(self) -> str:
        """The same report as Markdown: a table, the memory budget, conventions, findings."""
        def esc(s):
            return s.replace("|", "\\|")

        cells = self._cells()
        shape = self._input_text()
        title = (f"**Ledger of `{terminal_safe(self.model_name)}`** "
                 f"({terminal_safe(self.source)})")
        lines = [f"{title}, input `{shape}`", "",
                 "| " + " | ".join(self._COLUMNS) + " |",
                 "|" + "|".join("---:" if i in self._NUMERIC else "---"
                                for i in range(len(self._COLUMNS)))
                 + "|"]
        for r in cells:
            r = [f"`{r[0].strip()}`"] + r[1:]
            lines.append("| " + " | ".join(esc(c) for c in r) + " |")
        t = self.totals
        lines += ["", "| total | value |", "|---|---:|",
                  f"| params | {t['params']:,} |", f"| trainable params | {t['trainable_params']:,} |",
                  f"| MACs (forward) | {_num(t['macs'])} |", f"| FLOPs (forward) | {_num(t['flops'])} |",
                  f"| MACs (backward) | {_num(t['backward_macs'])} |",
                  f"| FLOPs (backward) | {_num(t['backward_flops'])} |"]
        lines += ["", f"| memory ({self.optimizer or 'inference'}, {self.dtype}) | bytes | |",
                  "|---|---:|---:|"]
        for key, value in self._memory_items():
            lines.append(f"| {key.replace('_', ' ')} | {_num(value)} | {human_bytes(value)} |")
        lines += ["", "Conventions: " + self.conventions]
        lines += [f"Note: {terminal_safe(n)}" for n in self.notes]
        lines += ["", "**Findings**", ""]
        lines += [f"- {esc(terminal_safe(f))}" for f in self.findings] or ["none."]
        return "\n".join(lines) + "\n"

    def __repr__(self) -> str:
        t = self.totals
        return (f"<Ledger {terminal_safe(self.model_name)}: {t['params']:,} params, {_num(t['flops'])} FLOPs, "
                f"{human_bytes(self.memory['total'])} for one training step>")
