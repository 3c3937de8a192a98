"""SGD with PyTorch's exact update: momentum, dampening, Nesterov, weight decay, maximize."""

from __future__ import annotations

import numpy as np

from .flat import fused_sgd
from .optimizer import Optimizer, StateKeys
from .state_names import BUILTIN

__all__ = ["SGD"]


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

    Only ``momentum != 0`` keeps state (``'momentum_buffer'``, shaped like the parameter),
    and a 16-bit parameter its float32 ``'master_param'`` (the buffer is float32 too).
    """

    _state_names = BUILTIN["SGD"]

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

    def _state_keys(self, group: dict) -> StateKeys:
        # None (what old PyTorch versions saved) means "no buffer yet", as PyTorch reads it
        return {"momentum_buffer": ("array-or-none", group["momentum"] != 0)}

    def _state_context(self, group: dict) -> str:
        return f"momentum={group['momentum']}"

    def _update(self, group: dict) -> None:
        lr, momentum = float(group["lr"]), float(group["momentum"])
        dampening, weight_decay = float(group["dampening"]), float(group["weight_decay"])
        nesterov, maximize = group["nesterov"], group["maximize"]
        for p, grad in self._trainable(group):
            if momentum != 0 and fused_sgd(self, p, grad, group):  # linearkit.backend.fast: one pass
                continue
            low = p.data.itemsize == 2  # 16-bit: step the float32 master, round into p.data
            if low:
                data = self._master(p, self.state.setdefault(p, {}))
                grad = grad if grad.dtype == data.dtype else grad.astype(data.dtype)
            else:
                data = p.data
            g = -grad if maximize else grad
            if weight_decay != 0:
                g = g + weight_decay * data
            if momentum != 0:
                state = self.state.setdefault(p, {})
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = state["momentum_buffer"] = np.array(g, dtype=data.dtype)
                else:
                    buf *= momentum
                    buf += (1.0 - dampening) * g
                g = g + momentum * buf if nesterov else buf
            data -= lr * g
            if low:
                self._write_back(p, data)
