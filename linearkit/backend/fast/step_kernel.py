"""A whole training step in one compiled call: the chain's forward, fused softmax-cross-entropy
and its gradient, the chain's backward and Adam over the flat state (``fast.kernels()`` only;
planned and checked in linearkit/runtime/compiled_step.py).

It calls the very kernels the step's separate calls run, in their order: ``chain_forward``,
``softmax_ce_forward``/``_backward``, ``chain_backward`` and ``adam_one`` per parameter. The
bits are theirs (tests/test_compiled_step.py runs both); what it saves is the Python between
them (docs/fast.md, "The whole step in one call"). Its arrays arrive packed: one ``work`` array,
one ``layout`` and one ``sums`` per batch size (backend/fast/step_layout.py), so that a call
unboxes about 20 arrays instead of 40.
"""

from __future__ import annotations

import numba

from .adam_hyper import BC2_SQRT, NEG_STEP_SIZE
from .adam_kernel import adam_one
from .chain_kernel import chain_backward, chain_forward
from .softmax_ce_kernel import softmax_ce_backward, softmax_ce_forward
from .step_layout import ALPHA, BETA, EXPS, HEADER, ONES, OUT, WS

__all__ = ["train_step"]


@numba.njit(cache=True, error_model="numpy", fastmath=False, nogil=True)
def train_step(x, t, weights, biases, weight_grads, bias_grads, layout, work, sums, grads,
               exp_avg, exp_avg_sq, max_exp_avg_sq, grad_modes, adam_flags, adam_scalars,
               ignore_index, loss_scale, bc2_sqrt, neg_step_size):
    """One step; returns the summed loss (float64), or -1.0 having changed nothing but the
    scratch (``work``, ``sums``, ``adam_scalars``) when a target is not a class index in
    ``[0, C)`` or is ``ignore_index`` (the caller then runs the step's NumPy path).

    ``x (B, in_0)``, ``t (B,)`` intp targets; ``weights``/``biases`` as ``chain_forward`` takes
    them, ``weight_grads``/``bias_grads``/``grad_modes`` as ``chain_backward`` does;
    ``layout``/``work``/``sums`` for B rows (backend/fast/step_layout.py); ``loss_scale`` the
    loss gradient's factor (``1/B`` for a mean). Adam: ``grads``, ``exp_avg``, ``exp_avg_sq``,
    ``max_exp_avg_sq`` the flat ``(N,)`` arrays (the last unread without AMSGrad), layer ``i``'s
    weight and bias at ``layout``'s adam offsets; ``adam_flags``/``adam_scalars`` as
    backend/fast/adam_hyper.py fills them, the step's two corrections given as floats.
    """
    rows = x.shape[0]
    n = len(weights)
    classes = weights[n - 1].shape[0]
    one, zero = work[ALPHA], work[BETA]
    flags = layout[HEADER:HEADER + n]
    ws = work[layout[WS]:layout[OUT]]
    out = work[layout[OUT]:layout[OUT] + rows * classes].reshape(rows, classes)
    exps = work[layout[EXPS]:layout[EXPS] + rows * classes].reshape(rows, classes)
    ones = work[layout[ONES]:layout[ONES] + rows]
    row_sum, target_gap = sums[:rows], sums[rows:2 * rows]
    chain_forward(one, zero, x, weights, biases, flags, ws, out)
    total = softmax_ce_forward(out, t, ignore_index, exps, row_sum, target_gap)
    if total < 0:
        return total
    softmax_ce_backward(exps, t, row_sum, target_gap, loss_scale, exps)
    chain_backward(one, zero, exps, x, weights, flags, ws, out, weight_grads, bias_grads,
                   grad_modes, ones)
    adam_scalars[BC2_SQRT] = bc2_sqrt            # rounded to the dtype, as NumPy assigns
    adam_scalars[NEG_STEP_SIZE] = neg_step_size
    amsgrad = adam_flags[0]
    starts = layout[HEADER + n:]
    for i in range(n):
        lo = starts[2 * i]
        if lo >= 0:
            w = weights[i].reshape(weights[i].size)     # 1-D, as the biases: one version
            hi = lo + w.size
            vmax = max_exp_avg_sq[lo:hi] if amsgrad else w
            adam_one(w, grads[lo:hi], exp_avg[lo:hi], exp_avg_sq[lo:hi], vmax, adam_flags,
                     adam_scalars)
        lo = starts[2 * i + 1]
        if lo >= 0:
            b = biases[i]
            hi = lo + b.size
            vmax = max_exp_avg_sq[lo:hi] if amsgrad else b
            adam_one(b, grads[lo:hi], exp_avg[lo:hi], exp_avg_sq[lo:hi], vmax, adam_flags,
                     adam_scalars)
    return total
