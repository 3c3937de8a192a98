"""Shared by the tests/test_optim*.py files: one training run for linearkit and for PyTorch.

Four parameters of different shapes in two groups with different learning rates; gradients
depend on the parameter (so differences feed back) and on the step; the last parameter has no
gradient every third step (skipped, as in PyTorch).
"""

from __future__ import annotations

import numpy as np

import linearkit as lk

SHAPES = [(3, 4), (4,), (2, 2), (5,)]
STEPS = 20
GROUPS = ({"lr": 0.05}, {"lr": 0.01})


def grad_fn(data: np.ndarray, step: int, index: int) -> np.ndarray:
    """A gradient that depends on the parameter (so errors feed back) and on the step."""
    rng = np.random.default_rng(1000 * step + index)
    return np.sin(3.0 * data) + 0.5 * data + rng.standard_normal(data.shape)


def initial(dtype=np.float64) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal(shape).astype(dtype) for shape in SHAPES]


def groups(params, group_options):
    """Two groups with different lr (and whatever else the case overrides)."""
    first, second = group_options
    return [{"params": params[:2], **first}, {"params": params[2:], **second}]


def run_ours(cls, kwargs, group_options=GROUPS, steps=STEPS, dtype=np.float64):
    params = [lk.Parameter(a) for a in initial(dtype)]
    opt = cls(groups(params, group_options), **kwargs)
    for step in range(steps):
        for i, p in enumerate(params):
            # the last parameter has no gradient on every third step: it is skipped then
            p.grad = None if (i == 3 and step % 3 == 1) else grad_fn(p.data, step, i).astype(dtype)
        opt.step()
    return params, opt


def run_torch(cls, kwargs, group_options=GROUPS, steps=STEPS, dtype=np.float64):
    import torch

    params = [torch.nn.Parameter(torch.from_numpy(a)) for a in initial(dtype)]
    opt = cls(groups(params, group_options), **kwargs)
    for step in range(steps):
        for i, p in enumerate(params):
            if i == 3 and step % 3 == 1:
                p.grad = None
            else:
                p.grad = torch.from_numpy(grad_fn(p.detach().numpy(), step, i).astype(dtype))
        opt.step()
    return params, opt
