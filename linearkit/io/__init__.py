"""Interop: safetensors files, PyTorch modules and .pt state dicts, and verify (a probe that
proves a conversion). Optional packages load on first use."""

from .safetensors import load, save
from .torch import from_torch, load_torch_state, to_torch
from .verify import VerifyReport, verify

__all__ = ["VerifyReport", "from_torch", "load", "load_torch_state", "save", "to_torch", "verify"]
