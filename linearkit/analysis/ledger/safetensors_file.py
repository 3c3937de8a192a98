"""The ledger's weights-file path: rows and sizes from a ``.safetensors`` header, no graph.

Tensors are grouped by module prefix ('0.weight', '0.bias' -> row '0'); 2-D float weights are read
for the findings. With no graph there are no FLOPs and no activations.
"""

from __future__ import annotations

import math
import re

from ...storage.safetensors_header import ITEMSIZE
from .accumulator import Acc
from .report import linear_text

__all__ = ["read_safetensors"]


_BUFFER_NAMES = ("running_mean", "running_var", "num_batches_tracked")
def _natural_key(s: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def read_safetensors(path: str, override):
    """Rows (one per module prefix) and sizes from a file's header; weights read for findings."""
    try:
        from safetensors import safe_open
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("reading a .safetensors file needs the 'safetensors' package: "
                          "pip install 'linearkit[cli]' (or pip install safetensors)") from None
    groups: dict[str, list] = {}
    with safe_open(path, framework="numpy") as f:
        for key in sorted(f.keys(), key=_natural_key):
            sl = f.get_slice(key)
            shape, st_dtype = tuple(sl.get_shape()), sl.get_dtype()
            prefix, _, name = key.rpartition(".")
            arr = None
            if name == "weight" and len(shape) == 2 and st_dtype in ("F64", "F32", "F16"):
                arr = f.get_tensor(key)
            groups.setdefault(prefix, []).append((name, shape, st_dtype, arr))
    acc = Acc(override.itemsize if override is not None else 4)
    root = acc.rows[acc.row("", "safetensors file", 0, kind="container")]
    weights = buffers = 0
    dtypes, params = set(), []
    for prefix, tensors in groups.items():
        names = {n: s for n, s, _, _ in tensors}
        w = names.get("weight")
        kind, info = "tensors", {}
        if w is not None and len(w) == 2:
            kind, info = "linear", {"in": w[1], "out": w[0], "bias": "bias" in names}
            type_ = linear_text(w[1], w[0], "bias" in names)
        elif "running_mean" in names:
            type_ = f"BatchNorm1d({names['running_mean'][0]})"
        elif w is not None and len(w) == 1:
            type_ = f"norm-like({w[0]},)"
        else:
            type_ = "tensors: " + ", ".join(sorted(names))
        i = acc.row(prefix, type_, 1, kind=kind, info=info)
        for name, shape, st_dtype, arr in tensors:
            numel = math.prod(shape)
            itemsize = override.itemsize if override is not None else ITEMSIZE.get(st_dtype, 4)
            nbytes = numel * itemsize
            if name in _BUFFER_NAMES or st_dtype[0] in "IUB":
                buffers += nbytes
                continue
            dtypes.add(st_dtype)
            weights += nbytes
            params.append((numel, itemsize, itemsize, True))  # torch's: grads as stored
            acc.own_params(i, [((prefix, name), numel, True)])
            if arr is not None:
                acc.linear_weights[i] = arr
        root.params += acc.rows[i].params
        root.trainable_params += acc.rows[i].trainable_params
    names = sorted(dtypes) or ["F32"]
    store = override.name if override is not None else "/".join(
        {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}.get(d, d)
        for d in names)
    return acc, {"weights": weights, "buffers": buffers, "store": store, "params": params}
