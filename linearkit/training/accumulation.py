"""Gradient accumulation: one optimizer step from k micro-batches, the full batch's gradient.

When a batch of ``N`` rows does not fit, run it as ``k`` micro-batches and add their gradients
before one step. For a mean-reduced loss the full batch's loss is ``L = Σ_j (D_j / D) L_j``,
where ``L_j`` is micro-batch ``j``'s mean and ``D_j`` its denominator (its rows, for
CrossEntropyLoss its targets' total weight), ``D = Σ_j D_j``. So micro-batch ``j``'s backward
starts from ``dy = D_j / D`` instead of 1: the gradients then add up to the full batch's, also
for uneven splits (``N`` not a multiple of ``k``). A sum-reduced loss needs no division
(``dy = 1``).

The pitfall this removes (a common one in tutorials): accumulating ``k`` mean losses each with
``dy = 1`` gives ``k`` times the full-batch gradient, so plain SGD takes a step ``k`` times too
large — the effective learning rate is multiplied by ``k``. Adam hides the mistake (its update
barely changes when every gradient is scaled by a constant: only through ``eps``), but gradient
clipping, L2 ``weight_decay`` (added to the gradient) and the loss curve do not.

What accumulation does *not* reproduce — BatchNorm and Dropout:

* ``BatchNorm1d`` in training mode normalizes each micro-batch with *its own* mean and variance,
  so outputs, loss and gradients differ from the full batch's, and the running statistics are
  updated ``k`` times (``num_batches_tracked += k``) from micro-batch statistics instead of once
  from the full batch's (tests/test_accumulation.py measures both). Use LayerNorm, or larger
  micro-batches, when this matters.
* ``Dropout`` draws a mask per micro-batch: the gradient is the full batch's for the masks
  drawn, not for the masks one full-batch call would draw.

Composed with a ``linearkit.training.amp.GradScaler``: every micro-batch's backward is scaled, the
gradients are unscaled *once* for the window (after the last micro-batch), then clipped, then
the optimizer steps (or the step is skipped on inf/NaN), then the scale updates.
"""

from __future__ import annotations

import contextlib
import math
from itertools import pairwise

import numpy as np

__all__ = ["accumulate", "accumulated_step", "check_clip", "finish_step", "micro_batch_slices"]

_WHERE = "linearkit.training.accumulation"


def micro_batch_slices(rows: int, micro_batches: int) -> list[slice]:
    """Split ``rows`` into ``micro_batches`` contiguous slices, sizes differing by at most one.

    The first ``rows % micro_batches`` slices get one row more (as ``numpy.array_split``).

    Examples
    --------
    >>> from linearkit.training.accumulation import micro_batch_slices
    >>> micro_batch_slices(10, 3)
    [slice(0, 4, None), slice(4, 7, None), slice(7, 10, None)]
    """
    rows = _count("rows", rows, 0)
    micro_batches = _count("micro_batches", micro_batches, 1)
    if micro_batches > rows:
        raise ValueError(
            f"{_WHERE}: micro_batches={micro_batches} is more than the batch's {rows} rows; "
            f"every micro-batch needs at least one row (use micro_batches <= {rows})")
    size, extra = divmod(rows, micro_batches)
    bounds = [0]
    for j in range(micro_batches):
        bounds.append(bounds[-1] + size + (j < extra))
    return [slice(a, b) for a, b in pairwise(bounds)]


def accumulate(model, loss_fn, x, y, *, micro_batches: int, scaler=None) -> float:
    """Forward and backward over ``micro_batches`` pieces of ``(x, y)``, adding into ``.grad``.

    Afterwards every trainable parameter's ``.grad`` holds (plus what it held before: zero it
    first) the gradient of the *full batch's* loss — for ``reduction='mean'`` each micro-batch's
    backward starts from ``dy = D_j / D`` (see the module docstring), for ``'sum'`` from 1 —
    multiplied by ``scaler``'s scale when one is given. No optimizer step.

    Parameters
    ----------
    model : Module
        Maps ``x[rows] (b, *in)`` to predictions ``(b, *out)``; its train/eval mode is left as
        the caller set it.
    loss_fn : Module
        A loss with ``reduction='mean'`` or ``'sum'``. The mean's denominator is the rows
        (``CrossEntropyLoss`` with class-index targets: the targets' total class weight, 0 for
        ``ignore_index``, so ``weight=`` and ``ignore_index`` are exact too); a custom mean loss
        is taken to average over rows.
    x : ndarray, shape (N, *in)
    y : ndarray, shape (N, *target)
    micro_batches : int
        ``k`` in ``[1, N]``: the rows are split by :func:`micro_batch_slices`.
    scaler : linearkit.training.amp.GradScaler, optional
        Scales each micro-batch's backward (``scaler.scale``); unscale once afterwards.

    Returns
    -------
    float
        The full batch's loss (unscaled): ``Σ_j (D_j / D) L_j``, or ``Σ_j L_j`` for ``'sum'``.

    Raises
    ------
    ValueError
        ``len(x) != len(y)``, an empty batch, ``micro_batches`` not in ``[1, N]``, a loss with
        ``reduction='none'`` (or none at all), a CrossEntropyLoss batch whose targets carry
        zero total weight.

    When a micro-batch raises (a ShapeError in the loss, a non-finite value under
    ``detect_anomaly``, ...), every parameter's ``.grad`` is put back as it was before the call
    — the same array with its old values, or None — and the error propagates: the gradients of
    the micro-batches that ran before it are not left half-accumulated. (What their forwards
    changed besides, such as BatchNorm's running statistics, stays.)
    """
    with _grads_restored_on_error(_all_parameters(model, loss_fn)):
        return _accumulate(model, loss_fn, x, y, micro_batches, scaler)


def _accumulate(model, loss_fn, x, y, micro_batches, scaler) -> float:
    x, y, slices = _split(x, y, micro_batches)
    reduction = getattr(loss_fn, "reduction", None)
    if reduction not in ("mean", "sum"):
        raise ValueError(
            f"{_WHERE}.accumulate: loss_fn must reduce to a scalar, reduction='mean' or 'sum'; "
            f"got {type(loss_fn).__name__} with reduction={reduction!r}. A per-element loss "
            "(reduction='none') has no single upstream gradient to split")
    if reduction == "sum":
        weights = [1.0] * len(slices)
    else:
        counts = _mean_counts(loss_fn, y, slices)
        total = sum(counts)
        if total == 0:
            raise ValueError(
                f"{_WHERE}.accumulate: the batch's targets carry zero total weight (every "
                "target is ignore_index or has class weight 0), so its mean loss is undefined; "
                "skip this batch")
        weights = [c / total for c in counts]
    loss = 0.0
    for rows, weight in zip(slices, weights):
        xb, yb = x[rows], y[rows]
        if weight == 0.0 and reduction == "mean":
            model(xb)          # no gradient from this piece; its forward still runs (BatchNorm)
            continue
        pred, backward = model.vjp(xb, input_grad=False)
        value, loss_backward = loss_fn.vjp(pred, yb)
        dy = weight if scaler is None else scaler.scale(weight)
        backward(loss_backward(dy))
        loss += weight * float(value)
    return loss


def accumulated_step(model, loss_fn, optimizer, x, y, *, micro_batches: int = 1,
                     scaler=None, clip: float | None = None, set_to_none: bool = False
                     ) -> float:
    """One optimizer step on the batch ``(x, y)``, run as ``micro_batches`` pieces.

    Exactly::

        loss = accumulate(model, loss_fn, x, y, micro_batches=k, scaler=scaler)
        if scaler: scaler.unscale_(optimizer)            # once per window
        if clip: clip_grad_norm_(optimizer's params, clip)
        scaler.step(optimizer); scaler.update()          # or optimizer.step()
        optimizer.zero_grad(set_to_none=set_to_none)

    With ``micro_batches=1`` and no scaler it is :func:`linearkit.training.loop.step` (plus ``clip``);
    the gradients must be zero (or None) on entry, as there.

    Parameters
    ----------
    model, loss_fn, x, y, micro_batches, scaler
        As :func:`accumulate`.
    optimizer : Optimizer
        Steps (and afterwards zeroes) its parameters.
    clip : float, optional
        ``max_norm`` for ``clip_grad_norm_`` (2-norm) over the optimizer's parameters, applied
        to the unscaled gradients; finite and > 0.
    set_to_none : bool
        Passed to ``optimizer.zero_grad`` (False: zero in place and reuse the buffers).

    Returns
    -------
    float
        The full batch's loss, before the update (also when the scaler skipped the step).

    A micro-batch that raises leaves every ``.grad`` as it was before the call (see
    :func:`accumulate`) and no step is taken.

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> from linearkit.training.accumulation import accumulated_step
    >>> rng = np.random.default_rng(0)
    >>> x, y = rng.standard_normal((10, 4)), rng.integers(0, 3, 10)
    >>> def fresh():
    ...     model = lk.Linear(4, 3, dtype=np.float64, rng=np.random.default_rng(1))
    ...     return model, lk.optim.SGD(model.parameters(), lr=0.1)
    >>> one, opt1 = fresh()
    >>> three, opt3 = fresh()
    >>> full = accumulated_step(one, lk.CrossEntropyLoss(), opt1, x, y)
    >>> split = accumulated_step(three, lk.CrossEntropyLoss(), opt3, x, y, micro_batches=3)
    >>> abs(full - split) < 1e-12, np.allclose(one.weight.data, three.weight.data, atol=1e-12)
    (True, True)
    """
    check_clip(clip, f"{_WHERE}.accumulated_step")
    with _grads_restored_on_error(_all_parameters(model, loss_fn, optimizer)):
        loss = _accumulate(model, loss_fn, x, y, micro_batches, scaler)
    return finish_step(optimizer, loss, scaler=scaler, clip=clip, set_to_none=set_to_none)


def check_clip(clip, where: str) -> None:
    """A ValueError naming ``where`` unless ``clip`` is None or a finite number > 0."""
    if clip is not None and (isinstance(clip, bool)
                             or not isinstance(clip, (int, float, np.floating))
                             or not (math.isfinite(clip) and clip > 0)):
        raise ValueError(f"{where}: clip is clip_grad_norm_'s max_norm, a finite number > 0; "
                         f"got {clip!r}")


def finish_step(optimizer, loss: float, *, scaler=None, clip: float | None = None,
                set_to_none: bool = False) -> float:
    """What follows the window's backwards: unscale (once), clip, step (or skip, with the
    scaler), update the scale, zero the gradients; returns ``loss``. ``accumulated_step`` and
    ``linearkit.distributed.step`` (which averages the gradients first) end with it."""
    from ..optim.clip import clip_grad_norm_

    if scaler is not None:
        scaler.unscale_(optimizer)
    if clip is not None:
        clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], clip)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=set_to_none)
    return loss


# ---------------------------------------------------------------------- helpers
def _count(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{_WHERE}: {name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def _split(x, y, micro_batches):
    x, y = np.asarray(x), np.asarray(y)
    if x.ndim == 0 or y.ndim == 0:
        raise ValueError(f"{_WHERE}: x and y need a row dimension; got x.shape={x.shape}, "
                         f"y.shape={y.shape}")
    if len(x) != len(y):
        raise ValueError(f"{_WHERE}: x and y must have the same number of rows; got "
                         f"x.shape={x.shape} and y.shape={y.shape}")
    if len(x) == 0:
        raise ValueError(f"{_WHERE}: the batch has 0 rows; there is nothing to accumulate "
                         "(skip empty batches)")
    return x, y, micro_batch_slices(len(x), micro_batches)


def _mean_counts(loss_fn, y: np.ndarray, slices: list[slice]) -> list[float]:
    """Each micro-batch's share of the mean's denominator: rows, or what the loss says each
    row weighs (``mean_weights``: cross-entropy's target weights)."""
    weights = getattr(loss_fn, "mean_weights", None)
    per_row = weights(y) if weights is not None else None
    if per_row is not None:
        return [float(per_row[rows].sum()) for rows in slices]
    return [float(rows.stop - rows.start) for rows in slices]


def _all_parameters(*owners) -> list:
    """The parameters of ``owners`` (modules, or an optimizer's ``param_groups``), each once."""
    seen, params = set(), []
    for owner in owners:
        if hasattr(owner, "param_groups"):
            found = [p for group in owner.param_groups for p in group["params"]]
        elif hasattr(owner, "parameters"):
            found = list(owner.parameters())
        else:
            continue
        for p in found:
            if id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    return params


@contextlib.contextmanager
def _grads_restored_on_error(params: list):
    """On an exception in the block, put each parameter's ``.grad`` back as it was on entry:
    the same array object holding its old values (the backwards add into it in place), or
    None; then re-raise. An all-zero gradient is remembered as "zeros" rather than copied, so
    the usual case (gradients zeroed before the window) costs no memory."""
    saved = []
    for p in params:
        g = p.grad
        values = None if g is None else (_ZEROS if not np.any(g) else np.array(g, copy=True))
        saved.append((p, g, values))
    try:
        yield
    except BaseException:
        for p, g, values in saved:
            p.grad = g
            if values is _ZEROS:
                g[...] = 0
                p.mark_zeroed()  # zeros in place: the next backward may overwrite them
            elif g is not None:
                g[...] = values
        raise


#: Marks a gradient that was all zeros on entry (restored by filling, not from a copy).
_ZEROS = object()
