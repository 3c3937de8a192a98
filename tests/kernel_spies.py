"""Count the calls of a compiled kernel, so that a test notices a silent fallback."""

from __future__ import annotations

import linearkit as lk


class KernelCalls:
    """Wraps ``lk.fast.kernels()``'s ``name`` (``"chain.chain_forward"``, ``"train_step"``) for
    the test's duration; ``calls`` counts the calls whose result ``counts(result)`` accepts
    (every call by default)."""

    def __init__(self, monkeypatch, name: str, counts=None):
        owner = lk.fast.kernels()
        *path, attribute = name.split(".")
        for part in path:
            owner = getattr(owner, part)
        real = getattr(owner, attribute)
        self.calls = 0

        def spy(*args):
            result = real(*args)
            self.calls += counts is None or bool(counts(result))
            return result
        monkeypatch.setattr(owner, attribute, spy)
