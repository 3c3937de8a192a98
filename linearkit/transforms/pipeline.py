"""``compress(model, ...)``: the transforms ``linearkit compress`` applies, in a sound order.

The order is fixed so that each step sees what the previous one made:
fold the norms (into the Linears around them) -> merge the linear runs (now longer) -> factorize
-> prune (and store the pruned layers sparse) -> quantize to int8. Pruning and int8 do not combine
(a sparse layer is not quantized; pick one). Every step returns its own report.
"""

from __future__ import annotations

from ..core.module import Module

__all__ = ["compress"]


def compress(model: Module, *, merge: bool = False, fold: bool = False, rank: int | None = None,
             energy: float | None = None, int8: bool = False, prune: float | None = None,
             probe=None) -> tuple[Module, list]:
    """Apply the chosen transforms to a copy of ``model``: ``(new_model, [report, ...])``.

    ``model`` must be in eval mode for ``fold`` (BatchNorm folds only with running statistics).
    ``prune``: the fraction of each weight's smallest-magnitude entries to zero; the pruned
    layers are then stored as CSR ``SparseLinear`` where that saves bytes (below 50% density).
    Raises ValueError when nothing is asked, or for a combination that cannot hold
    (``rank`` with ``energy``, ``prune`` with ``int8``).
    """
    from . import factorize, fold_norm, merge_linear, quantize, to_sparse
    from . import prune as prune_

    if not (merge or fold or rank or energy or int8 or prune is not None):
        raise ValueError("nothing to do: ask for at least one of merge, fold, rank/energy, "
                         "int8, prune")
    if rank is not None and energy is not None:
        raise ValueError("give a rank or an energy to keep, not both")
    if prune is not None and int8:
        raise ValueError("pruning stores layers sparse (float values + int32 indices) and int8 "
                         "stores them dense: the two do not combine; pick one")
    reports = []

    def step(result):
        nonlocal model
        model, report = result
        reports.append(report)

    if fold:
        step(fold_norm(model, probe=probe))
    if merge:
        step(merge_linear(model, probe=probe))
    if rank is not None or energy is not None:
        step(factorize(model, rank=rank, energy=energy, probe=probe))
    if prune is not None:
        step(prune_(model, prune, probe=probe))
        step(to_sparse(model, min_sparsity=0.5, probe=probe))
    if int8:
        step(quantize(model, "int8", probe=probe))
    return model, reports
