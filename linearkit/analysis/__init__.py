"""Verification and diagnosis: gradcheck, the ledger (params / memory / FLOPs / findings), stats.

Submodules load on first use, so ``import linearkit`` stays light.
"""

import importlib

_EXPORTS = {
    "gradcheck": "gradcheck", "GradcheckResult": "gradcheck", "GradcheckError": "gradcheck",
    "ledger": "ledger", "Ledger": "ledger",
    "stats": "stats", "record_stats": "stats",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        module = importlib.import_module(f".{_EXPORTS[name]}", __name__)
        return module if name == _EXPORTS[name] and not hasattr(module, name) else getattr(module, name)
    raise AttributeError(f"module 'linearkit.analysis' has no attribute {name!r}")
