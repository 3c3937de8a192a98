"""Small real datasets, built locally (no network), and a batch iterator.

- ``mnist1d()`` — MNIST-1D (4,000 train / 1,000 test signals of length 40, 10 classes),
  generated procedurally and cached as ``.npz``.
- ``DataLoader(x, y, batch_size, shuffle=..., drop_last=..., seed=...)`` — ``(xb, yb)`` batches.
"""

from .loader import DataLoader
from .mnist1d import MNIST1D, default_cache_dir, mnist1d

__all__ = ["MNIST1D", "DataLoader", "default_cache_dir", "mnist1d"]
