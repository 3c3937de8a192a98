"""The rules of the layers the transforms make (LoRA, int8, sparse), each in its own file."""

from __future__ import annotations

from .registry import register_rule

__all__ = ["register_surgery_rules"]


def register_surgery_rules() -> None:
    """Register the rule (with rebuild, so model files hold these layers) of every layer type
    ``linearkit.transforms`` creates, and of ``Checkpoint``; done once, when ``linearkit.rules``
    loads."""
    from . import checkpoint_rules, lora_rules, quantized_rules, sparse_rules

    for module in (lora_rules, quantized_rules, sparse_rules, checkpoint_rules):
        for layer_type, rule in module.RULES:
            register_rule(layer_type, rule)
