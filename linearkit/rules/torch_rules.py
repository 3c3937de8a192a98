"""The PyTorch twin of each shipped layer: the ``torch`` part of its rule.

``linearkit.io.from_torch`` / ``to_torch`` convert through these twins, and the ledger's PyTorch
path costs a torch module with the rule of the layer whose twin it is. The constructor
arguments are read the same way on both sides (linearkit's layers use PyTorch's argument and
attribute names), so one ``args(m, dtype)`` serves both directions. Decisions:

* ``ModuleList`` and ``ModuleDict`` are ``nn.ModuleList`` and ``nn.ModuleDict``, both ways, with
  the same child names (so the same state-dict keys). Neither has a forward on either side: a
  custom module calls their children, so the conversion keeps what they hold, not a computation
  (the ledger does not cost them either: a container row, as any torch module with children and
  no twin).
* ``Residual``'s twin is ``TorchResidual`` (``linearkit.io.torch``, built on first use): the
  ledger does not cost it as a Residual (it is a container row there, as any torch module with
  children and no twin).
* A materialized ``LazyLinear`` converts to ``nn.Linear``; the ledger describes an
  unmaterialized ``nn.LazyLinear`` as 'LazyLinear(?, out)'.
* The ledger matches Linear, LazyLinear, Bilinear, LayerNorm, RMSNorm, BatchNorm1d, Dropout,
  Flatten, Identity and Sequential twins by subclass (``isinstance``), the activations by exact
  class.

Every path is a string: torch is imported by the tools that already need it, never here.
"""

from __future__ import annotations

from ..layers import (
    GELU,
    BatchNorm1d,
    Bilinear,
    Dropout,
    Flatten,
    Identity,
    LayerNorm,
    LazyLinear,
    LeakyReLU,
    Linear,
    LogSoftmax,
    ModuleDict,
    ModuleList,
    ReLU,
    Residual,
    RMSNorm,
    Sequential,
    Sigmoid,
    SiLU,
    Softmax,
    Tanh,
)
from .text import bilinear_text, linear_text
from .torch_twin import TorchTwin

__all__ = ["BUILTIN_TORCH"]


def _linear(m, dt) -> dict:
    return {"in_features": m.in_features, "out_features": m.out_features,
            "bias": m.bias is not None, "dtype": dt}


def _layer_norm(m, dt) -> dict:
    return {"normalized_shape": tuple(m.normalized_shape), "eps": m.eps,
            "elementwise_affine": m.elementwise_affine,
            "bias": m.bias is not None or not m.elementwise_affine, "dtype": dt}


def _rms_norm(m, dt) -> dict:
    return {"normalized_shape": tuple(m.normalized_shape), "eps": m.eps,
            "elementwise_affine": m.elementwise_affine, "dtype": dt}


def _bilinear(m, dt) -> dict:
    return {"in1_features": m.in1_features, "in2_features": m.in2_features,
            "out_features": m.out_features, "bias": m.bias is not None, "dtype": dt}


def _bilinear_text(m) -> str:
    return bilinear_text(m.in1_features, m.in2_features, m.out_features, m.bias is not None)


def _batch_norm(m, dt) -> dict:
    return {"num_features": m.num_features, "eps": m.eps, "momentum": m.momentum,
            "affine": m.affine, "track_running_stats": m.track_running_stats,
            "bias": m.bias is not None or not m.affine, "dtype": dt}


def _in_order(cls, children):
    """A Sequential or ModuleDict (either side's) of the converted children, names kept."""
    return cls(children)


def _in_list(cls, children):
    """A ModuleList (either side's) of the converted children: their names are ``0..n`` in order
    on both sides, so the list gives them back."""
    return cls(list(children.values()))


def _residual(cls, children):
    return cls(children["module"])


def _linear_text(m) -> str:
    return linear_text(m.in_features, m.out_features, m.bias is not None)


def _dim(m, dt) -> dict:
    return {"dim": m.dim}


#: linearkit layer type -> its twin(s); the torch names are the linearkit ones.
BUILTIN_TORCH = {
    Linear: TorchTwin("torch.nn.Linear", _linear, ledger="subclasses", describe=_linear_text),
    LazyLinear: (
        TorchTwin("torch.nn.Linear", _linear, from_torch=False, ledger=None),
        TorchTwin("torch.nn.LazyLinear", to_torch=False, from_torch=False, ledger="subclasses",
                  describe=lambda m: f"LazyLinear(?, {m.out_features})"),
    ),
    ReLU: TorchTwin("torch.nn.ReLU"),
    Tanh: TorchTwin("torch.nn.Tanh"),
    Sigmoid: TorchTwin("torch.nn.Sigmoid"),
    SiLU: TorchTwin("torch.nn.SiLU"),
    Identity: TorchTwin("torch.nn.Identity", ledger="subclasses"),
    LeakyReLU: TorchTwin("torch.nn.LeakyReLU",
                         lambda m, dt: {"negative_slope": m.negative_slope}),
    GELU: TorchTwin("torch.nn.GELU", lambda m, dt: {"approximate": m.approximate}),
    Softmax: TorchTwin("torch.nn.Softmax", _dim),
    LogSoftmax: TorchTwin("torch.nn.LogSoftmax", _dim),
    Dropout: TorchTwin("torch.nn.Dropout", lambda m, dt: {"p": m.p}, ledger="subclasses",
                       describe=lambda m: f"Dropout(p={m.p})"),
    Flatten: TorchTwin("torch.nn.Flatten",
                       lambda m, dt: {"start_dim": m.start_dim, "end_dim": m.end_dim},
                       ledger="subclasses"),
    LayerNorm: TorchTwin("torch.nn.LayerNorm", _layer_norm, ledger="subclasses",
                         describe=lambda m: f"LayerNorm({tuple(m.normalized_shape)})"),
    RMSNorm: TorchTwin("torch.nn.RMSNorm", _rms_norm, ledger="subclasses",
                       describe=lambda m: f"RMSNorm({tuple(m.normalized_shape)})"),
    Bilinear: TorchTwin("torch.nn.Bilinear", _bilinear, ledger="subclasses",
                        describe=_bilinear_text),
    BatchNorm1d: TorchTwin("torch.nn.BatchNorm1d", _batch_norm, ledger="subclasses",
                           describe=lambda m: f"BatchNorm1d({m.num_features})"),
    Sequential: TorchTwin("torch.nn.Sequential", build=_in_order, ledger="subclasses"),
    ModuleList: TorchTwin("torch.nn.ModuleList", build=_in_list, ledger=None),
    ModuleDict: TorchTwin("torch.nn.ModuleDict", build=_in_order, ledger=None),
    Residual: TorchTwin("linearkit.io.torch.TorchResidual", build=_residual, ledger=None),
}
