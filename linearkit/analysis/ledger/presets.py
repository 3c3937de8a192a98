"""The ledger's example models, by name: what ``ledger('mlp-mnist')`` and the CLI accept."""

from __future__ import annotations

from ...core.module import Module
from ...layers import Linear, ReLU, Residual, Sequential

__all__ = ["PRESETS", "preset"]


def _mlp_mnist():
    return Sequential(Linear(784, 256), ReLU(), Linear(256, 256), ReLU(), Linear(256, 10))


def _mnist1d():
    return Sequential(Linear(40, 100), ReLU(), Residual(Sequential(Linear(100, 100), ReLU())),
                      Linear(100, 10))


#: name -> (factory, default input shape, description)
PRESETS = {
    "mlp-mnist": (_mlp_mnist, (64, 784), "MLP 784-256-256-10 with ReLU (MNIST)"),
    "mnist1d": (_mnist1d, (64, 40), "MLP 40-100-residual(100)-10 with ReLU (MNIST-1D)"),
    "linear-4096": (lambda: Linear(4096, 4096), (1, 4096), "one Linear(4096, 4096)"),
    "linear-512-256": (lambda: Linear(512, 256), (64, 512), "one Linear(512, 256)"),
    "linear-1024-4096": (lambda: Linear(1024, 4096), (64, 128, 1024),
                         "one Linear(1024, 4096) on (batch 64, sequence 128)"),
}


def preset(name: str) -> Module:
    """A fresh example model by name (see ``PRESETS``): 'mlp-mnist', 'mnist1d', 'linear-4096', …

    Its default input shape is ``PRESETS[name][1]``.
    """
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name][0]()
