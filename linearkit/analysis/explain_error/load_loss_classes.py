"""The message classes about loading a state dict (size mismatch, transposed weights, key
sets), dtypes, and the classification losses' targets (out of range, dtype, shape, batch size).
"""

from __future__ import annotations

import re

from .context import Context, ints
from .explanation import where

__all__ = ["CLASSES", "batch_size_mismatch", "ce_target_dtype", "dtype_mismatch",
           "target_out_of_range", "target_shape"]

_TORCH_DTYPE = {"double": "float64", "float": "float32", "half": "float16",
                "bfloat16": "bfloat16", "long": "int64", "int": "int32", "byte": "uint8",
                "bool": "bool"}


def _dtype_name(text: str) -> str:
    """'Double', 'torch.DoubleTensor', 'double' -> 'float64' (other names unchanged)."""
    base = text.split(".")[-1].removesuffix("Tensor").lower()
    return _TORCH_DTYPE.get(base, base)


def _size_entries(text: str) -> list:
    """``[(key, checkpoint shape, model shape)]`` of every size-mismatch line of a
    ``load_state_dict`` message (torch's ``torch.Size([..])`` or linearkit's ``(..)``)."""
    shape = r"(?:torch\.Size\(\[([\d,\s]*)\]\)|\(([\d,\s]*)\))"
    found = re.findall(rf"size mismatch for ([^:\s]+): copying a param with shape {shape} from "
                       rf"checkpoint, the shape in current model is {shape}", text)
    return [(k, ints(a or b), ints(c or d)) for k, a, b, c, d in found]


def _module_path(key: str) -> str:
    return key.rsplit(".", 1)[0] if "." in key else ""


def _state_size(m, ctx):
    entries = _size_entries(ctx.text)
    transposed = [e for e in entries if len(e[1]) == 2 and e[1] == e[2][::-1] and e[1] != e[2]]
    others = [e for e in entries if e not in transposed]
    if len(entries) > 1:
        ctx.notes.append(f"{len(entries)} entries differ: "
                         + ", ".join(f"{k} {list(a)} vs {list(b)}" for k, a, b in entries[1:4]))
    if not others:
        key, ck, mod = transposed[0]
        cause = (f"the checkpoint's {key} has shape {list(ck)}, the transpose of the model's "
                 f"{list(mod)}: it stores the weight as (in_features, out_features), as "
                 f"JAX/Keras/TF kernels do, where a Linear keeps (out_features, in_features)")
        if ctx.view is not None and ctx.view.is_torch:
            fix = f'transpose it before loading: sd["{key}"] = sd["{key}"].T'
        else:
            fix = (f'load with model.load_state_dict(sd, layout="in_out") (it transposes every '
                   f'Linear weight), or sd["{key}"] = sd["{key}"].T')
        return ctx.explanation("state_dict_transposed", cause, fix, _module_path(key))
    key, ck, mod = others[0]
    path = _module_path(key)
    module = None if ctx.view is None else ctx.view.by_path.get(path)
    name = type(module).__name__ if module is not None else None
    cause = (f"the checkpoint's {key} has shape {list(ck)} but the model's is {list(mod)}: the "
             f"checkpoint was saved from a model where {where(path)} has another size")
    if len(ck) == 2 and (name is None or hasattr(module, "in_features")):
        fix = (f"build {where(path)} as {name or 'Linear'}({ck[1]}, {ck[0]}), the checkpoint's "
               f"size (the model has {name or 'Linear'}({mod[1]}, {mod[0]}))")
    elif len(ck) == 1 and name is not None and not hasattr(module, "out_features"):
        fix = f"build {where(path)} as {name}({ck[0]}), the checkpoint's size"
    elif len(ck) == 1:
        fix = (f"give {where(path)} {ck[0]} features, the checkpoint's size (out_features="
               f"{ck[0]} for a Linear, LayerNorm({ck[0]}) or BatchNorm1d({ck[0]}) for a norm)")
    else:
        fix = f"build {where(path)} with the checkpoint's shape {list(ck)}"
    return ctx.explanation("state_dict_size", cause, fix, path)


def _state_keys(m, ctx):
    lists = {kind: re.findall(r'"([^"]*)"', names) for kind, names in re.findall(
        r"(Missing|Unexpected) key\(s\) in state_dict: ((?:\"[^\"]*\"(?:, )?)+)", ctx.text)}
    missing, unexpected = lists.get("Missing", []), lists.get("Unexpected", [])
    pairs = list(zip(sorted(unexpected), sorted(missing), strict=False))
    prefixes = {u[:len(u) - len(k)] for u, k in pairs if u.endswith(k) and u != k}
    if missing and len(missing) == len(unexpected) and len(prefixes) == 1 and all(
            u == next(iter(prefixes)) + k for u, k in pairs):
        (prefix,) = prefixes
        cause = (f"every checkpoint key has the extra prefix {prefix!r} (a model saved while "
                 f"wrapped, e.g. in DataParallel or DistributedDataParallel, saves 'module.')")
        fix = f"strip it: sd = {{k.removeprefix({prefix!r}): v for k, v in sd.items()}}"
        return ctx.explanation("state_dict_keys", cause, fix)
    parts = [f"{len(missing)} model key(s) are not in the checkpoint (e.g. {missing[0]!r})"
             if missing else "", f"{len(unexpected)} checkpoint key(s) are not in the model "
             f"(e.g. {unexpected[0]!r})" if unexpected else ""]
    cause = "the checkpoint's keys differ from the model's: " + "; ".join(p for p in parts if p)
    fix = ("build the model the checkpoint was saved from (same attribute names and layers), "
           "or pass strict=False to skip those keys knowingly")
    return ctx.explanation("state_dict_keys", cause, fix,
                           _module_path(missing[0]) if missing else None)


def dtype_mismatch(ctx: Context, got: str, wanted: str, what: str = "the input", fix=None):
    """``what`` is ``got`` where the layer's parameters are ``wanted`` (dtype names)."""
    found = ctx.failure()
    path = None if found is None else found.path
    if path is None and ctx.view is not None and what == "the input":
        # the input meets the parameters first at the first layer that has some of its own
        path, _ = next(iter(ctx.view.find(lambda m: any(True for _ in m.parameters(
            recurse=False)))), (None, None))
        if path is not None:
            ctx.notes.append(f"{where(path)} is the first layer with parameters, the first the "
                             f"input meets")
    owner = "the layer" if path is None else f"the layer {where(path)}" if path else "the model"
    cause = (f"{what} is {got} but the parameters of {owner} are {wanted}: the matmul does not "
             f"promote between dtypes")
    fix = fix or f"cast {what}: .to(torch.{wanted}) (or convert the model: model.to(torch.{got}))"
    return ctx.explanation("dtype_mismatch", cause, fix, path)


def _same_dtype(m, ctx):
    return dtype_mismatch(ctx, _dtype_name(m.group(1)), _dtype_name(m.group(2)))


def _found_dtype(m, ctx):
    return dtype_mismatch(ctx, _dtype_name(m.group(1)), _dtype_name(m.group(2)),
                          "a tensor in the backward (usually the loss's target)")


def _head(ctx: Context):
    """``(path, module)`` of the model's last Linear, the one that makes the logits."""
    linears = [] if ctx.view is None else ctx.view.linears()
    return linears[-1] if linears else (None, None)


def target_out_of_range(ctx: Context, target: int, classes: int | None = None):
    """A class index ``target`` outside ``0..classes-1`` (``classes`` None: from the model)."""
    path, head = _head(ctx)
    c = classes if classes is not None else getattr(head, "out_features", None)
    where_c = (f"the logits have C={c} classes (valid labels 0..{c - 1})" if c is not None
               else "a class index must be below the number of classes C, the logits' size")
    if target < 0:
        cause = f"a target holds the label {target}: labels are 0..C-1; {where_c}"
        fix = ("mark entries to skip with ignore_index (-100 by default) and drop other "
               "negative labels")
        return ctx.explanation("ce_target_range", cause, fix, path)
    cause = f"a target holds the class index {target}, but {where_c}"
    if c is not None and target == c:
        fix = (f"the labels look 1-based (1..{c}): pass target - 1; or, with {c + 1} classes, "
               f"give {where(path)} out_features={c + 1}")
    elif c is not None:
        fix = f"give {where(path)} out_features={target + 1} or more: one output per class"
    else:
        fix = (f"the model's last Linear needs out_features > {target} (one output per class),"
               f" or the labels are 1-based: pass target - 1")
    return ctx.explanation("ce_target_range", cause, fix, path)


def _ce_range(m, ctx):
    return target_out_of_range(ctx, int(m.group(1)))


def _ce_assert(m, ctx):
    path, head = _head(ctx)
    c = getattr(head, "out_features", None)
    ctx.notes.append("a device assert does not say which label: check target.min() and "
                     "target.max() on the CPU")
    cause = "a target holds a class index outside 0..C-1" + (
        f" (the logits have C={c} classes)" if c is not None else " (C: the logits' size)")
    fix = (f"make every label 0..{c - 1 if c is not None else 'C-1'}, or give {where(path)} "
           f"one output per class")
    return ctx.explanation("ce_target_range", cause, fix, path)


def ce_target_dtype(ctx: Context, got: str):
    cause = (f"the loss got {got} targets where it takes class indices as int64 (Long) of shape "
             f"(N,), or class probabilities as floats of the logits' shape (N, C)")
    if got.startswith(("float", "bfloat")):
        fix = "pass integer class indices: target.long() (torch) / target.astype(np.int64)"
    else:
        fix = "cast the class indices to int64: target.long() (torch) / target.astype(np.int64)"
    return ctx.explanation("ce_target_dtype", cause, fix)


def _ce_dtype(m, ctx):
    return ce_target_dtype(ctx, _dtype_name(m.group(1)))


def _ce_probabilities(m, ctx):
    cause = (f"the target has the logits' shape, so it is read as class probabilities, which "
             f"must be floating point; it is {_dtype_name(m.group(1))}")
    return ctx.explanation("ce_target_dtype", cause, "pass target.float() for probabilities, or "
                           "class indices of shape (N,): target.argmax(dim=1) for one-hot rows")


def target_shape(ctx: Context):
    """A class-index target with one dim too many (one-hot rows, an (N, 1) column)."""
    cause = ("the loss takes class indices of shape (N,) (one per sample), and the target has "
             "one more dim (one-hot rows, or an (N, 1) column)")
    fix = "pass target.argmax(dim=1) for one-hot rows, target.squeeze(1) for an (N, 1) column"
    return ctx.explanation("ce_target_shape", cause, fix)


def batch_size_mismatch(ctx: Context, n: int, t: int):
    """``n`` predictions (rows of the logits) against ``t`` targets."""
    cause = (f"the loss got {n} predictions but {t} targets: a view/reshape folded the batch "
             f"into another dim (x.view(-1, F) with the wrong F), or they come from different "
             f"batches")
    fix = "keep the batch dim in every reshape: x.view(x.size(0), -1) or Flatten()"
    return ctx.explanation("batch_size_mismatch", cause, fix)


CLASSES = [
    (re.compile(r"size mismatch for [^:\s]+: copying a param with shape"), _state_size),
    (re.compile(r"(?:Missing|Unexpected) key\(s\) in state_dict: \""), _state_keys),
    (re.compile(r"Target (-?\d+) is out of bounds"), _ce_range),
    (re.compile(r"t >= 0 && t < n_classes"), _ce_assert),
    (re.compile(r"expected target dtype to be Long or Byte, but got (\w+)"), _ce_dtype),
    (re.compile(r"expected scalar type Long but found (\w+)"), _ce_dtype),
    (re.compile(r"\"nll_loss\w*\" not implemented for '(\w+)'"), _ce_dtype),
    (re.compile(r"Expected floating point type for target with class probabilities, got (\w+)"),
     _ce_probabilities),
    (re.compile(r"\dD or \dD target tensor expected, multi-target not supported"),
     lambda m, ctx: target_shape(ctx)),
    (re.compile(r"Expected input batch_size \((\d+)\) to match target batch_size \((\d+)\)"),
     lambda m, ctx: batch_size_mismatch(ctx, int(m.group(1)), int(m.group(2)))),
    (re.compile(r"mat1 and mat2 must have the same dtype, but got (\w+) and (\w+)"), _same_dtype),
    (re.compile(r"expected m1 and m2 to have the same dtype, but got: (\w+) != (\w+)"),
     _same_dtype),
    (re.compile(r"expected scalar type (\w+) but found (\w+)"),
     lambda m, ctx: dtype_mismatch(ctx, _dtype_name(m.group(2)), _dtype_name(m.group(1)))),
    (re.compile(r"Input type \(([\w.]+)\) and (?:weight|bias) type \(([\w.]+)\) should be the "
                r"same"), _same_dtype),
    (re.compile(r"Found dtype (\w+) but expected (\w+)"), _found_dtype),
]
