"""``compress(model, ...)``: the transforms ``linearkit compress`` applies, in a sound order.

The order is fixed so that each step sees what the previous one made:
fold the norms (into the Linears around them) -> merge the linear runs (now longer) -> factorize
-> prune (and store the pruned layers sparse) -> quantize to int8. Pruning and int8 do not combine
(a sparse layer is not quantized; pick one). Every step returns its own report.

Two guards against a silently ruinous result (``transforms.budget``):

* with ``data=(x, y)`` held out, ``max_drop=`` searches the lossy steps (ranks or energies,
  prune amounts, int8 on/off) for the smallest model whose accuracy (integer labels) or MSE
  (float targets) stays within ``max_drop`` of the original's; without ``max_drop`` the steps
  asked for are applied and measured;
* without data, a lossy step whose ``report.max_rel_error`` on the probes exceeds
  ``budget.MAX_REL_ERROR`` (0.1) raises :class:`~linearkit.transforms.budget.CostlyTransformError`
  (a ValueError) saying what it costs, unless ``force=True``.
"""

from __future__ import annotations

from ..core.module import Module

__all__ = ["compress"]


def compress(model: Module, *, merge: bool = False, fold: bool = False, rank: int | None = None,
             energy: float | None = None, int8: bool = False, prune: float | None = None,
             probe=None, data=None, max_drop: float | None = None, force: bool = False
             ) -> tuple[Module, list]:
    """Apply the chosen transforms to a copy of ``model``: ``(new_model, [report, ...])``.

    ``data``: held-out ``(x (N, *in), y (N,) integer labels | (N, *out) float targets)``.
    With ``max_drop`` (accuracy points, or percent of the MSE) the lossy options become the
    search space (``rank``/``energy``/``prune`` may then be sequences; none given: the default
    grid) and the smallest model within the budget is returned; the report list is then a
    ``budget.BudgetReport`` (``.table()``, ``.choice()``, ``.candidates``, ``.chosen``).
    ``force``: without data, accept a step that changes the probe outputs by more than
    ``budget.MAX_REL_ERROR`` (else CostlyTransformError, a ValueError naming the fix).

    ``model`` must be in eval mode for ``fold`` (BatchNorm folds only with running statistics).
    ``prune``: the fraction of each weight's smallest-magnitude entries to zero; the pruned
    layers are then stored as CSR ``SparseLinear`` where that saves bytes (below 50% density).
    Raises ValueError when nothing is asked, or for a combination that cannot hold
    (``rank`` with ``energy``, ``prune`` with ``int8``).
    """
    from . import factorize, fold_norm, merge_linear, quantize, to_sparse
    from . import prune as prune_
    from .budget import MAX_REL_ERROR, CostlyTransformError, search

    if max_drop is not None and data is None:
        raise ValueError(f"max_drop={max_drop!r} needs held-out data to measure against; got "
                         "data=None; pass data=(x_test, y_test)")
    if max_drop is not None:  # a search: the options are the axes, any may be combined
        return search(model, data, apply=compress, max_drop=max_drop, merge=merge, fold=fold,
                      rank=rank, energy=energy, prune=prune, int8=int8, probe=probe)
    if not (merge or fold or rank or energy or int8 or prune is not None):
        raise ValueError("nothing to do: ask for at least one of merge, fold, rank/energy, "
                         "int8, prune")
    if rank is not None and energy is not None:
        raise ValueError("give a rank or an energy to keep, not both")
    if prune is not None and int8:
        raise ValueError("pruning stores layers sparse (float values + int32 indices) and int8 "
                         "stores them dense: the two do not combine; pick one")
    if data is not None:  # measure what was asked on the data; no probe-error refusal
        return search(model, data, apply=compress, max_drop=None, merge=merge, fold=fold,
                      rank=rank, energy=energy, prune=prune, int8=int8, probe=probe)
    reports = []
    probes = "random probes" + (" and your probe batch" if probe is not None else "")

    def step(result, option: str | None = None, flag: str | None = None):
        # option/flag name a lossy step, refused without data when its probe error is large
        nonlocal model
        model, report = result
        reports.append(report)
        if option and not force and report.max_rel_error > MAX_REL_ERROR:
            raise CostlyTransformError(option, flag, report.max_rel_error, probes)

    if fold:
        step(fold_norm(model, probe=probe))
    if merge:
        step(merge_linear(model, probe=probe))
    if rank is not None or energy is not None:
        key, value = ("rank", rank) if rank is not None else ("energy", energy)
        step(factorize(model, rank=rank, energy=energy, probe=probe), f"{key}={value!r}",
             f"--{key} {value:g}")
    if prune is not None:
        step(prune_(model, prune, probe=probe), f"prune={prune!r}", f"--prune {prune:g}")
        step(to_sparse(model, min_sparsity=0.5, probe=probe))
    if int8:
        step(quantize(model, "int8", probe=probe), "int8=True", "--int8")
    return model, reports
