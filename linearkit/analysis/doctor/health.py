"""Health on one batch: per-layer statistics (``analysis.stats``), the healthy bands, the first
layer outside them, and a verdict with remedies in order of likelihood.

One forward and backward of a *copy* of each piece runs under ``stats.StatsRecorder`` with its
arrays kept, so every figure of ``record_stats`` is reproduced exactly, and more are read off
the same arrays: the fraction of *dead units* of each ReLU (units that output 0 for every row
of the batch), whether all units of a layer are *identical* (same output on every row, and the
same gradient), and ``‖∇W‖ / ‖W‖`` per weight. Stats records leaves only; the output and
gradient of each *block* of the main path (a step with children: a ``Residual``, a
``LoRALinear``) are recorded here too, by call hooks on the copy.

The main path is the chain of steps the signal goes through: the children of a Sequential (of
its nested Sequentials, recursively); any other module is one step. The activation and
gradient bands apply to it, not to a Residual's branch or a composite layer's parts, whose
small outputs can be by design (a LoRA ``B`` starts at zero).

The bands (``BANDS``; docs/doctor.md explains each):

* ``activation``: a hidden step's output std divided by the std of the model's input, in
  ``[1e-2, 1e2]``. The steps from the last parametrized one on (the logits) are left out: their
  scale is set by the loss, not by how the signal propagates;
* ``gradient``: ``‖dy‖`` flowing into a step's output divided by ``‖dL/d(output)‖`` at the
  model's output, in ``[1e-2, 1e2]``; scanned from the loss backwards, the way gradients flow;
* ``grad_to_weight``: ``‖∇W‖ / ‖W‖`` of each weight (2-D parameter) in ``[1e-8, 10]``;
* ``dead_units``: below 0.9 of a ReLU's units dead on the batch;
* symmetry: no hidden layer whose units are all identical in output *and* gradient.

The verdict is the first of: non-finite values, symmetry, dead ReLUs, activations out of band
(first in forward order), gradients out of band (first from the loss), ``‖∇W‖/‖W‖`` out of
band; the others are listed under it.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import numpy as np

from ...rules import rule_for
from ..stats import StatsRecorder, StatsReport

__all__ = ["BANDS", "Health", "LayerHealth", "Remedy", "examine"]

#: The healthy bands (see the module docstring and docs/doctor.md).
BANDS = {
    "activation": (1e-2, 1e2),
    "gradient": (1e-2, 1e2),
    "grad_to_weight": (1e-8, 10.0),
    "dead_units": 0.9,
}
# Relative spread across units below which a layer's units count as identical: float32 rounding
# in a 256-wide dot product is ~1e-6 of the result, far below these.
_SAME_OUTPUT = 1e-4
_SAME_GRAD = 1e-3
_RELU_TYPES = {"ReLU"}
_NONFINITE = "non-finite"
_CONTAINERS = ("sequential", "residual")
_FAMILY = {"ReLU": "relu", "GELU": "relu", "SiLU": "relu", "LeakyReLU": "leaky_relu",
           "Tanh": "tanh", "Sigmoid": "sigmoid"}


@dataclass
class LayerHealth:
    """One layer (one call position) on the batch.

    The statistics of ``stats.LayerStats`` (``mean``, ``std``, ``max_abs``, ``zero_fraction``
    of the output ``y (B, *out)``; ``grad_out_norm`` = ‖dy‖, ``grad_in_norm`` = ‖dx‖;
    ``param_grad_norms``, ``param_norms`` by parameter name), plus: ``dead_units`` (ReLU only:
    fraction of the last axis's units that are 0 on every row), ``identical_units`` (every unit
    gives the same output on every row), ``identical_grads`` (and receives the same gradient),
    ``grad_to_weight`` (``‖∇p‖/‖p‖`` per 2-D parameter), ``act_ratio`` (std / the input's std;
    None for the output layers and off the main path), ``grad_ratio`` (‖dy‖ / ‖dL/d output‖;
    main path only), ``hidden`` (before the output layer), ``problems`` (the bands it leaves,
    as short labels), ``label`` (the ledger's type text, ``Linear(40, 100)``).

    ``kind`` is ``'layer'`` for a leaf (its figures are ``record_stats``') or ``'block'`` for a
    step of the main path that has children (a ``Residual``: its output, recorded by the
    doctor); ``main``: a step of the main path, where the activation and gradient bands apply;
    ``within``: the block it sits in (a Residual's branch); ``in_composite``: a part of a
    composite layer (LoRALinear's ``lora_B``, zero by design), where the weight and symmetry
    checks do not apply either; ``has_params``: it holds parameters.
    """

    path: str
    type: str
    shape: tuple | None
    mean: float | None
    std: float | None
    max_abs: float | None
    zero_fraction: float | None
    grad_out_norm: float | None
    grad_in_norm: float | None
    param_grad_norms: dict
    param_norms: dict
    dead_units: float | None = None
    identical_units: bool | None = None
    identical_grads: bool | None = None
    grad_to_weight: dict = field(default_factory=dict)
    act_ratio: float | None = None
    grad_ratio: float | None = None
    hidden: bool = True
    problems: list = field(default_factory=list)
    label: str = ""
    kind: str = "layer"
    main: bool = True
    within: str | None = None
    in_composite: bool = False
    has_params: bool = False

    @property
    def symmetric(self) -> bool:
        """Every unit identical in output and gradient: training can never tell them apart."""
        return bool(self.hidden and self.identical_units and self.identical_grads)

    def to_dict(self) -> dict:
        return {"path": self.path, "type": self.type, "label": self.label or self.type,
                "shape": None if self.shape is None else list(self.shape),
                "mean": self.mean, "std": self.std, "max_abs": self.max_abs,
                "zero_fraction": self.zero_fraction, "dead_units": self.dead_units,
                "grad_out_norm": self.grad_out_norm, "grad_in_norm": self.grad_in_norm,
                "param_grad_norms": dict(self.param_grad_norms),
                "param_norms": dict(self.param_norms), "grad_to_weight": dict(self.grad_to_weight),
                "act_ratio": self.act_ratio, "grad_ratio": self.grad_ratio,
                "hidden": self.hidden, "identical_units": self.identical_units,
                "identical_grads": self.identical_grads, "symmetric": self.symmetric,
                "kind": self.kind, "main": self.main, "within": self.within,
                "problems": list(self.problems)}


@dataclass
class Remedy:
    """One remedy: ``what`` it is, the linearkit ``call`` it names, runnable ``code`` and
    ``why`` it addresses what was measured."""

    what: str
    call: str
    code: str
    why: str

    def to_dict(self) -> dict:
        return {"what": self.what, "call": self.call, "code": self.code, "why": self.why}


@dataclass
class Health:
    """The health section: ``layers`` (forward order), the input's std, the output gradient's
    norm, the first layers outside the bands, the ``verdict`` (``'healthy'``, ``'non-finite'``,
    ``'symmetric'``, ``'vanishing'``, ``'exploding'``, ``'stalled'``, ``'dead-relu'``), its
    ``summary`` in words, the other ``problems``, ``remedies`` in order of likelihood, the
    ``StatsReport`` of each piece, and the loss."""

    layers: list[LayerHealth]
    x_std: float
    output_grad_norm: float | None
    first_activation: LayerHealth | None
    first_gradient: LayerHealth | None
    first_grad_to_weight: tuple | None
    verdict: str
    summary: str
    problems: list[str]
    remedies: list[Remedy]
    stats: list[tuple[str, StatsReport]]
    loss: float | None
    probe: str
    bands: dict = field(default_factory=lambda: dict(BANDS))
    init_check: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    param_grads: dict = field(default_factory=dict, repr=False)
    dy: dict = field(default_factory=dict, repr=False)

    def layer(self, path: str) -> LayerHealth:
        """The layer at ``path``."""
        for lay in self.layers:
            if lay.path == path:
                return lay
        raise KeyError(f"no layer {path!r}; paths: {[lay.path for lay in self.layers]}")

    def to_dict(self) -> dict:
        first_gw = None if self.first_grad_to_weight is None else {
            "path": self.first_grad_to_weight[0].path, "param": self.first_grad_to_weight[1],
            "value": self.first_grad_to_weight[2]}
        return {
            "verdict": self.verdict, "summary": self.summary, "problems": list(self.problems),
            "probe": self.probe, "loss": self.loss, "bands": {k: (list(v) if isinstance(v, tuple)
                                                                else v)
                                                            for k, v in self.bands.items()},
            "input_std": self.x_std, "output_grad_norm": self.output_grad_norm,
            "first_activation": None if self.first_activation is None else {
                "path": self.first_activation.path, "type": self.first_activation.type,
                "act_ratio": self.first_activation.act_ratio},
            "first_gradient": None if self.first_gradient is None else {
                "path": self.first_gradient.path, "type": self.first_gradient.type,
                "grad_ratio": self.first_gradient.grad_ratio},
            "first_grad_to_weight": first_gw,
            "layers": [lay.to_dict() for lay in self.layers],
            "remedies": [r.to_dict() for r in self.remedies],
            "init_check": list(self.init_check),
            "flags": [{"kind": f.kind, "layer": f.layer, "value": f.value, "message": f.message}
                      for _, rep in self.stats for f in rep.flags],
            "notes": list(self.notes),
        }


# ---------------------------------------------------------------------------- measuring
def _norm(a) -> float:
    a = np.asarray(a)
    return float(np.sqrt(np.sum(np.square(a, dtype=np.float64)))) if a.size else 0.0


def _units(a) -> np.ndarray | None:
    """``a`` as ``(rows, units)`` over its last axis (None when it has no second unit)."""
    if not isinstance(a, np.ndarray) or a.ndim == 0 or a.shape[-1] < 2 or a.dtype.kind != "f":
        return None
    return a.reshape(-1, a.shape[-1]).astype(np.float64, copy=False)


def _spread(a2: np.ndarray) -> tuple[float, float]:
    """(largest spread across units within a row, largest |value|)."""
    if a2.size == 0:
        return 0.0, 0.0
    return float(np.max(np.ptp(a2, axis=1))), float(np.max(np.abs(a2)))


def _leaf_of(module, sub: str):
    return module if not sub else module.get_submodule(sub)


def _structure(module) -> tuple[list[str], list[str], list[str]]:
    """``(steps, blocks, composites)`` of ``module`` by path: the main path's steps (the
    children of a Sequential, of its nested Sequentials recursively, and of a user's module
    that has children but no layer rule, whose forward linearkit cannot see: its leaves, in the
    order they run; any other module is one step), the steps that have children (a Residual,
    a LoRALinear: their outputs are recorded by the doctor, since stats records leaves only),
    and the layers with children that are neither (a LoRALinear: its leaves are its own
    parametrization)."""
    steps, composites = [], []

    def transparent(m) -> bool:
        rule = rule_for(m)
        return (rule is None and any(True for _ in m.children())) or \
            getattr(rule, "kind", None) == "sequential"

    def walk(m, path):
        if transparent(m):
            for name, child in m.named_children():
                walk(child, f"{path}.{name}" if path else name)
        else:
            steps.append(path)
    walk(module, "")
    for path, m in module.named_modules():
        kind = getattr(rule_for(m), "kind", None)
        if any(True for _ in m.children()) and not transparent(m) and kind not in _CONTAINERS:
            composites.append(path)
    blocks = [p for p in steps if any(True for _ in _leaf_of(module, p).children())]
    return steps, blocks, composites


def _inside(path: str, outer: str) -> bool:
    return outer == "" or path.startswith(outer + ".")


def _run_piece(piece, loss_fn, y, blocks):
    """Forward and backward of a copy of ``piece.module`` under a recorder keeping its arrays,
    with the output ``y`` and gradient ``dy`` of each block step recorded too.

    Returns ``(recorder, twin, loss, dout, block_records)``: the loss (None for a torch piece),
    the gradient at the piece's output ``(B, *out)``, ``{path: {"y": ..., "dy": ...}}``.
    """
    twin = copy.deepcopy(piece.module)
    for p in twin.parameters():
        p.grad = None
    records, handles = {}, []

    def forward(path):
        def hook(module, args, kwargs, out):
            if "input_grad" in kwargs and path not in records:  # vjp calls, the first only
                records[path] = {"y": out}
        return hook

    def backward_pre(path):
        def hook(module, grad_output):
            rec = records.get(path)
            if rec is not None and "dy" not in rec and grad_output:
                rec["dy"] = grad_output[0]
        return hook

    for path in blocks:
        m = _leaf_of(twin, path)
        handles += [m.register_forward_hook(forward(path), with_kwargs=True),
                    m.register_full_backward_pre_hook(backward_pre(path))]
    try:
        with StatsRecorder(twin, keep_arrays=True) as rec:
            pred, back = twin.vjp(piece.x, input_grad=False)
            if piece.grad is None and piece.path == "":
                loss, loss_back = loss_fn.vjp(pred, y)
                loss = float(np.asarray(loss))
                dout = loss_back()
            else:
                loss = None
                dout = piece.grad if piece.grad is not None else np.ones_like(pred)
                dout = np.asarray(dout, dtype=pred.dtype).reshape(pred.shape)
            back(dout)
            rec.next_step()
    finally:
        for h in handles:
            h.remove()
    return rec, twin, loss, dout, records


def _moments(y) -> tuple:
    """(mean, std, max |y|, fraction of zeros) in float64, as ``analysis.stats`` computes them."""
    if not isinstance(y, np.ndarray) or y.dtype.kind != "f" or y.size == 0:
        return None, None, None, None
    y64 = y.astype(np.float64, copy=False)
    return (float(y64.mean()), float(y64.std()), float(np.abs(y64).max()),
            float(np.count_nonzero(y == 0) / y.size))


def _layers_of(piece, rec: StatsRecorder, twin, block_records):
    """``(layers, modules, spreads, dy)`` of one piece: a LayerHealth per leaf call (and per
    block step, after its leaves), the user's module per path, the gradient's (spread across
    units, max |value|) per path, and the gradient ``dy`` flowing into each layer's output."""
    report = rec.report()
    leaf_root = not any(True for _ in twin.children())
    steps, blocks, composites = _structure(twin)
    by_key = {(r["path"], r["call"]): r for r in rec.records}
    rows, modules, spreads, dys = [], {}, {}, {}
    for order, s in enumerate(report.layers):
        sub = "" if leaf_root else s.path
        name = piece.qualify(sub) if s.call == 0 else f"{piece.qualify(sub)}#{s.call}"
        lay = LayerHealth(name, s.type, s.shape, s.mean, s.std, s.max_abs, s.zero_fraction,
                          s.grad_out_norm, s.grad_in_norm, dict(s.param_grad_norms),
                          dict(s.param_norms))
        lay.main = sub in steps
        lay.within = next((piece.qualify(b) for b in blocks if _inside(sub, b) and b != sub),
                          None)
        lay.in_composite = any(_inside(sub, c) and c != sub for c in composites)
        record = by_key[(s.path, s.call)]
        y2, dy2 = _units(record.get("y")), _units(record.get("dy"))
        dys[name] = record.get("dy")
        if s.type in _RELU_TYPES and y2 is not None:
            lay.dead_units = float(np.mean(np.all(y2 == 0, axis=0)))
        own = dict(_leaf_of(twin, sub).named_parameters(recurse=False))
        lay.has_params = bool(own)
        if own and y2 is not None and not lay.in_composite:
            spread, top = _spread(y2)
            lay.identical_units = bool(spread <= _SAME_OUTPUT * top)
            if dy2 is not None:
                spreads[name] = _spread(dy2)  # judged once the output gradient's size is known
        for n, p in own.items():
            g, w = lay.param_grad_norms.get(n), lay.param_norms.get(n)
            if p.data.ndim >= 2 and g is not None and w and not lay.in_composite:
                lay.grad_to_weight[n] = g / w
        modules[name] = _leaf_of(piece.module, sub)
        rows.append((order, lay))
    for b in blocks:  # a block's row comes after the last of its leaves
        inner = [order for order, lay in rows if lay.kind == "layer"
                 and _inside(_sub_of(piece, lay.path), b)]
        rec_b = block_records.get(b, {})
        y, dy = rec_b.get("y"), rec_b.get("dy")
        module = _leaf_of(twin, b)
        mean, std, max_abs, zeros = _moments(y)
        lay = LayerHealth(piece.qualify(b), type(module).__name__,
                          getattr(y, "shape", None), mean, std, max_abs, zeros,
                          None if dy is None else _norm(dy), None, {}, {})
        lay.kind, lay.main = "block", True
        lay.has_params = any(True for _ in module.parameters())
        modules[lay.path] = _leaf_of(piece.module, b)
        dys[lay.path] = dy
        rows.append((max(inner, default=-1) + 0.5, lay))
    rows.sort(key=lambda item: item[0])
    return [lay for _, lay in rows], modules, spreads, dys


def _sub_of(piece, path: str) -> str:
    """``path`` (the user's) inside ``piece``, without a ``#k`` call suffix."""
    path = path.split("#")[0]
    if not piece.path:
        return path
    return "" if path == piece.path else path[len(piece.path) + 1:]


# ---------------------------------------------------------------------------- bands
def _out_of(value, band) -> bool:
    lo, hi = band
    return value is not None and not (lo <= value <= hi)


def _fmt(v) -> str:
    if v is None:
        return "-"
    if v == 0 or not math.isfinite(v):
        return f"{v:g}"
    return f"{v:.3g}" if 1e-3 <= abs(v) < 1e4 else f"{v:.2e}"


def _finite(v) -> bool:
    return v is None or math.isfinite(v)


def _apply_bands(layers, x_std, g_out, spreads: dict) -> None:
    """Set each layer's ratios and problems. The activation and gradient bands apply to the
    main path's steps; the output step (the last with parameters) and those after it are not
    hidden, and a leaf inside a block is hidden when its block is."""
    main = [lay for lay in layers if lay.main]
    with_params = [i for i, lay in enumerate(main) if lay.has_params]
    output_from = with_params[-1] if with_params else max(len(main) - 1, 0)
    hidden = {lay.path: i < output_from for i, lay in enumerate(main)}
    for lay in layers:
        lay.hidden = hidden.get(lay.path, hidden.get(lay.within, True))
        if lay.main and lay.hidden and lay.std is not None and x_std > 0:
            lay.act_ratio = lay.std / x_std
        if lay.main and lay.grad_out_norm is not None and g_out:
            lay.grad_ratio = lay.grad_out_norm / g_out
        spread = spreads.get(lay.path)
        if spread is not None:
            # the gradient's spread across units, against its own size and, for a gradient
            # that is zero up to rounding, against the output's: both mean "identical"
            lay.identical_grads = bool(spread[0] <= _SAME_GRAD * spread[1]
                                       + 1e-6 * (g_out or 0.0))
        # short labels for the tables; the verdict says each in words
        if _out_of(lay.act_ratio, BANDS["activation"]):
            lay.problems.append(f"activation {_fmt(lay.act_ratio)}x")
        if _out_of(lay.grad_ratio, BANDS["gradient"]):
            lay.problems.append(f"gradient {_fmt(lay.grad_ratio)}x")
        for n, r in lay.grad_to_weight.items():
            if _out_of(r, BANDS["grad_to_weight"]):
                lay.problems.append(f"‖∇{n}‖/‖{n}‖ {_fmt(r)}")
        if lay.dead_units is not None and lay.dead_units >= BANDS["dead_units"]:
            lay.problems.append(f"{100 * lay.dead_units:.0f}% dead")
        if lay.symmetric:
            lay.problems.append("identical units")
        if not all(_finite(v) for v in (lay.mean, lay.std, lay.max_abs, lay.grad_out_norm)):
            lay.problems.append(_NONFINITE)


# ---------------------------------------------------------------------------- init check
def _family(layers, modules, start: int) -> tuple[str, float, str]:
    """``(family, negative slope, type name)`` of the nonlinearity the Linears feed: the first
    after layer ``start``, else the most common ('linear' without any)."""
    types = [lay.type for lay in layers]
    found = [t for t in types[start:] if t in _FAMILY]
    if found:
        t = found[0]
    else:
        found = [t for t in types if t in _FAMILY]
        if not found:
            return "linear", 0.0, ""
        t = max(set(found), key=found.count)
    m = next(modules.get(lay.path) for lay in layers[start:] + layers if lay.type == t)
    return _FAMILY[t], float(getattr(m, "negative_slope", 0.0) or 0.0), t


def _target_std(family: str, slope: float, fan_in: int, fan_out: int) -> tuple[float, str]:
    """The weight std the recommended init gives, and its call."""
    if family == "relu":
        return math.sqrt(2.0 / fan_in), 'lk.init.kaiming_normal_(m.weight, nonlinearity="relu")'
    if family == "leaky_relu":
        return (math.sqrt(2.0 / (1 + slope ** 2) / fan_in),
                f'lk.init.kaiming_normal_(m.weight, a={slope:g}, nonlinearity="leaky_relu")')
    gain = 5.0 / 3.0 if family == "tanh" else 1.0
    call = ('lk.init.xavier_uniform_(m.weight, gain=lk.init.calculate_gain("tanh"))'
            if family == "tanh" else "lk.init.xavier_uniform_(m.weight)")
    return gain * math.sqrt(2.0 / (fan_in + fan_out)), call


def _init_check(layers, modules, family, slope) -> list[dict]:
    """Per hidden weight matrix: its std against the recommended init's."""
    out = []
    for lay in layers:
        m = modules.get(lay.path)
        w = getattr(m, "weight", None)
        if (w is None or getattr(w, "data", None) is None or w.data.ndim != 2 or not lay.hidden
                or lay.in_composite or lay.kind != "layer"):
            continue
        fan_out, fan_in = w.data.shape
        target, call = _target_std(family, slope, fan_in, fan_out)
        std = float(np.asarray(w.data, dtype=np.float64).std())
        out.append({"path": lay.path, "fan_in": fan_in, "fan_out": fan_out, "std": std,
                    "target_std": target, "ratio": std / target if target else None,
                    "call": call})
    return out


# ---------------------------------------------------------------------------- remedies
_LOOP_INIT = """for m in model.modules():
    if isinstance(m, lk.Linear):
        {call}
        if m.bias is not None:
            lk.init.zeros_(m.bias)"""


def _remedies(verdict: str, family: str, slope: float, init_off: bool, width: int,
              check: list, act: str = "") -> list[Remedy]:
    """The remedies for ``verdict``, most likely first: the init comes first when a weight's
    std is off the recommended one by more than 2x (``init_off``), else after the structural
    fixes; ``act`` is the nonlinearity's type name for the code examples."""
    act_code = f"lk.{act}()" if act and act != "LeakyReLU" else \
        (f"lk.LeakyReLU({slope:g})" if act else "lk.ReLU()")
    _, call = _target_std(family, slope, max(width, 1), max(width, 1))
    name = call.split("(")[0]
    # the weight furthest from the init's std, the one the remedy most clearly concerns
    where = max((c for c in check if c["ratio"]), default=None,
                key=lambda c: abs(math.log(c["ratio"])))
    measured = ("" if where is None else
                f" Measured: '{where['path']}' has weight std {_fmt(where['std'])}, the init "
                f"gives {_fmt(where['target_std'])} (fan_in {where['fan_in']}).")
    fam = {"relu": "ReLU", "leaky_relu": f"LeakyReLU({slope:g})", "tanh": "tanh",
           "sigmoid": "sigmoid", "linear": "no nonlinearity"}[family]
    init = Remedy(f"initialization for {fam}", name, _LOOP_INIT.format(call=call),
                  f"sets each weight's std so a layer keeps its input's scale ({fam}), zero "
                  f"biases.{measured}")
    norm = Remedy("a normalization after each hidden Linear", "lk.LayerNorm",
                  f"lk.Sequential(lk.Linear({width}, {width}), lk.LayerNorm({width}), "
                  f"{act_code})",
                  "rescales every layer's output to mean 0, std 1 whatever the weights' scale, "
                  "in the forward and (through its backward) the gradient.")
    residual = Remedy("residual connections", "lk.Residual",
                      f"lk.Residual(lk.Sequential(lk.Linear({width}, {width}), {act_code}))",
                      "y = x + f(x): the identity path carries signal and gradient past a block "
                      "whatever its weights do.")
    clip = Remedy("gradient clipping", "lk.optim.clip_grad_norm_",
                  "lk.optim.clip_grad_norm_(model.parameters(), max_norm=1.0)  "
                  "# after backward, before opt.step()",
                  "caps the step a too-large gradient takes (it treats the symptom: the scale "
                  "itself comes from the init).")
    if verdict == "symmetric":
        init.why = ("draws each unit's weights independently, so units start different and "
                    "receive different gradients; a constant (or zero) init makes every unit "
                    "of a layer compute and learn the same thing forever. LayerNorm, Residual "
                    "and clipping keep the symmetry: only a random init breaks it.")
        return [init]
    if verdict == "vanishing":
        return [init, norm, residual] if init_off else [norm, residual, init]
    if verdict == "exploding":
        return [init, norm, clip] if init_off else [norm, clip, init]
    if verdict == "exploding-gradient":
        return [clip, init, norm] if not init_off else [init, clip, norm]
    if verdict == "stalled":
        return [init, norm, residual]
    if verdict == "dead-relu":
        leaky = Remedy("a leaky activation", "lk.LeakyReLU", "lk.LeakyReLU(0.01)",
                       "a dead ReLU has gradient 0 on every row and never recovers; "
                       "LeakyReLU keeps a small gradient.")
        return [init, leaky, norm]
    if verdict == "non-finite":
        rc = Remedy("find the layer that overflows", "lk.analysis.range_check",
                    "print(lk.analysis.range_check(model, x, dtype=np.float32))",
                    "names the first layer whose output or parameters are beyond the dtype's "
                    "range.")
        return [rc, clip, init]
    return []


# ---------------------------------------------------------------------------- examine
def examine(subject, types: dict | None = None) -> Health:
    """The health section for ``subject`` (``doctor.subject.Subject``); ``types`` maps paths to
    the ledger's type text (``Linear(40, 100)``) for the words."""
    types = types or {}
    layers, stats, modules, loss = [], [], {}, subject.loss
    param_grads, dy = {}, {}
    g_out = None if subject.output_grad is None else _norm(subject.output_grad)
    spreads = {}
    for piece in subject.pieces:
        _, blocks, _ = _structure(piece.module)
        rec, twin, piece_loss, dout, block_records = _run_piece(piece, subject.loss_fn,
                                                                subject.y, blocks)
        if piece.path == "" and piece.grad is None:
            loss, g_out = piece_loss, _norm(dout)
        stats.append((piece.path, rec.report()))
        part, mods, spr, dys = _layers_of(piece, rec, twin, block_records)
        for pname, p in twin.named_parameters():
            if p.grad is not None:
                param_grads[piece.qualify(pname)] = p.grad
        layers += part
        modules.update(mods)
        spreads.update(spr)
        dy.update(dys)
    x64 = np.asarray(subject.x, dtype=np.float64)
    x_std = float(x64.std()) if x64.size else 0.0
    notes = []
    if x_std == 0:
        x_std = float(np.sqrt(np.mean(x64 ** 2))) if x64.size else 0.0
        notes.append("the input's std is 0: the activation band is measured against its RMS"
                     if x_std else "the input is all zeros: no activation band")
    _apply_bands(layers, x_std, g_out, spreads)
    for lay in layers:
        lay.label = types.get(lay.path.split("#")[0], lay.type)

    first_act = next((lay for lay in layers if _out_of(lay.act_ratio, BANDS["activation"])),
                     None)
    first_grad = next((lay for lay in reversed(layers)
                       if _out_of(lay.grad_ratio, BANDS["gradient"])), None)
    first_gw = next(((lay, n, r) for lay in reversed(layers)
                     for n, r in lay.grad_to_weight.items()
                     if _out_of(r, BANDS["grad_to_weight"])), None)
    symmetric = [lay for lay in layers if lay.symmetric]
    dead = [lay for lay in layers if lay.dead_units is not None
            and lay.dead_units >= BANDS["dead_units"]]
    nonfinite = [lay for lay in layers if _NONFINITE in lay.problems]
    if loss is not None and not math.isfinite(loss) and not nonfinite:
        nonfinite = layers[-1:]

    start = 0 if first_act is None else layers.index(first_act)
    family, slope, act = _family(layers, modules, start)
    check = _init_check(layers, modules, family, slope)
    ratios = [c["ratio"] for c in check if c["ratio"]]
    init_off = bool(ratios) and any(not 0.5 <= r <= 2.0 for r in ratios)
    widths = [c["fan_out"] for c in check]
    width = max(set(widths), key=widths.count) if widths else 0

    def name(lay):
        t = types.get(lay.path.split("#")[0], lay.type)
        return f"'{lay.path or '(model)'}' ({t})"

    findings: list[tuple[str, str]] = []
    if nonfinite:
        lay = nonfinite[0]
        findings.append(("non-finite", (f"non-finite values (inf or NaN) first appear at "
                                       f"{name(lay)}; every figure after it is meaningless.")))
    if symmetric:
        lay = symmetric[0]
        rest = len(symmetric) - 1
        findings.append(("symmetric", (
            f"symmetric: symmetry never broken — every unit of {name(lay)}"
            + (f" and of {rest} more layer(s)" if rest else "")
            + " gives the same output on every row and receives the same gradient, so every "
              "step moves them identically: each such layer acts as a single unit. The "
              "weights look initialized to one constant (or zero).")))
    if dead:
        lay = dead[0]
        findings.append(("dead-relu", (
            f"dead ReLUs: {100 * lay.dead_units:.0f}% of the units of {name(lay)} are 0 on "
            f"every row of the batch (healthy: below {100 * BANDS['dead_units']:.0f}%); a dead "
            "unit passes no gradient and never recovers.")))
    if first_act is not None:
        lo, hi = BANDS["activation"]
        small = first_act.act_ratio < lo
        gain = _gain(layers, modules)
        per = "" if gain is None else (
            f"; each Linear {'shrinks' if gain < 1 else 'grows'} the signal about "
            f"{_fmt(1 / gain if gain < 1 else gain)}x")
        findings.append(("vanishing" if small else "exploding", (
            f"{'vanishing' if small else 'exploding'} activations: {name(first_act)} is the "
            f"first layer outside the band, its output std {_fmt(first_act.std)} is "
            f"{_fmt(first_act.act_ratio)}x the input's {_fmt(x_std)} (healthy: {lo:g}x to "
            f"{hi:g}x){per}.")))
    if first_grad is not None:
        lo, hi = BANDS["gradient"]
        small = first_grad.grad_ratio < lo
        kind = "vanishing" if small else "exploding-gradient"
        worst = min if small else max
        deepest = worst((lay for lay in layers if lay.grad_ratio is not None),
                        key=lambda lay: lay.grad_ratio)
        findings.append((kind, (
            f"{'vanishing' if small else 'exploding'} gradients: counting back from the loss, "
            f"{name(first_grad)} is the first layer outside the band, the gradient into its "
            f"output is {_fmt(first_grad.grad_ratio)}x the gradient at the model's output "
            f"(healthy: {lo:g}x to {hi:g}x); at {name(deepest)} it is "
            f"{_fmt(deepest.grad_ratio)}x.")))
    if first_gw is not None:
        lay, n, r = first_gw
        lo, hi = BANDS["grad_to_weight"]
        findings.append(("stalled" if r < lo else "exploding-gradient", (
            f"‖∇{n}‖/‖{n}‖ of {name(lay)} is {_fmt(r)} (healthy: {lo:g} to {hi:g}): "
            + ("an SGD step at any lr <= 1 changes the weight by less than float32 resolves "
               "(6e-8 relative)." if r < lo else
               "an SGD step at lr 0.1 would more than replace the weight."))))

    if findings:
        kind, summary = findings[0]
        problems = [text for _, text in findings[1:]]
    else:
        kind, problems = "healthy", []
        summary = ("healthy: on the main path every hidden layer's activation std is within "
                   f"{BANDS['activation'][0]:g}x-{BANDS['activation'][1]:g}x the input's, every "
                   f"gradient within {BANDS['gradient'][0]:g}x-{BANDS['gradient'][1]:g}x the "
                   "output's, every ‖∇W‖/‖W‖ within "
                   f"{BANDS['grad_to_weight'][0]:g}-{BANDS['grad_to_weight'][1]:g}, no ReLU "
                   f"layer {100 * BANDS['dead_units']:.0f}% dead and no layer of identical "
                   "units.")
    # the verdict's word; exploding gradients with a healthy forward get the clipping-first list
    verdict = "exploding" if kind == "exploding-gradient" else kind
    remedies = _remedies(kind, family, slope, init_off, width, check, act)
    probe = subject.probe.get("kind", "user")
    return Health(layers, x_std, g_out, first_act, first_grad, first_gw, verdict, summary,
                  problems, remedies, stats, loss, probe, dict(BANDS), check, notes,
                  param_grads, dy)


def _gain(layers, modules) -> float | None:
    """Geometric mean of the per-Linear change of the output std across the hidden layers."""
    stds = [lay.std for lay in layers if lay.main and lay.hidden and lay.has_params and lay.std]
    if len(stds) < 2 or stds[0] <= 0:
        return None
    return (stds[-1] / stds[0]) ** (1.0 / (len(stds) - 1))
