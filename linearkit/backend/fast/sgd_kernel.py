"""One-pass SGD with momentum, compiled by numba (imported only by ``fast.kernels()``).

The NumPy path of ``SGD`` (linearkit/optim/sgd.py) makes about six passes per parameter once its
momentum buffer exists; ``sgd_momentum`` makes one, with the same operations in the same order
on scalars rounded to the arrays' dtype as NumPy rounds a Python float: the same bits.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["sgd_momentum"]


@numba.njit(cache=True, error_model="numpy", fastmath=False, nogil=True)
def _sgd(param, grad, buf, flags, scalars):
    maximize, decay, nesterov = flags[0], flags[1], flags[2]
    wd, momentum, one_minus_dampening, lr = scalars[0], scalars[1], scalars[2], scalars[3]
    n = param.size                      # any shape, C-contiguous: one flat loop
    param, grad, buf = param.reshape(n), grad.reshape(n), buf.reshape(n)
    for i in range(n):
        g = -grad[i] if maximize else grad[i]
        p = param[i]
        if decay:
            g = g + wd * p
        b = buf[i] * momentum
        b = b + one_minus_dampening * g
        buf[i] = b
        g = g + momentum * b if nesterov else b
        param[i] = p - lr * g


def sgd_momentum(param, grad, buf, *, lr, momentum, dampening, weight_decay, nesterov, maximize,
                 scratch):
    """One SGD step with an existing momentum buffer, in place on ``param`` and ``buf``.

    ``param``, ``grad``, ``buf``: one shape, one dtype (float32 or float64), C-contiguous.
    ``scratch`` (a dict the caller keeps) holds the small arrays that carry the hyperparameters.
    """
    dtype = param.dtype
    bufs = scratch.get(dtype)
    if bufs is None:
        bufs = scratch[dtype] = (np.zeros(3, np.bool_), np.zeros(4, dtype))
    flags, scalars = bufs
    flags[0], flags[1], flags[2] = bool(maximize), weight_decay != 0, bool(nesterov)
    scalars[0], scalars[1], scalars[3] = weight_decay, momentum, lr
    scalars[2] = 1.0 - dampening
    _sgd(param, grad, buf, flags, scalars)
