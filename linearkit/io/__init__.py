"""Interop: safetensors files (more formats to come). Optional packages load on first use."""

from .safetensors import load, save

__all__ = ["load", "save"]
