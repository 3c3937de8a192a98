"""Reading an ONNX file for ``import_onnx``: the protobuf, its external data (only from files
inside the model's folder) and onnx's checker, every failure a FormatError naming the file (and
the node when onnx's message names one). Nothing here builds modules; ``onnx`` is passed in by
the caller (it is an optional dependency).
"""

from __future__ import annotations

import os
import re

from ..errors import FormatError

__all__ = ["canonical_domain", "check", "load"]

DEFAULT_DOMAINS = ("", "ai.onnx")


def _tensors(graph):
    """Every TensorProto a graph holds: initializers, sparse ones, node attributes, subgraphs."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("sparse_tensor"):
                yield from (a.sparse_tensor.values, a.sparse_tensor.indices)
            if a.HasField("g"):
                yield from _tensors(a.g)
            for g in a.graphs:
                yield from _tensors(g)


def _load_external_data(onnx, proto, path: str) -> None:
    """Read every tensor's external data into it, from files inside the model's folder only:
    a location that is absolute, climbs out with '..', or resolves (through symlinks) to a
    file outside the folder is a FormatError, and nothing is read from it."""
    base = os.path.dirname(os.path.abspath(path))
    real_base = os.path.realpath(base)
    for tensor in _tensors(proto.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in tensor.external_data}
        where = info.get("location", "")
        stored = f"tensor '{tensor.name}' stores its data in external file '{where}'"
        hint = ("keep the data file in the model's folder and name it relatively, as "
                "onnx.save_model(..., save_as_external_data=True, location='weights.bin') does")
        full = os.path.realpath(os.path.join(base, where))
        if (not where or os.path.isabs(where) or os.path.splitdrive(where)[0]
                or os.path.commonpath([real_base, full]) != real_base or full == real_base):
            raise FormatError(f"{stored}: expected a file inside the model's folder {base}; "
                              "import_onnx reads no data from outside it", path=path, hint=hint)
        if not os.path.isfile(full):
            raise FormatError(f"{stored}: no such file in {base}", path=path, hint=hint)
        try:
            offset, length = int(info.get("offset", 0)), info.get("length")
            size = os.path.getsize(full)
            length = size - offset if length is None else int(length)
            if offset < 0 or length < 0 or offset + length > size:
                raise ValueError(f"offset {offset} and length {length} are outside the file's "
                                 f"{size} bytes")
            fd = os.open(full, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(fd, "rb") as f:
                f.seek(offset)
                data = f.read(length)
        except (OSError, ValueError) as e:
            raise FormatError(f"{stored}: cannot read it ({e})", path=path, hint=hint) from None
        tensor.raw_data = data
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]


def load(onnx, path: str):
    """The ModelProto in ``path`` with its external data read in (see _load_external_data)."""
    from google.protobuf.message import DecodeError  # onnx's own dependency

    try:
        proto = onnx.load(path, load_external_data=False)
    except DecodeError as e:
        raise FormatError(f"not an ONNX model (DecodeError: {e})", path=path) from None
    except Exception as e:  # noqa: BLE001 - onnx raises many types; all mean "not ONNX"
        raise FormatError(f"not an ONNX model ({type(e).__name__}: {e})", path=path) from None
    _load_external_data(onnx, proto, path)
    return proto


def check(onnx, proto, path: str) -> None:
    """``onnx.checker.check_model(full_check=True)``, its errors as FormatErrors naming the
    node when the message does."""
    try:
        if proto.ByteSize() >= 2**31:  # too big to hand over in memory: the checker reads it
            onnx.checker.check_model(path, full_check=True)
        else:
            onnx.checker.check_model(proto, full_check=True)
    except Exception as e:  # noqa: BLE001 - ValidationError, InferenceError, ValueError: invalid
        message = " ".join(str(e).split())
        where = ""
        inferred = re.search(r"op_type:\s*(\w+), node name:\s*([^)]*)\)", message)
        checked = re.search(r"Name:\s*(\S*)\s+OpType:\s*(\w+)", message)
        if inferred is not None:
            where = f"node '{inferred.group(2) or '?'}' ({inferred.group(1)}): "
        elif checked is not None:
            where = f"node '{checked.group(1) or '?'}' ({checked.group(2)}): "
        hint = ("declare the shape of every graph input and output (open dims as None or a "
                "name: onnx.helper.make_tensor_value_info('y', TensorProto.FLOAT, ['n', 3]))"
                if "Field 'shape'" in message else "fix the model where the checker says")
        raise FormatError(f"{where}the ONNX checker rejects the model "
                          f"({type(e).__name__}: {message})", path=path, hint=hint) from None


def canonical_domain(proto) -> None:
    """Spell the default domain '' everywhere: 'ai.onnx' is its other name, which onnx's
    checker does not accept but the operators are the same."""
    for node in proto.graph.node:
        if node.domain == "ai.onnx":
            node.domain = ""
    entries = list(proto.opset_import)
    if any(o.domain == "ai.onnx" for o in entries):
        version = next(o.version for o in entries if o.domain in DEFAULT_DOMAINS)
        del proto.opset_import[:]
        proto.opset_import.extend(o for o in entries if o.domain not in DEFAULT_DOMAINS)
        entry = proto.opset_import.add()
        entry.domain, entry.version = "", version
