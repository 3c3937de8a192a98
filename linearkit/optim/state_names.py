"""The per-parameter state each built-in optimizer keeps, by PyTorch's key names: the classes
take their ``_state_names`` from here, and a state-dict load names the optimizer whose state it
was given by mistake even before that optimizer's file is imported."""

from __future__ import annotations

__all__ = ["ADAM_KEYS", "ADAM_KEYS_AMSGRAD", "BUILTIN"]

ADAM_KEYS = ("exp_avg", "exp_avg_sq")
ADAM_KEYS_AMSGRAD = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")

#: optimizer name -> every key its per-parameter state may hold
BUILTIN = {
    "SGD": frozenset({"momentum_buffer"}),
    "Adam": frozenset({"step", *ADAM_KEYS_AMSGRAD}),
    "AdamW": frozenset({"step", *ADAM_KEYS_AMSGRAD}),
}
