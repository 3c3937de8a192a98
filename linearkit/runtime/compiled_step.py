"""``loop.step`` as one compiled call, when nothing in the step needs Python between its parts.

The step is ``model.vjp`` -> ``CrossEntropyLoss.vjp`` -> backward -> ``Adam.step_and_zero_grad``.
When each part would run its compiled kernel anyway (the model a chain
``runtime/compiled_chain.py`` takes, the loss its fused case, Adam its flat one-pass step),
``backend/fast/step_kernel.py`` runs the four kernels in one call, on the arrays they would get:
the same bits, without the Python between the parts (docs/fast.md, "The whole step in one
call"; tests/test_compiled_step.py compares every state after every step).

Anything else returns None before touching anything, and ``loop.step`` runs the parts one by
one; ``prepare`` returns the first condition that failed: the route switched off
(``linearkit.runtime.disabled``; ``LINEARKIT_FAST=0`` turns every kernel off), a model with
hooks or not a plain ``Sequential``, ``detect_anomaly``, a precision policy, ``tracemalloc``
tracing, another loss or optimizer (or a subclass), more than one parameter group, a group
that is not exactly the chain's trainable parameters, Adam's first step (it packs the flat
state), gradients neither all None nor all the flat buffer's own views; and ``run`` gives up
on a target outside ``[0, C)`` or equal to ``ignore_index`` (the parts raise or ignore it).
"""

from __future__ import annotations

import numpy as np

from .. import functional as F
from ..backend import fast
from ..backend import gemm as _gemm
from ..backend import threads as _threads
from ..backend.fast import blas as _blas
from ..backend.fast import chain_flags as K
from ..layers.container import Sequential, trains
from ..losses import FUSED_CE_MAX, CrossEntropyLoss
from ..optim.adam import STATE_KEYS, STATE_KEYS_AMSGRAD, Adam, AdamW
from . import compiled_chain as _compiled
from . import switches as _switches
from . import thin_path as _thin

__all__ = ["prepare", "run"]

_OPTIMIZERS = (Adam, AdamW)
_REDUCTIONS = ("mean", "sum")


class _StepPlan:
    """The arrays the step kernel takes besides the chain's, for one chain plan and one flat
    Adam state (kept on the optimizer while both are the same objects)."""

    __slots__ = ("bias_grads", "bounds", "chain", "data", "flat", "modes", "params", "scratch",
                 "slots", "weight_grads")

    def __init__(self, chain, flat, params, data, bounds, weight_grads, bias_grads, slots):
        self.chain, self.flat, self.params = chain, flat, params
        self.data = data                    # each parameter's data, a 1-D view (group order)
        self.bounds = bounds                # (n + 1,) int64: its slice of the flat arrays
        self.weight_grads, self.bias_grads = weight_grads, bias_grads   # per chain layer
        self.slots = slots                  # (layer, 0 weight | 1 bias) per parameter
        self.modes = np.zeros((len(chain.units), 2), np.int64)   # the backward's grad_modes
        self.scratch = {}                   # rows -> the kernel's scratch arrays (never read
        #                                     after a step: nothing of it is returned)

    def __deepcopy__(self, memo):
        # a copy's reshaped views would be arrays of their own, no longer the parameters'
        # (its FlatState is not found either: Optimizer._flat is keyed by the group's id), so
        # a copied optimizer plans again
        return None

    def scratch_for(self, rows: int, dtype) -> tuple:
        """``(ws, out, exps, row_sum, target_gap)`` for a batch of ``rows``, reused."""
        arrays = self.scratch.get(rows)
        if arrays is None:
            chain = self.chain
            out = np.empty((rows, chain.weights[-1].shape[0]), dtype)
            row_sum, target_gap = np.empty((2, rows))
            arrays = (np.empty(rows * chain.ws_per_row, dtype), out, np.empty_like(out),
                      row_sum, target_gap)
            if len(self.scratch) >= 4:       # batch sizes seen: a few (the last is smaller)
                self.scratch.clear()
            self.scratch[rows] = arrays
        return arrays


def run(model, loss_fn, optimizer, x, y, set_to_none: bool) -> float | None:
    """``loop.step(model, loss_fn, optimizer, x, y, set_to_none=...)`` in one compiled call:
    the loss (a float), every state as the step's parts leave it; or None, nothing touched,
    when the step is not one the kernel runs (``prepare`` says why)."""
    ready = prepare(model, loss_fn, optimizer, x, y)
    if ready.__class__ is str:
        return None
    kernels, kept, group, rows, modes, step = ready
    return _run(kernels, kept, optimizer, group, x, y, rows, loss_fn, modes, step + 1,
                set_to_none)


def prepare(model, loss_fn, optimizer, x, y):
    """What ``run`` needs for this step, or why the step runs as its parts (a str, the first
    condition that failed; ``linearkit.runtime.explain`` shows it)."""
    if not _switches.on["compiled_step"]:
        return "switched off (linearkit.runtime.disabled)"
    if type(model) is not Sequential:
        return "the model is not a Sequential"
    if model.has_hooks() or loss_fn.has_hooks():
        return "a call hook is registered on the model or the loss"
    if type(loss_fn) is not CrossEntropyLoss:
        return "the loss is not CrossEntropyLoss"
    if type(optimizer) not in _OPTIMIZERS:
        return "the optimizer is not Adam or AdamW"
    if len(optimizer.param_groups) != 1:
        return "the optimizer has more than one parameter group"
    why = _thin.blocker()
    if why is not None:
        return why
    kept = optimizer.__dict__.get("_compiled_step")
    if kept is False:
        return "numba could not compile the step for these arrays"
    chain = _compiled.plan_for(model.steps(), x, False, trains, model)
    if chain.__class__ is not _compiled.Plan:
        return "the model is not one compiled chain: " + _compiled.describe(chain)
    rows = x.shape[0]
    if not (loss_fn.weight is None and not loss_fn.label_smoothing
            and loss_fn.reduction in _REDUCTIONS and type(y) is np.ndarray
            and y.dtype.kind in "iu" and y.shape == (rows,)):
        return ("the loss has a class weight, label smoothing or reduction='none', or the "
                "targets are not class indices of shape (B,)")
    classes = chain.weights[-1].shape[0]
    if rows * classes > FUSED_CE_MAX:      # the loss's NumPy path: other roundings
        return "the batch's logits are too many for the fused loss kernel"
    group = optimizer.param_groups[0]
    params = group["params"]
    keys = STATE_KEYS_AMSGRAD if group["amsgrad"] else STATE_KEYS
    flat = optimizer.flat_state(group)
    state = optimizer.state
    if (flat is None or not flat.adopted or flat.mixed or flat.buffers["grad"].dtype != x.dtype
            or not flat.owns(params, state, keys)):
        return ("Adam's flat state is not packed yet (its first step packs it) or holds other "
                "arrays")
    step = state[params[0]]["step"]
    for p in params:
        if state[p]["step"] != step:
            return "the parameters are at different steps"
    if kept is None or kept.chain is not chain or kept.flat is not flat or kept.params != params:
        kept = _step_plan(chain, flat, params)
        if kept is None:
            return "the optimizer's group is not exactly the chain's trainable parameters"
        object.__setattr__(optimizer, "_compiled_step", kept)
    modes = _grad_modes(kept)
    if modes is None:
        return "the gradients are neither all None nor all the flat buffer's own views"
    kernels = fast.kernels()
    if kernels is None:
        return _compiled.NO_KERNELS
    if _blas.functions(x.dtype) is None:
        return _compiled.NO_BLAS
    return kernels, kept, group, rows, modes, step


def _run(kernels, kept, optimizer, group, x, y, rows, loss_fn, modes, t, set_to_none):
    chain, flat, params = kept.chain, kept.flat, kept.params
    dtype = x.dtype
    targets = y.astype(np.intp, copy=False)
    if not _compiled.plain_array(targets):      # one compiled version: a contiguous, writeable copy
        targets = np.array(targets, np.intp)
    beta1, beta2 = group["betas"]
    adam_flags, adam_scalars = kernels.adam_settings(
        flat.__dict__.setdefault("_scratch", {}), dtype, step=t, lr=group["lr"], beta1=beta1,
        beta2=beta2, eps=group["eps"], weight_decay=group["weight_decay"],
        maximize=group["maximize"], decoupled_weight_decay=optimizer.decoupled_weight_decay,
        amsgrad=bool(group["amsgrad"]), zero_grads=not set_to_none)
    arrays = flat.arrays
    grads = flat.buffers["grad"]
    vmax = arrays.get("max_exp_avg_sq", grads)
    macs = rows * chain.macs_per_row
    if macs >= _threads.switch_macs:
        _threads.before_gemm(macs)
    mean = loss_fn.reduction == "mean"
    ws, out, exps, row_sum, target_gap = kept.scratch_for(rows, dtype)
    try:
        total = kernels.train_step(
            chain.one, chain.zero, x, chain.weights, chain.biases, chain.flags_for(rows),
            ws, out, targets, int(loss_fn.ignore_index), exps, row_sum, target_gap,
            1.0 / rows if mean else 1.0, kept.weight_grads, kept.bias_grads, modes,
            _gemm.ones_vector(rows, dtype), kept.data, grads, arrays["exp_avg"],
            arrays["exp_avg_sq"], vmax, kept.bounds, adam_flags, adam_scalars)
    except Exception as err:       # numba could not type these arrays: the parts, for good
        if not type(err).__module__.startswith("numba"):
            raise
        object.__setattr__(optimizer, "_compiled_step", False)
        return None
    if total < 0:           # a target out of range or ignored: the parts raise or ignore it
        return None
    state = optimizer.state
    for p in params:
        state[p]["step"] = t
    if set_to_none:
        for p in params:
            p.grad = None
            p._zeroed = None             # as grad_buffer() left it, before zero_grad()
    else:
        for p, view in zip(params, flat.grad_views):
            p.grad = view                # already its view, or None before this step
            p.mark_zeroed()              # the kernel zeroed it after reading it
    return float(dtype.type(total / rows if mean else total))


def _step_plan(chain, flat, params) -> _StepPlan | None:
    """The step plan for ``chain`` and ``flat``, or None unless the group is exactly the
    chain's trainable parameters (each of them once)."""
    index = {id(p): i for i, p in enumerate(params)}
    if len(index) != len(params):
        return None
    weight_grads, bias_grads = [], []
    slots = [None] * len(params)
    for layer, (linear, _) in enumerate(chain.units):
        f = chain.flags[layer]
        found = chain.weights[layer], chain.biases[layer]
        for column, (param, wanted, out) in enumerate((
                (linear._parameters["weight"], f & K.NEED_DW, weight_grads),
                (linear._parameters["bias"], f & K.NEED_DB, bias_grads))):
            if not wanted:
                out.append(found[column])       # a dummy the kernel does not read
                continue
            i = index.get(id(param))
            if i is None or slots[i] is not None:
                return None
            slots[i] = (layer, column)
            out.append(flat.grad_views[i])
    if None in slots:                       # a parameter the chain does not train
        return None
    data = tuple(p.data.reshape(-1) for p in params)   # views: the chain's arrays are C-order
    bounds = np.array([s.start for s in flat.slices] + [flat.slices[-1].stop], np.int64)
    return _StepPlan(chain, flat, list(params), data, bounds, tuple(weight_grads),
                     tuple(bias_grads), slots)


def _grad_modes(kept: _StepPlan) -> np.ndarray | None:
    """``grad_modes`` for the backward kernel (1 overwrite, 2 add into the gradient), or None
    unless the gradients are all None (written into the flat buffer) or all its own views."""
    params, views = kept.params, kept.flat.grad_views
    modes = kept.modes
    first = params[0].grad
    if first is None:
        for p in params:
            if p.grad is not None:
                return None
        for layer, column in kept.slots:
            modes[layer, column] = 1
        return modes
    for p, view, (layer, column) in zip(params, views, kept.slots):
        grad = p.grad
        if grad is not view:
            return None
        modes[layer, column] = 1 if p._zeroed is grad else 2
    return modes
