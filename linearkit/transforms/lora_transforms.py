"""LoRA as transforms: add adapters, merge them in, extract them from a fine-tune, save and load
them as files that hold only the adapters.

A LoRA adapter (Hu et al. 2021, as peft implements it) leaves a Linear's weight ``W (out, in)``
frozen and learns ``A (r, in)`` and ``B (out, r)`` beside it::

    y = x Wᵀ + b + (alpha / r) · dropout(x) Aᵀ Bᵀ          (linearkit.layers.lora.LoRALinear)

``A`` starts Kaiming-uniform, ``B`` at zero, so a fresh adapter changes nothing. Here:

* ``add_lora(model, rank, alpha)`` wraps each targeted Linear in a ``LoRALinear`` and freezes
  every other parameter (as peft: only the adapters train);
* ``merge_lora(adapted)`` folds each adapter in: ``W' = W + (alpha/r) · B @ A`` (float64, cast
  back), a plain Linear again; the drift is measured;
* ``extract_lora(tuned, base, rank)`` goes the other way: for each Linear a fine-tune changed, the
  rank-r adapter closest to ``ΔW = W_tuned - W_base`` (truncated SVD: the best rank-r
  approximation in Frobenius and spectral norm, Eckart–Young);
* ``save_adapter`` / ``load_adapter`` (in ``lora_adapter.py``): a ``.safetensors`` file with only
  the ``lora_A`` / ``lora_B`` tensors (peft's adapter-file keys without its ``base_model.model.``
  prefix) and the adapter's settings as JSON metadata; it loads onto the base model.

The array tier: ``merge_lora_weights`` and ``extract_lora_weights``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields

import numpy as np

from .. import precision
from ..core.module import Module
from ..core.random import resolve
from ..layers import Linear
from ..layers.lora import LoRALinear
from ..rules import is_lazy, rule_for
from .transform_report import TransformReport
from .walk import Ties, copy_model, finish, linear_from, lists, named, select_linears, set_submodule

__all__ = ["LoRAReport", "add_lora", "extract_lora", "extract_lora_weights", "merge_lora",
           "merge_lora_weights"]

@dataclass
class LoRAReport(TransformReport):
    """A ``TransformReport`` plus the adapted model's parameter counts, as peft's
    ``print_trainable_parameters``: ``trainable_params`` (the adapters') of ``total_params``
    (every parameter, adapters included)."""

    trainable_params: int = 0
    total_params: int = 0

    def summary(self) -> str:
        pct = 100.0 * self.trainable_params / self.total_params if self.total_params else 0.0
        return (f"{super().summary()}; trainable params {self.trainable_params:,} of "
                f"{self.total_params:,} ({pct:.4g}%)")


def lora_report(report: TransformReport, model: Module) -> LoRAReport:
    params = list(model.parameters())
    return LoRAReport(**{f.name: getattr(report, f.name) for f in fields(TransformReport)},
                      trainable_params=sum(p.numel() for p in params if p.requires_grad),
                      total_params=sum(p.numel() for p in params))


# ---------------------------------------------------------------- the array tier
def merge_lora_weights(weight, lora_a, lora_b, scaling: float) -> np.ndarray:
    """``W + scaling · B @ A``: a LoRA adapter folded into its base weight.

    Parameters
    ----------
    weight : array ``(out, in)``
        The base Linear's weight.
    lora_a : array ``(r, in)``
    lora_b : array ``(out, r)``
    scaling : float
        ``alpha / r``.

    Returns
    -------
    ndarray ``(out, in)``
        Computed in float64, returned in ``weight``'s dtype (one rounding, at the end).

    Examples
    --------
    >>> import numpy as np
    >>> from linearkit.transforms.lora_transforms import merge_lora_weights
    >>> merge_lora_weights(np.eye(2), np.array([[1., 2.]]), np.array([[1.], [0.]]), 0.5)
    array([[1.5, 1. ],
           [0. , 1. ]])
    """
    w, a, b = np.asarray(weight), np.asarray(lora_a), np.asarray(lora_b)
    if w.ndim != 2 or a.ndim != 2 or b.ndim != 2 or a.shape[1] != w.shape[1] \
            or b.shape != (w.shape[0], a.shape[0]):
        raise ValueError(f"merge_lora_weights() takes weight (out, in), lora_a (r, in), lora_b "
                         f"(out, r); got {w.shape}, {a.shape}, {b.shape}")
    merged = w.astype(np.float64) + float(scaling) * (b.astype(np.float64) @ a.astype(np.float64))
    return merged.astype(w.dtype if np.issubdtype(w.dtype, np.floating) else np.float64)


def extract_lora_weights(delta, rank: int, scaling: float = 1.0
                         ) -> tuple[np.ndarray, np.ndarray, float]:
    """The rank-``rank`` LoRA factors closest to ``delta``: ``scaling · B @ A = ΔW_r``.

    ``ΔW_r = U_r Σ_r V_rᵀ`` is the truncated SVD of ``delta`` — the best rank-r approximation in
    the Frobenius and spectral norms (Eckart–Young). Σ_r is split evenly between the factors:
    ``A = sqrt(Σ_r / scaling) V_rᵀ``, ``B = U_r sqrt(Σ_r / scaling)``. A rank above
    ``min(out, in)`` is padded with zero rows of ``A`` and columns of ``B``.

    Parameters
    ----------
    delta : array ``(out, in)``
        The weight change, e.g. ``W_tuned - W_base``.
    rank : int
        ``r`` >= 1.
    scaling : float
        The adapter's ``alpha / r`` (> 0), divided out of the factors.

    Returns
    -------
    a : ndarray ``(r, in)``
    b : ndarray ``(out, r)``
        Computed in float64, returned in ``delta``'s dtype (float64 if it is not floating).
    energy : float
        The fraction of ``||delta||_F²`` that ``ΔW_r`` keeps, ``Σ σ_i² (i <= r) / Σ σ_i²``
        (1.0 for a zero ``delta``). The relative Frobenius error is ``sqrt(1 - energy)``.

    Examples
    --------
    >>> import numpy as np
    >>> from linearkit.transforms.lora_transforms import extract_lora_weights
    >>> delta = np.outer([1., 2.], [3., 0., 4.])            # rank 1
    >>> a, b, energy = extract_lora_weights(delta, rank=1, scaling=2.0)
    >>> a.shape, b.shape, energy
    ((1, 3), (2, 1), 1.0)
    >>> bool(np.allclose(2.0 * b @ a, delta))
    True
    """
    d = np.asarray(delta)
    if d.ndim != 2:
        raise ValueError(f"extract_lora_weights() takes a 2-D delta (out, in), got shape {d.shape}")
    if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or rank < 1:
        raise ValueError(f"rank must be a positive int, got {rank!r}")
    if not (isinstance(scaling, numbers.Real) and math.isfinite(scaling) and scaling > 0):
        raise ValueError(f"scaling must be a positive number, got {scaling!r}")
    dtype = d.dtype if np.issubdtype(d.dtype, np.floating) else np.dtype(np.float64)
    n_out, n_in = d.shape
    a, b = np.zeros((rank, n_in)), np.zeros((n_out, rank))
    energy = 1.0
    if d.size:
        u, s, vt = np.linalg.svd(d.astype(np.float64), full_matrices=False)
        k = min(rank, s.size)
        root = np.sqrt(s[:k] / float(scaling))
        a[:k] = root[:, None] * vt[:k]
        b[:, :k] = u[:, :k] * root
        total = float(np.sum(s ** 2))
        energy = float(np.sum(s[:k] ** 2)) / total if total > 0 else 1.0
    return a.astype(dtype), b.astype(dtype), energy


# ---------------------------------------------------------------- shared steps
def adapters(model: Module) -> list[tuple[str, LoRALinear]]:
    """``(path, layer)`` of every LoRA adapter (a layer whose rule lists merge_lora: a
    LoRALinear), in model order."""
    return [(p, m) for p, m in model.named_modules() if lists(m, "merge_lora")]


def adapter_owner(path: str, adapter_paths) -> str | None:
    """The adapter that ``path`` lies inside (its base_layer, lora_A, ...), or None."""
    for owner in adapter_paths:
        if path != owner and (owner == "" or path.startswith(owner + ".")):
            return owner
    return None


def freeze_all_but_adapters(model: Module) -> None:
    """peft's default: only ``lora_A`` and ``lora_B`` train; everything else is frozen, and no
    parameter keeps a gradient copied from the input model (a frozen one would hold its buffer
    for nothing)."""
    for p in model.parameters():
        p.requires_grad = False
        p.grad = None
    for _, m in adapters(model):
        m.lora_A.requires_grad_(True)
        m.lora_B.requires_grad_(True)


def left_frozen(model: Module, adapted: set) -> list[str]:
    """A report line for each layer with parameters of its own that got no adapter."""
    return [f"{named(p, m)}: no adapter; frozen (only the adapters train)"
            for p, m in model.named_modules()
            if p not in adapted and adapter_owner(p, adapted) is None
            and any(True for _ in m.parameters(recurse=False))]


def wrap(layer: Linear, rank, alpha, dropout, rng) -> LoRALinear:
    """``LoRALinear(layer, rank, alpha, dropout)`` in ``layer``'s training mode.

    A bfloat16 layer (which NumPy's random draws cannot fill) is widened to float32 for the
    adapter's initialization and the whole adapter then stored in bfloat16: the base weights
    come back bit for bit (bfloat16 -> float32 -> bfloat16 is exact), ``A`` is its float32
    draw rounded once. ``layer`` is the transform's copy, edited in place."""
    store = layer.dtype
    if precision.is_16bit(store) and store != np.float16:  # ml_dtypes.bfloat16
        layer.to(np.float32)
        lora = LoRALinear(layer, rank, alpha, dropout, rng=rng)
        lora.to(store)
    else:
        lora = LoRALinear(layer, rank, alpha, dropout, rng=rng)
    lora.train(layer.training)
    return lora


def _text(m: Module) -> str:
    """A layer's type text, as its rule writes it: 'LoRALinear(40, 100, r=4)'."""
    return rule_for(m).describe_module(m)


def added_line(path: str, layer: Linear, lora: LoRALinear) -> str:
    """The report line of an adapter added to (or loaded onto) the Linear at ``path``."""
    r, n_in, n_out = lora.rank, lora.in_features, lora.out_features
    return (f"{named(path, layer)} -> {_text(lora)}: base frozen, "
            f"+{r * (n_in + n_out):,} trainable (lora_A {r}x{n_in}, lora_B {n_out}x{r}), "
            f"scaling {lora.scaling:g}")


def layer_info(path: str, lora: LoRALinear, **extra) -> dict:
    """The report's ``layers`` entry of the adapter at ``path`` (plus ``extra``)."""
    return {"path": path, "rank": lora.rank, "alpha": lora.alpha, "scaling": lora.scaling,
            "dropout": lora.dropout, "in": lora.in_features, "out": lora.out_features,
            "trainable": lora.rank * (lora.in_features + lora.out_features), **extra}


def _refuse_named_non_linears(model: Module, targets, adapter_paths, transform: str) -> None:
    """A target that is exactly the path of a layer that cannot take an adapter: say which."""
    if targets is None:
        return
    modules = dict(model.named_modules())
    for target in [targets] if isinstance(targets, str) else list(targets):
        m = modules.get(target)
        owner = adapter_owner(target, adapter_paths) if m is not None else None
        if owner is not None:
            raise ValueError(f"{transform}(): target {named(target, m)} is inside the LoRA "
                             f"adapter {named(owner, modules[owner])}: adapters do not nest; "
                             "target the adapted layer's own path after merge_lora()")
        if m is None or lists(m, transform):
            continue
        if lists(m, "merge_lora"):
            why = "already has a LoRA adapter (merge_lora() it first to adapt it again)"
        elif is_lazy(m):
            why = "is not materialized: run the model once (or load its weights) first"
        else:
            why = "is not a Linear: LoRA adapts Linear layers only"
        raise TypeError(f"{transform}(): target {named(target, m)} {why}")


def refuse_tied(model: Module, chosen, transform: str) -> None:
    """A ValueError, saying why and what to do, for a chosen ``(path, Linear)`` held by several
    slots of ``model`` (tied): an adapter wraps one use, and would untie the rest. A Linear at
    several paths only because its container is shared is not refused: its adapter, put inside
    that container, serves every path (``walk.Ties``)."""
    ties = Ties(model)
    for path, layer in chosen:
        paths = ties.where(layer)
        if ties.slots(layer) > 1:
            rest = ", ".join(map(repr, paths[1:]))
            other = ("" if transform == "load_adapter"
                     else "; or leave the layer out with targets= naming the other layers")
            raise ValueError(
                f"{transform}(): {named(path, layer)} is one Linear used at "
                f"{', '.join(map(repr, paths))} (tied), and an adapter wraps one use: the "
                "others would keep the bare layer, silently untied from it. To adapt every use "
                f"separately, untie them first: put a copy (copy.deepcopy of the layer) at "
                f"{rest}{other}")


# ---------------------------------------------------------------- add / merge
def add_lora(model: Module, rank: int = 8, alpha: float = 16, targets=None, dropout: float = 0.0,
             *, rng: np.random.Generator | int | None = None, probe=None
             ) -> tuple[Module, LoRAReport]:
    """A copy of ``model`` with a LoRA adapter on each targeted Linear; only the adapters train.

    Each targeted ``Linear(in, out)`` becomes ``LoRALinear(base_layer=<that Linear, frozen>,
    rank, alpha, dropout)``: ``y = x Wᵀ + b + (alpha/rank) · dropout(x) Aᵀ Bᵀ`` with ``A (rank,
    in)`` Kaiming-uniform (peft's init) and ``B (out, rank)`` zeros, so the new model computes
    exactly what ``model`` does until it trains. Every other parameter of the copy is frozen
    (``requires_grad`` False), as peft does, so an optimizer over ``parameters()`` updates only
    ``lora_A``/``lora_B`` and keeps state for nothing else. ``model`` is not modified.

    Parameters
    ----------
    model : Module
    rank : int
        ``r`` >= 1 (default 8).
    alpha : float
        ``scaling = alpha / rank`` (default 16).
    targets : None, str or list of str
        Which Linears (paths, last components as peft's ``target_modules``, or globs; see
        ``walk.select_linears``); None: every plain Linear not already inside an adapter.
    dropout : float
        Dropout on the adapters' input, in [0, 1] (default 0: an Identity).
    rng : numpy.random.Generator or int, optional
        Source of the ``A`` values (one generator for all layers); default the library's.
    probe : array ``(N, *, in)``, optional
        Inputs to check the copy on, besides random ones.

    Returns
    -------
    adapted : Module
    report : LoRAReport
        ``changed``: each adapted layer; ``left``: each other layer with parameters (frozen);
        ``layers``: per adapter ``path, rank, alpha, scaling, dropout, in, out, trainable``;
        ``trainable_params`` of ``total_params``; ``max_abs_error`` 0 (B = 0).

    Raises
    ------
    TypeError
        A target that is exactly the path of a layer that is not a plain Linear (named).
    ValueError
        A target that names nothing, or lies inside an existing adapter; a tied Linear; bad
        ``rank``, ``alpha`` or ``dropout``.

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> from linearkit.transforms import add_lora
    >>> model = lk.Sequential(lk.Linear(40, 100), lk.ReLU(), lk.Linear(100, 10))
    >>> adapted, report = add_lora(model, rank=4, alpha=8, targets=["0"], rng=0)
    >>> report.changed[0]
    "'0' (Linear(40, 100)) -> LoRALinear(40, 100, r=4): base frozen, +560 trainable (lora_A 4x40, lora_B 100x4), scaling 2"
    >>> report.trainable_params, report.total_params, report.max_abs_error
    (560, 5670, 0.0)
    """
    new = copy_model(model, "add_lora")
    existing = {p for p, _ in adapters(new)}
    _refuse_named_non_linears(new, targets, existing, "add_lora")
    chosen = []
    for path, layer in select_linears(new, targets, "add_lora"):
        owner = adapter_owner(path, existing)
        if owner is None:
            chosen.append((path, layer))
        elif targets is not None:
            raise ValueError(f"add_lora(): target {named(path, layer)} is inside the LoRA adapter "
                             f"'{owner}': adapters do not nest; merge_lora() first")
    if not chosen:
        raise ValueError("add_lora(): the model has no Linear layer to adapt"
                         + (" (every Linear is already inside an adapter)" if existing else ""))
    refuse_tied(new, chosen, "add_lora")
    gen = None if rng is None else resolve(rng)
    changed, layers, adapted = [], [], set()
    for path, layer in chosen:
        lora = wrap(layer, rank, alpha, dropout, gen)
        new = set_submodule(new, path, lora)
        changed.append(added_line(path, layer, lora))
        layers.append(layer_info(path, lora))
        adapted.add(path)
    freeze_all_but_adapters(new)
    left = [f"{named(p, m)}: already adapted; its adapter keeps training" for p, m in
            adapters(new) if p in existing]
    left += left_frozen(new, adapted | existing)
    return new, lora_report(finish("add_lora", model, new, probe, changed, left, layers), new)


def merge_lora(adapted: Module, *, probe=None) -> tuple[Module, TransformReport]:
    """A copy of ``adapted`` with every LoRA adapter folded into a plain Linear.

    Each ``LoRALinear`` becomes ``Linear(in, out)`` with weight ``W + (alpha/r) · B @ A``
    (computed in float64, rounded once to the layer's dtype) and the base's bias. The merged
    Linears are fresh layers: their ``requires_grad`` is True again (a merged model trains
    like any other); every other parameter keeps its flag (add_lora froze them: call
    ``requires_grad_(True)`` to fine-tune all of it). ``adapted`` is not modified, so nothing is
    lost. The probes run in eval mode (an adapter's dropout is the identity there, as in the
    merged layer).

    Returns
    -------
    merged : Module
    report : TransformReport
        ``max_rel_error``: the merge drift on the probes (float32: about 1e-7, from the one
        rounding of ``W'``); ``layers``: per adapter ``path, rank, scaling, delta_norm``
        (``||scaling·BA||_F / ||W||_F``, how far the adapter moved the weight).

    Raises
    ------
    ValueError
        The model holds no LoRALinear (nothing to merge).

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> from linearkit.transforms import add_lora, merge_lora
    >>> model = lk.Sequential(lk.Linear(8, 4), lk.Tanh())
    >>> merged, report = merge_lora(add_lora(model, rank=2, rng=0)[0])
    >>> merged[0], report.max_abs_error
    (Linear(in_features=8, out_features=4, bias=True), 0.0)
    """
    new = copy_model(adapted, "merge_lora")
    found = adapters(new)
    if not found:
        raise ValueError(f"merge_lora(): {named('', new)} holds no LoRALinear layer, so there "
                         "is nothing to merge (add_lora, extract_lora or load_adapter make them)")
    changed, layers = [], []
    paths: dict[int, list[str]] = {}
    for p, m in new.named_modules(remove_duplicate=False):
        paths.setdefault(id(m), []).append(p)
    for path, lora in found:
        base = lora.base_layer
        w = merge_lora_weights(base.weight.data, lora.lora_A.weight.data,
                               lora.lora_B.weight.data, lora.scaling)
        layer = linear_from(w, None if base.bias is None else base.bias.data, base.dtype)
        layer.training = lora.training
        for at in paths[id(lora)]:  # a LoRALinear used at several paths: one merged Linear
            new = set_submodule(new, at, layer)
        w0 = np.linalg.norm(base.weight.data.astype(np.float64))
        delta = np.linalg.norm(lora.delta_weight())
        changed.append(f"{named(path, lora)} -> {_text(layer)}: "
                       f"W + {lora.scaling:g}·B@A (rank {lora.rank})")
        layers.append({"path": path, "rank": lora.rank, "scaling": lora.scaling,
                       "delta_norm": float(delta / w0) if w0 > 0 else float(delta > 0)})
    return new, finish("merge_lora", adapted, new, probe, changed, [], layers)


# ---------------------------------------------------------------- extract
def _refuse_adapters(model: Module, which: str) -> None:
    found = adapters(model)
    if found:
        path, m = found[0]
        raise ValueError(f"extract_lora(): {which} holds LoRA adapters ({named(path, m)}): "
                         f"pass plain models — merge_lora({which})[0] first")


def _check_same_architecture(tuned: Module, base: Module) -> None:
    """Same module paths, types and parameter shapes, or a ValueError at the first difference."""
    if not isinstance(base, Module):
        raise TypeError(f"extract_lora() takes the base as a linearkit Module, got "
                        f"{type(base).__name__}")
    t, b = list(tuned.named_modules()), list(base.named_modules())
    for i in range(max(len(t), len(b))):
        if i >= len(t) or i >= len(b):
            path, m = (b[i] if i >= len(t) else t[i])
            who = "base" if i >= len(t) else "tuned"
            raise ValueError(f"extract_lora(): tuned and base differ at {named(path, m)}: only "
                             f"the {who} model has it; extract_lora needs the base that was "
                             "fine-tuned (the same architecture)")
        (pt, mt), (pb, mb) = t[i], b[i]
        shapes_t = [(n, p.shape) for n, p in mt.named_parameters(recurse=False)]
        shapes_b = [(n, p.shape) for n, p in mb.named_parameters(recurse=False)]
        if pt != pb or type(mt) is not type(mb) or shapes_t != shapes_b:
            raise ValueError(f"extract_lora(): tuned and base differ at {named(pt, mt)}: the base "
                             f"has {named(pb, mb)} there; extract_lora needs the base that was "
                             "fine-tuned (the same architecture)")


def extract_lora(tuned: Module, base: Module, rank: int, *, alpha: float | None = None,
                 targets=None, probe=None) -> tuple[Module, LoRAReport]:
    """The LoRA adapters that best reproduce a fine-tune: ``tuned``'s change from ``base``.

    For every targeted Linear whose weight differs between the two models (same path), the
    layer becomes a ``LoRALinear`` around the *base* weight whose ``scaling · B @ A`` is the
    rank-``rank`` truncated SVD of ``ΔW = W_tuned - W_base`` — the best rank-r approximation
    (Eckart–Young); see ``extract_lora_weights``.

    What LoRA cannot express is carried over from ``tuned``, and the report says so: a changed
    bias goes into the adapter's ``base_layer`` (so the model still matches ``tuned``; an
    adapter file does not hold it), and so do the values of every other layer (a non-targeted
    Linear, a norm) that differs from ``base``. Layers equal in both are ``base``'s (= tuned's).
    As after ``add_lora``, only the adapters train. Neither input is modified.

    Parameters
    ----------
    tuned, base : Module
        The fine-tuned model and the one it was tuned from: the same architecture (paths, layer
        types, parameter shapes), plain layers (``merge_lora`` an adapted model first).
    rank : int
        ``r`` >= 1, the same for every layer (padded with zeros above ``min(in, out)``).
    alpha : float, optional
        Default ``2 * rank`` (scaling 2, the ratio of add_lora's defaults 8 and 16).
    targets : optional
        As ``add_lora``'s, naming layers of ``tuned``; None: every Linear.
    probe : array, optional
        Inputs to check on, besides random ones.

    Returns
    -------
    adapted : Module
    report : LoRAReport
        ``max_abs_error`` / ``max_rel_error``: the adapted model against ``tuned`` on the probes;
        ``layers``: per adapter ``path, rank, energy`` (the fraction of ``||ΔW||_F²`` kept),
        ``rel_error`` (``||scaling·BA - ΔW||_F / ||ΔW||_F``, with the stored factors) and
        ``bias_carried``; ``left``: layers left or carried, with why.

    Raises
    ------
    ValueError
        Different architectures (naming the first differing path), adapters in either model,
        no targeted Linear that changed, a bad ``rank`` or ``alpha``.
    """
    if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or rank < 1:
        raise ValueError(f"extract_lora(): rank must be a positive int, got {rank!r}")
    alpha = 2 * int(rank) if alpha is None else alpha
    new = copy_model(tuned, "extract_lora")
    _refuse_adapters(new, "tuned")
    _refuse_adapters(base, "base")
    _check_same_architecture(new, base)
    base_modules = dict(base.named_modules())
    chosen = select_linears(new, targets, "extract_lora")
    refuse_tied(new, chosen, "extract_lora")
    changed, left, layers, adapted = [], [], [], set()
    for path, layer in chosen:
        ref = base_modules[path]
        w_b = ref.weight.data.astype(np.float64)
        delta = layer.weight.data.astype(np.float64) - w_b
        bias_changed = layer.bias is not None and not np.array_equal(layer.bias.data,
                                                                      ref.bias.data)
        if not delta.any():
            left.append(f"{named(path, layer)}: weight equal to the base's, no adapter"
                        + ("; its changed bias is kept from tuned" if bias_changed else ""))
            continue
        core = linear_from(ref.weight.data, None if layer.bias is None else layer.bias.data,
                           layer.dtype)
        core.train(layer.training)
        lora = wrap(core, rank, alpha, 0.0, np.random.default_rng(0))
        a, b, energy = extract_lora_weights(delta, lora.rank, lora.scaling)
        lora.lora_A.weight.data[...] = a
        lora.lora_B.weight.data[...] = b
        norm = np.linalg.norm(delta)
        rel = float(np.linalg.norm(lora.delta_weight() - delta) / norm)
        new = set_submodule(new, path, lora)
        adapted.add(path)
        changed.append(f"{named(path, layer)} -> {_text(lora)}: "
                       f"keeps {energy:.4%} of ΔW's energy, relative error {rel:.3g}"
                       + ("; bias carried from tuned (LoRA cannot express a bias change; an "
                          "adapter file does not hold it)" if bias_changed else ""))
        layers.append({"path": path, "rank": lora.rank, "alpha": lora.alpha,
                       "scaling": lora.scaling, "energy": energy, "rel_error": rel,
                       "bias_carried": bias_changed})
    if not adapted:
        raise ValueError("extract_lora(): no targeted Linear differs between tuned and base: "
                         "there is no fine-tune to extract" + (f" ({'; '.join(left)})"
                                                               if left else ""))
    for path, m in new.named_modules():
        if path in adapted or adapter_owner(path, adapted) is not None or path not in base_modules:
            continue
        own = dict(m.named_parameters(recurse=False))
        ref = dict(base_modules[path].named_parameters(recurse=False))
        if any(not np.array_equal(p.data, ref[n].data) for n, p in own.items()) \
                and not any(path == q for q, _ in chosen):
            left.append(f"{named(path, m)}: differs from the base but is not an adapter "
                        "target: tuned's values kept")
    freeze_all_but_adapters(new)
    report = finish("extract_lora", tuned, new, probe, changed, left, layers)
    return new, lora_report(report, new)
