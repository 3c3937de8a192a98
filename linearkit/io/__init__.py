"""Interop: self-describing .safetensors model files, PyTorch modules and .pt state dicts,
scikit-learn estimators, ONNX export and import, and verify (a probe that proves a conversion). Optional packages
(safetensors, torch, scikit-learn, onnx) load on first use."""

from .model_file import load_model
from .onnx_export import OnnxExportError, export_onnx
from .onnx_import import import_onnx
from .safetensors import load, save
from .sklearn import from_sklearn, predict_proba_like
from .torch import from_torch, load_torch_state, to_torch
from .verify import VerifyReport, verify

__all__ = ["OnnxExportError", "VerifyReport", "export_onnx", "from_sklearn", "from_torch",
           "import_onnx", "load", "load_model", "load_torch_state", "predict_proba_like", "save",
           "to_torch", "verify"]
