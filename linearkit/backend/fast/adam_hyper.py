"""Adam's hyperparameters as the compiled kernels read them, computed in plain Python (no numba:
runtime/compiled_step.py uses this before any kernel is loaded).

``adam_kernel.adam_one`` reads ``flags`` (5 bools) and ``scalars`` (7 values of the arrays'
dtype). ``fill`` writes every entry that stays the same from step to step; ``corrections``
gives the two that change with the step count. Python floats are rounded to the dtype by
assignment into the array, as NumPy rounds them (NEP 50); the compiled step assigns the two
corrections the same way inside the kernel (a float64 stored into a float32 array rounds to
nearest, as NumPy's assignment does).
"""

from __future__ import annotations

__all__ = ["BC2_SQRT", "NEG_STEP_SIZE", "corrections", "fill"]

BC2_SQRT, NEG_STEP_SIZE = 4, 6       # the entries of ``scalars`` that change with the step


def fill(flags, scalars, *, lr, beta1, beta2, eps, weight_decay, maximize,
         decoupled_weight_decay, amsgrad, zero_grads) -> None:
    """Write ``flags (5,)`` (amsgrad, maximize, L2, decoupled decay, zero the gradients) and
    ``scalars (7,)`` except ``scalars[BC2_SQRT]`` and ``scalars[NEG_STEP_SIZE]``."""
    lr, beta1, beta2 = float(lr), float(beta1), float(beta2)
    eps, weight_decay = float(eps), float(weight_decay)
    weight = 1.0 - beta1
    lerp_small = weight < 0.5
    decay = weight_decay != 0 and decoupled_weight_decay
    flags[0], flags[1] = amsgrad, bool(maximize)
    flags[2], flags[3] = weight_decay != 0 and not decoupled_weight_decay, decay
    flags[4] = bool(zero_grads)
    scalars[0] = 1.0 - lr * weight_decay if decay else weight_decay
    scalars[1] = weight if lerp_small else weight - 1.0
    scalars[2], scalars[3] = beta2, 1.0 - beta2
    scalars[5] = eps


def corrections(lr: float, beta1: float, beta2: float, step) -> tuple[float, float]:
    """``(sqrt(1 - beta2^t), -lr / (1 - beta1^t))`` for step ``t`` (Python floats in,
    Python floats out: ``scalars[BC2_SQRT]`` and ``scalars[NEG_STEP_SIZE]``)."""
    return (1.0 - beta2 ** step) ** 0.5, -(lr / (1.0 - beta1 ** step))
