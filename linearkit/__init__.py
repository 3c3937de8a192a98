"""linearkit: the linear layer, done right — PyTorch semantics on NumPy.

``y = x @ W.T + b`` with ``W (out_features, in_features)``, ``b (out_features,)``,
``x (*, in_features)``; exact analytic gradients through ``module.vjp``; init, losses and
optimizers that match PyTorch. See README.md.
"""

from . import errors, functional, init, optim, precision
from .backend import denormal, fast, threads
from .backend.denormal import set_flush_denormal
from .backend.threads import get_num_threads, set_num_threads
from .core import anomaly, hooks, random
from .core.anomaly import detect_anomaly
from .core.module import Module, Parameter
from .core.random import manual_seed
from .errors import (
    AllocationError,
    AnomalyError,
    BackwardError,
    ClassIndexError,
    DTypeError,
    FormatError,
    ShapeError,
)
from .layers import (
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
    LoRALinear,
    ModuleDict,
    ModuleList,
    QuantizedLinear,
    QuantizedTrainingError,
    ReLU,
    Residual,
    RMSNorm,
    Sequential,
    Sigmoid,
    SiLU,
    Softmax,
    SparseLinear,
    Tanh,
)
from .losses import (
    BCELoss,
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    HuberLoss,
    KLDivLoss,
    L1Loss,
    MSELoss,
    NLLLoss,
    SmoothL1Loss,
)
from .training import loop
from .training.checkpointing import Checkpoint, checkpoint, checkpoint_sequential

__version__ = "0.1.0"

__all__ = [
    "SmoothL1Loss",
    "NLLLoss",
    "KLDivLoss",
    "HuberLoss",
    "BCELoss",
    "GELU",
    "AllocationError",
    "AnomalyError",
    "BCEWithLogitsLoss",
    "BackwardError",
    "BatchNorm1d",
    "Bilinear",
    "Checkpoint",
    "ClassIndexError",
    "CrossEntropyLoss",
    "DTypeError",
    "Dropout",
    "Flatten",
    "FormatError",
    "Identity",
    "L1Loss",
    "LayerNorm",
    "LazyLinear",
    "LeakyReLU",
    "Linear",
    "LoRALinear",
    "LogSoftmax",
    "MSELoss",
    "Module",
    "ModuleDict",
    "ModuleList",
    "Parameter",
    "QuantizedLinear",
    "QuantizedTrainingError",
    "RMSNorm",
    "ReLU",
    "Residual",
    "Sequential",
    "ShapeError",
    "SiLU",
    "Sigmoid",
    "Softmax",
    "SparseLinear",
    "Tanh",
    "accumulation",
    "amp",
    "analysis",
    "checkpoint",
    "checkpoint_sequential",
    "data",
    "detect_anomaly",
    "doctor",
    "distributed",
    "explain",
    "functional",
    "get_num_threads",
    "hooks",
    "init",
    "io",
    "load",
    "load_model",
    "loop",
    "manual_seed",
    "optim",
    "precision",
    "save",
    "set_flush_denormal",
    "set_num_threads",
    "threads",
    "transforms",
]


# Modules that lived at the top level before the rooms, by the names the docs use
_MOVED = {"accumulation": "training.accumulation", "amp": "training.amp",
          "checkpointing": "training.checkpointing", "train": "recipes.train_mnist1d"}


def __getattr__(name):
    # Heavier namespaces load on first use, so `import linearkit` stays fast and light.
    import importlib

    if name in ("analysis", "cli", "data", "distributed", "io", "recipes", "rules", "runtime",
                "training", "transforms"):
        return importlib.import_module(f".{name}", __name__)
    if name in _MOVED:
        return importlib.import_module(f".{_MOVED[name]}", __name__)
    if name == "doctor":
        from .analysis.doctor import doctor

        return doctor
    if name == "explain":
        from .analysis.explain_error import explain

        return explain
    if name == "load_model":
        from .io.model_file import load_model

        return load_model
    if name in ("save", "load"):
        from .io import safetensors as _st

        return getattr(_st, name)
    raise AttributeError(f"module 'linearkit' has no attribute {name!r}")
