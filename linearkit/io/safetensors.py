"""Save and load weights as ``.safetensors`` — a format that cannot execute code on load.

Writing uses the official ``safetensors`` package (the ``cli`` extra), imported only when called.
Reading goes through linearkit's own strict reader (:mod:`linearkit.storage.safetensors_header`): the header is
checked in full — stricter than the reference loader, which accepts duplicate names — and any
defect is a :class:`~linearkit.FormatError` naming the file; F16 reads natively, BF16 through
``ml_dtypes`` (also the ``cli`` extra).
Keys are the model's state-dict keys (PyTorch's naming), so files move both ways between
linearkit and PyTorch (``safetensors.torch.load_file`` reads them directly).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping

import numpy as np

from ..errors import FormatError
from ..storage.safetensors_header import read_tensors
from ..storage.tensor_file import write_tensors
from .architecture import architecture_metadata

__all__ = ["load", "save"]


def save(model_or_state, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> str:
    """Write a model's ``state_dict()`` (or a dict of arrays) to ``path``, atomically.

    One layer of temp-file-and-rename: the bytes go to ``.tmp-*.safetensors`` in the same
    folder, are fsync'ed, and the temp file is renamed over ``path`` (``os.replace``), so ``path``
    is always either the old file or the complete new one. After an exception the temp file is
    removed. A SIGKILL (or power loss) mid-save can leave one ``.tmp-*.safetensors`` beside the
    target — safe to delete — but never a truncated target. A new file gets the mode the umask
    gives any new file; overwriting keeps the old file's mode. The model's ``repr`` is stored in
    the metadata under ``"linearkit.model"``, and its architecture (``io.spec``, JSON) under
    ``"linearkit.spec"``, so ``linearkit.load_model(path)`` rebuilds it. Returns the path written.
    """
    state = model_or_state.state_dict() if hasattr(model_or_state, "state_dict") else model_or_state
    if not isinstance(state, Mapping) or not all(isinstance(k, str) for k in state):
        got = type(model_or_state).__name__
        raise TypeError(f"save() takes a linearkit Module (its state_dict() is saved) or a dict "
                        f"of arrays {{str name: array}}, got {got}"
                        + ("" if not isinstance(state, Mapping) else " with non-str keys"))
    # np.asarray(order="C"), not np.ascontiguousarray: that one turns a 0-d array into shape
    # (1,), and BatchNorm's num_batches_tracked would no longer load back into its own model.
    arrays = {key: np.asarray(value, order="C") for key, value in state.items()}
    meta = {"format": "np"}
    if hasattr(model_or_state, "state_dict"):
        meta["linearkit.model"] = repr(model_or_state)
        meta.update(architecture_metadata(model_or_state))  # "linearkit.spec": load_model reads it
    meta.update(metadata or {})
    return write_tensors(path, arrays, meta)


def load(path: str | os.PathLike, model=None, strict: bool = True, strict_finite: bool = False):
    """Read a ``.safetensors`` file, strictly; nothing is loaded unless all of it is sound.

    The header is checked in full first (:mod:`linearkit.storage.safetensors_header`): any defect —
    truncation, a duplicate name, bad offsets or dtypes, a pickle given by mistake — is a
    :class:`~linearkit.FormatError` naming the file, the problem and the fix. No code runs.

    Without ``model``: returns the dict of arrays (state-dict keys -> ndarrays; F16 as
    ``float16``, BF16 as ``ml_dtypes.bfloat16``). With ``model``: loads them into it via
    ``model.load_state_dict(..., strict)`` and returns the model (a LazyLinear materializes from
    the file's shapes); BF16/F8 tensors are widened to float32 first (exact), then cast to the
    model's dtype like any other value. A shape mismatch, or with ``strict`` a missing or
    unexpected key, is a FormatError naming the file (the RuntimeError chained), and the model is
    unchanged. NaN/Inf in a float tensor: a ``UserWarning`` naming the tensors, or with
    ``strict_finite=True`` a FormatError (before the model is touched).
    """
    path = os.fspath(path)
    state, _ = read_tensors(path)
    check_finite(path, state, strict_finite)
    if model is None:
        return state
    state = {k: a.astype(np.float32) if a.dtype.kind == "V" else a for k, a in state.items()}
    over = _overflowing(state, model)
    if over:
        problem = (f"tensor(s) {', '.join(map(repr, over))} hold values beyond float16's range "
                   f"(±{_FLOAT16_MAX:g}): loaded into the model's float16 arrays they become inf")
        if strict_finite:
            raise FormatError(problem, path=path, hint="keep the model in float32 or bfloat16 "
                              "(bfloat16 has float32's range), or rescale the weights")
        warnings.warn(f"{path}: {problem}", UserWarning, stacklevel=2)
    # The overflow to inf was said above, naming the tensors: NumPy's nameless cast warning
    # would only repeat it.
    quiet = np.errstate(over="ignore" if over else np.geterr()["over"])
    try:
        with quiet:
            model.load_state_dict(state, strict=strict)
    except RuntimeError as err:
        raise FormatError(f"does not fit the {type(model).__name__} given: {err}", path=path,
                          hint="build the model with the architecture the file was saved from, "
                               "or pass strict=False to skip missing/unexpected keys") from err
    return model


_FLOAT16_MAX = float(np.finfo(np.float16).max)
_BLOCK = 1 << 16  # values checked at once: the masks stay small beside the tensor


def _blocks(array: np.ndarray):
    flat = array.reshape(-1)
    for start in range(0, flat.size, _BLOCK):
        yield flat[start:start + _BLOCK]


def check_finite(path: str, state: dict, strict_finite: bool, stacklevel: int = 3) -> None:
    """Warn (``UserWarning``) or, with ``strict_finite``, raise the FormatError naming the
    tensors of ``state`` (name -> array, read from ``path``) that hold NaN or Inf. Checked a
    block at a time: no mask of a whole tensor is made."""
    bad = [name for name, a in state.items() if a.dtype.kind in "fV"
           and not all(np.isfinite(block).all() for block in _blocks(a))]
    if not bad:
        return
    problem = f"non-finite values (NaN or Inf) in tensor(s) {', '.join(map(repr, bad))}"
    if strict_finite:
        raise FormatError(problem, path=path,
                          hint="the weights diverged or are corrupt; use an earlier checkpoint")
    warnings.warn(f"{path}: {problem}", UserWarning, stacklevel=stacklevel)


def _overflowing(state: dict, model) -> list[str]:
    """The keys of ``state`` whose finite values exceed float16's range where ``model`` stores
    that key in float16 (a cast there would make them inf)."""
    targets = model.state_dict()
    over = []
    for key, value in state.items():
        target = targets.get(key)
        if target is None or np.asarray(target).dtype != np.float16:
            continue
        value = np.asarray(value)
        if value.dtype.kind != "f" or value.dtype == np.float16 or not value.size:
            continue
        if any(np.any(np.abs(block[np.isfinite(block)]) > _FLOAT16_MAX)
               for block in _blocks(value)):
            over.append(key)
    return over
