"""The flat fast path: a parameter group's state in one contiguous array per key.

When every parameter of a group (two or more, one compute dtype) steps together, an optimizer can run
its elementwise update once over the whole group instead of once per parameter: a handful of
ufunc calls instead of a handful per parameter. ``FlatState`` packs the state (``state[p][key]``
become views into it, so per-parameter access and ``state_dict()`` see the same values) and
adopts the gradients (after the first step each ``p.grad`` is a view of one flat buffer, so the
next backward writes straight into it and ``zero_grad(set_to_none=False)`` is one ``fill``).
The math stays the optimizer's: elementwise operations in the same order on the packed arrays
give the same bits as on each parameter alone (tests/test_optim_flat.py checks it).

Mixed precision: float16/bfloat16 parameters compute in float32, so they share a float32 group
with float32 parameters (their states and gradients are float32; the optimizer steps their
float32 masters and rounds into ``p.data``). A 16-bit parameter whose gradient is kept in its
storage dtype (``precision.policy(grads="storage")``) makes the group step per parameter.
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np

from ..backend import fast

__all__ = ["FlatState", "flat_state", "fused_adam", "fused_sgd"]


class FlatState:
    """One parameter group's per-parameter state arrays packed into single contiguous arrays.

    Parameters
    ----------
    params : list of Parameter
        The group, in order; ``N`` is the total number of their elements.
    state : dict
        The optimizer's state; ``state[p]`` must exist for every ``p``. Its arrays for ``keys``
        are copied in (a fresh entry, ``{'step': 0}``, starts at zero), then rebound to views.
    keys : tuple of str
        The state keys to pack (e.g. ``('exp_avg', 'exp_avg_sq')``).
    dtype : numpy dtype
        The parameters' (common) compute dtype: float32 for 16-bit parameters.

    Attributes
    ----------
    arrays : dict of str to ndarray, each of shape (N,)
        The packed state; ``state[p][key]`` is ``arrays[key][slices[i]].reshape(p.shape)``.
    buffers : dict
        ``'grad'`` (N,): the adopted gradients; ``'data'`` (N,): scratch for gathering ``p.data``,
        made by the first ``gather(..., into='data')`` (only Adam's L2 weight decay gathers the
        data), so a group that never needs it holds no such array (the ledger counts none).
    mixed : bool
        Whether some parameter is stored in 16 bits (its step goes through its master copy).
    """

    def __init__(self, params: list, state: dict, keys: tuple, dtype: np.dtype):
        self.params = list(params)
        self.mixed = any(p.data.itemsize == 2 for p in self.params)
        self.shapes = [p.data.shape for p in params]
        bounds = np.cumsum([0] + [p.data.size for p in params]).tolist()
        self.slices = [slice(a, b) for a, b in pairwise(bounds)]
        total = bounds[-1]
        self.arrays = {key: np.zeros(total, dtype) for key in keys}
        self.buffers = {"grad": np.empty(total, dtype)}
        self.views = {key: self.split(array) for key, array in self.arrays.items()}
        self.grad_views = self.split(self.buffers["grad"])
        self.adopted = False    # whether adopt_grads ran once (Adam's first step)
        for i, p in enumerate(self.params):
            entry = state[p]
            for key in keys:
                if key in entry:
                    self.views[key][i][...] = entry[key]
                entry[key] = self.views[key][i]

    def split(self, flat: np.ndarray) -> list:
        """Per-parameter views of a flat array of shape (N,), shaped like the parameters."""
        return [flat[s].reshape(shape) for s, shape in zip(self.slices, self.shapes)]

    def owns(self, params: list, state: dict, keys: tuple) -> bool:
        """True while the group and every ``state[p][key]`` are still this object's views."""
        if params != self.params or len(keys) != len(self.arrays):
            return False
        views = self.views
        for key in keys:                  # plain loops: this runs at every step
            mine = views.get(key)
            if mine is None:
                return False
            for p, view in zip(params, mine):
                entry = state.get(p)
                if entry is None or entry.get(key) is not view:
                    return False
        return True

    def gather(self, arrays: list, into: str = "grad") -> np.ndarray:
        """Copy ``arrays`` (one per parameter) into a flat buffer of shape (N,) and return it."""
        out = self.buffers.get(into)
        if out is None:
            grad = self.buffers["grad"]
            out = self.buffers[into] = np.empty(grad.shape, grad.dtype)
        return np.concatenate([a.reshape(-1) for a in arrays], out=out)

    def owns_grads(self, params: list) -> bool:
        """True when every ``p.grad`` is this object's view of its flat gradient buffer."""
        return all(p.grad is view for p, view in zip(params, self.grad_views))

    def adopt_grads(self, params: list) -> np.ndarray:
        """The group's gradients as one flat array (N,); afterwards each ``p.grad`` is a view.

        Gradients already there (written in place after ``zero_grad(set_to_none=False)``) cost
        nothing; new ones are copied in once and rebound (same values, new home).
        """
        flat = self.buffers["grad"]
        self.adopted = True
        if not self.owns_grads(params):
            self.gather([p.grad for p in params])
            for p, view in zip(params, self.grad_views):
                p.grad = view  # not zeroed: the next add_grad adds into it
        return flat


def fused_adam(flat: FlatState, params: list, keys: tuple, step: int, hyper: dict,
               zero_grads: bool = False) -> bool:
    """Step the group with the compiled one-pass kernel (``linearkit.backend.fast``) when it can.

    Returns False, having touched nothing, for a mixed-precision group, a dtype other than
    float32/float64, a ``p.data`` not C-contiguous or reshaped since the packing, numba absent
    or ``LINEARKIT_FAST=0``: the caller then runs the NumPy path. The kernel gives the NumPy
    path's bits (tests/test_fast.py).
    Call it after the step counts are set. The kernel reads each ``p.grad`` where it is (the
    flat buffer's views after ``zero_grad(set_to_none=False)``, fresh arrays after the default
    ``set_to_none=True``): no gradient is copied. ``zero_grads`` (only when every ``p.grad`` is
    the flat buffer's view: ``flat.owns_grads``): the kernel also zeroes each ``p.grad`` in place
    after reading it, and marks it zeroed (``zero_grad(set_to_none=False)``).
    """
    dtype = flat.buffers["grad"].dtype
    if flat.mixed or not fast.supports(dtype):
        return False
    grads = [p.grad for p in params]
    # the flat buffer's own views (made right here); zero_grads says the caller checked it
    own_grads = zero_grads or all(g is view for g, view in zip(grads, flat.grad_views))
    for p, grad, shape in zip(params, grads, flat.shapes):  # the kernel has no bounds checks
        d = p.data
        if not (d.flags.c_contiguous and d.dtype == dtype and d.shape == shape):
            return False
        if not (own_grads or grad.flags.c_contiguous and grad.dtype == dtype
                and grad.shape == shape):
            return False
    kernels = fast.kernels()    # None under LINEARKIT_FAST=0; numba is imported on first use
    if kernels is None:
        return False
    views = flat.views
    vmax = views[keys[2]] if len(keys) == 3 else None
    kernels.adam_flat(params, grads, views[keys[0]], views[keys[1]], vmax, step=step,
                      **hyper, scratch=flat.__dict__.setdefault("_scratch", {}),
                      zero_grads=zero_grads)
    if zero_grads:
        for p in params:
            p.mark_zeroed()
    return True


def fused_sgd(opt, p, grad: np.ndarray, group: dict) -> bool:
    """SGD's momentum step for one parameter through the compiled kernel, when it can.

    Returns False, having touched nothing, unless ``p`` has a momentum buffer already (the
    first step copies the gradient, in NumPy), ``p.data``, ``grad`` and the buffer share one
    shape and dtype (float32/float64: never a 16-bit parameter) and are C-contiguous, numba
    imports and ``LINEARKIT_FAST`` is not 0. Same bits as the NumPy path (tests/test_fast.py).
    """
    data = p.data
    dtype = data.dtype
    if not fast.supports(dtype) or not fast.enabled():
        return False
    entry = opt.state.get(p)
    buf = entry.get("momentum_buffer") if entry is not None else None
    if buf is None or "master_param" in entry:
        return False
    for a in (data, grad, buf):
        if not (a.dtype == dtype and a.shape == data.shape and a.flags.c_contiguous):
            return False
    if buf is grad or buf is data or grad is data:
        return False
    kernels = fast.kernels()
    if kernels is None:
        return False
    kernels.sgd_momentum(data, grad, buf, lr=float(group["lr"]),
                         momentum=float(group["momentum"]),
                         dampening=float(group["dampening"]),
                         weight_decay=float(group["weight_decay"]), nesterov=group["nesterov"],
                         maximize=group["maximize"],
                         scratch=opt.__dict__.setdefault("_fast_scratch", {}))
    return True


def flat_state(opt, group: dict, live: list, keys: tuple) -> FlatState | None:
    """``group``'s state as a FlatState (cached on ``opt``), when every parameter steps together.

    Eligible when all of the group's parameters (two or more, one compute dtype, each gradient
    in it) have a gradient this step (``live``: ``(p, grad)`` pairs) and share one step count; otherwise None and the
    optimizer steps each parameter on its own. A cached FlatState is reused while it still owns
    the state; anything that replaced the state (``load_state_dict``, new ``keys`` after a
    hyperparameter changed) is noticed and the arrays are packed anew. A parameter whose state
    exists but lacks one of ``keys`` (or its step) raises, as the per-parameter path does:
    it is never zero-filled.
    """
    params = group["params"]
    if len(live) != len(params) or len(params) < 2:
        return None
    dtype = params[0].data.dtype
    if dtype.itemsize == 2:
        dtype = np.dtype(np.float32)  # 16-bit storage computes (and keeps its states) in float32
    for p, g in live:
        if g.dtype != dtype or (p.data.dtype != dtype and p.data.itemsize != 2):
            return None
    state = opt.state
    cache = opt._flat.get(id(group))
    if cache is not None and cache.owns(params, state, keys):
        first = state[params[0]].get("step")      # owned: every state entry exists
        for p in params:
            if state[p].get("step") != first:
                return None
        return cache
    steps = {state[p].get("step") if p in state else 0 for p in params}
    if len(steps) != 1:
        return None
    for p in params:
        entry = state.get(p)
        if entry is not None and (missing := [k for k in ("step", *keys) if k not in entry]):
            raise opt._incomplete_state(p, missing)
    for p in params:
        state.setdefault(p, {"step": 0})
    cache = opt._flat[id(group)] = FlatState(params, state, keys, dtype)
    return cache
