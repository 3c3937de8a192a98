"""Write named arrays and string metadata as a ``.safetensors`` file, atomically. The bytes come
from the official ``safetensors`` package (the ``cli`` extra), imported only when called; they
are written once, through ``atomic.write_atomically``. Reading is ``safetensors_header``'s."""

from __future__ import annotations

import os

import numpy as np

from .atomic import write_atomically

__all__ = ["write_tensors"]


def _safetensors_numpy():
    try:
        import safetensors.numpy as st
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError(
            "saving .safetensors needs the 'safetensors' package: "
            "pip install 'linearkit[cli]' (or pip install safetensors)") from None
    return st


def write_tensors(path: str | os.PathLike, arrays: dict[str, np.ndarray],
                  metadata: dict[str, str]) -> str:
    """Write ``arrays`` (name -> C-contiguous ndarray, any shape) with ``metadata`` to ``path``
    as one safetensors file, replacing it atomically; returns the path written."""
    st = _safetensors_numpy()
    # np.asarray(order="C"), not np.ascontiguousarray: that one turns a 0-d array into shape
    # (1,), and BatchNorm's num_batches_tracked would no longer load back into its own model.
    arrays = {name: np.asarray(value, order="C") for name, value in arrays.items()}
    # safetensors serializes to bytes; we write them, so there is no second temp file.
    return write_atomically(path, st.save(arrays, metadata=metadata), suffix=".safetensors")
