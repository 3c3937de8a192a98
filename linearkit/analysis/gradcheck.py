"""Gradient check: the analytic backward (``vjp``) against central differences.

The scalar checked is a fixed random projection ``L = Σ y·r`` (``r`` drawn once from
``seed``), so one backward call ``backward(r)`` gives the whole analytic gradient of L, and
``(L(θ+ε) - L(θ-ε)) / 2ε`` per element gives the numeric one, for every input and parameter.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.module import Module
from ..rules import rule_for

__all__ = ["GradcheckError", "GradcheckResult", "Mismatch", "TensorReport", "gradcheck"]

# dtype -> (eps, atol, rtol); see gradcheck's docstring for why.
_DEFAULTS = {np.dtype(np.float64): (1e-6, 1e-5, 1e-3), np.dtype(np.float32): (1e-3, 1e-2, 1e-2)}


class GradcheckError(AssertionError):
    """The analytic gradient disagrees with the numeric one; ``.result`` has the details."""

    def __init__(self, message: str, result: GradcheckResult | None = None):
        super().__init__(message)
        self.result = result


@dataclass
class Mismatch:
    """One element: ``name`` (``input[0]`` or a parameter path), its index, both gradients."""

    name: str
    index: tuple
    analytic: float
    numeric: float

    def __str__(self) -> str:
        return (f"{self.name}[{', '.join(map(str, self.index))}]: analytic {self.analytic:.6g}, "
                f"numeric {self.numeric:.6g}")


@dataclass
class TensorReport:
    """Errors of one checked tensor; ``worst`` is the element furthest outside tolerance."""

    name: str
    shape: tuple
    ok: bool
    max_abs_error: float
    max_rel_error: float
    worst: Mismatch | None
    score: float = 0.0  # max |a - n| / (atol + rtol·|n|); > 1 fails


@dataclass
class GradcheckResult:
    """``ok`` (also its truth value), the largest errors, the ``worst`` element (furthest outside
    tolerance) and a ``TensorReport`` per tensor name. ``max_rel_error`` is ``|a-n|/max(|a|,|n|)``
    over elements above atol (tinier ones count only in the absolute error)."""

    ok: bool
    max_abs_error: float
    max_rel_error: float
    worst: Mismatch | None
    tensors: dict
    dtype: np.dtype
    eps: float
    atol: float
    rtol: float

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        head = (f"gradcheck {'passed' if self.ok else 'FAILED'} ({self.dtype}, eps={self.eps:g}, "
                f"atol={self.atol:g}, rtol={self.rtol:g}): max abs error "
                f"{self.max_abs_error:.3g}, max rel error {self.max_rel_error:.3g}")
        lines = [head]
        if self.worst is not None:
            lines.append(f"  worst: {self.worst}")
        width = max((len(n) for n in self.tensors), default=0)
        for t in self.tensors.values():
            lines.append(f"  {t.name:<{width}}  {t.shape!s:<12} max abs {t.max_abs_error:.2e}"
                         f"  max rel {t.max_rel_error:.2e}  {'ok' if t.ok else 'FAILED'}")
        return "\n".join(lines)


def _compare(name, a, n, atol, rtol) -> TensorReport:
    err = np.abs(a - n)
    big = np.maximum(np.abs(a), np.abs(n))
    rel = np.where(big > atol, err / np.where(big > atol, big, 1.0), 0.0)
    score = np.nan_to_num(err / (atol + rtol * np.abs(n)), nan=np.inf)
    if a.size == 0:
        return TensorReport(name, a.shape, True, 0.0, 0.0, None)
    k = np.unravel_index(int(np.argmax(score)), a.shape)
    worst = Mismatch(name, tuple(int(i) for i in k), float(a[k]), float(n[k]))
    return TensorReport(name, a.shape, bool(score.max() <= 1), float(err.max()),
                        float(rel.max()), worst, float(score.max()))


def _numeric(arr: np.ndarray, eps: float, loss, name: str) -> np.ndarray:
    """Central differences of ``loss`` for each element of ``arr`` (moved in place, restored)."""
    numeric = np.empty(arr.shape)
    for idx in np.ndindex(arr.shape):
        orig = arr[idx].copy()
        try:
            arr[idx] = orig + eps
            hi, f_hi = float(arr[idx]), loss()
            arr[idx] = orig - eps
            lo, f_lo = float(arr[idx]), loss()
        finally:
            arr[idx] = orig
        if hi == lo:
            raise ValueError(f"eps={eps:g} is too small to move {name}{list(idx)}={orig}")
        numeric[idx] = (f_hi - f_lo) / (hi - lo)
    return numeric


def gradcheck(module_or_fn, *inputs, eps=None, atol=None, rtol=None, raise_on_failure=False,
              params=True, seed=0) -> GradcheckResult:
    """Compare the analytic gradients of ``module_or_fn`` with central differences.

    ``module_or_fn``: a ``Module`` (checked through ``module.vjp(*inputs)``) or a callable
    ``fn(*inputs) -> (y, backward)`` with the same protocol: ``backward(dy)`` returns the input
    gradient, or a tuple of them (None: no dependence). ``y`` is one array or a scalar. Hold an
    input fixed (a loss's target) by closing over it: ``lambda p: loss.vjp(p, target)``;
    integer inputs are held fixed anyway.

    Checked: every floating input (perturbed on a copy; the caller's arrays are untouched) and,
    with ``params=True``, every parameter of the module that requires grad (``params`` may
    instead map names to Parameters, e.g. for an ``fn`` closing over a model, or be False).
    Each element moves by ±eps and is restored bit for bit; every ``.grad`` and buffer
    (BatchNorm running statistics) is put back as it was: the check loses nothing.

    Determinism: the module is checked in its current mode. BatchNorm in training mode is
    deterministic given the batch. Dropout in training mode uses one fixed mask (from ``seed``,
    the same for every evaluation; the library generator is not consumed), so its gradient is
    that of the function the mask defines. Other randomness raises ValueError (use ``eval()``).

    Defaults follow the lowest precision among the checked tensors. float64: eps=1e-6,
    atol=1e-5, rtol=1e-3 (truncation ~eps², rounding ~1e-16/eps, both far below atol).
    float32: eps=1e-3, atol=rtol=1e-2 (unit roundoff 6e-8 makes the rounding error in L about
    6e-8·|L|/eps ≈ 1e-4·|L|, truncation ~1e-6; 1e-2 leaves margin while an O(1) bug still
    fails). float16 is refused. An element passes when ``|analytic - numeric| <= atol +
    rtol·|numeric|``; errors are measured on the exact step stored (``x±eps`` rounded).

    Returns a ``GradcheckResult``; with ``raise_on_failure=True`` a failure raises
    ``GradcheckError`` (an AssertionError) carrying it.
    """
    if not inputs:
        raise TypeError("gradcheck needs at least one input")
    module = module_or_fn if isinstance(module_or_fn, Module) else None
    if module is None and not callable(module_or_fn):
        raise TypeError(f"expected a Module or a callable, got {type(module_or_fn).__name__}")
    fn = (lambda *a: module.vjp(*a, input_grad=True)) if module is not None else module_or_fn
    xs = [np.array(x, copy=True) for x in inputs]
    modules = list(module.modules()) if module is not None else []
    # The layers that draw a random mask (a 'dropout' rule: Dropout and its subclasses), each
    # pinned to its own seeded Generator (Dropout.rng) while the check runs.
    dropouts = [m for m in modules if getattr(rule_for(m), "kind", None) == "dropout"
                and m.training and m.p > 0]
    saved_rngs = [m.rng for m in dropouts]
    saved_buffers = [(m, name, b, b.copy()) for m in modules
                     for name, b in m.named_buffers(recurse=False, remove_duplicate=False)]
    saved_grads = []

    def evaluate():
        for k, m in enumerate(dropouts):
            m.rng = np.random.default_rng([seed, k])
        y, backward = fn(*xs)
        return np.asarray(y), backward

    try:
        y, backward = evaluate()
        again, _ = evaluate()
        if again.shape != y.shape or not np.array_equal(again, y, equal_nan=True):
            raise ValueError("gradcheck needs a deterministic function, but two evaluations at "
                             "the same point differ; call model.eval() or fix its random state")
        named = (list(module.named_parameters()) if module is not None else []) \
            if params is True else list(dict(params or {}).items())
        named = [(n, p) for n, p in named if p.requires_grad]
        everything = list(module.parameters()) if module is not None else []
        everything += [p for _, p in named if all(p is not q for q in everything)]
        saved_grads = [(p, p.grad) for p in everything]
        for p in everything:
            p.grad = None
        r = np.random.default_rng(seed).standard_normal(y.shape).astype(y.dtype)
        r64, grads = r.astype(np.float64), backward(r)
        grads = grads if isinstance(grads, tuple) else (grads,)
        # (name, array perturbed in place, analytic gradient)
        targets = [(f"input[{i}]", x, grads[i] if i < len(grads) else None)
                   for i, x in enumerate(xs) if x.dtype.kind == "f"]
        targets += [(n, p.data, p.grad) for n, p in named]

        if not targets:
            raise ValueError("nothing to check: no floating input and no trainable parameter")
        dtypes = {t[1].dtype for t in targets}
        if dtypes - set(_DEFAULTS):
            raise TypeError(f"gradcheck supports float32 and float64, got {sorted(map(str, dtypes))}"
                            "; convert first, e.g. model.to(np.float64) and x.astype(np.float64)")
        dtype = np.dtype(np.float32) if np.dtype(np.float32) in dtypes else np.dtype(np.float64)
        eps, atol, rtol = (d if v is None else v for v, d in zip((eps, atol, rtol),
                                                                   _DEFAULTS[dtype]))

        def loss() -> float:
            return float(np.sum(evaluate()[0].astype(np.float64) * r64))

        reports = {}
        for name, arr, g in targets:
            analytic = np.zeros(arr.shape) if g is None else np.asarray(g, dtype=np.float64)
            if analytic.shape != arr.shape:
                raise GradcheckError(f"{name}: analytic gradient has shape {analytic.shape}, "
                                     f"but the tensor has shape {arr.shape}")
            numeric = _numeric(arr, eps, loss, name)
            reports[name] = _compare(name, analytic, numeric, atol, rtol)
    finally:
        for m, rng in zip(dropouts, saved_rngs):
            m.rng = rng
        for m, name, b, values in saved_buffers:
            b[...] = values
            setattr(m, name, b)
        for p, grad in saved_grads:
            p.grad = grad

    ranked = sorted(reports.values(), key=lambda t: t.score)
    result = GradcheckResult(
        ok=all(t.ok for t in ranked),
        max_abs_error=float(np.max([t.max_abs_error for t in ranked] or [0.0])),
        max_rel_error=float(np.max([t.max_rel_error for t in ranked] or [0.0])),
        worst=ranked[-1].worst if ranked else None,
        tensors=reports, dtype=dtype, eps=eps, atol=atol, rtol=rtol)
    if raise_on_failure and not result.ok:
        raise GradcheckError(str(result), result)
    return result
