"""Layers: one file per family. Each layer is parameters plus a call into ``functional``."""

from .activation import GELU, LeakyReLU, LogSoftmax, ReLU, Sigmoid, SiLU, Softmax, Tanh
from .bilinear import Bilinear
from .container import ModuleDict, ModuleList, Residual, Sequential
from .dropout import Dropout
from .flatten import Flatten
from .linear import Identity, LazyLinear, Linear
from .lora import LoRALinear
from .norm import BatchNorm1d, LayerNorm, RMSNorm
from .quantized import QuantizedLinear, QuantizedTrainingError
from .sparse import SparseLinear

__all__ = [
    "GELU",
    "BatchNorm1d",
    "Bilinear",
    "Dropout",
    "Flatten",
    "Identity",
    "LayerNorm",
    "LazyLinear",
    "LeakyReLU",
    "Linear",
    "LoRALinear",
    "LogSoftmax",
    "ModuleDict",
    "ModuleList",
    "QuantizedLinear",
    "QuantizedTrainingError",
    "RMSNorm",
    "ReLU",
    "Residual",
    "Sequential",
    "SiLU",
    "Sigmoid",
    "Softmax",
    "SparseLinear",
    "Tanh",
]
