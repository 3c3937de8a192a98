"""The ledger's totals and memory budget for one training step, common to every source.

Weights, buffers, gradients, optimizer states, a master copy under mixed precision and the
activations saved for backward; then the findings, and the ``Ledger`` that holds it all.
"""

from __future__ import annotations

import numpy as np

from .findings import collect_findings
from .report import Ledger

__all__ = ["OPTIMIZER_STATES", "finish"]

#: Optimizer states kept per trainable parameter.
OPTIMIZER_STATES = {"adam": 2, "adamw": 2, "sgd-momentum": 1, "sgd": 0}


def _paths(paths) -> str:
    return ", ".join(p or "(model)" for p in paths)


def _masters(params, master_dtype):
    """Per parameter entry, the dtype of its master copy (None: the optimizer steps it as it is).

    'auto' follows linearkit's optimizers: a float32 master for each 16-bit trainable parameter
    (float16/bfloat16), none for the others; a dtype: a master of every trainable parameter in
    it (what an optimizer keeping one for all would hold); None: no master at all.
    """
    if master_dtype == "auto":
        f32 = np.dtype(np.float32)
        return [f32 if trainable and itemsize == 2 else None
                for _, itemsize, _, trainable in params]
    master = None if master_dtype is None else np.dtype(master_dtype)
    return [master if trainable else None for _, _, _, trainable in params]


def _training_state(params, masters, optimizer) -> dict:
    """Bytes of the gradients, master copies and optimizer states of the trainable parameters.

    ``params``: ``[(numel, itemsize, grad_itemsize, trainable), ...]``. A parameter with a
    master keeps its states in the master's dtype, one without in its own.
    """
    states_per = OPTIMIZER_STATES[optimizer]
    out = {"grads": 0, "master": 0, "optimizer": 0}
    for (numel, itemsize, grad_itemsize, trainable), master in zip(params, masters):
        if not trainable:
            continue
        out["grads"] += numel * grad_itemsize
        out["master"] += 0 if master is None else numel * master.itemsize
        out["optimizer"] += states_per * numel * (itemsize if master is None else master.itemsize)
    return out


def _master_note(params, masters, store) -> str:
    """What the budget counts as master copies ('' when there are none)."""
    with_master = [(n, m) for (n, _, _, _), m in zip(params, masters) if m is not None]
    if not with_master:
        return ""
    trainable = sum(n for n, _, _, t in params if t)
    count = sum(n for n, _ in with_master)
    which = "" if count == trainable else \
        f" for {count:,} of the {trainable:,} trainable parameters"
    return (f"mixed precision: {with_master[0][1].name} master weights and optimizer "
            f"states{which}, {store} weights.")


def finish(acc, sizes, source, name, shape, optimizer, master_dtype, rank_check, notes):
    """Totals, the memory budget and the findings, common to every source.

    ``sizes``: ``weights``, ``buffers`` (bytes), ``store`` (a dtype name for the report) and
    ``params``: ``[(numel, itemsize, grad_itemsize, trainable), ...]``, once per parameter.
    """
    root = acc.rows[0]
    params, trainable = root.params, root.trainable_params
    training = optimizer is not None
    masters = _masters(sizes["params"], master_dtype)
    state = (_training_state(sizes["params"], masters, optimizer) if training
             else {"grads": 0, "master": 0, "optimizer": 0})
    grads, master_bytes, states = state["grads"], state["master"], state["optimizer"]
    graph = shape is not None
    activations = (acc.saved_total if training else 0) if graph else None
    weights = sizes["weights"]
    memory = {"weights": weights, "buffers": sizes["buffers"], "grads": grads,
              "master": master_bytes, "optimizer": states,
              "training_state": weights + grads + master_bytes + states,
              "activations": activations}
    memory["total"] = memory["training_state"] + sizes["buffers"] + (activations or 0)
    c = acc.cost
    leaf = [r for n, r in enumerate(acc.rows) if n not in acc.containers
            and r.kind not in ("sequential", "residual", "container", "custom")]
    totals = {
        "params": params, "trainable_params": trainable,
        "macs": c["macs"], "flops": c["gemm"] + c["bias"] + c["elem"], "gemm_flops": c["gemm"],
        "bias_flops": c["bias"], "elementwise_flops": c["elem"], "backward_macs": c["bwd_macs"],
        "backward_flops": c["bwd"], "output_bytes": sum(r.output_bytes or 0 for r in leaf)}
    if graph:  # layers without arithmetic (Flatten, Identity, eval Dropout) cost 0, not "?"
        for r in acc.rows:
            if r.macs is None and r.kind != "unused" and r.path not in acc.unaccounted:
                r.macs = r.flops = r.backward_macs = r.backward_flops = 0
    else:
        totals.update(dict.fromkeys(("macs", "flops", "gemm_flops", "bias_flops",
                                     "elementwise_flops", "backward_macs", "backward_flops",
                                     "output_bytes")))
        for r in acc.rows:
            r.macs = r.flops = r.backward_macs = r.backward_flops = None
    notes = list(notes) + acc.notes
    if acc.unaccounted:
        notes.append(f"no FLOP rule for {_paths(acc.unaccounted)}: their FLOPs are missing "
                     "from the totals.")
    if acc.unsaved and training and graph:
        notes.append(f"no saved-array rule for {_paths(acc.unsaved)}: what their backward "
                     "keeps is missing from the activations.")
    master_note = _master_note(sizes["params"], masters, sizes["store"]) if training else ""
    if master_note:
        notes.append(master_note)
    if not training:
        notes.append("optimizer=None: inference, so no grads, optimizer states or saved "
                     "activations.")
        for r in acc.rows:
            r.saved_bytes = None if r.saved_bytes is None else 0
    return Ledger(source=source, model_name=name, input_shape=shape, dtype=sizes["store"],
                  optimizer=optimizer, rows=acc.rows, totals=totals, memory=memory,
                  findings=collect_findings(acc, rank_check), notes=notes)
