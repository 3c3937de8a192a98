"""Layers: one file per family. Each layer is parameters plus a call into ``functional``."""

from .activation import GELU, LeakyReLU, LogSoftmax, ReLU, Sigmoid, SiLU, Softmax, Tanh
from .container import ModuleDict, ModuleList, Residual, Sequential
from .dropout import Dropout
from .flatten import Flatten
from .linear import Identity, LazyLinear, Linear
from .lora import LoRALinear
from .norm import BatchNorm1d, LayerNorm
from .quantized import QuantizedLinear, QuantizedTrainingError
from .sparse import SparseLinear

__all__ = [
    "GELU",
    "BatchNorm1d",
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
    "ReLU",
    "Residual",
    "Sequential",
    "SiLU",
    "Sigmoid",
    "Softmax",
    "SparseLinear",
    "Tanh",
]
