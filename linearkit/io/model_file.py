"""Self-describing model files: weights and architecture in one ``.safetensors`` file.

``linearkit.save(model, path)`` stores the architecture (``io.spec``, JSON, never code) in the
file's metadata under ``"linearkit.spec"``; ``load_model(path)`` rebuilds the model from it and
loads the weights. Any safetensors reader still reads the tensors (the metadata is str -> str).

A file is untrusted until checked, in this order, each step bounded by the one before: the
header (``storage.safetensors_header.read_header``); the architecture's JSON
(``spec.spec_from_json``: length, brackets, nesting depth, duplicate keys, all before
``json.loads``); the architecture against the header (``spec.check_spec``: node count, names,
and every tensor a layer's arguments declare, by shape and kind of dtype) — so a spec asking
for a ``Linear(100000, 100000)`` the file does not hold is a FormatError in microseconds, with
nothing allocated. Only then are the layers built, without their random init, and the tensors
read into them: straight into the layers' arrays where the file stores a tensor in its array's
dtype (a file ``linearkit.save`` wrote always does), so loading costs the model's own bytes and
no copy beside them.
"""

from __future__ import annotations

import os

import numpy as np

from ..core.module import Module
from ..errors import FormatError
from .architecture import SPEC_KEY, architecture_metadata

__all__ = ["SPEC_KEY", "architecture_metadata", "checked_spec", "load_model",
           "model_from_metadata", "read_spec"]


def read_spec(path) -> dict | None:
    """The architecture stored in ``path`` (a parsed spec), or None when the file has none.

    The JSON is parsed with ``spec_from_json``'s bounds; the tree is not checked against the
    tensors (``checked_spec`` does that)."""
    from ..storage.safetensors_header import read_header

    return _spec_of(path, read_header(path)[1])


def _spec_of(path, metadata: dict) -> dict | None:
    from .spec import spec_from_json

    text = metadata.get(SPEC_KEY)
    return None if text is None else spec_from_json(text, os.fspath(path))


def checked_spec(path, entries: dict, metadata: dict):
    """The file's architecture checked against its header (``spec.check_spec``), a
    ``spec.SpecNode`` tree; None when the file stores none. Reads no tensor, builds nothing.

    ``entries``, ``metadata``: ``read_header(path)[:2]``.
    """
    from .spec import check_spec

    spec = _spec_of(path, metadata)
    return None if spec is None else check_spec(spec, os.fspath(path), entries)


def model_from_metadata(path, metadata: dict, *, strict_finite: bool = False) -> Module | None:
    """The model the file's ``metadata`` (from ``read_header``) describes, with the file's
    weights loaded; None when it describes none. For callers that read the header already.

    The architecture is checked against the file's header before any layer is built (the
    header is read again here, for its tensor entries); the layers are then built without
    their random init and every tensor is loaded into them.
    """
    from ..storage.safetensors_header import read_header
    from .spec import build_model

    path = os.fspath(path)
    entries = read_header(path)[0]
    tree = checked_spec(path, entries, metadata)
    if tree is None:
        return None
    model = build_model(tree, source=path, entries=entries)
    # A LazyLinear the file stores unmaterialized holds no weight or bias: nothing to load.
    lazy = {node.key(name) for node in tree.walk() if node.lazy for name in ("weight", "bias")}
    _load_checked(path, model, entries, lazy, strict_finite)
    return model


def _load_checked(path: str, model: Module, entries: dict, lazy: set,
                  strict_finite: bool) -> None:
    """Read every tensor of ``path`` into ``model`` (just built from the checked architecture).

    A tensor stored in the dtype of the array the model holds for it is read straight into that
    array; the others (another dtype, an array the model does not hold as its own) are read
    apart and cast by ``load_state_dict``. Every key still goes through ``load_state_dict``,
    whose checks decide (a value that already is the array it is assigned to costs nothing).
    Loads non-strictly only so that an unmaterialized LazyLinear's absent weight is no error;
    any other missing or unexpected key (the file changed since its header was checked) is a
    FormatError, and nothing of the model is kept by the caller then.
    """
    from ..storage.safetensors_header import file_dtype, read_tensors, read_tensors_into
    from .safetensors import check_finite

    held = model.state_dict()
    direct = {}
    for key, (dtype, shape, _, _) in entries.items():
        array = held.get(key)
        if (type(array) is np.ndarray and array.shape == shape and array.flags.c_contiguous
                and array.flags.writeable and array.dtype == file_dtype(path, key, dtype)):
            direct[key] = array
    read_tensors_into(path, direct)
    others = set(entries) - set(direct)
    rest = read_tensors(path, names=others)[0] if others else {}
    state = {key: direct[key] if key in direct else rest[key]  # in the file's order
             for key in entries if key in direct or key in rest}
    state.update(rest)  # a name the header no longer lists: load_state_dict reports it
    check_finite(path, state, strict_finite)
    state = {k: a.astype(np.float32) if a.dtype.kind == "V" and k in rest else a
             for k, a in state.items()}
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as err:
        raise FormatError(f"does not fit the {type(model).__name__} its architecture "
                          f"describes: {err}", path=path,
                          hint="the file changed while it was read, or was edited; save the "
                               "model again with linearkit.save(model, path)") from err
    missing = [key for key in missing if key not in lazy]
    if missing or unexpected:
        raise FormatError(f"the tensors do not fit the architecture: missing "
                          f"{missing or 'none'}, unexpected {unexpected or 'none'}", path=path,
                          hint="the file changed while it was read, or was edited; save the "
                               "model again with linearkit.save(model, path)")


def load_model(path, *, strict_finite: bool = False) -> Module:
    """Rebuild the model saved in ``path`` and load its weights; returns it.

    Raises
    ------
    FormatError
        The file is malformed, has no architecture (written by another tool or with weights
        only: build the model yourself and use ``linearkit.load(path, model)``), names a layer
        type that is not registered, its architecture is out of bounds (``spec.MAX_DEPTH``,
        ``MAX_NODES``...) or names a child badly, or its tensors do not fit the architecture
        (checked from the header, before any layer is built).

    Examples
    --------
    >>> import os, tempfile, numpy as np, linearkit as lk
    >>> model = lk.Sequential(lk.Linear(3, 2), lk.Tanh())
    >>> path = os.path.join(tempfile.mkdtemp(), "m.safetensors")
    >>> _ = lk.save(model, path)
    >>> again = lk.load_model(path)
    >>> x = np.ones((1, 3), np.float32)
    >>> bool((again(x) == model(x)).all())
    True
    """
    from ..storage.safetensors_header import read_header

    path = os.fspath(path)
    model = model_from_metadata(path, read_header(path)[1], strict_finite=strict_finite)
    if model is None:
        raise FormatError("the file holds weights but no architecture (no 'linearkit.spec' "
                          "metadata)", path=path,
                          hint="build the model in code and load the weights into it: "
                               "linearkit.load(path, model)")
    return model
