"""Save and load weights as ``.safetensors`` — a format that cannot execute code on load.

Uses the official ``safetensors`` package (the ``cli`` extra), imported only when called.
Keys are the model's state-dict keys (PyTorch's naming), so files move both ways between
linearkit and PyTorch (``safetensors.torch.load_file`` reads them directly).
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

__all__ = ["load", "save"]


def _safetensors_numpy():
    try:
        import safetensors.numpy as st
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError(
            "saving/loading .safetensors needs the 'safetensors' package: "
            "pip install 'linearkit[cli]' (or pip install safetensors)") from None
    return st


def _new_file_mode() -> int:
    """The mode ``open()`` gives a new file: 0o666 less the process's umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def save(model_or_state, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> str:
    """Write a model's ``state_dict()`` (or a dict of arrays) to ``path``, atomically.

    The file is written to a temporary name in the same folder and renamed into place, so an
    interrupted save never leaves a truncated file where a good one was. The model's ``repr`` is
    stored in the metadata under ``"linearkit.model"``. Returns the path written.
    """
    st = _safetensors_numpy()
    state = model_or_state.state_dict() if hasattr(model_or_state, "state_dict") else model_or_state
    # np.asarray(order="C"), not np.ascontiguousarray: that one turns a 0-d array into shape
    # (1,), and BatchNorm's num_batches_tracked would no longer load back into its own model.
    arrays = {key: np.asarray(value, order="C") for key, value in state.items()}
    meta = {"format": "np"}
    if hasattr(model_or_state, "state_dict"):
        meta["linearkit.model"] = repr(model_or_state)
    meta.update(metadata or {})
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".safetensors", dir=folder)
    os.close(fd)
    try:
        st.save_file(arrays, tmp, metadata=meta)
        os.chmod(tmp, _new_file_mode())  # mkstemp's 0600 would survive the rename
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def load(path: str | os.PathLike, model=None, strict: bool = True):
    """Read a ``.safetensors`` file.

    Without ``model``: returns the dict of arrays (state-dict keys -> ndarrays).
    With ``model``: loads them into it via ``model.load_state_dict(..., strict)`` and returns
    the model (a LazyLinear materializes from the file's shapes).
    """
    st = _safetensors_numpy()
    state = st.load_file(os.fspath(path))
    if model is None:
        return state
    model.load_state_dict(state, strict=strict)
    return model
