"""The training step and the evaluation pass, written once.

``step`` is the four lines of the README's "A training step" (the backward protocol:
docs/architecture.md);
``evaluate`` is the batched accuracy/loss pass every script used to copy. ``linearkit train``,
the init experiment, ``analysis.stats`` and the benchmarks call these, so a change to the
protocol (hooks, precision, a thread policy) lands in one place.
"""

from __future__ import annotations

import numpy as np

from ..runtime import compiled_step as _compiled_step

__all__ = ["evaluate", "step"]


def step(model, loss_fn, optimizer, x, y, *, set_to_none: bool = False) -> float:
    """One training step: forward with a backward closure, loss, backward, update, zero.

    Exactly::

        pred, backward = model.vjp(x, input_grad=False)
        loss, loss_backward = loss_fn.vjp(pred, y)
        backward(loss_backward())
        optimizer.step(); optimizer.zero_grad(set_to_none=set_to_none)

    (the last line as ``optimizer.step_and_zero_grad(set_to_none)`` when the optimizer has it:
    the same result, with Adam's compiled step zeroing the gradients in its own pass). When each
    part would run its compiled kernel anyway (a ``Sequential`` of Linear/ReLU/Residual,
    ``CrossEntropyLoss``, ``Adam``/``AdamW``; linearkit/runtime/compiled_step.py says exactly when), the
    four lines run as one compiled call: the same bits, every state left as they leave it.
    The model's train/eval mode is left as the caller set it (call ``model.train()`` first for
    Dropout and BatchNorm to behave as in training).

    Parameters
    ----------
    model : Module
        Maps ``x`` to predictions ``pred``.
    loss_fn : Module
        A loss with a scalar reduction (``'mean'`` or ``'sum'``), e.g. ``CrossEntropyLoss()``.
    optimizer : Optimizer
        Steps the model's parameters.
    x : ndarray, shape (B, *in)
    y : ndarray, shape (B,) class indices, or (B, *out) targets
    set_to_none : bool
        Passed to ``optimizer.zero_grad``. False (default) zeroes the gradients in place, so the
        next backward reuses the buffers.

    Returns
    -------
    float
        The loss of this batch, before the update.

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> from linearkit.training.loop import step
    >>> model = lk.Sequential(lk.Linear(4, 3, rng=np.random.default_rng(0)))
    >>> opt = lk.optim.SGD(model.parameters(), lr=0.1)
    >>> x, y = np.ones((2, 4), np.float32), np.array([0, 1])
    >>> first = step(model, lk.CrossEntropyLoss(), opt, x, y)
    >>> isinstance(first, float), step(model, lk.CrossEntropyLoss(), opt, x, y) < first
    (True, True)
    """
    compiled = _compiled_step.run(model, loss_fn, optimizer, x, y, set_to_none)
    if compiled is not None:    # the same step in one compiled call (linearkit/runtime/compiled_step.py)
        return compiled
    pred, backward = model.vjp(x, input_grad=False)
    loss, loss_backward = loss_fn.vjp(pred, y)
    backward(loss_backward())
    fused = getattr(optimizer, "step_and_zero_grad", None)   # the same, in fewer passes
    if fused is not None:
        fused(set_to_none)
    else:
        optimizer.step()
        optimizer.zero_grad(set_to_none=set_to_none)
    return float(loss)


def evaluate(model, x, y, *, batch_size: int = 1000, loss_fn=None) -> dict:
    """Accuracy (and loss) of ``model`` on ``(x, y)``, in evaluation mode, batch by batch.

    The model is put in eval mode for the pass (Dropout off, BatchNorm on its running
    statistics, which are not updated) and every submodule's mode is restored afterwards, even
    when the pass raises. No backward state is kept (plain forward calls).

    Parameters
    ----------
    model : Module
    x : ndarray, shape (N, *in)
    y : ndarray, shape (N,) integer class indices, or (N, *out) float targets
    batch_size : int
        Rows per forward call (>= 1); bounds the memory of the pass, not its result.
    loss_fn : Module, optional
        A loss with ``reduction='mean'``; its batch values are averaged over rows, weighted by
        the batch's length, so the result does not depend on ``batch_size`` (up to rounding).

    Returns
    -------
    dict
        ``{"accuracy": float or None, "loss": float or None}``. ``accuracy`` is the fraction of
        rows whose argmax over the last axis of ``pred (N, C)`` equals the integer label; None
        when ``y`` is not integer (a regression target). ``loss`` is None without ``loss_fn``.

    Raises
    ------
    ValueError
        ``N == 0`` (accuracy and loss are undefined), ``len(x) != len(y)``, a bad
        ``batch_size``, a loss without ``reduction='mean'``, or predictions whose leading shape
        does not match integer labels.

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> from linearkit.training.loop import evaluate
    >>> model = lk.Sequential(lk.Identity())
    >>> x = np.array([[2.0, 0.0], [0.0, 1.0], [3.0, 1.0]], np.float32)
    >>> evaluate(model, x, np.array([0, 1, 1]))
    {'accuracy': 0.6666666666666666, 'loss': None}
    """
    x = np.asarray(x)
    y = np.asarray(y)
    if x.ndim == 0 or y.ndim == 0:
        raise ValueError(f"evaluate needs arrays with a row dimension; got x.shape={x.shape}, "
                         f"y.shape={y.shape}")
    n = len(x)
    if n != len(y):
        raise ValueError(f"evaluate: x and y must have the same number of rows; got "
                         f"x.shape={x.shape} and y.shape={y.shape}")
    if n == 0:
        raise ValueError("evaluate: x has 0 rows, so accuracy and loss are undefined; "
                         "pass at least one row (is the test split empty?)")
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
            or batch_size < 1:
        raise ValueError(f"evaluate: batch_size must be an int >= 1, got {batch_size!r}")
    if loss_fn is not None and getattr(loss_fn, "reduction", "mean") != "mean":
        raise ValueError(f"evaluate: loss_fn must use reduction='mean' (got "
                         f"{loss_fn.reduction!r}); the batch means are averaged over rows")
    labels = y.dtype.kind in "iu"
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        correct, total = 0, 0.0
        for start in range(0, n, batch_size):
            xb, yb = x[start:start + batch_size], y[start:start + batch_size]
            pred = np.asarray(model(xb))
            if loss_fn is not None:
                total += float(loss_fn(pred, yb)) * len(xb)
            if labels:
                if pred.ndim < 2 or pred.shape[:-1] != yb.shape:
                    raise ValueError(
                        f"evaluate: accuracy needs predictions (N, C) for labels (N,); got "
                        f"pred.shape={pred.shape} for y.shape={yb.shape} (batch at row {start})")
                correct += int(np.count_nonzero(pred.argmax(axis=-1) == yb))
    finally:
        for module, training in modes:
            object.__setattr__(module, "training", training)
    return {"accuracy": correct / n if labels else None,
            "loss": total / n if loss_fn is not None else None}
