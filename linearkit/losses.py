"""Losses with PyTorch's semantics: MSELoss, L1Loss, SmoothL1Loss, HuberLoss, CrossEntropyLoss,
NLLLoss, BCELoss, BCEWithLogitsLoss, KLDivLoss.

Each loss is a Module with ``forward(pred, target) -> loss`` and
``vjp(pred, target) -> (loss, backward)``; ``backward(dy=None)`` returns ``dL/dpred`` (``dy``
defaults to 1 for the scalar reductions; for ``reduction='none'`` it has the loss's shape).

Conventions shared by every loss:

* ``reduction`` is ``'mean'`` (default), ``'sum'`` or ``'none'``. The loss is a 0-d ndarray
  (an array of per-element losses for ``'none'``) in ``pred``'s dtype; float32 stays float32.
* ``target`` is cast to ``pred``'s dtype where it holds values (MSE, L1, BCE, CE probabilities).
* Deliberate departures from PyTorch, each raising a clear error instead of a silent result:
  a ``'mean'`` (or KLDivLoss's ``'batchmean'``) over zero elements (an empty batch, or — for
  CrossEntropyLoss/NLLLoss — a batch whose targets are all ``ignore_index`` or carry zero total
  weight) raises ``ValueError`` where PyTorch returns NaN; the elementwise losses (MSE, L1,
  SmoothL1, Huber, BCE, BCEWithLogits, KLDiv) need ``target.shape == pred.shape`` where PyTorch
  broadcasts (with a warning) and usually computes the wrong thing.
"""

from __future__ import annotations

import numpy as np

from . import functional as F
from .backend import fast
from .core.module import Module
from .errors import ClassIndexError, DTypeError, Located, ShapeError

__all__ = ["BCELoss", "BCEWithLogitsLoss", "CrossEntropyLoss", "HuberLoss", "KLDivLoss", "L1Loss",
           "MSELoss", "NLLLoss", "SmoothL1Loss"]

_REDUCTIONS = ("mean", "sum", "none")


class _LossValueError(Located, ValueError):
    """A target value (not its shape or dtype) the loss cannot take; names the loss."""


def _optional_array(name: str, value) -> np.ndarray | None:
    if value is None:
        return None
    array = np.asarray(value)
    if array.dtype.kind not in "fiu":
        raise TypeError(f"{name} must be a real-valued array, got dtype {array.dtype}")
    if array.dtype.kind != "f":
        array = array.astype(np.float32)
    return array


class _Loss(Module):
    """Shared argument checks and reductions; subclasses implement ``_run(pred, target)``."""

    def __init__(self, reduction: str = "mean"):
        super().__init__()
        if reduction not in _REDUCTIONS:
            raise ValueError(
                f"{type(self).__name__}: reduction must be 'mean', 'sum' or 'none', "
                f"got {reduction!r}")
        self.reduction = reduction

    def forward(self, pred, target) -> np.ndarray:
        """The loss: a 0-d ndarray (``'mean'``/``'sum'``) or per-element array (``'none'``)."""
        return self._run(pred, target)[0]

    def vjp(self, pred, target):
        """``(loss, backward)``; ``backward(dy=None)`` returns ``dL/dpred`` (pred's shape)."""
        return self._run(pred, target)

    def _run(self, pred, target):  # pragma: no cover - abstract
        raise NotImplementedError

    def mean_weights(self, target) -> np.ndarray | None:
        """Each sample's share of the ``'mean'`` reduction's denominator, ``(B,)`` float64, for
        a loss whose mean is not over the batch's rows; None when every row counts 1 (what
        gradient accumulation splits a batch's mean by)."""
        return None

    # ------------------------------------------------------------------ checks
    def _pred(self, pred) -> np.ndarray:
        if not isinstance(pred, np.ndarray):
            pred = np.asarray(pred, dtype=np.float32)
        if pred.dtype.kind != "f":
            raise DTypeError(
                f"pred must be a floating-point array, got dtype {pred.dtype}", module=self,
                hint="pass the model's output (logits/predictions), or cast it: "
                     "pred.astype(np.float32)")
        return pred

    def _same_shape_target(self, pred: np.ndarray, target) -> np.ndarray:
        """``target`` with pred's shape, cast to pred's dtype (values, not class indices)."""
        target = np.asarray(target)
        if target.dtype.kind not in "fiub":
            raise DTypeError(f"target must be a real-valued array, got dtype {target.dtype}",
                             module=self)
        if target.shape != pred.shape:
            hint = None
            if target.size == pred.size:
                hint = ("same number of elements, different shape: reshape it, e.g. "
                        "target.reshape(pred.shape)")
                if pred.shape[-1:] == (1,):
                    hint += " (a model with one output gives (N, 1); targets are often (N,))"
            raise ShapeError(
                f"target shape {target.shape} must equal pred shape {pred.shape} "
                "(linearkit does not broadcast targets: PyTorch warns and broadcasts, which "
                "usually computes the wrong loss)", module=self, hint=hint)
        return target.astype(pred.dtype, copy=False)

    def _empty_mean(self, what: str = "an empty batch (0 elements)") -> _LossValueError:
        return _LossValueError(
            f"reduction='mean' over {what} is undefined (PyTorch returns NaN)", module=self,
            hint="skip empty batches, or use reduction='sum' and divide by your own count")

    def _scale(self, dy, count):
        """Upstream gradient per element: ``dy / count`` for 'mean', ``dy`` for 'sum'/'none'."""
        if self.reduction == "none":
            if dy is None:
                raise _LossValueError(
                    "backward() needs dy for reduction='none' (the loss is not a scalar)",
                    module=self, hint="pass dy of the loss's shape, e.g. backward(np.ones_like("
                                      "loss)), or use reduction='mean' or 'sum'")
            return dy
        scale = 1.0 if dy is None else dy
        return scale / count if self.reduction == "mean" else scale

    #: options the repr shows after ``reduction`` when they differ from their default
    _repr_options: tuple[tuple[str, object], ...] = ()

    def extra_repr(self) -> str:
        parts = [] if self.reduction == "mean" else [f"reduction='{self.reduction}'"]
        parts += [f"{name}={getattr(self, name)}" for name, default in self._repr_options
                  if getattr(self, name) != default]
        return ", ".join(parts)


class _Elementwise(_Loss):
    """A loss ``l(pred, target)`` elementwise over same-shaped arrays."""

    def _reduce(self, loss: np.ndarray, dtype) -> tuple[np.ndarray, int]:
        n = loss.size
        if self.reduction == "none":
            return np.asarray(loss), n
        if self.reduction == "mean":
            if n == 0:
                raise self._empty_mean()
            return np.asarray(loss.sum() / n, dtype=dtype), n
        return np.asarray(loss.sum(), dtype=dtype), n


class MSELoss(_Elementwise):
    """Mean squared error ``(pred - target)²``, reduced by ``reduction``.

    Shape: pred ``(*)``, target ``(*)`` (same shape; cast to pred's dtype) -> loss ``()`` or
    ``(*)`` for ``'none'``.

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> lk.MSELoss()(np.array([1.0, 3.0], np.float32), np.array([0.0, 1.0], np.float32))
    array(2.5, dtype=float32)
    """

    def _run(self, pred, target):
        x = self._pred(pred)
        d = np.asarray(x - self._same_shape_target(x, target))
        loss, n = self._reduce(d * d, x.dtype)

        def backward(dy=None):
            g = np.asarray(d * self._scale(dy, n))
            g *= 2
            return g

        return loss, backward


class L1Loss(_Elementwise):
    """Mean absolute error ``|pred - target|``; its gradient is ``sign(pred - target)`` (0 at 0).

    Shape: pred ``(*)``, target ``(*)`` (same shape) -> loss ``()`` or ``(*)`` for ``'none'``.
    """

    def _run(self, pred, target):
        x = self._pred(pred)
        d = np.asarray(x - self._same_shape_target(x, target))
        loss, n = self._reduce(np.abs(d), x.dtype)

        def backward(dy=None):
            r = self._scale(dy, n)
            return np.asarray(np.sign(d) * r)

        return loss, backward


class BCEWithLogitsLoss(_Loss):
    """Binary cross-entropy on logits: ``-w [pw·y log σ(x) + (1 - y) log(1 - σ(x))]``.

    Computed as ``(1 - y) x + (1 + (pw - 1) y) softplus(-x)`` with
    ``softplus(-x) = log1p(exp(-|x|)) + max(-x, 0)``: exact and finite for logits of any size.

    Parameters
    ----------
    weight : array, optional
        Rescales each element's loss; broadcast against pred (e.g. ``(C,)`` or ``(N, 1)``).
    reduction : 'mean' (over all elements) | 'sum' | 'none'
    pos_weight : array, optional
        Weight of the positive term, broadcast along the last (class) dimension, ``(C,)``.

    Shape
    -----
    pred ``(*)`` logits, target ``(*)`` in [0, 1] (same shape; bool/int 0-1 labels are
    cast to pred's dtype) -> loss ``()`` or ``(*)`` for ``'none'``.
    """

    def __init__(self, weight=None, reduction: str = "mean", pos_weight=None):
        super().__init__(reduction)
        self.register_buffer("weight", _optional_array("BCEWithLogitsLoss weight", weight))
        self.register_buffer("pos_weight",
                             _optional_array("BCEWithLogitsLoss pos_weight", pos_weight))

    def _broadcast(self, name: str, array, x: np.ndarray):
        if array is None:
            return None
        try:
            ok = np.broadcast_shapes(array.shape, x.shape) == x.shape
        except ValueError:
            ok = False
        if not ok:
            raise ShapeError(f"{name} of shape {array.shape} does not broadcast to pred's shape "
                             f"{x.shape}", module=self,
                             hint=f"{name} needs one entry per class along the last dimension, "
                                  f"shape ({x.shape[-1] if x.ndim else 1},)")
        return array.astype(x.dtype, copy=False)

    def _run(self, pred, target):
        x = self._pred(pred)
        y = self._same_shape_target(x, target)
        w = self._broadcast("weight", self.weight, x)
        pw = self._broadcast("pos_weight", self.pos_weight, x)
        n = x.size
        if self.reduction == "mean" and n == 0:
            raise self._empty_mean()
        e = np.exp(-np.abs(x))                                 # exp(-|x|) in (0, 1]
        softplus_neg = np.log1p(e)
        softplus_neg += np.maximum(-x, 0)                      # softplus(-x) = -log σ(x)
        lw = None if pw is None else (pw - 1) * y + 1          # weight of the log σ term
        loss = (1 - y) * x
        loss += softplus_neg if lw is None else lw * softplus_neg
        if w is not None:
            loss *= w
        if self.reduction != "none":
            total = loss.sum()
            loss = np.asarray(total / n if self.reduction == "mean" else total, dtype=x.dtype)
        else:
            # A 0-d input's arithmetic gives a NumPy scalar; the loss is an ndarray either way.
            loss = np.asarray(loss)

        def backward(dy=None):
            r = self._scale(dy, n)
            # σ(x) from exp(-|x|): 1/(1+e) for x >= 0, e/(1+e) otherwise (no overflow).
            sig = np.where(x >= 0, 1, e)
            sig /= 1 + e
            if lw is None:
                sig -= y                                       # dL/dx = σ(x) - y
            else:
                sig *= lw
                sig -= pw * y                                  # dL/dx = lw σ(x) - pw y
            if w is not None:
                sig *= w
            sig *= r
            return sig

        return loss, backward

# The fused cross-entropy kernel makes one exp per element through libm (not vectorized) where
# NumPy's exp is SIMD: it wins while call overheads dominate, so it is used up to this many
# elements (batch x classes; docs/fast.md, "Figures behind choices in the code").
FUSED_CE_MAX = 8192


class CrossEntropyLoss(_Loss):
    """Cross-entropy between logits and class indices or class probabilities (PyTorch's).

    Parameters
    ----------
    weight : array ``(C,)``, optional
        Per-class rescaling. With class indices, ``'mean'`` divides by the sum of the targets'
        weights (``Σ weight[target]`` over non-ignored entries), exactly as PyTorch.
    ignore_index : int
        Class-index targets equal to it contribute neither loss nor gradient (default -100).
    reduction : 'mean' | 'sum' | 'none'
    label_smoothing : float in [0, 1]
        Mixes the target with the uniform distribution: ``(1 - ε) target + ε / C``; with
        ``weight`` the uniform part is weighted per class, as in PyTorch.

    Shape
    -----
    pred ``(N, C)`` or ``(N, C, d1, …)`` logits, or ``(C,)`` for one unbatched sample;
    target either class indices, integer ``(N,)`` / ``(N, d1, …)`` / ``()`` in ``[0, C)``, or
    class probabilities, float with pred's shape. loss: ``()``, or ``(N, d1, …)`` for ``'none'``.

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> logits = np.array([[2.0, 0.0, 0.0]], np.float32)
    >>> loss, backward = lk.CrossEntropyLoss().vjp(logits, np.array([0]))
    >>> loss.shape, loss.dtype, round(float(loss), 4)
    ((), dtype('float32'), 0.2395)
    >>> backward().round(3)
    array([[-0.213,  0.107,  0.107]], dtype=float32)
    """

    def __init__(self, weight=None, ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0):
        super().__init__(reduction)
        weight = _optional_array("CrossEntropyLoss weight", weight)
        if weight is not None and weight.ndim != 1:
            raise ValueError(f"CrossEntropyLoss: weight must be 1-D (one entry per class), got "
                             f"shape {weight.shape}")
        self.register_buffer("weight", weight)
        if isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, np.integer)):
            raise TypeError(f"CrossEntropyLoss: ignore_index must be an int, got {ignore_index!r}")
        self.ignore_index = int(ignore_index)
        label_smoothing = float(label_smoothing)
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"CrossEntropyLoss: label_smoothing must be in [0, 1], got "
                             f"{label_smoothing}")
        self.label_smoothing = label_smoothing

    def mean_weights(self, target) -> np.ndarray | None:
        """Each row's share of the ``'mean'`` denominator for class-index targets ``(B, *)``:
        the class weights of its targets (1 each without ``weight``), 0 for ``ignore_index``;
        None for class probabilities (every row counts 1)."""
        target = np.asarray(target)
        if target.dtype.kind not in "iu":
            return None
        t = target.reshape(len(target), -1).astype(np.intp)
        keep = t != self.ignore_index
        w = self.weight
        if w is None:
            return keep.sum(axis=1).astype(np.float64)
        w = np.asarray(w, np.float64)
        safe = np.clip(np.where(keep, t, 0), 0, max(len(w) - 1, 0))  # the loss checks range
        return (w[safe] * keep).sum(axis=1) if len(w) else np.zeros(len(target))

    # ------------------------------------------------------------------ target checks
    def _target_error(self, x: np.ndarray, target: np.ndarray, index_shape: tuple) -> Exception:
        kind = target.dtype.kind
        both = (f"expected class indices (integer, shape {index_shape}) or class probabilities "
                f"(float, shape {x.shape}, pred's shape), got {target.dtype} target of shape "
                f"{target.shape}")
        if kind == "f" and target.shape == index_shape:
            return DTypeError(both, module=self, hint="class indices must be integers: "
                              "target.astype(np.int64)")
        if x.ndim == 1 and kind in "iu" and target.ndim == 1:
            return ShapeError(both, module=self, hint=(
                "a 1-D pred is read as ONE unbatched sample of C logits (target shape ()); "
                "for a batch pass logits (N, C); for one logit per sample use "
                "BCEWithLogitsLoss"))
        if kind in "iub" and target.shape == x.shape:
            return DTypeError(both, module=self, hint=(
                "an integer target of pred's shape looks one-hot: pass class indices "
                "target.argmax(axis=1), or probabilities target.astype(pred.dtype)"))
        if kind not in "iuf":
            return DTypeError(both, module=self, hint="cast the class indices: "
                              "target.astype(np.int64)")
        hint = None
        if target.shape == index_shape + (1,):
            hint = "drop the trailing 1: target.reshape(-1)" if target.ndim == 2 \
                else "drop the trailing 1: target.squeeze(-1)"
        elif x.ndim == 1:
            hint = ("a 1-D pred is read as ONE unbatched sample of C logits (target shape ()); "
                    "for a batch pass logits (N, C); for one logit per sample use "
                    "BCEWithLogitsLoss")
        elif x.ndim >= 3 and target.shape == x.shape[:-1]:
            hint = ("the class dimension must be dim 1, as in PyTorch: pass "
                    "np.moveaxis(pred, -1, 1), or flatten to pred.reshape(-1, C) with "
                    "target.reshape(-1)")
        elif target.ndim == 1 and x.ndim == 2 and target.shape[0] == x.shape[1] != x.shape[0]:
            hint = "is pred transposed? it must be (N, C) with one row per sample"
        return ShapeError(both, module=self, hint=hint)

    def _check_range(self, t: np.ndarray, keep, num_classes: int) -> None:
        bad = (t < 0) | (t >= num_classes)
        if keep is not None:
            bad &= keep
        if not bad.any():
            return
        values = np.unique(t[bad])
        shown = ", ".join(str(v) for v in values[:5]) + (", …" if values.size > 5 else "")
        hint = None
        if t.min() >= 1 and t.max() == num_classes:
            hint = "the labels look 1-based: pass target - 1"
        elif values.min() < 0:
            hint = (f"negative labels are not classes; if they mark padding, set "
                    f"ignore_index to that value, e.g. {type(self).__name__}(ignore_index="
                    f"{int(values.min())})")
        else:
            hint = f"does the model's last layer have out_features={int(t.max()) + 1}?"
        raise ClassIndexError(
            f"target holds class index {shown}, but pred has C={num_classes} classes "
            f"(valid: 0..{num_classes - 1}, or ignore_index={self.ignore_index} to skip an "
            "entry)", module=self, hint=hint)

    def _class_rows(self, x: np.ndarray, c: int, dtype):
        """``(weight, x2)``: the class weights checked against ``c`` classes and cast to
        ``dtype`` (None without weights), and ``x`` with its classes on the last axis, one row
        per loss element, ``x2 (M, C)``; an empty batch under ``'mean'`` is an error."""
        w = self.weight
        if w is not None:
            if w.shape != (c,):
                raise ShapeError(f"weight has shape {w.shape} but pred has C={c} classes",
                                 module=self, hint=f"pass one weight per class, shape ({c},)")
            w = w.astype(dtype, copy=False)
        if x.ndim == 1:
            x2 = x[None]
        elif x.ndim == 2:
            x2 = x
        else:
            x2 = np.moveaxis(x, 1, -1).reshape(-1, c)
        if x2.shape[0] == 0 and self.reduction == "mean":
            raise self._empty_mean()
        return w, x2

    # ------------------------------------------------------------------ forward / backward
    def _run(self, pred, target):
        x = self._pred(pred)
        if x.ndim == 0:
            raise ShapeError("pred must have a class dimension: (N, C), (N, C, d1, ...) or (C,),"
                             " got a 0-d array", module=self)
        target = np.asarray(target)
        dtype = x.dtype
        c = x.shape[1] if x.ndim >= 2 else x.shape[0]
        index_shape = x.shape[:1] + x.shape[2:] if x.ndim >= 2 else ()
        kind = target.dtype.kind
        if kind in "iu" and target.shape == index_shape:
            probabilities = False
        elif kind == "f" and target.shape == x.shape:
            probabilities = True
        else:
            raise self._target_error(x, target, index_shape)
        if c == 0:
            raise ShapeError(f"pred has 0 classes (shape {x.shape})", module=self)
        w, x2 = self._class_rows(x, c, dtype)
        m = x2.shape[0]
        eps = self.label_smoothing
        if not probabilities and w is None and not eps and self.reduction != "none":
            fused = self._fused(x, x2, target, c)
            if fused is not None:
                return fused
        logp = F.log_softmax(x2, -1)

        if probabilities:
            q = target.astype(dtype, copy=False)
            q = q[None] if x.ndim == 1 else (q if x.ndim == 2 else
                                             np.moveaxis(q, 1, -1).reshape(-1, c))
            if eps:
                q = q * (1.0 - eps) + eps / c
            wq = q if w is None else q * w
            rows = -np.einsum("ij,ij->i", logp, wq)
            denom = m
        else:
            t = target.reshape(-1)
            if t.dtype != np.intp:
                t = t.astype(np.intp)
            keep = None
            if m:
                lo, hi = int(t.min()), int(t.max())
                if lo <= self.ignore_index <= hi:
                    keep = t != self.ignore_index
                if lo < 0 or hi >= c:
                    self._check_range(t, keep, c)
                if keep is not None:
                    t = np.where(keep, t, 0)               # a safe index for ignored rows
            arange = np.arange(m)
            rows = logp[arange, t]                         # log p of the target class
            if keep is not None:
                rows[~keep] = 0
            # Target weight per row (0 where ignored); None means 1 everywhere.
            wt = w[t] if w is not None else None
            kf = None if keep is None else keep.astype(dtype)
            if kf is not None:
                wt = kf if wt is None else wt * kf
            if wt is not None:
                rows *= wt
            np.negative(rows, out=rows)
            if eps:
                smooth = -(logp.sum(axis=1) if w is None else logp @ w)
                if keep is not None:
                    smooth[~keep] = 0
                rows *= 1.0 - eps
                rows += (eps / c) * smooth
            denom = m if wt is None else wt.sum()
            if self.reduction == "mean" and denom == 0:
                raise self._empty_mean("targets whose total weight is 0 (every target is "
                                       "ignore_index, or has class weight 0)")

        if self.reduction == "none":
            loss = rows.reshape(index_shape)
        else:
            total = rows.sum()
            loss = np.asarray(total / denom if self.reduction == "mean" else total, dtype=dtype)

        def backward(dy=None):
            r = self._scale(dy, denom)
            if self.reduction == "none":
                r = r.reshape(m, 1)
            dx = np.exp(logp, out=logp)                    # softmax, reusing logp's memory
            if probabilities:
                dx *= wq.sum(axis=1, keepdims=True)
                dx -= wq
            elif wt is None and not eps:
                dx[arange, t] -= 1
            else:
                # d/dx of -(1-ε) w_t log p_t - (ε/C) Σ_k w_k log p_k, per row (0 if ignored).
                g = (1.0 - eps) if wt is None else (1.0 - eps) * wt
                coef = g
                if eps:
                    mean_w = 1.0 if w is None else w.sum() / c
                    coef = g + (eps * mean_w if kf is None else (eps * mean_w) * kf)
                dx *= coef if np.ndim(coef) == 0 else coef[:, None]
                dx[arange, t] -= g
                if eps:
                    uniform = eps / c if w is None else (eps / c) * w
                    dx -= uniform if kf is None else kf[:, None] * uniform
            dx *= r
            if x.ndim == 1:
                return dx.reshape(c)
            if x.ndim == 2:
                return dx
            moved = dx.reshape(x.shape[:1] + x.shape[2:] + (c,))
            return np.ascontiguousarray(np.moveaxis(moved, -1, 1))

        return loss, backward

    def _fused(self, x, x2, target, c):
        """The common case (integer targets all in range, none ignored, a scalar reduction) in
        two compiled passes (``fast.softmax_ce_forward``/``_backward``); None when the
        kernels cannot take it, and the NumPy path runs. Results are rounded once from float64
        (the kernel's docstring), so they can differ from the NumPy path's by a few ulp."""
        m = x2.shape[0]
        if not (0 < m and x.ndim <= 2 and x2.size <= FUSED_CE_MAX and x2.flags.c_contiguous
                and fast.supports(x2.dtype)):
            return None
        kernels = fast.kernels()
        if kernels is None:
            return None
        t = target.reshape(-1).astype(np.intp, copy=False)
        exps = np.empty_like(x2)
        row_sum, target_gap = np.empty((2, m))
        total = kernels.softmax_ce_forward(x2, t, self.ignore_index, exps, row_sum, target_gap)
        if total < 0:       # a target out of range or ignored: the NumPy path raises or ignores
            return None
        mean = self.reduction == "mean"
        loss = np.asarray(total / m if mean else total, dtype=x2.dtype)

        def backward(dy=None):
            scale = 1.0 if dy is None else float(dy)
            kernels.softmax_ce_backward(exps, t, row_sum, target_gap,
                                        scale / m if mean else scale, exps)
            return exps.reshape(c) if x.ndim == 1 else exps

        return loss, backward

    def extra_repr(self) -> str:
        parts = []
        if self.weight is not None:
            parts.append(f"weight=<{self.weight.shape[0]} classes>")
        if self.ignore_index != -100:
            parts.append(f"ignore_index={self.ignore_index}")
        if self.reduction != "mean":
            parts.append(f"reduction='{self.reduction}'")
        if self.label_smoothing:
            parts.append(f"label_smoothing={self.label_smoothing}")
        return ", ".join(parts)


# ------------------------------------------------------------------------ more elementwise losses
class SmoothL1Loss(_Elementwise):
    """Smooth L1: ``0.5 d² / beta`` where ``|d| < beta``, else ``|d| - 0.5 beta`` (``d = pred -
    target``); ``beta=0`` is exactly L1Loss, as in PyTorch. Its gradient is ``clip(d / beta, -1,
    1)`` (``sign(d)`` for ``beta=0``).

    Shape: pred ``(*)``, target ``(*)`` (same shape; cast to pred's dtype) -> loss ``()`` or
    ``(*)`` for ``'none'``.
    """

    _repr_options = (("beta", 1.0),)

    def __init__(self, reduction: str = "mean", beta: float = 1.0):
        super().__init__(reduction)
        beta = float(beta)
        if not beta >= 0:
            raise ValueError(f"SmoothL1Loss: beta must be >= 0 (PyTorch refuses negative "
                             f"values), got {beta}")
        self.beta = beta

    def _run(self, pred, target):
        x = self._pred(pred)
        d = np.asarray(x - self._same_shape_target(x, target))
        a = np.abs(d)
        beta = self.beta
        if beta == 0:
            elementwise = a
        else:
            elementwise = np.where(a < beta, (0.5 / beta) * d * d, a - 0.5 * beta).astype(
                x.dtype, copy=False)
        loss, n = self._reduce(elementwise, x.dtype)

        def backward(dy=None):
            r = self._scale(dy, n)
            g = np.sign(d) if beta == 0 else np.clip(d / beta, -1, 1)
            return np.asarray(g * r, dtype=x.dtype)

        return loss, backward


class HuberLoss(_Elementwise):
    """Huber: ``0.5 d²`` where ``|d| < delta``, else ``delta (|d| - 0.5 delta)`` (``d = pred -
    target``); equals ``delta * SmoothL1Loss(beta=delta)``. Its gradient is ``clip(d, -delta,
    delta)``.

    Shape: pred ``(*)``, target ``(*)`` (same shape; cast to pred's dtype) -> loss ``()`` or
    ``(*)`` for ``'none'``.
    """

    _repr_options = (("delta", 1.0),)

    def __init__(self, reduction: str = "mean", delta: float = 1.0):
        super().__init__(reduction)
        delta = float(delta)
        if not delta > 0:
            raise ValueError(f"HuberLoss: delta must be > 0 (PyTorch refuses non-positive "
                             f"values), got {delta}")
        self.delta = delta

    def _run(self, pred, target):
        x = self._pred(pred)
        d = np.asarray(x - self._same_shape_target(x, target))
        a = np.abs(d)
        delta = self.delta
        elementwise = np.where(a < delta, 0.5 * d * d, delta * (a - 0.5 * delta)).astype(
            x.dtype, copy=False)
        loss, n = self._reduce(elementwise, x.dtype)

        def backward(dy=None):
            r = self._scale(dy, n)
            return np.asarray(np.clip(d, -delta, delta) * r, dtype=x.dtype)

        return loss, backward


class BCELoss(_Elementwise):
    """Binary cross-entropy on probabilities: ``-w [y log x + (1 - y) log(1 - x)]``.

    As in PyTorch, each log is clamped at -100 (so ``x = 0`` or ``1`` gives a finite loss), and
    the gradient ``w (x - y) / max(x (1 - x), 1e-12)`` is finite too. Use BCEWithLogitsLoss on
    logits instead where you can: it is exact for any logit.

    Parameters
    ----------
    weight : array, optional
        Rescales each element's loss; broadcast against pred (e.g. ``(C,)`` or ``(N, 1)``).
    reduction : 'mean' (over all elements) | 'sum' | 'none'

    Shape
    -----
    pred ``(*)`` probabilities in [0, 1], target ``(*)`` in [0, 1] (same shape; bool/int
    0-1 labels are cast to pred's dtype) -> loss ``()`` or ``(*)`` for ``'none'``.
    """

    # PyTorch's floor on x (1 - x) in the gradient's denominator: a C++ float constant, so
    # float64 sees 1e-12 rounded to float32 (9.99999996e-13).
    EPSILON = float(np.float32(1e-12))

    def __init__(self, weight=None, reduction: str = "mean"):
        super().__init__(reduction)
        self.register_buffer("weight", _optional_array("BCELoss weight", weight))

    _broadcast = BCEWithLogitsLoss._broadcast

    def _run(self, pred, target):
        x = self._pred(pred)
        y = self._same_shape_target(x, target)
        w = self._broadcast("weight", self.weight, x)
        # Out-of-range probabilities (and NaN) are an error in PyTorch as well.
        if x.size and not ((x >= 0) & (x <= 1)).all():
            raise _LossValueError(
                "all elements of pred must be probabilities in [0, 1] (PyTorch raises too)",
                module=self, hint="apply a sigmoid first, or pass the logits to "
                                  "BCEWithLogitsLoss (more accurate)")
        with np.errstate(divide="ignore"):                # log(0) = -inf, clamped below
            log_x = np.maximum(np.log(x), -100)
            log_1mx = np.maximum(np.log1p(-x), -100)
        elementwise = np.asarray((y - 1) * log_1mx - y * log_x)
        if w is not None:
            elementwise = elementwise * w
        loss, n = self._reduce(elementwise, x.dtype)

        def backward(dy=None):
            r = self._scale(dy, n)
            g = (x - y) / np.maximum((1 - x) * x, x.dtype.type(self.EPSILON))
            if w is not None:
                g *= w
            return np.asarray(g * r, dtype=x.dtype)

        return loss, backward


class KLDivLoss(_Elementwise):
    """Kullback–Leibler divergence ``target (log target - pred)``, pred holding log-probabilities.

    With ``log_target=True`` the target holds log-probabilities too: ``exp(target) (target -
    pred)``. A zero target contributes 0 (``0 log 0 = 0``, as PyTorch's ``xlogy``).

    Parameters
    ----------
    reduction : 'mean' | 'batchmean' | 'sum' | 'none'
        ``'mean'`` divides the sum by the number of elements (PyTorch's, which warns that it is
        not the KL divergence); ``'batchmean'`` divides by the batch size ``pred.shape[0]`` (by 1
        for a 0-d pred), the KL divergence per sample.
    log_target : bool

    Shape
    -----
    pred ``(*)`` log-probabilities, target ``(*)`` (same shape; cast to pred's dtype) ->
    loss ``()`` or ``(*)`` for ``'none'``. The gradient is ``-target`` (``-exp(target)``).
    """

    _repr_options = (("log_target", False),)

    def __init__(self, reduction: str = "mean", log_target: bool = False):
        if reduction not in _REDUCTIONS + ("batchmean",):
            raise ValueError(f"KLDivLoss: reduction must be 'mean', 'batchmean', 'sum' or "
                             f"'none', got {reduction!r}")
        batchmean = reduction == "batchmean"
        super().__init__("sum" if batchmean else reduction)
        self.reduction = reduction
        self.batchmean = batchmean
        self.log_target = bool(log_target)

    def _run(self, pred, target):
        x = self._pred(pred)
        t = self._same_shape_target(x, target)
        if self.log_target:
            p = np.exp(t)
            elementwise = p * (t - x)
        else:
            p = t
            with np.errstate(divide="ignore", invalid="ignore"):
                # xlogy(t, t): 0 where t == 0; NaN for a negative target, as in PyTorch.
                xlogx = np.where(t == 0, 0, t * np.log(np.where(t == 0, 1, t)))
            elementwise = xlogx - t * x
        elementwise = np.asarray(elementwise, dtype=x.dtype)
        if not self.batchmean:
            loss, n = self._reduce(elementwise, x.dtype)
            scale = lambda dy: self._scale(dy, n)          # what backward applies
        else:
            batch = x.shape[0] if x.ndim else 1
            if batch == 0:
                raise self._empty_mean("an empty batch (0 samples), with 'batchmean'")
            loss = np.asarray(elementwise.sum() / batch, dtype=x.dtype)
            scale = lambda dy: (1.0 if dy is None else dy) / batch

        def backward(dy=None):
            return np.asarray(-p * scale(dy), dtype=x.dtype)

        return loss, backward


# ------------------------------------------------------------------------ NLLLoss
class NLLLoss(_Loss):
    """Negative log-likelihood of class indices: ``-weight[t] pred[t]``, pred holding
    log-probabilities (e.g. a log-softmax's output); CrossEntropyLoss is log-softmax then this.

    Parameters
    ----------
    weight : array ``(C,)``, optional
        Per-class rescaling. ``'mean'`` divides by the sum of the targets' weights
        (``Σ weight[target]`` over non-ignored entries), exactly as PyTorch.
    ignore_index : int
        Targets equal to it contribute neither loss nor gradient, nor to the mean's denominator
        (default -100).
    reduction : 'mean' | 'sum' | 'none'

    Shape
    -----
    pred ``(N, C)`` or ``(N, C, d1, …)`` log-probabilities, or ``(C,)`` for one unbatched
    sample; target integer class indices ``(N,)`` / ``(N, d1, …)`` / ``()`` in ``[0, C)``.
    loss: ``()``, or ``(N, d1, …)`` for ``'none'``.
    """

    def __init__(self, weight=None, ignore_index: int = -100, reduction: str = "mean"):
        super().__init__(reduction)
        weight = _optional_array("NLLLoss weight", weight)
        if weight is not None and weight.ndim != 1:
            raise ValueError(f"NLLLoss: weight must be 1-D (one entry per class), got "
                             f"shape {weight.shape}")
        self.register_buffer("weight", weight)
        if isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, np.integer)):
            raise TypeError(f"NLLLoss: ignore_index must be an int, got {ignore_index!r}")
        self.ignore_index = int(ignore_index)

    # The same class-index bookkeeping as CrossEntropyLoss's.
    mean_weights = CrossEntropyLoss.mean_weights
    _check_range = CrossEntropyLoss._check_range
    _class_rows = CrossEntropyLoss._class_rows

    def _run(self, pred, target):
        x = self._pred(pred)
        if x.ndim == 0:
            raise ShapeError("pred must have a class dimension: (N, C), (N, C, d1, ...) or (C,),"
                             " got a 0-d array", module=self)
        target = np.asarray(target)
        dtype = x.dtype
        c = x.shape[1] if x.ndim >= 2 else x.shape[0]
        index_shape = x.shape[:1] + x.shape[2:] if x.ndim >= 2 else ()
        if target.dtype.kind not in "iu":
            raise DTypeError(
                f"target must hold integer class indices (shape {index_shape}), got dtype "
                f"{target.dtype}", module=self, hint="cast the class indices: "
                "target.astype(np.int64); for class probabilities use KLDivLoss or "
                "CrossEntropyLoss")
        if target.shape != index_shape:
            hint = None
            if target.shape == index_shape + (1,):
                hint = "drop the trailing 1: target.squeeze(-1)"
            elif x.ndim == 1:
                hint = ("a 1-D pred is read as ONE unbatched sample of C log-probabilities "
                        "(target shape ()); for a batch pass (N, C)")
            elif x.ndim >= 3 and target.shape == x.shape[:-1]:
                hint = ("the class dimension must be dim 1, as in PyTorch: pass "
                        "np.moveaxis(pred, -1, 1)")
            raise ShapeError(f"target shape {target.shape} must be pred's shape without the "
                             f"class dimension (dim 1), {index_shape}, for pred of shape "
                             f"{x.shape}", module=self, hint=hint)
        w, x2 = self._class_rows(x, c, dtype)
        m = x2.shape[0]
        t = target.reshape(-1).astype(np.intp)
        keep = t != self.ignore_index
        if m:
            self._check_range(t, keep, c)
        t = np.where(keep, t, 0)                           # a safe index for ignored rows
        # Each row's weight: weight[t] (1 without weight), 0 where ignored.
        wt = keep.astype(dtype) if w is None else w[t] * keep
        arange = np.arange(m)
        rows = -(x2[arange, t] * wt)
        denom = wt.sum()
        if self.reduction == "mean" and denom == 0:
            raise self._empty_mean("targets whose total weight is 0 (every target is "
                                   "ignore_index, or has class weight 0)")
        if self.reduction == "none":
            loss = np.asarray(rows.reshape(index_shape), dtype=dtype)
        else:
            total = rows.sum()
            loss = np.asarray(total / denom if self.reduction == "mean" else total, dtype=dtype)

        def backward(dy=None):
            r = self._scale(dy, denom)
            if self.reduction == "none":
                r = np.asarray(r).reshape(m)
            dx = np.zeros_like(x2)
            dx[arange, t] = -wt * r                        # only the target entry has a slope
            if x.ndim == 1:
                return dx.reshape(c)
            if x.ndim == 2:
                return dx
            moved = dx.reshape(x.shape[:1] + x.shape[2:] + (c,))
            return np.ascontiguousarray(np.moveaxis(moved, -1, 1))

        return loss, backward

    def extra_repr(self) -> str:
        parts = []
        if self.weight is not None:
            parts.append(f"weight=<{self.weight.shape[0]} classes>")
        if self.ignore_index != -100:
            parts.append(f"ignore_index={self.ignore_index}")
        if self.reduction != "mean":
            parts.append(f"reduction='{self.reduction}'")
        return ", ".join(parts)
