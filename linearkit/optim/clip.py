"""Gradient clipping as ``torch.nn.utils``: ``clip_grad_norm_`` and ``clip_grad_value_``."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from ..core.module import Parameter

__all__ = ["clip_grad_norm_", "clip_grad_value_"]


def _params(parameters) -> list[Parameter]:
    if isinstance(parameters, Parameter):
        return [parameters]
    return list(parameters)


def _norm(x: np.ndarray, norm_type: float):
    """The vector ``norm_type``-norm of ``x`` flattened (0 for an empty array), dtype kept."""
    if x.size == 0:
        return 0.0
    return np.linalg.norm(x.reshape(-1), norm_type)


def clip_grad_norm_(parameters: Parameter | Iterable[Parameter], max_norm: float,
                    norm_type: float = 2.0, error_if_nonfinite: bool = False) -> np.ndarray:
    """Scale gradients in place so that their joint norm is at most ``max_norm``.

    The total norm is that of all gradients concatenated into one vector (``norm_type`` may be
    ``inf``). Every gradient is multiplied by ``min(max_norm / (total + 1e-6), 1)``, as in
    PyTorch. Parameters without a gradient are ignored.

    Returns the total norm (before clipping) as a 0-d ndarray in the gradients' dtype.
    Raises RuntimeError if it is NaN/Inf and ``error_if_nonfinite`` is True.
    """
    grads = [p.grad for p in _params(parameters) if p.grad is not None]
    norm_type = float(norm_type)
    if not grads:
        return np.asarray(0.0, dtype=np.float32)
    dtype = np.result_type(*grads)
    norms = np.array([_norm(g, norm_type) for g in grads], dtype=dtype)
    total = np.asarray(_norm(norms, norm_type), dtype=dtype)
    if error_if_nonfinite and not np.isfinite(total):
        raise RuntimeError(
            f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, "
            "so it cannot be clipped. To disable this error and scale the gradients by the "
            "non-finite norm anyway, set `error_if_nonfinite=False`")
    coef = float(max_norm) / (float(total) + 1e-6)
    if not coef < 1.0 and not math.isnan(coef):
        return total
    with np.errstate(invalid="ignore"):                         # inf * 0, as PyTorch: NaN
        for g in grads:
            g *= np.asarray(coef, dtype=g.dtype)
    return total


def clip_grad_value_(parameters: Parameter | Iterable[Parameter], clip_value: float) -> None:
    """Clamp every gradient in place to ``[-clip_value, clip_value]``."""
    clip_value = float(clip_value)
    for p in _params(parameters):
        if p.grad is not None:
            np.clip(p.grad, -clip_value, clip_value, out=p.grad)
