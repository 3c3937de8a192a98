"""Optimizers with PyTorch's exact update rules: SGD, Adam, AdamW; gradient clipping.

An optimizer holds ``param_groups`` (a list of dicts: ``'params'`` plus that group's
hyperparameters) and ``state`` (per-Parameter dicts, created on a parameter's first step).
``step()`` updates ``p.data`` in place, in its own dtype (float32 stays float32: every scalar
in the update is a Python float). A parameter whose ``grad`` is None, or whose
``requires_grad`` is False, is skipped and gets no state.

``state_dict()`` has PyTorch's layout — ``{'state': {index: {...}}, 'param_groups':
[{..., 'params': [index, ...]}]}``, parameters numbered in group order — and holds deep copies,
so saving, loading into a fresh optimizer and continuing reproduces the run bit for bit.
Adam's ``'step'`` is kept as a Python int (PyTorch keeps a float tensor; both load).

Examples
--------
>>> import numpy as np, linearkit as lk
>>> p = lk.Parameter(np.ones(2, np.float32))
>>> opt = lk.optim.SGD([p], lr=0.1, momentum=0.9)
>>> p.grad = np.array([1.0, -2.0], np.float32)
>>> opt.step(); p.data
array([0.9, 1.2], dtype=float32)
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable

import numpy as np

from .module import Parameter

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "clip_grad_norm_", "clip_grad_value_"]


class Optimizer:
    """Base class: parameter groups, per-parameter state, zero_grad, state_dict.

    Parameters
    ----------
    params : iterable of Parameter, or of dicts ``{'params': [...], **hyperparameters}``
        Groups override ``defaults`` for their parameters (e.g. a smaller ``lr`` for a backbone).
    defaults : dict
        Hyperparameters used by every group that does not set them.

    Subclasses implement ``_validate(group)`` (raise ValueError for a bad hyperparameter) and
    ``_update(group)`` (one step for the group's parameters).
    """

    def __init__(self, params, defaults: dict):
        self.defaults = dict(defaults)
        self._validate(self.defaults)
        self.state: dict[Parameter, dict] = {}
        self.param_groups: list[dict] = []
        self._flat: dict[int, _FlatState] = {}
        if isinstance(params, Parameter):
            raise TypeError("params must be an iterable of Parameters (e.g. model.parameters() "
                            "or [p]), got a single Parameter")
        if isinstance(params, (set, frozenset)):
            raise TypeError("optimizer parameters must be an ordered collection (a list), not a "
                            "set: the order of a set changes between runs")
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list; did the model build its "
                             "parameters yet? (a LazyLinear has none before its first call)")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    # ------------------------------------------------------------------ groups
    def add_param_group(self, param_group: dict) -> None:
        """Add a group (``{'params': [...], **overrides}``); missing options take the defaults."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, got {type(param_group).__name__}")
        if "params" not in param_group:
            raise ValueError("param_group needs a 'params' entry (a list of Parameters)")
        params = param_group["params"]
        if isinstance(params, Parameter):
            params = [params]
        elif isinstance(params, (set, frozenset)):
            raise TypeError("a param group's 'params' must be an ordered collection (a list), "
                            "not a set")
        params = list(params)
        for p in params:
            if not isinstance(p, Parameter):
                hint = (" wrap arrays: Parameter(array)" if isinstance(p, np.ndarray)
                        else " pass model.parameters()")
                raise TypeError(f"an optimizer can only optimize Parameters, got "
                                f"{type(p).__name__};{hint}")
        ids = [id(p) for p in params]
        if len(set(ids)) != len(ids):
            raise ValueError("a parameter group holds the same Parameter twice; it would be "
                             "updated twice per step")
        taken = {id(p) for g in self.param_groups for p in g["params"]}
        if taken.intersection(ids):
            raise ValueError("some parameters appear in more than one parameter group")
        group = {key: value for key, value in param_group.items() if key != "params"}
        for key, value in self.defaults.items():
            group.setdefault(key, value)
        self._validate(group)
        group = {"params": params, **group}
        self.param_groups.append(group)

    def _validate(self, group: dict) -> None:
        pass

    # ------------------------------------------------------------------ stepping
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset every parameter's ``.grad``: to None (default), or fill it with zeros in place.

        In place (``set_to_none=False``), the next backward overwrites the zeroed buffers
        instead of allocating new ones; a group whose gradients live in one flat buffer (see
        ``_flat_state``) is zeroed with a single call.
        """
        for group in self.param_groups:
            flat = self._flat.get(id(group))
            if not set_to_none and flat is not None and flat.owns_grads(group["params"]):
                flat.buffers["grad"].fill(0)
                for p in group["params"]:
                    p.mark_zeroed()
                continue
            for p in group["params"]:
                p.zero_grad(set_to_none)

    def step(self, closure: Callable[[], object] | None = None):
        """One update of every parameter that has a gradient; returns ``closure()`` if given."""
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            self._update(group)
        return loss

    def _update(self, group: dict) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _flat_state(self, group: dict, live: list, keys: tuple) -> _FlatState | None:
        """The group's state as contiguous arrays, when every parameter steps together.

        Eligible when all of the group's parameters (two or more, one dtype) have a gradient
        this step and share one step count. ``state[p][key]`` then are views into the flat
        arrays, so ``state_dict()`` and per-parameter access see the same values; anything that
        replaces them (``load_state_dict``) is noticed and the flat arrays are rebuilt.
        """
        params = group["params"]
        if len(live) != len(params) or len(params) < 2:
            return None
        dtype = params[0].data.dtype
        if any(p.data.dtype != dtype or g.dtype != dtype for p, g in live):
            return None
        steps = {self.state[p].get("step") if p in self.state else 0 for p in params}
        if len(steps) != 1:
            return None
        cache = self._flat.get(id(group))
        if cache is not None and cache.owns(params, self.state, keys):
            return cache
        for p in params:
            self.state.setdefault(p, {"step": 0})
        cache = self._flat[id(group)] = _FlatState(params, self.state, keys, dtype)
        return cache

    @staticmethod
    def _trainable(group: dict):
        """``(p, grad)`` for each parameter of ``group`` that takes a step."""
        for p in group["params"]:
            grad = p.grad
            if grad is None or not p.requires_grad:
                continue
            if grad.shape != p.data.shape:
                raise ValueError(f"a gradient of shape {grad.shape} does not match its "
                                 f"parameter's shape {p.data.shape}")
            yield p, grad

    # ------------------------------------------------------------------ state dict
    def _indexed(self) -> dict[int, int]:
        index: dict[int, int] = {}
        for group in self.param_groups:
            for p in group["params"]:
                index.setdefault(id(p), len(index))
        return index

    def state_dict(self) -> dict:
        """``{'state': {i: {...}}, 'param_groups': [{..., 'params': [i, ...]}]}`` (deep copies)."""
        index = self._indexed()
        groups = []
        for group in self.param_groups:
            packed = {k: copy.deepcopy(v) for k, v in group.items() if k != "params"}
            packed["params"] = [index[id(p)] for p in group["params"]]
            groups.append(packed)
        state = {index[id(p)]: copy.deepcopy(s) for p, s in self.state.items() if id(p) in index}
        return {"state": dict(sorted(state.items())), "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore hyperparameters and state saved by ``state_dict()`` (this or PyTorch's layout).

        The groups must match in number and size. Arrays are copied and cast to each
        parameter's dtype; a shape mismatch raises ValueError naming the entry.
        """
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"loaded state dict has {len(saved_groups)} parameter group(s), "
                             f"this optimizer has {len(self.param_groups)}")
        for i, (group, saved) in enumerate(zip(self.param_groups, saved_groups)):
            if len(group["params"]) != len(saved["params"]):
                raise ValueError(f"loaded state dict's parameter group {i} has "
                                 f"{len(saved['params'])} parameters, this optimizer's has "
                                 f"{len(group['params'])}")
        by_index = {}
        for group, saved in zip(self.param_groups, saved_groups):
            by_index.update(zip(saved["params"], group["params"]))
        state: dict[Parameter, dict] = {}
        for key, entries in state_dict["state"].items():
            p = by_index.get(int(key))
            if p is None:
                raise ValueError(f"loaded state dict has state for parameter {key}, which no "
                                 "parameter group lists")
            state[p] = {name: self._load_value(p, key, name, value)
                        for name, value in entries.items()}
        for group, saved in zip(self.param_groups, saved_groups):
            for name, value in saved.items():
                if name != "params":
                    group[name] = copy.deepcopy(value)
        self.state = state

    @staticmethod
    def _load_value(p: Parameter, key, name: str, value):
        if name == "step":
            return round(float(np.asarray(value)))
        if value is None or isinstance(value, (bool, int, float)):
            return value
        array = np.array(value, dtype=p.data.dtype)             # a copy, in p's dtype
        if array.shape != p.data.shape:
            raise ValueError(f"state '{name}' of parameter {key} has shape {array.shape}, but the "
                             f"parameter has shape {p.data.shape}")
        return array

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            for key in sorted(group):
                if key != "params":
                    lines.append(f"    {key}: {group[key]}")
        lines.append(")")
        return "\n".join(lines)


class _FlatState:
    """One parameter group's per-parameter state arrays packed into single contiguous arrays.

    ``arrays[key]`` has one element per parameter element of the group (in group order);
    ``state[p][key]`` is rebound to the matching view, shaped like ``p``.
    """

    def __init__(self, params: list, state: dict, keys: tuple, dtype: np.dtype):
        self.params = list(params)
        self.shapes = [p.data.shape for p in params]
        bounds = np.cumsum([0] + [p.data.size for p in params]).tolist()
        self.slices = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
        total = bounds[-1]
        self.arrays = {key: np.zeros(total, dtype) for key in keys}
        self.buffers = {"grad": np.empty(total, dtype), "data": np.empty(total, dtype)}
        self.views = {key: self.split(array) for key, array in self.arrays.items()}
        self.grad_views = self.split(self.buffers["grad"])
        for i, p in enumerate(self.params):
            entry = state[p]
            for key in keys:
                if key in entry:
                    self.views[key][i][...] = entry[key]
                entry[key] = self.views[key][i]

    def split(self, flat: np.ndarray) -> list:
        """Per-parameter views of a flat array, shaped like the parameters."""
        return [flat[s].reshape(shape) for s, shape in zip(self.slices, self.shapes)]

    def owns(self, params: list, state: dict, keys: tuple) -> bool:
        """True while the group and every ``state[p][key]`` are still this object's views."""
        if params != self.params or set(keys) != set(self.arrays):
            return False
        for i, p in enumerate(params):
            entry = state.get(p)
            if entry is None or any(entry.get(k) is not self.views[k][i] for k in keys):
                return False
        return True

    def gather(self, arrays: list, into: str = "grad") -> np.ndarray:
        """Copy ``arrays`` (one per parameter) into a flat buffer and return it."""
        return np.concatenate([a.reshape(-1) for a in arrays], out=self.buffers[into])

    def owns_grads(self, params: list) -> bool:
        """True when every ``p.grad`` is this object's view of its flat gradient buffer."""
        return all(p.grad is view for p, view in zip(params, self.grad_views))

    def adopt_grads(self, params: list) -> np.ndarray:
        """The group's gradients as one flat array; afterwards each ``p.grad`` is a view of it.

        Gradients already there (written in place after ``zero_grad(set_to_none=False)``) cost
        nothing; new ones are copied in once and rebound (same values, new home).
        """
        flat = self.buffers["grad"]
        if not self.owns_grads(params):
            self.gather([p.grad for p in params])
            for p, view in zip(params, self.grad_views):
                p.grad = view  # not zeroed: the next add_grad adds into it
        return flat


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum, dampening, Nesterov, weight decay.

    Per step, as in PyTorch (``g`` the gradient, negated when ``maximize``)::

        g = g + weight_decay * p                     (if weight_decay)
        buf = g  (first step)  |  buf = momentum * buf + (1 - dampening) * g
        g = g + momentum * buf  (nesterov)  |  g = buf          (if momentum)
        p = p - lr * g

    Only ``momentum != 0`` keeps state (``'momentum_buffer'``).
    """

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0, dampening: float = 0,
                 weight_decay: float = 0, nesterov: bool = False, *, maximize: bool = False):
        defaults = {"lr": lr, "momentum": momentum, "dampening": dampening,
                    "weight_decay": weight_decay, "nesterov": nesterov, "maximize": maximize}
        super().__init__(params, defaults)

    def _validate(self, group: dict) -> None:
        _check(group["lr"] >= 0.0, f"Invalid learning rate: {group['lr']} (must be >= 0)")
        _check(group["momentum"] >= 0.0, f"Invalid momentum value: {group['momentum']} "
                                         "(must be >= 0)")
        _check(group["weight_decay"] >= 0.0, f"Invalid weight_decay value: "
                                             f"{group['weight_decay']} (must be >= 0)")
        _check(not group["nesterov"] or (group["momentum"] > 0 and group["dampening"] == 0),
               "Nesterov momentum requires a momentum > 0 and zero dampening")

    def _update(self, group: dict) -> None:
        lr, momentum = float(group["lr"]), float(group["momentum"])
        dampening, weight_decay = float(group["dampening"]), float(group["weight_decay"])
        nesterov, maximize = group["nesterov"], group["maximize"]
        for p, grad in self._trainable(group):
            g = -grad if maximize else grad
            if weight_decay != 0:
                g = g + weight_decay * p.data
            if momentum != 0:
                state = self.state.setdefault(p, {})
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = state["momentum_buffer"] = np.array(g, dtype=p.data.dtype)
                else:
                    buf *= momentum
                    buf += (1.0 - dampening) * g
                g = g + momentum * buf if nesterov else buf
            p.data -= lr * g


class Adam(Optimizer):
    """Adam (Kingma & Ba), with PyTorch's order of operations, bias correction and eps.

    Per step ``t`` (``g`` the gradient, negated when ``maximize``)::

        g = g + weight_decay * p                 (Adam's L2 penalty; AdamW decays p instead)
        m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g * g
        v_hat = max(v_hat, v)                    (amsgrad; v_hat replaces v below)
        denom = sqrt(v) / sqrt(1 - beta2^t) + eps
        p = p - lr / (1 - beta1^t) * m / denom

    eps is added *after* the bias correction of ``sqrt(v)``, as in PyTorch.
    State per parameter: ``step``, ``exp_avg``, ``exp_avg_sq`` (and ``max_exp_avg_sq``).
    """

    _decoupled = False

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0, amsgrad: bool = False, *,
                 maximize: bool = False):
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                    "amsgrad": amsgrad, "maximize": maximize}
        super().__init__(params, defaults)

    def _validate(self, group: dict) -> None:
        _check(group["lr"] >= 0.0, f"Invalid learning rate: {group['lr']} (must be >= 0)")
        _check(group["eps"] >= 0.0, f"Invalid epsilon value: {group['eps']} (must be >= 0)")
        betas = group["betas"]
        _check(len(betas) == 2, f"betas must be a pair (beta1, beta2), got {betas!r}")
        for i, beta in enumerate(betas):
            _check(0.0 <= beta < 1.0, f"Invalid beta parameter at index {i}: {beta} "
                                      "(must be in [0, 1))")
        _check(group["weight_decay"] >= 0.0, f"Invalid weight_decay value: "
                                             f"{group['weight_decay']} (must be >= 0)")

    def _update(self, group: dict) -> None:
        lr, weight_decay = float(group["lr"]), float(group["weight_decay"])
        keys = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if group["amsgrad"] \
            else ("exp_avg", "exp_avg_sq")
        live = list(self._trainable(group))
        flat = self._flat_state(group, live, keys)
        if flat is not None:
            # Fast path: the whole group in a handful of ufunc calls over contiguous arrays.
            # Elementwise math in the same order gives the same bits as the loop below.
            params = [p for p, _ in live]
            t = self.state[params[0]]["step"] + 1
            for p in params:
                self.state[p]["step"] = t
            g = flat.adopt_grads(params)
            data = None
            if weight_decay != 0:
                if self._decoupled:
                    for p in params:
                        p.data *= 1.0 - lr * weight_decay
                else:
                    data = flat.gather([p.data for p in params], into="data")
            update = self._direction(group, g, data, *(flat.arrays[k] for k in keys), t=t)
            for p, u in zip(params, flat.split(update)):
                p.data += u
            return
        for p, grad in live:
            data = p.data
            state = self.state.get(p)
            if state is None:
                state = self.state[p] = {"step": 0}
                for key in keys:
                    state[key] = np.zeros_like(data)
            state["step"] += 1
            if weight_decay != 0 and self._decoupled:
                data *= 1.0 - lr * weight_decay
            data += self._direction(group, grad, data, *(state[k] for k in keys), t=state["step"])

    def _direction(self, group: dict, g, data, m, v, v_max=None, t: int = 1) -> np.ndarray:
        """Update the moments ``m``, ``v`` (and ``v_max``) in place; return the step for ``p``.

        ``data`` is the parameter (read for Adam's L2 penalty only); ``g`` is never written.
        """
        lr, eps, weight_decay = float(group["lr"]), float(group["eps"]), float(group["weight_decay"])
        beta1, beta2 = (float(b) for b in group["betas"])
        if group["maximize"]:
            g = -g
        if weight_decay != 0 and not self._decoupled:
            g = g + weight_decay * data
        _lerp_(m, g, 1.0 - beta1)
        v *= beta2
        v += (1.0 - beta2) * g * g
        step_size = lr / (1.0 - beta1 ** t)
        bias_correction2_sqrt = (1.0 - beta2 ** t) ** 0.5
        if v_max is not None:
            v = np.maximum(v_max, v, out=v_max)
        denom = np.sqrt(v)
        denom /= bias_correction2_sqrt
        denom += eps
        update = m * -step_size
        update /= denom
        return update


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter), as PyTorch's AdamW.

    Identical to Adam except that ``weight_decay`` (default 1e-2) shrinks the parameter,
    ``p = p * (1 - lr * weight_decay)``, before the moment updates, instead of adding
    ``weight_decay * p`` to the gradient.
    """

    _decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 maximize: bool = False):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize)


def _lerp_(start: np.ndarray, end: np.ndarray, weight: float) -> None:
    """``start += weight * (end - start)`` in place, with PyTorch's formula for each weight."""
    diff = end - start
    if weight < 0.5:
        diff *= weight
        start += diff
    else:
        diff *= weight - 1.0                  # end - (end - start) * (1 - weight)
        np.add(end, diff, out=start)


# ----------------------------------------------------------------------------- clipping
def _params(parameters) -> list[Parameter]:
    if isinstance(parameters, Parameter):
        return [parameters]
    return list(parameters)


def _norm(x: np.ndarray, norm_type: float):
    """The vector ``norm_type``-norm of ``x`` flattened (0 for an empty array), dtype kept."""
    if x.size == 0:
        return 0.0
    return np.linalg.norm(x.reshape(-1), norm_type)


def clip_grad_norm_(parameters: Parameter | Iterable[Parameter], max_norm: float,
                    norm_type: float = 2.0, error_if_nonfinite: bool = False) -> np.ndarray:
    """Scale gradients in place so that their joint norm is at most ``max_norm``.

    The total norm is that of all gradients concatenated into one vector (``norm_type`` may be
    ``inf``). Every gradient is multiplied by ``min(max_norm / (total + 1e-6), 1)``, as in
    PyTorch. Parameters without a gradient are ignored.

    Returns the total norm (before clipping) as a 0-d ndarray in the gradients' dtype.
    Raises RuntimeError if it is NaN/Inf and ``error_if_nonfinite`` is True.
    """
    grads = [p.grad for p in _params(parameters) if p.grad is not None]
    norm_type = float(norm_type)
    if not grads:
        return np.asarray(0.0, dtype=np.float32)
    dtype = np.result_type(*grads)
    norms = np.array([_norm(g, norm_type) for g in grads], dtype=dtype)
    total = np.asarray(_norm(norms, norm_type), dtype=dtype)
    if error_if_nonfinite and not np.isfinite(total):
        raise RuntimeError(
            f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, "
            "so it cannot be clipped. To disable this error and scale the gradients by the "
            "non-finite norm anyway, set `error_if_nonfinite=False`")
    coef = float(max_norm) / (float(total) + 1e-6)
    if not coef < 1.0 and not math.isnan(coef):
        return total
    with np.errstate(invalid="ignore"):                         # inf * 0, as PyTorch: NaN
        for g in grads:
            g *= np.asarray(coef, dtype=g.dtype)
    return total


def clip_grad_value_(parameters: Parameter | Iterable[Parameter], clip_value: float) -> None:
    """Clamp every gradient in place to ``[-clip_value, clip_value]``."""
    clip_value = float(clip_value)
    for p in _params(parameters):
        if p.grad is not None:
            np.clip(p.grad, -clip_value, clip_value, out=p.grad)
