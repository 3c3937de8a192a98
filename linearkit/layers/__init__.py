"""Layers: one file per family. Each layer is parameters plus a call into ``functional``."""

from .activation import GELU, LeakyReLU, LogSoftmax, ReLU, Sigmoid, SiLU, Softmax, Tanh
from .container import Residual, Sequential
from .dropout import Dropout
from .flatten import Flatten
from .linear import Identity, LazyLinear, Linear
from .norm import BatchNorm1d, LayerNorm

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
    "LogSoftmax",
    "ReLU",
    "Residual",
    "Sequential",
    "SiLU",
    "Sigmoid",
    "Softmax",
    "Tanh",
]
