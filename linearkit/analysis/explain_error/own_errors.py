"""linearkit's own errors: ``ShapeError``/``DTypeError``/... name the module path, its
signature, the detail and a hint (``module 'classifier.2' (Linear(...)): expected input of shape
(*, 256), got (16, 512)``, then ``  hint: ...``); ``FormatError`` names the file and the problem.

``parse_own`` takes one apart (from the exception object, or from its text); ``CLASSES`` restate
the details linearkit raises for the same mistakes as PyTorch's messages, with the same kinds;
any other linearkit error is restated as it is (``restate``), its path and hint kept.
"""

from __future__ import annotations

import re

from ... import layers, losses
from ...errors import FormatError, Located
from .context import Context, OwnError, ints
from .explanation import Explanation, where
from .load_loss_classes import (
    batch_size_mismatch,
    ce_target_dtype,
    dtype_mismatch,
    target_out_of_range,
    target_shape,
)
from .shape_classes import batchnorm_mismatch, layernorm_mismatch, linear_mismatch

__all__ = ["CLASSES", "file_error", "parse_own", "restate"]

_SIG = r"[A-Za-z_]\w*\(.*?\)"
_PATH_FORM = re.compile(rf"\Amodule '(?P<path>[^']*)' \((?P<sig>{_SIG})\): (?P<detail>.*?)"
                        r"(?:\n  hint: (?P<hint>.*))?\Z", re.DOTALL)
_ROOT_FORM = re.compile(rf"\A(?P<sig>{_SIG}): (?P<detail>.*?)(?:\n  hint: (?P<hint>.*))?\Z",
                        re.DOTALL)
_FILE_FORM = re.compile(r"\A(?P<path>[^\n]+?): (?P<problem>[^\n]+)\n  hint: (?P<hint>.*)\Z",
                        re.DOTALL)


def _linearkit_type(name: str, view) -> bool:
    """Whether ``name`` is a linearkit layer or loss class, or the class of a module in the
    model given."""
    if any(isinstance(getattr(room, name, None), type) for room in (layers, losses)):
        return True
    return view is not None and any(type(m).__name__ == name for m in view.by_path.values())


def parse_own(exc, text: str, view):
    """An ``OwnError`` for a linearkit layer or loss error, a ``FormatError``-like
    ``(path, problem, hint)`` tuple for a file error, or None for any other message."""
    if isinstance(exc, FormatError):
        return exc.path, exc.problem, exc.hint
    if isinstance(exc, Located):
        module = exc.module
        path = exc.path
        if view is not None and module is not None:
            path = view.path_of(module)  # None: the loss, or a module outside this model
        sig = module._signature() if module is not None else ""
        return OwnError(path, sig, exc.detail, exc.hint, module)
    m = _PATH_FORM.match(text)
    if m:
        return OwnError(m["path"], m["sig"], m["detail"], m["hint"])
    m = _ROOT_FORM.match(text)
    if m and _linearkit_type(m["sig"].split("(", 1)[0], view):
        path = None
        if view is not None and type(view.model).__name__ == m["sig"].split("(", 1)[0]:
            path = ""  # the model itself raised
        return OwnError(path, m["sig"], m["detail"], m["hint"])
    m = _FILE_FORM.match(text)
    if m:
        return m["path"], m["problem"], m["hint"]
    return None


def file_error(parsed, text: str) -> Explanation:
    path, problem, hint = parsed
    cause = f"linearkit refused the file {path}: {problem}" if path else \
        f"linearkit refused the file: {problem}"
    return Explanation(True, "file_format", cause, None,
                       hint or "re-export the file with safetensors' save_file or "
                               "linearkit's save", text)


def _module_int(ctx: Context, attr: str):
    module = None if ctx.own is None else ctx.own.module
    if module is None and ctx.view is not None and ctx.own.path is not None:
        module = ctx.view.by_path.get(ctx.own.path)
    value = getattr(module, attr, None)
    if value is None and ctx.own is not None:
        m = re.search(rf"{attr}=(\d+)", ctx.own.signature)
        value = int(m.group(1)) if m else None
    return value


def _width(m, ctx: Context):
    dims, got = ints(m.group(1)), ints(m.group(2))
    name = ctx.own.type_name
    if name == "LayerNorm" or "normalized_shape" in ctx.own.signature:
        return layernorm_mismatch(ctx, dims, got)
    out = _module_int(ctx, "out_features")
    if out is None or len(dims) != 1 or not got:
        return restate(ctx)
    return linear_mismatch(ctx, got[-1], dims[0], out, got)


def _batchnorm(m, ctx: Context):
    got = ints(m.group(2))
    return batchnorm_mismatch(ctx, got[1] if len(got) > 1 else got[-1], int(m.group(1)))


def _ce_range(m, ctx: Context):
    return target_out_of_range(ctx, int(m.group(1)), int(m.group(2)))


def _ce_target(m, ctx: Context):
    wanted, dtype, got = ints(m.group(1)), m.group(2), ints(m.group(3))
    if dtype.startswith(("int", "uint")):
        if len(got) == len(wanted) + 1:
            return target_shape(ctx)
        return batch_size_mismatch(ctx, wanted[0] if wanted else 1, got[0] if got else 1)
    return ce_target_dtype(ctx, dtype)


def _dy(m, ctx: Context):
    dy, y = ints(m.group(1)), ints(m.group(2))
    path = ctx.own.path
    cause = (f"the gradient given to the backward of {where(path)} has shape {list(dy)}, but "
             f"its forward output has shape {list(y)}")
    return ctx.explanation("grad_shape", cause, ctx.own.hint or
                           f"pass a gradient of the output's shape {list(y)}", path)


def _loss_target(m, ctx: Context):
    target, pred = ints(m.group(1)), ints(m.group(2))
    cause = (f"{ctx.own.type_name}'s target has shape {list(target)} but the prediction "
             f"{list(pred)}; linearkit does not broadcast a target (PyTorch warns and does, "
             f"which usually computes the wrong loss)")
    fix = "give the target the prediction's shape" + (
        f", or make the model's last layer output {target[-1]} features"
        if len(target) == len(pred) and target[-1] != pred[-1] else "")
    return ctx.explanation("loss_target_shape", cause, fix)


def _residual(m, ctx: Context):
    before, after = ints(m.group(1)), ints(m.group(2))
    path = ctx.own.path
    cause = (f"the block inside {where(path)} maps {list(before)} to {list(after)}; a residual "
             f"connection adds its input, so both must have one shape")
    return ctx.explanation("residual_width", cause, ctx.own.hint or
                           "make the block end with as many features as it starts with", path)


def _dtype(m, ctx: Context):
    return dtype_mismatch(ctx, m.group(2), m.group(1), fix=ctx.own.hint or
                          f"cast the input: x.astype(np.{m.group(1)})")


def restate(ctx: Context) -> Explanation:
    """Any other linearkit error: its own words, its module path and its hint."""
    own = ctx.own
    who = own.signature or "a linearkit module"
    at = "" if own.path is None else f" at {where(own.path)}"
    cause = f"linearkit's error from {who}{at}: {own.detail}"
    fix = own.hint or "the message says what the module expected: change the input or the layer"
    return ctx.explanation("linearkit_error", cause, fix, own.path)


CLASSES = [
    (re.compile(r"\Aexpected input of shape \(\*, ([\d,\s]+)\), got \(([\d,\s]*)\)\Z"), _width),
    (re.compile(r"\Aexpected input of shape \(N, (\d+)\) or \(N, \d+, L\), got "
                r"\(([\d,\s]*)\)\Z"), _batchnorm),
    (re.compile(r"target holds class index (-?\d+), but pred has C=(\d+) classes"), _ce_range),
    (re.compile(r"expected class indices \(integer, shape \(([\d,\s]*)\)\) or class "
                r"probabilities .*?, got (\w+) target of shape \(([\d,\s]*)\)"), _ce_target),
    (re.compile(r"backward got dy of shape \(([\d,\s]*)\), but the forward output has shape "
                r"\(([\d,\s]*)\)"), _dy),
    (re.compile(r"target shape \(([\d,\s]*)\) must equal pred shape \(([\d,\s]*)\)"),
     _loss_target),
    (re.compile(r"the wrapped module maps shape \(([\d,\s]*)\) to \(([\d,\s]*)\); a residual"),
     _residual),
    (re.compile(r"\Aexpected a (?:floating-point )?(\w+) input\b.*?, got (\w+)"), _dtype),
]
