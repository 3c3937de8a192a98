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


def finish(acc, sizes, source, name, shape, optimizer, master_dtype, rank_check, notes):
    """Totals, the memory budget and the findings, common to every source."""
    root = acc.rows[0]
    params, trainable = root.params, root.trainable_params
    if master_dtype == "auto":
        master = np.dtype(np.float32) if sizes["half"] else None
    else:
        master = None if master_dtype is None else np.dtype(master_dtype)
    training = optimizer is not None
    grads = sizes["trainable"] if training else 0
    master_bytes = trainable * master.itemsize if training and master is not None else 0
    per_state = master.itemsize if master is not None else (
        sizes["trainable"] // trainable if trainable else 0)
    states = OPTIMIZER_STATES[optimizer] * trainable * per_state if training else 0
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
    if master_bytes:
        notes.append(f"mixed precision: {master.name} master weights and optimizer states, "
                     f"{sizes['store']} weights and grads.")
    if not training:
        notes.append("optimizer=None: inference, so no grads, optimizer states or saved "
                     "activations.")
        for r in acc.rows:
            r.saved_bytes = None if r.saved_bytes is None else 0
    return Ledger(source=source, model_name=name, input_shape=shape, dtype=sizes["store"],
                  optimizer=optimizer, rows=acc.rows, totals=totals, memory=memory,
                  findings=collect_findings(acc, rank_check), notes=notes)
