"""The ledger's accumulator: the rows being built, and the running sums every source shares.

Each parameter is counted once, at the first module that owns it (tied weights are noted), and
each array a backward keeps alive is counted once, at the first module that saves it.
"""

from __future__ import annotations

import numpy as np

from .report import Row

__all__ = ["Acc"]


class Acc:
    """Accumulates rows, first-wins parameter counting and once-only saved arrays."""

    def __init__(self, itemsize: int):
        self.itemsize = itemsize
        self.rows: list[Row] = []
        self.param_owner: dict[int, str] = {}
        self.kept: dict = {}  # key of each array counted as saved -> its bytes (in order)
        self.cost = {"macs": 0, "gemm": 0, "bias": 0, "elem": 0, "bwd_macs": 0, "bwd": 0}
        self.unaccounted: list[str] = []  # paths of rows whose FLOPs no rule gives
        self.unsaved: list[str] = []  # paths of rows whose saved arrays no rule gives
        self.containers: set[int] = set()  # rows that sum their children (not leaves)
        self.chains: list[tuple] = []  # (Sequential row, its children's rows), for findings
        self.linear_weights: dict[int, np.ndarray] = {}  # row index -> weight (for findings)
        self.notes: list[str] = []
        self.saved_total = 0
        self.recompute_peak = 0  # the largest checkpointed segment's recompute (end_recompute)

    def row(self, path, type_, depth, kind="module", **kw) -> int:
        self.rows.append(Row(path=path, type=type_, depth=depth, kind=kind, **kw))
        return len(self.rows) - 1

    def own_params(self, index: int, params) -> None:
        """Count ``params`` [(Parameter-like, numel, trainable)] at row ``index``, first wins."""
        row = self.rows[index]
        tied = []
        for key, numel, trainable in params:
            if key in self.param_owner:
                tied.append(self.param_owner[key])
                continue
            self.param_owner[key] = row.path
            row.params += numel
            row.trainable_params += numel if trainable else 0
        if tied:
            row.note = (row.note + " " if row.note else "") + \
                f"tied with {', '.join(sorted({p or '(model)' for p in tied}))}"

    def add_cost(self, index: int, cost) -> None:
        macs, gemm, bias, elem, bwd_macs, bwd = cost
        row = self.rows[index]
        row.macs = (row.macs or 0) + macs
        row.flops = (row.flops or 0) + gemm + bias + elem
        row.backward_macs = (row.backward_macs or 0) + bwd_macs
        row.backward_flops = (row.backward_flops or 0) + bwd
        for k, v in zip(("macs", "gemm", "bias", "elem", "bwd_macs", "bwd"), cost):
            self.cost[k] += v

    def keep(self, index: int, key, nbytes: int) -> None:
        """Row ``index``'s backward holds the array ``key`` (counted once over the model)."""
        row = self.rows[index]
        if row.saved_bytes is None:
            row.saved_bytes = 0
        if key not in self.kept:
            self.kept[key] = nbytes
            row.saved_bytes += nbytes
            self.saved_total += nbytes

    def roll_up(self, index: int, children: list[int]) -> None:
        """Add the children's figures into container row ``index``."""
        row = self.rows[index]
        for c in children:
            child = self.rows[c]
            row.params += child.params
            row.trainable_params += child.trainable_params
            for k in ("macs", "flops", "backward_macs", "backward_flops", "saved_bytes"):
                v = getattr(child, k)
                if v is not None:
                    setattr(row, k, (getattr(row, k) or 0) + v)

    def begin_recompute(self):
        """Enter a checkpointed segment (a row of kind 'checkpoint'): a mark for end_recompute."""
        mark = (len(self.kept), self.recompute_peak)
        self.recompute_peak = 0
        return mark

    def end_recompute(self, index: int, mark, input_key) -> None:
        """Leave the checkpointed segment of row ``index`` (its children rolled up).

        What its children kept is not held from the forward to the backward: the segment's
        backward recomputes it, one segment at a time. So it leaves the held total and the kept
        keys (the row's own rule then counts the input the checkpoint holds), and the segment's
        arrays but its input — plus the largest segment nested in it — are a recompute peak; the
        largest over the model is added to the activations once (``finish_recompute``). The
        recompute is a second forward: the children's forward cost is added to the row's
        backward. A segment with no backward work (frozen, no input gradient) recomputes nothing.
        """
        start, outer_peak = mark
        added = list(self.kept.items())[start:]
        for key, _ in added:
            del self.kept[key]
        segment = sum(nbytes for _, nbytes in added)
        self.saved_total -= segment
        row = self.rows[index]
        if row.saved_bytes is not None:
            row.saved_bytes = 0
        peak = 0
        if row.backward_flops:
            peak = segment - dict(added).get(input_key, 0) + self.recompute_peak
            self.add_cost(index, (0, 0, 0, 0, row.macs or 0, row.flops or 0))
        self.recompute_peak = max(outer_peak, peak)

    def finish_recompute(self) -> None:
        """Add the largest recompute peak to the activations (once the pass is done)."""
        if self.recompute_peak:
            self.saved_total += self.recompute_peak
            self.notes.append(
                f"activation checkpointing: the activations count what is held from the forward "
                f"to the backward (each checkpointed segment's input) plus "
                f"{self.recompute_peak:,} bytes, the largest segment's recomputed activations, "
                f"alive while its backward runs.")
