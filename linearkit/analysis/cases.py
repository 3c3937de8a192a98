"""The case table of every shipped module: what the conformance tests and ``linearkit gradcheck``
both run over (one table, so a new layer is covered by both with one entry).

A ``ModuleCase`` builds a linearkit module for a dtype and a random generator, and names its
PyTorch reference as a function of a namespace (``ref(nn)``, with ``nn`` = ``torch.nn`` plus a
``Residual``, which torch lacks), so this file never imports torch. A ``LossCase`` builds a
loss, a prediction shape and a target.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .. import layers as L
from .. import losses
from .case_modules import HeadsDict, LoopList

__all__ = ["LOSS_CASES", "MODULE_CASES", "LossCase", "ModuleCase", "build", "inputs"]


@dataclass(frozen=True)
class ModuleCase:
    """One module configuration.

    ``make(dtype, rng) -> Module``; ``ref(nn) -> torch.nn.Module`` with the same structure;
    ``shape`` a batched input shape; ``train`` the mode both run in; ``unbatched``: ``x[0]``
    (one sample, batch dim dropped) is a valid input too; ``user_module``: the top module is a
    user's module holding a container without forward (``analysis.case_modules``), which has
    no ``LayerRule`` (model files keep its weights without the architecture);
    ``extra_shapes``: the shapes of the inputs after the first, for a module that takes several
    (``Bilinear``: ``((5, 4),)``; its backward returns a tuple of input gradients).
    """

    id: str
    make: Callable
    ref: Callable
    shape: tuple
    train: bool = True
    unbatched: bool = True
    user_module: bool = False
    extra_shapes: tuple = ()

    @property
    def shapes(self) -> tuple:
        """The shape of every input, the first one's (``shape``) first."""
        return (self.shape, *self.extra_shapes)


@dataclass(frozen=True)
class LossCase:
    """``make() -> loss module``; ``ref(nn)``; ``shape`` of the prediction; ``target(rng)``;
    ``pred(rng)``, where the loss takes predictions in a range (BCELoss: probabilities), else
    standard-normal ones."""

    id: str
    make: Callable
    ref: Callable
    shape: tuple
    target: Callable
    pred: Callable | None = None


def _lin(i, o, bias=True):
    return lambda dt, rng: L.Linear(i, o, bias, dtype=dt, rng=rng)


def _lora(dt, rng):
    """A LoRALinear with its base unfrozen, so the conformance tests see every gradient (the
    frozen base is tested in tests/test_transforms_lora.py)."""
    layer = L.LoRALinear(L.Linear(4, 3, dtype=dt, rng=rng), rank=2, alpha=4, rng=rng)
    layer.base_layer.requires_grad_(True)
    return layer


def _sparse(dt, rng):
    """A SparseLinear holding half of a Linear(4, 3)'s weights (6 of 12, 1 or 3 per row)."""
    dense = L.Linear(4, 3, dtype=dt, rng=rng)
    keep = np.array([[1, 0, 1, 0], [0, 1, 0, 0], [1, 1, 1, 0]], bool)
    return L.SparseLinear.from_linear(dense, mask=keep)


def _plain(cls, *args, **kwargs):
    """A module without parameters or dtype (activations, Flatten, Identity, Dropout)."""
    return lambda dt, rng: cls(*args, **kwargs)


MODULE_CASES = [
    ModuleCase("Linear", _lin(4, 3), lambda nn: nn.Linear(4, 3), (5, 4)),
    ModuleCase("Linear-nobias", _lin(4, 3, False), lambda nn: nn.Linear(4, 3, bias=False), (5, 4)),
    ModuleCase("Linear-3d", _lin(4, 3), lambda nn: nn.Linear(4, 3), (2, 3, 4)),
    ModuleCase("LazyLinear", lambda dt, rng: L.LazyLinear(3, dtype=dt, rng=rng),
               lambda nn: nn.LazyLinear(3), (5, 4)),
    ModuleCase("LoRALinear", _lora, lambda nn: nn.LoRALinear(4, 3, 2, 4), (5, 4)),
    ModuleCase("Identity", _plain(L.Identity), lambda nn: nn.Identity(), (5, 4)),
    ModuleCase("ReLU", _plain(L.ReLU), lambda nn: nn.ReLU(), (5, 4)),
    ModuleCase("LeakyReLU", _plain(L.LeakyReLU), lambda nn: nn.LeakyReLU(), (5, 4)),
    ModuleCase("LeakyReLU-0.2", _plain(L.LeakyReLU, 0.2), lambda nn: nn.LeakyReLU(0.2), (5, 4)),
    ModuleCase("GELU", _plain(L.GELU), lambda nn: nn.GELU(), (5, 4)),
    ModuleCase("GELU-tanh", _plain(L.GELU, "tanh"), lambda nn: nn.GELU("tanh"), (5, 4)),
    ModuleCase("Tanh", _plain(L.Tanh), lambda nn: nn.Tanh(), (5, 4)),
    ModuleCase("Sigmoid", _plain(L.Sigmoid), lambda nn: nn.Sigmoid(), (5, 4)),
    ModuleCase("SiLU", _plain(L.SiLU), lambda nn: nn.SiLU(), (5, 4)),
    ModuleCase("Softmax", _plain(L.Softmax, dim=-1), lambda nn: nn.Softmax(dim=-1), (5, 4)),
    ModuleCase("Softmax-dim1", _plain(L.Softmax, dim=1), lambda nn: nn.Softmax(dim=1),
               (2, 3, 4), unbatched=False),
    ModuleCase("LogSoftmax", _plain(L.LogSoftmax, dim=-1), lambda nn: nn.LogSoftmax(dim=-1),
               (5, 4)),
    ModuleCase("Dropout-p0-train", _plain(L.Dropout, 0.0), lambda nn: nn.Dropout(0.0), (5, 4)),
    ModuleCase("Dropout-eval", _plain(L.Dropout, 0.5), lambda nn: nn.Dropout(0.5), (5, 4),
               train=False),
    ModuleCase("LayerNorm", lambda dt, rng: L.LayerNorm(4, dtype=dt),
               lambda nn: nn.LayerNorm(4), (5, 4)),
    ModuleCase("LayerNorm-2d-noaffine",
               lambda dt, rng: L.LayerNorm((3, 4), eps=1e-3, elementwise_affine=False, dtype=dt),
               lambda nn: nn.LayerNorm((3, 4), eps=1e-3, elementwise_affine=False), (2, 3, 4)),
    ModuleCase("RMSNorm", lambda dt, rng: L.RMSNorm(4, dtype=dt),
               lambda nn: nn.RMSNorm(4), (5, 4)),
    ModuleCase("RMSNorm-2d-noaffine",
               lambda dt, rng: L.RMSNorm((3, 4), eps=1e-3, elementwise_affine=False, dtype=dt),
               lambda nn: nn.RMSNorm((3, 4), eps=1e-3, elementwise_affine=False), (2, 3, 4)),
    ModuleCase("Bilinear", lambda dt, rng: L.Bilinear(3, 4, 2, dtype=dt, rng=rng),
               lambda nn: nn.Bilinear(3, 4, 2), (5, 3), extra_shapes=((5, 4),)),
    ModuleCase("Bilinear-nobias-3d",
               lambda dt, rng: L.Bilinear(3, 2, 4, bias=False, dtype=dt, rng=rng),
               lambda nn: nn.Bilinear(3, 2, 4, bias=False), (2, 3, 3), extra_shapes=((2, 3, 2),)),
    ModuleCase("BatchNorm1d-NC-train", lambda dt, rng: L.BatchNorm1d(4, dtype=dt),
               lambda nn: nn.BatchNorm1d(4), (6, 4), unbatched=False),
    ModuleCase("BatchNorm1d-NC-eval", lambda dt, rng: L.BatchNorm1d(4, dtype=dt),
               lambda nn: nn.BatchNorm1d(4), (6, 4), train=False, unbatched=False),
    ModuleCase("BatchNorm1d-NCL-train",
               lambda dt, rng: L.BatchNorm1d(3, momentum=None, dtype=dt),
               lambda nn: nn.BatchNorm1d(3, momentum=None), (4, 3, 5), unbatched=False),
    ModuleCase("BatchNorm1d-NCL-eval", lambda dt, rng: L.BatchNorm1d(3, dtype=dt),
               lambda nn: nn.BatchNorm1d(3), (4, 3, 5), train=False, unbatched=False),
    ModuleCase("Flatten", _plain(L.Flatten), lambda nn: nn.Flatten(), (2, 3, 4), unbatched=False),
    ModuleCase("Sequential",
               lambda dt, rng: L.Sequential(L.Linear(4, 8, dtype=dt, rng=rng), L.ReLU(),
                                            L.Linear(8, 3, dtype=dt, rng=rng)),
               lambda nn: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)), (5, 4)),
    ModuleCase("Sequential-flatten",
               lambda dt, rng: L.Sequential(L.Flatten(), L.Linear(6, 3, dtype=dt, rng=rng),
                                            L.Tanh()),
               lambda nn: nn.Sequential(nn.Flatten(), nn.Linear(6, 3), nn.Tanh()), (4, 2, 3),
               unbatched=False),
    ModuleCase("Residual", lambda dt, rng: L.Residual(L.Linear(4, 4, dtype=dt, rng=rng)),
               lambda nn: nn.Residual(nn.Linear(4, 4)), (5, 4)),
    ModuleCase("Residual-block",
               lambda dt, rng: L.Residual(L.Sequential(
                   L.LayerNorm(4, dtype=dt), L.Linear(4, 6, dtype=dt, rng=rng), L.GELU(),
                   L.Dropout(0.0), L.Linear(6, 4, dtype=dt, rng=rng))),
               lambda nn: nn.Residual(nn.Sequential(nn.LayerNorm(4), nn.Linear(4, 6), nn.GELU(),
                                                    nn.Dropout(0.0), nn.Linear(6, 4))), (5, 4)),
    # ModuleList and ModuleDict have no forward (as in torch): a user's module calls them.
    ModuleCase("ModuleList-loop", lambda dt, rng: LoopList(dtype=dt, rng=rng),
               lambda nn: nn.LoopList(), (5, 4), user_module=True),
    ModuleCase("ModuleDict-heads", lambda dt, rng: HeadsDict(dtype=dt, rng=rng),
               lambda nn: nn.HeadsDict(), (5, 4), user_module=True),
]


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a blocked or broken install
        return False


if _installed("scipy"):  # SparseLinear's kernels (the sparse extra)
    MODULE_CASES.append(ModuleCase("SparseLinear", _sparse,
                                   lambda nn: nn.SparseLinear(4, 3, 6), (5, 4)))


def _labels(classes, shape):
    return lambda rng: rng.integers(0, classes, shape)


def _reals(shape):
    return lambda rng: rng.standard_normal(shape)


def _probabilities(shape):
    return lambda rng: rng.uniform(0.0, 1.0, shape)


LOSS_CASES = [
    LossCase("MSELoss", lambda: losses.MSELoss(), lambda nn: nn.MSELoss(), (5, 3), _reals((5, 3))),
    LossCase("MSELoss-sum", lambda: losses.MSELoss(reduction="sum"),
             lambda nn: nn.MSELoss(reduction="sum"), (5, 3), _reals((5, 3))),
    LossCase("L1Loss", lambda: losses.L1Loss(), lambda nn: nn.L1Loss(), (5, 3), _reals((5, 3))),
    LossCase("CrossEntropyLoss", lambda: losses.CrossEntropyLoss(),
             lambda nn: nn.CrossEntropyLoss(), (6, 4), _labels(4, (6,))),
    LossCase("CrossEntropyLoss-smoothing", lambda: losses.CrossEntropyLoss(label_smoothing=0.1),
             lambda nn: nn.CrossEntropyLoss(label_smoothing=0.1), (6, 4), _labels(4, (6,))),
    LossCase("BCEWithLogitsLoss", lambda: losses.BCEWithLogitsLoss(),
             lambda nn: nn.BCEWithLogitsLoss(), (5, 3), _probabilities((5, 3))),
    LossCase("NLLLoss", lambda: losses.NLLLoss(), lambda nn: nn.NLLLoss(), (6, 4),
             _labels(4, (6,))),
    LossCase("BCELoss", lambda: losses.BCELoss(), lambda nn: nn.BCELoss(), (5, 3),
             _probabilities((5, 3)), pred=lambda rng: rng.uniform(0.05, 0.95, (5, 3))),
    LossCase("SmoothL1Loss", lambda: losses.SmoothL1Loss(beta=0.5),
             lambda nn: nn.SmoothL1Loss(beta=0.5), (5, 3), _reals((5, 3))),
    LossCase("HuberLoss", lambda: losses.HuberLoss(delta=0.5),
             lambda nn: nn.HuberLoss(delta=0.5), (5, 3), _reals((5, 3))),
    LossCase("KLDivLoss", lambda: losses.KLDivLoss(reduction="batchmean"),
             lambda nn: nn.KLDivLoss(reduction="batchmean"), (5, 3), _probabilities((5, 3))),
]


def inputs(case: ModuleCase, dtype=np.float64, seed: int = 0) -> tuple:
    """The case's inputs, one standard-normal array per shape in ``case.shapes``."""
    draw = np.random.default_rng(seed)
    return tuple(draw.standard_normal(shape).astype(dtype) for shape in case.shapes)


def build(case: ModuleCase, dtype=np.float64, seed: int = 0):
    """``(module, x)`` — ``(module, x1, x2, ...)`` for a case of several inputs: the case's
    module in its mode, materialized by one call, with random parameters and float buffers (so
    a default ones/zeros init cannot hide a bug)."""
    rng = np.random.default_rng(seed)
    module = case.make(np.dtype(dtype), rng).train(case.train)
    xs = inputs(case, dtype, seed)
    module(*xs)
    for p in module.parameters():
        p.data[...] = rng.uniform(-1.0, 1.0, p.shape)
    for _, b in module.named_buffers():
        if b.dtype.kind == "f":
            b[...] = rng.uniform(0.5, 1.5, b.shape)
    return (module, *xs)
