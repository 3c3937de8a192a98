"""``linearkit inspect FILE``: what a .safetensors file holds, read without trusting it.

Tensors (name, dtype, shape, bytes), the metadata, the architecture when the file stores one,
and the parameter and memory summary. The header is checked strictly (``safetensors_header``),
and the architecture against it (``io.spec.check_spec``), before anything is shown. Only the
header is read: no tensor data, no model built, no weight allocated — the architecture is shown
as text made from the spec, and the counts come from the header's shapes.
"""

from __future__ import annotations

import math
import os

__all__ = ["describe_file", "first_layer_width", "not_safetensors", "render"]

#: Extensions of the model files a folder given to ``inspect`` is searched for.
MODEL_EXTENSIONS = (".safetensors", ".onnx", ".pt", ".pth")

def describe_file(path) -> dict:
    """A JSON-able description of a .safetensors file (raises FormatError when malformed).

    ``architecture``: the stored architecture as text (``io.spec.describe_spec``) or None;
    ``ledger``: None without one, else ``params`` and ``trainable_params`` (values, as the ledger
    of the rebuilt model counts them: parameters, not buffers; a LoRA base is frozen) and
    ``memory`` (bytes of ``weights`` and ``buffers``, from the header's shapes and dtypes).
    For FLOPs and training memory: ``linearkit ledger FILE`` (the input shape from the file's
    first layer, or ``--input-shape``).
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


def _looks_like_safetensors(head: bytes, size: int) -> bool:
    """An 8-byte little-endian header length that fits the file, then ``{``."""
    n = int.from_bytes(head[:8], "little") if len(head) >= 8 else -1
    return len(head) >= 9 and 2 <= n <= size - 8 and head[8:9] == b"{"


def _looks_like_onnx(head: bytes) -> bool:
    """An ONNX ModelProto (protobuf) starts with field 1, ``ir_version`` (tag 0x08, a small
    varint), then another field: producer_name (0x12), ..., graph (0x3a), opset_import (0x42)."""
    return (len(head) >= 3 and head[0] == 0x08 and head[1] < 0x80
            and head[2] in (0x12, 0x1a, 0x22, 0x2a, 0x32, 0x3a, 0x42))


def _looks_like_torch(head: bytes) -> bool:
    """``torch.save``: a zip archive (``PK\\x03\\x04``, since torch 1.6) or a pickle (``\\x80``
    then protocol 2-5, the legacy format)."""
    return head[:4] == b"PK\x03\x04" or (head[:1] == b"\x80" and head[1:2] in b"\x02\x03\x04\x05")


def _onnx_summary(path: str) -> str:
    """``; graph inputs x[1,4], outputs y[1,3], ops Gemm x2, Relu x1`` when onnx is installed
    and the file parses, else ''. Imported only here: onnx is an optional extra."""
    try:
        import onnx
    except ImportError:
        return ""
    try:
        graph = onnx.load(path, load_external_data=False).graph
    except Exception:  # noqa: BLE001 - a summary is optional; doctor/convert say what is wrong
        return ""

    def shown(value) -> str:
        dims = value.type.tensor_type.shape.dim
        return value.name + "[" + ",".join(d.dim_param or str(d.dim_value) for d in dims) + "]"

    ops: dict = {}
    for node in graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    weights = {t.name for t in graph.initializer}
    inputs = [shown(v) for v in graph.input if v.name not in weights]
    counted = ", ".join(f"{op} x{n}" for op, n in ops.items())
    return (f"; graph inputs {', '.join(inputs) or 'none'}, outputs "
            f"{', '.join(shown(v) for v in graph.output) or 'none'}, ops {counted or 'none'}")


def not_safetensors(path) -> str | None:
    """One line saying what ``path`` is and which command reads it, when it is a folder, an
    ONNX model or a PyTorch file rather than a .safetensors file; None otherwise (a
    .safetensors file, or something the strict reader will name itself)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        found = sorted(name for name in os.listdir(path)
                       if name.lower().endswith(MODEL_EXTENSIONS)
                       and os.path.isfile(os.path.join(path, name)))
        if not found:
            return (f"{path} is a folder, not a file, and holds no model file "
                    f"({', '.join('*' + e for e in MODEL_EXTENSIONS)}); give a .safetensors file")
        listed = ", ".join(found[:10]) + (f" and {len(found) - 10} more" if len(found) > 10 else "")
        return (f"{path} is a folder, not a file; the model files in it: {listed}; inspect one: "
                f"linearkit inspect {os.path.join(path, found[0])}")
    try:
        with open(path, "rb") as f:
            head = f.read(9)
        size = os.path.getsize(path)
    except OSError:
        return None  # the reader reports it, with the file's name and the system's reason
    if _looks_like_safetensors(head, size):
        return None
    stem = os.path.splitext(path)[0]
    ext = os.path.splitext(path)[1].lower()
    if ext == ".onnx" or _looks_like_onnx(head):
        return (f"{path} is an ONNX model (protobuf), not a .safetensors file"
                f"{_onnx_summary(path)}; inspect reads .safetensors: check it with linearkit "
                f"doctor {path}, or convert it: linearkit convert {path} {stem}.safetensors")
    if _looks_like_torch(head) or (ext in (".pt", ".pth") and not head.startswith(b"{")):
        return (f"{path} is a PyTorch file (torch.save: zip/pickle), not a .safetensors file; "
                f"inspect reads .safetensors: convert its state dict (no torch.load and "
                f"save_file needed): linearkit convert {path} {stem}.safetensors, or check it "
                f"against a model file of the same layers: linearkit doctor {path} "
                f"--arch ARCH.safetensors")
    return None


def first_layer_width(path) -> int | None:
    """The width of the input the file's architecture takes (the ``in_features`` of the first
    Linear, SparseLinear, QuantizedLinear or materialized LazyLinear the input meets, a
    LayerNorm's 1-D ``normalized_shape``, a BatchNorm1d's ``num_features``), read from the
    header only; None when the file stores no architecture or its first layer does not say
    (an unmaterialized LazyLinear, a user's layer)."""
    from ..io.model_file import checked_spec
    from ..layers import (
        BatchNorm1d,
        LayerNorm,
        LazyLinear,
        Linear,
        QuantizedLinear,
        SparseLinear,
    )
    from ..storage.safetensors_header import read_header

    path = os.fspath(path)
    entries, metadata, _, _ = read_header(path)
    tree = checked_spec(path, entries, metadata)
    if tree is None:
        return None
    for node in tree.walk():  # depth first: a Sequential's first child before its second
        if node.cls in (Linear, LazyLinear, QuantizedLinear):
            if node.lazy or "weight" not in (node.state or {}):
                return None
            return int(node.state["weight"].shape[1])  # (out_features, in_features)
        if node.cls is SparseLinear:
            return int(node.args["in_features"])
        if node.cls is LayerNorm:
            shape = node.args.get("normalized_shape")
            shape = [shape] if isinstance(shape, int) else shape
            return int(shape[0]) if isinstance(shape, list) and len(shape) == 1 else None
        if node.cls is BatchNorm1d:
            return int(node.args.get("num_features"))
        if node.state is None or node.state:  # a user's layer, or one holding tensors
            return None
        # a container or a stateless layer (Sequential, ReLU, Dropout, ...): look further in
    return None


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
        from .ledger.report import human_bytes

        memory = ", ".join(f"{name} {human_bytes(n)}" for name, n in
                           info["ledger"]["memory"].items())
        lines.append(f"ledger: {info['ledger']['params']:,} parameters "
                     f"({info['ledger']['trainable_params']:,} trainable); memory {memory} "
                     "(FLOPs and training memory: linearkit ledger FILE [--input-shape N,...])")
    return "\n".join(lines)
