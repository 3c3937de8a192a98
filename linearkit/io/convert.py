"""``linearkit convert IN OUT``: move a model between .safetensors, .pt/.pth and .onnx.

| from → to | what it takes |
|---|---|
| .safetensors → .pt/.pth | the state dict, as torch tensors (``torch.save``; torch needed) |
| .pt/.pth → .safetensors | a state dict read with ``torch.load(weights_only=True)`` (never unpickled otherwise); weights only |
| .safetensors → .onnx | a file with its architecture (``linearkit.save``) and ``input_shape`` |
| .onnx → .safetensors | a graph ``import_onnx`` supports; the file gets the architecture |

Every output is written atomically (temp file beside it, then renamed).
"""

from __future__ import annotations

import io
import os

from ..errors import FormatError
from ..storage.atomic import write_atomically

__all__ = ["FORMATS", "convert", "load_any"]

FORMATS = {".safetensors": "safetensors", ".pt": "torch", ".pth": "torch", ".onnx": "onnx"}


def _format(path: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext not in FORMATS:
        raise FormatError(f"unknown file type {ext or '(none)'!r}", path=path,
                          hint="use .safetensors, .pt/.pth or .onnx")
    return FORMATS[ext]


def _save_torch_state(state: dict, path: str) -> None:
    try:
        import torch
    except ImportError:
        raise ImportError('writing a .pt file needs PyTorch: pip install "linearkit[torch]"'
                          ) from None
    buffer = io.BytesIO()
    torch.save({k: torch.from_numpy(v.copy()) for k, v in state.items()}, buffer)
    write_atomically(path, buffer.getvalue(), suffix=".pt")


def convert(source, target, *, input_shape=None) -> str:
    """Convert ``source`` into ``target`` (formats from the extensions; see the module table).

    Returns the path written. Raises FormatError naming the file for an unsupported pair, a
    malformed input, or a .safetensors file without architecture where one is needed.
    """
    from .model_file import load_model
    from .safetensors import load, save

    source, target = os.fspath(source), os.fspath(target)
    src, dst = _format(source), _format(target)
    if os.path.abspath(source) == os.path.abspath(target):
        raise FormatError("the output is the input file", path=target,
                          hint="give another output path")
    if src == "safetensors" and dst == "torch":
        _save_torch_state(load(source), target)
    elif src == "torch" and dst == "safetensors":
        from .torch import load_torch_state

        save(load_torch_state(source), target)
    elif src == "safetensors" and dst == "onnx":
        from .onnx_export import export_onnx

        if input_shape is None:
            raise FormatError("exporting to ONNX needs the input shape", path=source,
                              hint="pass input_shape, e.g. --input-shape 1,40")
        export_onnx(load_model(source).eval(), target, input_shape)
    elif src == "onnx" and dst == "safetensors":
        from .onnx_import import import_onnx

        save(import_onnx(source), target)
    else:
        raise FormatError(f"cannot convert {src} to {dst}", path=source,
                          hint="supported: safetensors <-> pt, safetensors <-> onnx")
    return target


def load_any(path: str, architecture: str | None = None):
    """A linearkit model from ``path``: a self-describing .safetensors (``linearkit.save``), an
    ONNX MLP (``import_onnx``), or a PyTorch state dict (.pt/.pth, read without unpickling) put
    into the architecture of ``architecture`` (a linearkit model file whose layers match).

    Raises FormatError naming the file for anything else.
    """
    from .model_file import load_model

    kind = FORMATS.get(os.path.splitext(path)[1].lower())
    if kind == "safetensors":
        return load_model(path)
    if kind == "onnx":
        from .onnx_import import import_onnx

        return import_onnx(path)
    if kind == "torch":
        if architecture is None:
            raise FormatError("a .pt/.pth file holds weights but no architecture", path=path,
                              hint="give one with --arch MODEL.safetensors (a linearkit model "
                                   "file of the same layers), or convert the torch model with "
                                   "linearkit.io.from_torch and linearkit.save")
        from .torch import load_torch_state

        model = load_model(architecture)
        try:
            model.load_state_dict(load_torch_state(path))
        except RuntimeError as err:
            first = str(err).split("\n\t")[1] if "\n\t" in str(err) else str(err)
            raise FormatError(f"its state dict does not fit the architecture of {architecture}: "
                              f"{first.strip()}", path=path,
                              hint="--arch must be a model file of the same layers") from None
        return model
    raise FormatError(f"unknown file type {os.path.splitext(path)[1] or '(none)'!r}", path=path,
                      hint="give a .safetensors, .onnx, .pt or .pth file")
