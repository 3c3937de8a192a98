"""The architecture a model file carries: the model's spec as JSON under one metadata key,
written by ``save`` and read back by ``load_model`` (``model_file.py``)."""

from __future__ import annotations

import json
import warnings

from ..core.module import Module

__all__ = ["SPEC_KEY", "architecture_metadata"]

#: The metadata key that holds the architecture.
SPEC_KEY = "linearkit.spec"


def architecture_metadata(model) -> dict[str, str]:
    """``{SPEC_KEY: json}`` for a model whose every type can be rebuilt; ``{}`` (and a warning
    that says why) for one that cannot, whose weights are still saved."""
    from .spec import model_spec

    if not isinstance(model, Module):
        return {}
    try:
        return {SPEC_KEY: json.dumps(model_spec(model), separators=(",", ":"))}
    except TypeError as err:
        warnings.warn(f"saving the weights without the architecture: {err}", stacklevel=3)
        return {}
