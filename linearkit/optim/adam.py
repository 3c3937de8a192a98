"""Adam and AdamW with PyTorch's exact update, as functions on arrays and as optimizers.

``adam_step`` is the reference: one parameter's update, in place, in PyTorch's order of
operations (its single-tensor implementation). ``Adam`` steps each parameter through it, or a
whole group at once through ``adam_direction`` on the flat arrays of ``flat.py``; both give the
same bits (tests/test_optim_adam.py checks the flat path against ``adam_step``).
"""

from __future__ import annotations

import numpy as np

from .. import precision
from .flat import FlatState, flat_state, fused_adam
from .optimizer import Optimizer, StateKeys
from .state_names import ADAM_KEYS, ADAM_KEYS_AMSGRAD, BUILTIN

__all__ = ["Adam", "AdamW", "adam_direction", "adam_step"]

STATE_KEYS = ADAM_KEYS
STATE_KEYS_AMSGRAD = ADAM_KEYS_AMSGRAD
_NEEDS = {keys: frozenset({"step", *keys}) for keys in (STATE_KEYS, STATE_KEYS_AMSGRAD)}


def adam_direction(grad: np.ndarray, param: np.ndarray | None, exp_avg: np.ndarray,
                   exp_avg_sq: np.ndarray, max_exp_avg_sq: np.ndarray | None = None, *,
                   step: int, lr: float, beta1: float, beta2: float, eps: float,
                   weight_decay: float = 0.0, maximize: bool = False,
                   decoupled_weight_decay: bool = False) -> np.ndarray:
    """Update the moments in place and return the step to add to the parameter.

    Parameters
    ----------
    grad : ndarray, shape (*)
        The gradient; never written.
    param : ndarray of shape (*), or None
        Read only for Adam's L2 penalty (``weight_decay != 0`` and not decoupled).
    exp_avg, exp_avg_sq : ndarray, shape (*)
        The first and second moments, updated in place.
    max_exp_avg_sq : ndarray of shape (*), or None
        AMSGrad's running maximum of ``exp_avg_sq``, updated in place; None without AMSGrad.
    step : int
        This step's number ``t``, counting from 1.
    lr, beta1, beta2, eps, weight_decay, maximize, decoupled_weight_decay
        As in ``Adam``; scalars are used as Python floats, so float32 arrays stay float32.

    Returns
    -------
    ndarray, shape (*)
        A new array: ``-lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)``.
    """
    lr, eps, weight_decay = float(lr), float(eps), float(weight_decay)
    beta1, beta2 = float(beta1), float(beta2)
    g = -grad if maximize else grad
    if weight_decay != 0 and not decoupled_weight_decay:
        g = g + weight_decay * param
    _lerp_(exp_avg, g, 1.0 - beta1)
    v = exp_avg_sq
    v *= beta2
    v += (1.0 - beta2) * g * g
    step_size = lr / (1.0 - beta1 ** step)
    bias_correction2_sqrt = (1.0 - beta2 ** step) ** 0.5
    if max_exp_avg_sq is not None:
        v = np.maximum(max_exp_avg_sq, v, out=max_exp_avg_sq)
    denom = np.sqrt(v)
    denom /= bias_correction2_sqrt
    denom += eps
    update = exp_avg * -step_size
    update /= denom
    return update


def adam_step(param: np.ndarray, grad: np.ndarray, exp_avg: np.ndarray, exp_avg_sq: np.ndarray,
              max_exp_avg_sq: np.ndarray | None = None, *, step: int, lr: float, beta1: float,
              beta2: float, eps: float, weight_decay: float = 0.0, maximize: bool = False,
              decoupled_weight_decay: bool = False) -> None:
    """One Adam (AdamW when ``decoupled_weight_decay``) step, in place, as PyTorch computes it.

    ``param``, ``exp_avg``, ``exp_avg_sq`` (and ``max_exp_avg_sq``, given for AMSGrad) are
    updated in place; all arrays share one shape ``(*)``; ``grad`` is never written. AdamW first
    shrinks ``param *= 1 - lr * weight_decay``; then ``param += adam_direction(...)``.

    Examples
    --------
    >>> import numpy as np
    >>> p, g = np.array([1.0, -1.0]), np.array([0.5, 0.5])
    >>> m, v = np.zeros(2), np.zeros(2)
    >>> adam_step(p, g, m, v, step=1, lr=0.1, beta1=0.9, beta2=0.999, eps=1e-8)
    >>> p                      # the first step moves every element by about lr
    array([ 0.9, -1.1])
    """
    if weight_decay != 0 and decoupled_weight_decay:
        param *= 1.0 - float(lr) * float(weight_decay)
    param += adam_direction(grad, param, exp_avg, exp_avg_sq, max_exp_avg_sq, step=step, lr=lr,
                            beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
                            maximize=maximize, decoupled_weight_decay=decoupled_weight_decay)


def _lerp_(start: np.ndarray, end: np.ndarray, weight: float) -> None:
    """``start += weight * (end - start)`` in place, with PyTorch's formula for each weight."""
    diff = end - start
    if weight < 0.5:
        diff *= weight
        start += diff
    else:
        diff *= weight - 1.0                  # end - (end - start) * (1 - weight)
        np.add(end, diff, out=start)


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


class Adam(Optimizer):
    """Adam (Kingma & Ba), with PyTorch's order of operations, bias correction and eps.

    Per step ``t`` (``g`` the gradient, negated when ``maximize``)::

        g = g + weight_decay * p                 (Adam's L2 penalty; AdamW decays p instead)
        m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g * g
        v_hat = max(v_hat, v)                    (amsgrad; v_hat replaces v below)
        denom = sqrt(v) / sqrt(1 - beta2^t) + eps
        p = p - lr / (1 - beta1^t) * m / denom

    eps is added *after* the bias correction of ``sqrt(v)``, as in PyTorch (``adam_step`` is
    this update on arrays). State per parameter: ``step``, ``exp_avg``, ``exp_avg_sq`` (and
    ``max_exp_avg_sq``), each array shaped like the parameter. A group whose parameters all
    step together is updated in one pass over flat arrays (``flat.py``), with the same bits.
    A 16-bit parameter is stepped through its float32 ``'master_param'`` with float32 states,
    and ``p.data`` receives the result rounded (``Optimizer``); a group may mix dtypes.
    """

    _decoupled = False
    _zeroes_while_stepping = True
    _state_names = BUILTIN["Adam"]

    @property
    def decoupled_weight_decay(self) -> bool:
        """True for AdamW (weight decay applied to the weights), False for Adam (to the grads)."""
        return self._decoupled

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

    def _state_keys(self, group: dict) -> StateKeys:
        return {"step": ("step", True), "exp_avg": ("array", True),
                "exp_avg_sq": ("array", True),
                "max_exp_avg_sq": ("array", bool(group["amsgrad"]))}

    def _state_context(self, group: dict) -> str:
        return f"amsgrad={bool(group['amsgrad'])}"

    def _check_loaded_group(self, index: int, saved: dict) -> list[str]:
        # PyTorch 2.13 saves the rule in every Adam/AdamW group; ours is fixed by the class
        flag = saved.get("decoupled_weight_decay")
        if flag is None or bool(flag) == self._decoupled:
            return []
        rule, fits = ("decoupled weight decay", "AdamW") if flag else ("an L2 penalty", "Adam")
        return [(f"loaded parameter group {index} has decoupled_weight_decay={bool(flag)} "
                 f"({rule}), but this optimizer is {type(self).__name__}; load it into {fits}")]

    def _update(self, group: dict, zero_grads: bool = False) -> bool:
        beta1, beta2 = group["betas"]
        hyper = {"lr": float(group["lr"]), "beta1": float(beta1), "beta2": float(beta2),
                 "eps": float(group["eps"]), "weight_decay": float(group["weight_decay"]),
                 "maximize": group["maximize"], "decoupled_weight_decay": self._decoupled}
        keys = STATE_KEYS_AMSGRAD if group["amsgrad"] else STATE_KEYS
        live = [*self._trainable(group)]  # not list(): its lists refill the freelist slowly
        flat = flat_state(self, group, live, keys)
        if flat is not None:
            return self._update_flat(flat, [p for p, _ in live], keys, hyper, zero_grads)
        needs = _NEEDS[keys]
        for p, _ in live:                   # check every state before the first update
            state = self.state.get(p)
            if state is not None and not state.keys() >= needs:
                raise self._incomplete_state(p, [k for k in ("step", *keys) if k not in state])
        for p, grad in live:
            state = self.state.get(p)
            if state is None:
                state = self.state[p] = {"step": 0}
                for key in keys:  # float32 for a 16-bit parameter
                    state[key] = np.zeros(p.data.shape, precision.compute_dtype(p.data.dtype))
            state["step"] += 1
            if p.data.itemsize == 2:  # 16-bit: step the float32 master, round into p.data
                master = self._master(p, state)
                grad = grad if grad.dtype == master.dtype else grad.astype(master.dtype)
                adam_step(master, grad, *(state[k] for k in keys), step=state["step"], **hyper)
                self._write_back(p, master)
                continue
            adam_step(p.data, grad, *(state[k] for k in keys), step=state["step"], **hyper)
        return False

    def _update_flat(self, flat: FlatState, params: list, keys: tuple, hyper: dict,
                     zero_grads: bool = False) -> bool:
        """The whole group in a handful of ufunc calls over contiguous arrays.

        Elementwise math in the same order as ``adam_step`` on each parameter, so the same bits.
        With ``zero_grads``, the compiled step also zeroes the gradients when they are the flat
        buffer's own views (distinct memory by construction); returns whether it did.
        """
        t = self.state[params[0]]["step"] + 1
        for p in params:
            self.state[p]["step"] = t
        # The first step moves the gradients into the flat buffer (so zero_grad(set_to_none=
        # False) is one fill and the next backwards write there). After that the compiled step
        # (linearkit.backend.fast) reads each p.grad where it is: gradients a backward made fresh after
        # the default zero_grad(set_to_none=True) are not copied in first.
        if not flat.adopted:
            flat.adopt_grads(params)
        zero = zero_grads and flat.owns_grads(params)
        if fused_adam(flat, params, keys, t, hyper, zero):
            return zero
        g = flat.adopt_grads(params)
        # what each step is applied to: p.data, or a 16-bit parameter's float32 master
        targets = [self._master(p, self.state[p]) if p.data.itemsize == 2 else p.data
                   for p in params] if flat.mixed else [p.data for p in params]
        data = None
        lr, weight_decay = hyper["lr"], hyper["weight_decay"]
        if weight_decay != 0:
            if self._decoupled:
                for target in targets:
                    target *= 1.0 - lr * weight_decay
            else:
                data = flat.gather(targets, into="data")
        update = adam_direction(g, data, *(flat.arrays[k] for k in keys), step=t, **hyper)
        for target, u in zip(targets, flat.split(update)):
            target += u
        if flat.mixed:
            for p, target in zip(params, targets):
                if target is not p.data:
                    self._write_back(p, target)
        return False


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
