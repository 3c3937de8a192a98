"""``linearkit inspect FILE``: what a .safetensors file holds, read without trusting it.

Tensors (name, dtype, shape, bytes), the metadata, the architecture when the file stores one,
and the parameter and memory summary. The header is checked strictly (``safetensors_header``),
and the architecture against it (``io.spec.check_spec``), before anything is shown. Only the
header is read: no tensor data, no model built, no weight allocated — the architecture is shown
as text made from the spec, and the counts come from the header's shapes.
"""

from __future__ import annotations

import json
import math
import os

__all__ = ["describe_file", "render"]

def describe_file(path) -> dict:
    """A JSON-able description of a .safetensors file (raises FormatError when malformed).

    ``architecture``: the stored architecture as text (``io.spec.describe_spec``) or None;
    ``ledger``: None without one, else ``params`` and ``trainable_params`` (values, as the ledger
    of the rebuilt model counts them: parameters, not buffers; a LoRA base is frozen) and
    ``memory`` (bytes of ``weights`` and ``buffers``, from the header's shapes and dtypes).
    For FLOPs and training memory: ``linearkit ledger FILE --input-shape ...``.
    """
    from ..io.model_file import SPEC_KEY, checked_spec
    from ..io.spec import describe_spec, tensor_roles
    from ..storage.safetensors_header import ITEMSIZE, read_header

    path = os.fspath(path)
    entries, metadata, _, data_size = read_header(path)
    tensors = [{"name": name, "dtype": dtype, "shape": list(shape),
                "bytes": math.prod(shape) * ITEMSIZE[dtype]}
               for name, (dtype, shape, _begin, _end) in entries.items()]
    info = {"file": path, "bytes": os.path.getsize(path), "data_bytes": data_size,
            "tensors": tensors, "parameters": sum(math.prod(t["shape"]) for t in tensors),
            # the architecture is shown from the spec, so its JSON and the repr are left out here
            "metadata": {k: v for k, v in metadata.items()
                         if k != SPEC_KEY and not (k == "linearkit.model" and SPEC_KEY in metadata)},
            "architecture": None, "ledger": None}
    tree = checked_spec(path, entries, metadata)
    if tree is not None:
        # A tensor no shipped layer claims belongs to a user's layer: counted as a parameter.
        roles = tensor_roles(tree)
        count = {"param": 0, "frozen": 0, "buffer": 0}
        size = {"param": 0, "frozen": 0, "buffer": 0}
        for t in tensors:
            role = roles.get(t["name"], "param")
            count[role] += math.prod(t["shape"])
            size[role] += t["bytes"]
        info["architecture"] = describe_spec(tree)
        info["ledger"] = {"params": count["param"] + count["frozen"],
                          "trainable_params": count["param"],
                          "memory": {"weights": size["param"] + size["frozen"],
                                     "buffers": size["buffer"]}}
    return info


def render(info: dict) -> str:
    """``describe_file``'s result as text."""
    lines = [f"{info['file']}: {info['bytes']:,} bytes, {len(info['tensors'])} tensors, "
             f"{info['parameters']:,} values"]
    width = max([len(t["name"]) for t in info["tensors"]] + [6])
    lines.append(f"  {'tensor':<{width}}  dtype  {'shape':<16} bytes")
    for t in info["tensors"]:
        shape = "(" + ", ".join(map(str, t["shape"])) + ("," if len(t["shape"]) == 1 else "") + ")"
        lines.append(f"  {t['name']:<{width}}  {t['dtype']:<5}  {shape:<16} {t['bytes']:,}")
    if info["metadata"]:
        lines.append("metadata:")
        for key, value in info["metadata"].items():
            text = value if len(value) <= 200 else value[:200] + f"... ({len(value):,} chars)"
            lines.append(f"  {key}: " + text.replace("\n", "\n    "))
    if info["architecture"] is None:
        lines.append("architecture: none stored (weights only; linearkit.load(path, model) "
                     "loads them into a model you build)")
    else:
        lines.append("architecture (linearkit.load_model rebuilds it):")
        lines += ["  " + line for line in info["architecture"].splitlines()]
        memory = json.dumps(info["ledger"]["memory"], default=str)
        lines.append(f"ledger: {info['ledger']['params']:,} parameters "
                     f"({info['ledger']['trainable_params']:,} trainable); memory {memory} "
                     "(FLOPs and training memory: linearkit ledger FILE --input-shape ...)")
    return "\n".join(lines)
