"""Self-describing model files: weights and architecture in one ``.safetensors`` file.

``linearkit.save(model, path)`` stores the architecture (``io.spec``, JSON, never code) in the
file's metadata under ``"linearkit.spec"``; ``load_model(path)`` rebuilds the model from it and
loads the weights. Any safetensors reader still reads the tensors (the metadata is str -> str).
"""

from __future__ import annotations

import os

from ..core.module import Module
from ..errors import FormatError
from .architecture import SPEC_KEY, architecture_metadata

__all__ = ["SPEC_KEY", "architecture_metadata", "load_model", "model_from_metadata", "read_spec"]

def read_spec(path) -> dict | None:
    """The architecture stored in ``path`` (a parsed spec), or None when the file has none."""
    from ..storage.safetensors_header import read_header

    return _spec_of(path, read_header(path)[1])


def _spec_of(path, metadata: dict) -> dict | None:
    from .spec import spec_from_json

    text = metadata.get(SPEC_KEY)
    return None if text is None else spec_from_json(text, os.fspath(path))


def model_from_metadata(path, metadata: dict, *, strict_finite: bool = False) -> Module | None:
    """The model the file's ``metadata`` (from ``read_header``) describes, with the file's
    weights loaded; None when it describes none. For callers that read the header already."""
    from .safetensors import load
    from .spec import build_model

    spec = _spec_of(path, metadata)
    if spec is None:
        return None
    model = build_model(spec, source=os.fspath(path))
    load(path, model, strict_finite=strict_finite)
    return model


def load_model(path, *, strict_finite: bool = False) -> Module:
    """Rebuild the model saved in ``path`` and load its weights; returns it.

    Raises
    ------
    FormatError
        The file is malformed, has no architecture (written by another tool or with weights
        only: build the model yourself and use ``linearkit.load(path, model)``), names a layer
        type that is not registered, or its tensors do not fit the architecture.

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
