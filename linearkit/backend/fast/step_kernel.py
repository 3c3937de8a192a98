"""A whole training step in one compiled call: the chain's forward, fused softmax-cross-entropy
and its gradient, the chain's backward and Adam over the flat state (``fast.kernels()`` only;
planned and checked in linearkit/runtime/compiled_step.py).

It calls the very kernels the step's separate calls run, in their order, on the same arrays:
``chain_forward``, ``softmax_ce_forward``/``_backward``, ``chain_backward`` and ``adam_one``
per parameter. The bits are theirs (tests/test_compiled_step.py runs both); what it saves is
the Python between them (docs/fast.md, "The whole step in one call", has the timing).
"""

from __future__ import annotations

import numba

from .adam_kernel import adam_one
from .chain_kernel import chain_backward, chain_forward
from .softmax_ce_kernel import softmax_ce_backward, softmax_ce_forward

__all__ = ["train_step"]


@numba.njit(cache=True, error_model="numpy", fastmath=False, nogil=True)
def train_step(one, zero, x, weights, biases, flags, ws, out,
               t, ignore_index, exps, row_sum, target_gap, loss_scale,
               weight_grads, bias_grads, grad_modes, ones,
               params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, bounds, adam_flags,
               adam_scalars):
    """One step; returns the summed loss (float64), or -1.0 having changed nothing but the
    scratch arrays (``ws``, ``out``, ``exps``, ...) when a target is not a class index in
    ``[0, C)`` or is ``ignore_index`` (the caller then runs the step's NumPy path).

    Chain arrays as ``chain_forward``/``chain_backward`` take them (``x (B, in_0)``,
    ``out (B, C)``); ``t (B,)`` intp targets; ``exps (B, C)``, ``row_sum``/``target_gap (B,)``
    float64 scratch; ``loss_scale`` the loss gradient's factor (``1/B`` for a mean). Adam:
    ``params[i]`` parameter i's data as a 1-D view, its gradient and moments
    ``grads/exp_avg/exp_avg_sq/max_exp_avg_sq[bounds[i]:bounds[i + 1]]`` (flat, shape (N,);
    ``max_exp_avg_sq`` unread without AMSGrad); ``adam_flags``/``adam_scalars`` from
    ``adam_kernel.adam_settings``.
    """
    chain_forward(one, zero, x, weights, biases, flags, ws, out)
    total = softmax_ce_forward(out, t, ignore_index, exps, row_sum, target_gap)
    if total < 0:
        return total
    softmax_ce_backward(exps, t, row_sum, target_gap, loss_scale, exps)
    chain_backward(one, zero, exps, x, weights, flags, ws, out, weight_grads, bias_grads,
                   grad_modes, ones)
    amsgrad = adam_flags[0]
    for i in range(len(params)):
        lo, hi = bounds[i], bounds[i + 1]
        p = params[i]
        vmax = max_exp_avg_sq[lo:hi] if amsgrad else p
        adam_one(p, grads[lo:hi], exp_avg[lo:hi], exp_avg_sq[lo:hi], vmax, adam_flags,
              adam_scalars)
    return total
