"""int8 quantization: ``quantize_weight`` on arrays, ``quantize(model, "int8")`` on models.

Symmetric, per output channel, int8 storage, float32 accumulation, dequantized output; the
arithmetic (and how it differs from torch.ao's observers) is in ``linearkit.layers.quantized``.
Each targeted plain ``Linear`` becomes a ``QuantizedLinear``; everything else stays float. A
quantized model runs (``model(x)``), saves and loads (``linearkit.save`` / ``load_model``, the
weights stored as I8), and refuses to train (its ``vjp`` raises ``QuantizedTrainingError``).
"""

from __future__ import annotations

import numpy as np

from ..core.module import Module
from ..errors import ShapeError
from ..layers.quantized import ACTIVATION_MODES, QuantizedLinear, int8_rows
from ..rules import rule_for
from .transform_report import evaluating, hooks_off, probe_inputs, state_size
from .walk import copy_model, finish, named, paths_text, replace_everywhere, select_linears, uses

__all__ = ["SCHEMES", "quantize", "quantize_weight"]

#: The schemes ``quantize`` knows.
SCHEMES = {"int8": "symmetric per-output-channel int8 weights, float32 accumulation "
                   "(activations='dynamic': per-row int8 activations too)"}


def quantize_weight(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-output-channel int8 quantization of a weight: ``(q, scale)``.

    Parameters
    ----------
    w : ndarray ``(out, in)``, floating, finite

    Returns
    -------
    q : int8 ``(out, in)``, ``clip(round_half_even(w / scale[:, None]), -127, 127)``
    scale : float32 ``(out,)``, ``max|w[o, :]| / 127``; an all-zero row gets scale 1 (its q is
        0 and it dequantizes to exactly 0).

    ``|w - q * scale[:, None]| <= scale[:, None] / 2`` elementwise. Unlike torch.ao's
    ``PerChannelMinMaxObserver`` (``max|w| / 127.5``, range ``[-128, 127]``) the range is
    symmetric and each row's largest weight is exactly ``±127 * scale``.

    Examples
    --------
    >>> import numpy as np
    >>> from linearkit.transforms import quantize_weight
    >>> q, scale = quantize_weight(np.array([[1.27, -0.5, 0.0], [0.0, 0.0, 0.0]], np.float32))
    >>> q.tolist(), scale.tolist()
    ([[127, -50, 0], [0, 0, 0]], [0.009999999776482582, 1.0])
    """
    w = np.asarray(w)
    if w.ndim != 2 or w.dtype.kind != "f":
        raise ValueError(f"quantize_weight() takes a floating weight of shape (out, in), got "
                         f"{w.dtype} of shape {w.shape}")
    if not np.isfinite(w).all():
        raise ValueError("quantize_weight(): the weight holds NaN or Inf, which no finite scale "
                         "represents; fix the model (it diverged) before quantizing")
    q, scale = int8_rows(w, np.float32)
    return q.astype(np.int8), scale


def quantize(model: Module, scheme: str = "int8", *, activations: str | None = None,
             targets=None, probe=None):
    """Replace every targeted plain ``Linear`` by its int8 ``QuantizedLinear``:
    ``(new_model, report)``; ``model`` is not modified.

    A Linear used at several paths (tied) is one layer: it becomes one ``QuantizedLinear``,
    put at each of its paths, so the new model is tied the same way.

    Parameters
    ----------
    scheme : 'int8' (the only one; anything else is a ValueError listing the schemes)
    activations : None (weight-only) or 'dynamic' (per-row int8 activations too)
    targets : None (every Linear) or path(s) / suffixes / globs (see ``walk.select_linears``)
    probe : optional batch of real inputs ``(N, in)``, checked beside 64 random rows

    Report
    ------
    The model-level errors and sizes (``TransformReport``; ``bytes_after`` counts the int8
    weights, float32 scales and biases: ~1/4 of the float32 weights' bytes), ``changed`` /
    ``left`` lines, and ``report.layers``: one dict per quantized layer with ``path``,
    ``bytes_before``, ``bytes_after``, ``max_abs_weight_error`` (max |w - q·scale|, at most
    half the row's scale), ``output_rel_error`` (max |Δy| / max |y| of that layer alone on the
    inputs that reach it when the probes run through the model; None if none reach it).

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> from linearkit.transforms import quantize
    >>> model = lk.Sequential(lk.Linear(64, 32), lk.ReLU(), lk.Linear(32, 10))
    >>> small, report = quantize(model, "int8")
    >>> type(small[0]).__name__, report.bytes_before, report.bytes_after
    ('QuantizedLinear', 9640, 2704)
    """
    if scheme not in SCHEMES:
        there = "; ".join(f"{name!r}: {what}" for name, what in SCHEMES.items())
        raise ValueError(f"quantize(): unknown scheme {scheme!r}; the schemes are: {there}")
    if activations not in ACTIVATION_MODES:
        raise ValueError(f"quantize(): activations must be None (weight-only) or 'dynamic' "
                         f"(per-row int8 activations too), got {activations!r}")
    transform = f"quantize({scheme})"
    new = copy_model(model, "quantize")
    chosen = select_linears(new, targets, "quantize")
    for path, layer in chosen:
        if not np.isfinite(layer.weight.data).all():
            raise ValueError(f"quantize(): {named(path, layer)} has NaN or Inf in its weight, "
                             "which no finite scale represents; fix the model (it diverged) "
                             "before quantizing")
    where = uses(new)
    changed, left, layers = [], [], []
    # The copy's layers run here (recording inputs, measuring each layer's error) with the call
    # hooks they were copied with set aside: a user's hook is not for the transform's runs.
    with hooks_off(new):
        inputs = _layer_inputs(new, [m for _, m in chosen], probe_inputs(model, probe))
        for (path, layer), seen in zip(chosen, inputs):
            ql = QuantizedLinear.from_linear(layer, activations)
            layers.append(_figures(path, layer, ql, seen))
            f = layers[-1]
            rel = "n/a" if f["output_rel_error"] is None else f"{f['output_rel_error']:.3g}"
            paths = where[id(layer)]
            tied = (f"; one layer used at {paths_text(paths)} (tied): the same QuantizedLinear "
                    "at each" if len(paths) > 1 else "")
            changed.append(f"{named(path, layer)} -> {rule_for(ql).describe_module(ql)}: "
                           f"{f['bytes_before']:,} -> {f['bytes_after']:,} bytes, max |dw| "
                           f"{f['max_abs_weight_error']:.3g}, layer output rel error {rel}{tied}")
            new = replace_everywhere(new, paths, ql)
    left += _left_float(model, {p for p, _ in chosen})
    return new, finish(transform, model, new, probe, changed, left, layers)


def _layer_inputs(model: Module, layers: list, probes: list) -> list[list]:
    """The inputs each of ``layers`` receives while ``model`` (eval mode) runs the probes (a
    layer used at several paths records the inputs of every use)."""
    seen = {id(m): [] for m in layers}
    handles = [m.register_forward_pre_hook(lambda mod, args: seen[id(mod)].append(args[0]))
               for m in layers]
    try:
        with evaluating(model):
            for x in probes:
                try:
                    model(x)
                except ShapeError as err:
                    raise ValueError(f"the probe inputs do not fit the model ({err}); pass a "
                                     "batch of real inputs as probe=") from None
    finally:
        for handle in handles:
            handle.remove()
    return [seen[id(m)] for m in layers]


def _max_weight_error(w: np.ndarray, q: np.ndarray, scale: np.ndarray) -> float:
    """``max |w - q * scale[:, None]|`` over ``w (out, in)``, in float64, a block of rows at a
    time (the float64 copies of a whole weight would be several times its size)."""
    rows = max(1, (1 << 16) // max(w.shape[1], 1))
    err = 0.0
    for lo in range(0, w.shape[0] if w.size else 0, rows):
        part = slice(lo, lo + rows)
        deq = q[part].astype(np.float64) * scale[part].astype(np.float64)[:, None]
        err = max(err, float(np.abs(w[part].astype(np.float64) - deq).max()))
    return err


def _figures(path: str, layer, ql: QuantizedLinear, inputs: list) -> dict:
    err = _max_weight_error(layer.weight.data, ql.weight, ql.weight_scale)
    rel = None
    if inputs:
        diff = ref = 0.0
        for x in inputs:
            a = np.asarray(layer(x), np.float64)
            if a.size:
                diff = max(diff, float(np.abs(np.asarray(ql(x), np.float64) - a).max()))
                ref = max(ref, float(np.abs(a).max()))
        rel = diff / ref if ref > 0 else (0.0 if diff == 0 else float("inf"))
    return {"path": path, "bytes_before": state_size(layer)[1],
            "bytes_after": state_size(ql)[1], "max_abs_weight_error": err,
            "output_rel_error": rel}


def _left_float(model: Module, quantized: set) -> list[str]:
    """A line for each leaf layer of ``model`` that keeps float parameters, with why."""
    candidates = {p for p, _ in select_linears(model, None, "quantize")}
    out = []
    for path, m in model.named_modules():
        if path in quantized or any(True for _ in m.children()) \
                or not any(True for _ in m.parameters()):
            continue
        why = ("not among targets" if path in candidates
               else "only plain Linear layers are quantized")
        out.append(f"{named(path, m)}: stays float ({why})")
    return out
