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
``load_state_dict`` checks everything before it assigns anything: a missing key, another
optimizer's state, a wrong shape or other group sizes raise ValueError naming the parameter,
its group and the key, and leave the optimizer as it was.

The files: ``optimizer.py`` (the base: groups, state, zero_grad, state dicts), ``loading.py``
(what ``load_state_dict`` checks), ``sgd.py``, ``adam.py`` (Adam, AdamW and ``adam_step``, the
update as a function on arrays), ``flat.py`` (a group's state in one contiguous buffer, for a
one-pass update), ``clip.py`` (``clip_grad_norm_``, ``clip_grad_value_``), ``lr_scheduler.py``
(learning-rate schedulers with PyTorch's semantics, e.g. ``lr_scheduler.OneCycleLR``).

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

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .adam import Adam, AdamW
    from .clip import clip_grad_norm_, clip_grad_value_
    from .optimizer import Optimizer
    from .sgd import SGD

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "clip_grad_norm_", "clip_grad_value_"]

# Each name's file, loaded on first use: `import linearkit` pays for none of them (seven small
# files cost about a millisecond to import), `linearkit.optim.Adam` for what Adam needs.
_HOME = {"SGD": "sgd", "Adam": "adam", "AdamW": "adam", "Optimizer": "optimizer",
         "clip_grad_norm_": "clip", "clip_grad_value_": "clip"}
_FILES = ("adam", "clip", "flat", "loading", "lr_scheduler", "optimizer", "sgd")


def __getattr__(name: str):
    if name in _HOME:
        value = getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
    elif name in _FILES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module 'linearkit.optim' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_FILES})
