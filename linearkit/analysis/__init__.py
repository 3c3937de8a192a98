"""Verification and diagnosis: gradcheck, the ledger (params / memory / FLOPs / findings), stats.

Submodules load on first use, so ``import linearkit`` stays light. Importing a submodule would
bind the *module* to its name in this package (``analysis.ledger`` the module, not the function),
so on first use every exported name of that submodule is bound here explicitly.
"""

import importlib

_EXPORTS = {
    "gradcheck": "gradcheck", "GradcheckResult": "gradcheck", "GradcheckError": "gradcheck",
    "ledger": "ledger", "Ledger": "ledger", "preset": "ledger",
    "record_stats": "stats", "StatsReport": "stats",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'linearkit.analysis' has no attribute {name!r}")
    source = _EXPORTS[name]
    module = importlib.import_module(f".{source}", __name__)
    for exported, where in _EXPORTS.items():
        if where == source and hasattr(module, exported):
            globals()[exported] = getattr(module, exported)
    return globals()[name]
