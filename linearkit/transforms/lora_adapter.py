"""LoRA adapter files: ``save_adapter`` writes only a model's ``lora_A`` / ``lora_B`` tensors
(peft's adapter-file keys without its ``base_model.model.`` prefix) and the adapters' settings as
JSON metadata; ``load_adapter`` checks such a file in full and puts the adapters onto a copy of
the base model (see ``lora.py`` for the adapters themselves)."""

from __future__ import annotations

import json
import numbers
import os

import numpy as np

from ..core.module import Module
from ..errors import FormatError
from .lora_transforms import (
    LoRAReport,
    adapter_owner,
    adapters,
    added_line,
    freeze_all_but_adapters,
    layer_info,
    left_frozen,
    lora_report,
    refuse_tied,
    wrap,
)
from .walk import copy_model, finish, lists, named, set_submodule

__all__ = ["ADAPTER_FORMAT", "ADAPTER_KEY", "load_adapter", "save_adapter"]

#: The ``format`` field of an adapter file's JSON metadata (under ``ADAPTER_KEY``).
ADAPTER_FORMAT = "linearkit.lora/1"
#: The safetensors metadata key that holds it.
ADAPTER_KEY = "linearkit.lora"


def save_adapter(model: Module, path: str | os.PathLike) -> str:
    """Write only ``model``'s LoRA adapters to the ``.safetensors`` file ``path``, atomically.

    Tensors: ``'<layer path>.lora_A.weight'`` ``(r, in)`` and ``'<layer path>.lora_B.weight'``
    ``(out, r)`` for each LoRALinear — peft's adapter-file keys without its
    ``base_model.model.`` prefix. Metadata ``'linearkit.lora'`` (JSON): ``format``
    (``ADAPTER_FORMAT``), ``targets`` (the layer paths), per layer ``rank``, ``alpha``,
    ``dropout``, ``in_features``, ``out_features``, and ``rank``/``alpha``/``dropout`` at the top
    when every layer agrees. The base weights are not written: ``load_adapter(base, path)``
    puts the adapters back onto the base model. Needs the ``safetensors`` package (the ``cli``
    extra). Returns the path written.

    Raises ValueError when the model holds no adapter.
    """
    found = adapters(model) if isinstance(model, Module) else []
    if not found:
        raise ValueError(f"save_adapter(): {type(model).__name__} holds no LoRALinear layer: "
                         "nothing to save (add_lora first)")
    arrays, per_layer = {}, {}
    for where, lora in found:
        prefix = f"{where}." if where else ""
        arrays[prefix + "lora_A.weight"] = lora.lora_A.weight.data
        arrays[prefix + "lora_B.weight"] = lora.lora_B.weight.data
        per_layer[where] = {"rank": lora.rank, "alpha": lora.alpha, "dropout": lora.dropout,
                            "in_features": lora.in_features, "out_features": lora.out_features}
    meta = {"format": ADAPTER_FORMAT, "targets": [p for p, _ in found], "layers": per_layer}
    for key in ("rank", "alpha", "dropout"):
        values = {v[key] for v in per_layer.values()}
        if len(values) == 1:
            meta[key] = values.pop()
    from ..storage.tensor_file import write_tensors

    return write_tensors(path, arrays, {"format": "np", ADAPTER_KEY: json.dumps(meta)})


def _adapter_metadata(path: str, metadata: dict) -> dict:
    """The checked JSON metadata of an adapter file, or a FormatError naming the file."""
    text = metadata.get(ADAPTER_KEY)
    if text is None:
        raise FormatError(f"holds no LoRA adapter (no {ADAPTER_KEY!r} metadata)", path=path,
                          hint="write adapters with linearkit.transforms.save_adapter; a whole "
                               "model file loads with linearkit.load_model")
    try:
        meta = json.loads(text)
    except ValueError as err:
        raise FormatError(f"the {ADAPTER_KEY!r} metadata is not valid JSON ({err})",
                          path=path) from None
    if not isinstance(meta, dict) or meta.get("format") != ADAPTER_FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise FormatError(f"adapter format {got!r}, expected {ADAPTER_FORMAT!r}", path=path,
                          hint="written by another program or a newer linearkit")
    targets, per_layer = meta.get("targets"), meta.get("layers")
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets) \
            or not isinstance(per_layer, dict) or set(per_layer) != set(targets) \
            or len(set(targets)) != len(targets):
        raise FormatError("the adapter metadata needs 'targets' (a list of distinct layer "
                          "paths) and 'layers' (an object with one entry per target)", path=path)
    for target in targets:
        entry = per_layer[target]
        ok = isinstance(entry, dict) and all(
            isinstance(entry.get(k), numbers.Real) and not isinstance(entry.get(k), bool)
            for k in ("rank", "alpha", "dropout"))
        if not ok:
            raise FormatError(f"the adapter metadata of layer {target!r} needs numbers 'rank', "
                              f"'alpha' and 'dropout', got {entry!r}", path=path)
    return meta


def _adapter_tensor(path: str, tensors: dict, key: str, shape: tuple) -> np.ndarray:
    if key not in tensors:
        raise FormatError(f"tensor {key!r} is missing (the metadata lists its layer)", path=path,
                          hint="the file was edited or written by another program")
    array = tensors[key]
    if array.dtype.kind == "V":  # bfloat16 / float8 from ml_dtypes: widen exactly
        array = array.astype(np.float32)
    if array.dtype.kind != "f":
        raise FormatError(f"tensor {key!r} has dtype {array.dtype}, expected a float", path=path)
    if array.shape != shape:
        raise FormatError(f"tensor {key!r} has shape {array.shape}, but the base model's layer "
                          f"needs {shape}", path=path,
                          hint="load the adapter onto the base model it was trained on")
    if not np.isfinite(array).all():
        raise FormatError(f"tensor {key!r} holds NaN or Inf", path=path,
                          hint="the adapter diverged or the file is corrupt")
    return array


def load_adapter(base: Module, path: str | os.PathLike, *, probe=None
                 ) -> tuple[Module, LoRAReport]:
    """A copy of ``base`` with the adapters of the file ``path`` (``save_adapter``'s) on it.

    Each layer the file names must be a plain Linear of ``base`` at that path, with the
    in/out sizes the tensors need. As after ``add_lora``, only the adapters train. The file is
    checked in full before anything is built: a malformed file, metadata that is not an
    adapter's, a missing or extra tensor, a layer ``base`` lacks or a shape that does not fit
    is a ``linearkit.FormatError`` (a ValueError) naming the file and the tensor key, and
    ``base`` is never modified.

    Returns
    -------
    adapted : Module
    report : LoRAReport
        ``max_abs_error`` / ``max_rel_error``: how far the adapters move ``base``'s outputs on
        the probes (not an error: the file's fine-tune); ``changed``: each adapted layer.
    """
    from ..storage.safetensors_header import read_tensors

    path = os.fspath(path)
    new = copy_model(base, "load_adapter")
    tensors, metadata = read_tensors(path)
    meta = _adapter_metadata(path, metadata)
    targets, per_layer = meta["targets"], meta["layers"]
    expected = {f"{t}.{name}" if t else name for t in targets
                for name in ("lora_A.weight", "lora_B.weight")}
    extra = sorted(set(tensors) - expected)
    if extra:
        raise FormatError(f"tensor {extra[0]!r} is not a LoRA factor of a listed layer "
                          f"(an adapter file holds only lora_A/lora_B of {targets})", path=path,
                          hint="a whole model file loads with linearkit.load_model")
    modules = dict(new.named_modules())
    existing = {p for p, _ in adapters(new)}
    plan = []
    for target in targets:
        key_a = f"{target}.lora_A.weight" if target else "lora_A.weight"
        key_b = f"{target}.lora_B.weight" if target else "lora_B.weight"
        layer = modules.get(target)
        if layer is None or adapter_owner(target, existing) is not None:
            there = ", ".join(repr(p) for p, m in modules.items()
                              if lists(m, "add_lora")) or "none"
            raise FormatError(f"tensor {key_a!r}: the base model has no layer {target!r} to "
                              f"adapt; its Linear layers are: {there}", path=path,
                              hint="load the adapter onto the base model it was trained on")
        if not lists(layer, "add_lora"):  # a plain Linear: its own rule lists add_lora
            raise FormatError(f"tensor {key_a!r}: layer {named(target, layer)} of the base "
                              "model is not a plain Linear", path=path,
                              hint=("merge_lora() the model first" if lists(
                                  layer, "merge_lora") else "load it onto the base model it "
                                  "was trained on"))
        entry = per_layer[target]
        rank = tensors[key_a].shape[0] if key_a in tensors and tensors[key_a].ndim == 2 else 0
        if rank != entry["rank"]:
            raise FormatError(f"tensor {key_a!r} has shape {tensors.get(key_a, np.empty(0)).shape}"
                              f", but the metadata gives rank {entry['rank']}", path=path)
        a = _adapter_tensor(path, tensors, key_a, (rank, layer.in_features))
        b = _adapter_tensor(path, tensors, key_b, (layer.out_features, rank))
        plan.append((target, layer, entry, a, b))
    refuse_tied(new, [(target, layer) for target, layer, *_ in plan], "load_adapter")
    changed, layers, adapted = [], [], set()
    for target, layer, entry, a, b in plan:
        try:
            lora = wrap(layer, entry["rank"], entry["alpha"], entry["dropout"],
                         np.random.default_rng(0))
        except (TypeError, ValueError) as err:
            raise FormatError(f"the adapter of layer {target!r} cannot be built: {err}",
                              path=path) from None
        lora.lora_A.weight.data[...] = a
        lora.lora_B.weight.data[...] = b
        new = set_submodule(new, target, lora)
        adapted.add(target)
        changed.append(added_line(target, layer, lora).replace("base frozen, +", "loaded, +"))
        layers.append(layer_info(target, lora))
    freeze_all_but_adapters(new)
    left = left_frozen(new, adapted | existing)
    report = finish("load_adapter", base, new, probe, changed, left, layers)
    return new, lora_report(report, new)
