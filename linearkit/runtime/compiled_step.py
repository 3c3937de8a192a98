"""``loop.step`` as one compiled call, when nothing in the step needs Python between its parts.

The step is ``model.vjp`` -> ``CrossEntropyLoss.vjp`` -> backward -> ``Adam.step_and_zero_grad``.
When each part would run its compiled kernel anyway (the model a chain
``runtime/compiled_chain.py`` takes, the loss its fused case, Adam its flat one-pass step),
``backend/fast/step_kernel.py`` runs the four kernels' code in one call, on the arrays they
would get: the same bits, without the Python between the parts (docs/fast.md, "The whole step
in one call"; tests/test_compiled_step.py compares every state after every step).

Anything else returns None before touching anything, and ``loop.step`` runs the parts one by
one; ``prepare`` returns the first condition that failed: the route switched off
(``linearkit.runtime.disabled``; ``LINEARKIT_FAST=0`` turns every kernel off), a model with
hooks or not a plain ``Sequential``, ``detect_anomaly``, a precision policy, ``tracemalloc``
tracing, another loss or optimizer (or a subclass), more than one parameter group, a group
that is not exactly the chain's trainable parameters, Adam's first step (it packs the flat
state), gradients neither all None nor all the flat buffer's own views; and ``run`` gives up
on a target outside ``[0, C)`` or equal to ``ignore_index`` (the parts raise or ignore it).

What a step pays for in Python: the optimizer keeps a ``_StepPlan`` made by ``prepare`` under
one structure token (linearkit/core/structure.py: replaced when any module changes a child, a
Parameter, a hook or any attribute, and when a route is switched). While the token, the model
and the loss are the ones it was made for, a step checks only what can change without the
token changing (``_StepPlan.check``: the switches and global modes, the input and targets,
each Parameter's array and flags, Adam's group, flat state and per-parameter state, the
gradients), then calls the kernel's compiled entry point with the plan's arrays (per batch
size, made once: backend/fast/step_layout.py). Any check that fails sends the step through
``prepare`` again, which plans anew or names the reason.
"""

from __future__ import annotations

from _tracemalloc import is_tracing  # the C half of tracemalloc: no import cost

import numpy as np

from ..backend import fast
from ..backend import threads as _threads
from ..backend.fast import adam_hyper as _hyper
from ..backend.fast import blas as _blas
from ..backend.fast import chain_flags as K
from ..backend.fast import step_layout as _layout
from ..core import structure as _structure
from ..layers.container import Sequential, trains
from ..losses import FUSED_CE_MAX, CrossEntropyLoss
from ..optim.adam import STATE_KEYS, STATE_KEYS_AMSGRAD, Adam, AdamW
from . import compiled_chain as _compiled
from . import switches as _switches
from . import thin_path as _thin

__all__ = ["prepare", "run"]

_OPTIMIZERS = (Adam, AdamW)
_REDUCTIONS = ("mean", "sum")
_INTP = np.dtype(np.intp)

OFF = "switched off (linearkit.runtime.disabled)"
NOT_ADAM = "the optimizer is not Adam or AdamW"
GROUPS = "the optimizer has more than one parameter group"
TARGETS = ("the loss has a class weight, label smoothing or reduction='none', or the targets "
           "are not class indices of shape (B,)")
TOO_MANY = "the batch's logits are too many for the fused loss kernel"
FLAT = "Adam's flat state is not packed yet (its first step packs it) or holds other arrays"
STEPS = "the parameters are at different steps"
GRADS = "the gradients are neither all None nor all the flat buffer's own views"
# a check that finds the plan out of date (prepare makes a new one)
STALE = "the kept plan is out of date"


class _StepPlan:
    """Everything the step kernel takes besides ``x`` and the targets, for one chain plan, one
    loss, one flat Adam state and one structure token (kept on the optimizer)."""

    __slots__ = ("adam", "adam_flags", "adam_scalars", "amsgrad", "bias_grads", "by_rows",
                 "chain", "classes", "decoupled", "dispatcher", "dtype", "entry", "exp_avg",
                 "exp_avg_sq", "flat", "grads", "group", "hyper", "loss", "mask", "members",
                 "model", "modes", "pairs", "params", "rows", "slots", "step", "token", "vmax",
                 "weight_grads", "width", "written")

    def __deepcopy__(self, memo):
        # a copy's arrays would be arrays of their own, no longer the parameters' (its
        # FlatState is not found either: Optimizer._flat is keyed by the group's id), so a
        # copied optimizer plans again
        return None

    def check(self, optimizer, x, y) -> str | None:
        """None when this step runs as planned (``self.step`` and ``self.mask`` then hold its
        Adam step count and which gradients are added into), else why not (``STALE`` when the
        plan no longer fits: a Parameter's array or flags, the group or the flat state
        changed)."""
        if not _switches.on["compiled_step"]:
            return OFF
        if type(optimizer) not in _OPTIMIZERS:
            return NOT_ADAM
        groups = optimizer.param_groups
        if len(groups) != 1:
            return GROUPS
        group = self.group
        if (groups[0] is not group or group["params"] != self.params
                or bool(group["amsgrad"]) is not self.amsgrad
                or optimizer.flat_state(group) is not self.flat):
            return STALE
        why = _thin.blocker()
        if why is not None:
            return why
        if not fast.enabled():
            return _compiled.NO_KERNELS
        if not (type(x) is np.ndarray and x.ndim == 2 and _compiled.plain_array(x)):
            return STALE
        rows, width = x.shape
        if rows < 2 or width != self.width or x.dtype != self.dtype:
            return STALE
        if is_tracing():
            return _compiled.TRACING
        if not (type(y) is np.ndarray and y.dtype.kind in "iu" and y.shape == (rows,)):
            return TARGETS
        if rows * self.classes > FUSED_CE_MAX:      # the loss's NumPy path: other roundings
            return TOO_MANY
        for p, data, requires_grad in self.members:
            if p.data is not data or p.requires_grad is not requires_grad \
                    or not data.flags.writeable:
                return STALE
        state = optimizer.state
        step = mask = nones = 0
        first = True
        for p, exp_avg, exp_avg_sq, vmax, view, bit in self.rows:
            entry = state.get(p)
            if entry is None or entry.get("exp_avg") is not exp_avg \
                    or entry.get("exp_avg_sq") is not exp_avg_sq \
                    or (vmax is not None and entry.get("max_exp_avg_sq") is not vmax):
                return FLAT
            if first:
                step, first = entry.get("step"), False
            elif entry.get("step") != step:
                return STEPS
            grad = p.grad
            if grad is None:
                nones += 1
            elif grad is not view:
                return GRADS
            elif p._zeroed is not grad:
                mask |= bit                  # not zeroed since the last step: add into it
        if nones and nones != len(self.rows):
            return GRADS
        self.step, self.mask = step, mask
        return None

    def run(self, optimizer, x, y, set_to_none: bool) -> float | None:
        """The step ``check`` allowed: the loss, or None (nothing changed) when the kernel
        hands it back (a target out of range or ignored) or numba cannot compile it."""
        kernels = fast.kernels()
        if kernels is None:
            return None
        rows = x.shape[0]
        targets = y
        if y.dtype != _INTP or not _compiled.plain_array(y):
            targets = np.array(y, _INTP)     # one compiled version: contiguous, writeable intp
        arrays = self.by_rows.get(rows)
        if arrays is None:
            arrays = self._arrays_for(rows)
        t = self.step + 1
        bc2_sqrt, neg_step_size = self._hyper(optimizer.param_groups[0], t, not set_to_none)
        if self.mask != self.written:
            self._set_modes()
        loss = self.loss
        ignore = loss.ignore_index                 # only a class index in [0, C) can match
        ignore = int(ignore) if 0 <= ignore < self.classes else -1
        mean = loss.reduction == "mean"
        macs = rows * self.chain.macs_per_row
        if macs >= _threads.switch_macs:
            _threads.before_gemm(macs)
        chain = self.chain
        fn = kernels.train_step
        call = self.entry if fn is self.dispatcher else fn
        layout, work, sums = arrays
        args = (x, targets, chain.weights, chain.biases, self.weight_grads, self.bias_grads,
                layout, work, sums, self.grads, self.exp_avg, self.exp_avg_sq, self.vmax,
                self.modes, self.adam_flags, self.adam_scalars, ignore,
                1.0 / rows if mean else 1.0, bc2_sqrt, neg_step_size)
        try:
            total = call(*args)
        except Exception as err:    # numba could not type these arrays: the parts, for good
            if not type(err).__module__.startswith("numba"):
                raise
            object.__setattr__(optimizer, "_compiled_step", False)
            return None
        if call is not self.entry:
            self._find_entry(fn, args)
        if total < 0:           # a target out of range or ignored: the parts raise or ignore it
            return None
        state = optimizer.state
        if set_to_none:
            for p, _ in self.pairs:
                state[p]["step"] = t
                p.grad = None
                p._zeroed = None             # as grad_buffer() left it, before zero_grad()
        else:
            for p, view in self.pairs:
                state[p]["step"] = t
                p.grad = view                # already its view, or None before this step
                p._zeroed = view             # mark_zeroed(): the kernel zeroed it after reading
        return float(self.dtype.type(total / rows if mean else total))

    def _hyper(self, group, t, zero_grads: bool) -> tuple[float, float]:
        """Adam's flags and scalars for this step: refilled when a hyperparameter changed; the
        two corrections for step ``t``."""
        # values, not the objects (a list of betas or an array may be changed in place)
        key = (float(group["lr"]), tuple(group["betas"]), float(group["eps"]),
               float(group["weight_decay"]), bool(group["maximize"]), zero_grads)
        if key != self.hyper[0]:
            lr, (beta1, beta2) = key[0], key[1]
            _hyper.fill(self.adam_flags, self.adam_scalars, lr=lr, beta1=beta1, beta2=beta2,
                        eps=key[2], weight_decay=key[3], maximize=key[4],
                        decoupled_weight_decay=self.decoupled, amsgrad=self.amsgrad,
                        zero_grads=zero_grads)
            self.hyper = (key, lr, float(beta1), float(beta2))
        _, lr, beta1, beta2 = self.hyper
        return _hyper.corrections(lr, beta1, beta2, t)

    def _set_modes(self) -> None:
        """``grad_modes`` for ``self.mask``: 2 (add into) for its bits, 1 (overwrite) else."""
        modes, mask = self.modes, self.mask
        for i, (layer, column) in enumerate(self.slots):
            modes[layer, column] = 2 if mask >> i & 1 else 1
        self.written = mask

    def _arrays_for(self, rows: int) -> tuple:
        chain = self.chain
        arrays = _layout.arrays(chain.weights, chain.flags_for(rows), chain.ws_per_row, rows,
                                self.dtype, self.adam)
        if len(self.by_rows) >= 4:           # batch sizes seen: a few (the last is smaller)
            self.by_rows.clear()
        self.by_rows[rows] = arrays
        return arrays

    def _find_entry(self, dispatcher, args) -> None:
        """After a call through the numba dispatcher: its compiled entry point for these
        argument types, called directly by the next steps (the plan's arrays keep their types,
        and ``check`` holds ``x`` and the targets to one type each); None where numba has no
        such attribute, or the arguments' types are not found (the dispatcher then stays)."""
        try:
            sig = tuple(dispatcher.typeof_pyval(a) for a in args)
            self.entry = dispatcher.overloads[sig].entry_point
            self.dispatcher = dispatcher
        except (AttributeError, KeyError, TypeError, ValueError):
            self.entry = self.dispatcher = None


def run(model, loss_fn, optimizer, x, y, set_to_none: bool) -> float | None:
    """``loop.step(model, loss_fn, optimizer, x, y, set_to_none=...)`` in one compiled call:
    the loss (a float), every state as the step's parts leave it; or None, nothing touched,
    when the step is not one the kernel runs (``prepare`` says why)."""
    kept = getattr(optimizer, "__dict__", {}).get("_compiled_step")   # None: prepare says why
    if (kept.__class__ is not _StepPlan or kept.token is not _structure.token
            or kept.model is not model or kept.loss is not loss_fn
            or kept.check(optimizer, x, y) is not None):
        kept = prepare(model, loss_fn, optimizer, x, y)
        if kept.__class__ is str:
            return None
    return kept.run(optimizer, x, y, set_to_none)


def prepare(model, loss_fn, optimizer, x, y):
    """The plan ``run`` takes for this step (kept on the optimizer), or why the step runs as
    its parts (a str, the first condition that failed; ``linearkit.runtime.explain`` shows
    it)."""
    token = _structure.token
    if not _switches.on["compiled_step"]:
        return OFF
    if type(model) is not Sequential:
        return "the model is not a Sequential"
    if model.has_hooks() or loss_fn.has_hooks():
        return "a call hook is registered on the model or the loss"
    if type(loss_fn) is not CrossEntropyLoss:
        return "the loss is not CrossEntropyLoss"
    if type(optimizer) not in _OPTIMIZERS:
        return NOT_ADAM
    if len(optimizer.param_groups) != 1:
        return GROUPS
    why = _thin.blocker()
    if why is not None:
        return why
    kept = getattr(optimizer, "__dict__", {}).get("_compiled_step")   # None: prepare says why
    if kept is False:
        return "numba could not compile the step for these arrays"
    chain = _compiled.plan_for(model.steps(), x, False, trains, model)
    if chain.__class__ is not _compiled.Plan:
        return "the model is not one compiled chain: " + _compiled.describe(chain)
    rows = x.shape[0]
    if not (loss_fn.weight is None and not loss_fn.label_smoothing
            and loss_fn.reduction in _REDUCTIONS and type(y) is np.ndarray
            and y.dtype.kind in "iu" and y.shape == (rows,)):
        return TARGETS
    classes = chain.weights[-1].shape[0]
    if rows * classes > FUSED_CE_MAX:
        return TOO_MANY
    group = optimizer.param_groups[0]
    params = group["params"]
    keys = STATE_KEYS_AMSGRAD if group["amsgrad"] else STATE_KEYS
    flat = optimizer.flat_state(group)
    if (flat is None or not flat.adopted or flat.mixed or flat.buffers["grad"].dtype != x.dtype
            or not flat.owns(params, optimizer.state, keys)):
        return FLAT
    if fast.kernels() is None:
        return _compiled.NO_KERNELS
    if _blas.functions(x.dtype) is None:
        return _compiled.NO_BLAS
    if (kept.__class__ is not _StepPlan or kept.chain is not chain or kept.flat is not flat
            or kept.group is not group or kept.params != params
            or kept.amsgrad is not bool(group["amsgrad"])):
        kept = _step_plan(chain, flat, group, optimizer.decoupled_weight_decay)
        if kept is None:
            return "the optimizer's group is not exactly the chain's trainable parameters"
        object.__setattr__(optimizer, "_compiled_step", kept)
    why = kept.check(optimizer, x, y)
    if why is not None:
        return why
    kept.token, kept.model, kept.loss = token, model, loss_fn
    return kept


def _step_plan(chain, flat, group, decoupled: bool) -> _StepPlan | None:
    """The step plan for ``chain`` and ``flat``, or None unless the group is exactly the
    chain's trainable parameters (each of them once)."""
    params = list(group["params"])
    index = {id(p): i for i, p in enumerate(params)}
    if len(index) != len(params):
        return None
    weight_grads, bias_grads = [], []
    slots = [None] * len(params)
    adam = np.full((len(chain.units), 2), -1, np.int64)
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
            adam[layer, column] = flat.slices[i].start
    if None in slots:                       # a parameter the chain does not train
        return None
    amsgrad = bool(group["amsgrad"])
    views = flat.views
    plan = _StepPlan()
    plan.token = plan.model = plan.loss = None      # set by prepare once the step is checked
    plan.chain, plan.flat, plan.group, plan.params = chain, flat, group, params
    plan.amsgrad, plan.decoupled = amsgrad, bool(decoupled)
    plan.dtype = chain.weights[0].dtype
    plan.width = chain.weights[0].shape[1]
    plan.classes = chain.weights[-1].shape[0]
    plan.weight_grads, plan.bias_grads = tuple(weight_grads), tuple(bias_grads)
    plan.adam = adam
    plan.members = tuple((p, p.data, p.requires_grad) for linear, _ in chain.units
                         for p in linear._parameters.values() if p is not None)
    plan.rows = tuple(
        (p, views["exp_avg"][i], views["exp_avg_sq"][i],
         views["max_exp_avg_sq"][i] if amsgrad else None, flat.grad_views[i], 1 << i)
        for i, p in enumerate(params))
    plan.pairs = tuple(zip(params, flat.grad_views))
    plan.slots = tuple(slots)
    plan.modes = np.zeros((len(chain.units), 2), np.int64)   # 0 where nothing is computed
    for layer, column in slots:
        plan.modes[layer, column] = 1
    plan.mask = plan.written = plan.step = 0
    arrays = flat.arrays
    plan.grads = flat.buffers["grad"]
    plan.exp_avg, plan.exp_avg_sq = arrays["exp_avg"], arrays["exp_avg_sq"]
    plan.vmax = arrays["max_exp_avg_sq"] if amsgrad else plan.grads   # unread without AMSGrad
    plan.adam_flags = np.zeros(5, np.bool_)
    plan.adam_scalars = np.zeros(7, plan.dtype)
    plan.hyper = (None, 0.0, 0.0, 0.0)
    plan.by_rows = {}
    plan.entry = plan.dispatcher = None
    return plan
