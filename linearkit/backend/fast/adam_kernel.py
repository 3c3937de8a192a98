"""One-pass Adam/AdamW over flat arrays, compiled by numba (imported only by ``fast.kernels()``).

``adam_direction`` + ``param += update`` (linearkit/optim/adam.py) make about 13 passes over the
arrays with temporaries; ``adam`` makes one. Every operation is the NumPy path's, in its order, on
scalars already rounded to the arrays' dtype as NumPy rounds a Python float (NEP 50), and with
``fastmath=False`` (no contraction into FMA, no reassociation): the same bits.
``error_model="numpy"`` lets the loop vectorize (division by zero gives inf/nan, as NumPy does).
"""

from __future__ import annotations

import numba
import numpy as np

from . import adam_hyper as _hyper

__all__ = ["adam_flat", "adam_settings"]

_JIT = {"cache": True, "error_model": "numpy", "fastmath": False, "nogil": True}


@numba.njit(cache=True, error_model="numpy", fastmath=False, inline="always")
def _moments(g, p, m, v, maximize, l2, wd, decay, w, beta2, one_minus_beta2):
    """One element's gradient (penalized) and moments, in ``adam_direction``'s order."""
    if maximize:
        g = -g
    if decay:                           # AdamW: p *= 1 - lr * weight_decay
        p = p * wd
    elif l2:                            # Adam's L2 penalty: g = g + weight_decay * p
        g = g + wd * p
    diff = g - m
    m = m + diff * w if w > 0 else g + diff * w     # _lerp_: w is weight or weight - 1
    v = v * beta2
    v = v + one_minus_beta2 * g * g
    return p, m, v


@numba.njit(**_JIT)
def adam_one(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, flags, scalars):
    maximize, l2, decay, zero_grad = flags[1], flags[2], flags[3], flags[4]
    wd, w, beta2, one_minus_beta2 = scalars[0], scalars[1], scalars[2], scalars[3]
    bc2_sqrt, eps, neg_step_size = scalars[4], scalars[5], scalars[6]
    n = param.size                      # any shape, C-contiguous: one flat loop
    param, grad, exp_avg = param.reshape(n), grad.reshape(n), exp_avg.reshape(n)
    exp_avg_sq = exp_avg_sq.reshape(n)
    if flags[0]:                        # AMSGrad (a separate loop: no aliasing to check)
        max_exp_avg_sq = max_exp_avg_sq.reshape(n)
        for i in range(n):
            p, m, v = _moments(grad[i], param[i], exp_avg[i], exp_avg_sq[i], maximize, l2, wd,
                               decay, w, beta2, one_minus_beta2)
            exp_avg[i], exp_avg_sq[i] = m, v
            if zero_grad:                   # zero_grad(set_to_none=False), in the same pass
                grad[i] = 0
            vm = max_exp_avg_sq[i]
            if not np.isnan(vm) and not vm >= v:     # np.maximum: nan wins
                vm = v
            max_exp_avg_sq[i] = vm
            param[i] = p + m * neg_step_size / (np.sqrt(vm) / bc2_sqrt + eps)
    else:
        for i in range(n):
            p, m, v = _moments(grad[i], param[i], exp_avg[i], exp_avg_sq[i], maximize, l2, wd,
                               decay, w, beta2, one_minus_beta2)
            exp_avg[i], exp_avg_sq[i] = m, v
            if zero_grad:
                grad[i] = 0
            param[i] = p + m * neg_step_size / (np.sqrt(v) / bc2_sqrt + eps)


def _array(p):
    """A Parameter's ``.data`` (read at call time), or the array itself."""
    return p if isinstance(p, np.ndarray) else p.data


def adam_settings(scratch, dtype, *, step, lr, beta1, beta2, eps, weight_decay=0.0,
                  maximize=False, decoupled_weight_decay=False, amsgrad=False, zero_grads=False):
    """``(flags, scalars)``: the small arrays that carry one step's hyperparameters into ``adam_one``
    (kept in ``scratch``, a dict the caller keeps, so that a step allocates nothing). The Python
    floats are rounded to ``dtype`` by assignment, as NumPy rounds them (NEP 50):
    backend/fast/adam_hyper.py."""
    bufs = scratch.get(dtype)
    if bufs is None:
        bufs = scratch[dtype] = (np.zeros(5, np.bool_), np.zeros(7, dtype))
    flags, scalars = bufs
    _hyper.fill(flags, scalars, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                weight_decay=weight_decay, maximize=maximize,
                decoupled_weight_decay=decoupled_weight_decay, amsgrad=amsgrad,
                zero_grads=zero_grads)
    scalars[_hyper.BC2_SQRT], scalars[_hyper.NEG_STEP_SIZE] = _hyper.corrections(
        float(lr), float(beta1), float(beta2), step)
    return flags, scalars


def adam_flat(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, *, step, lr, beta1, beta2,
              eps, weight_decay=0.0, maximize=False, decoupled_weight_decay=False, scratch=None,
              zero_grads=False):
    """``adam_step`` on each ``(param, grad, m, v[, v_max])``, one pass each.

    ``params`` holds arrays or Parameters (their ``.data`` is stepped, read at call time).
    The arrays of one parameter share its shape and are C-contiguous; all share one dtype
    (float32 or float64); ``max_exp_avg_sqs`` is None without AMSGrad.
    The hyperparameters are Python floats, rounded here to the dtype exactly as NumPy rounds them.
    ``scratch`` (a dict the caller keeps): see ``adam_settings``. ``zero_grads``: each gradient
    is set to 0 in the same pass, after it is read (``zero_grad(set_to_none=False)`` without its
    own pass).
    """
    amsgrad = max_exp_avg_sqs is not None
    flags, scalars = adam_settings(
        {} if scratch is None else scratch, _array(params[0]).dtype, step=step, lr=lr,
        beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay, maximize=maximize,
        decoupled_weight_decay=decoupled_weight_decay, amsgrad=amsgrad, zero_grads=zero_grads)
    for i, p in enumerate(params):
        p = _array(p)
        vmax = max_exp_avg_sqs[i] if amsgrad else p    # unread without AMSGrad
        adam_one(p, grads[i], exp_avgs[i], exp_avg_sqs[i], vmax, flags, scalars)
