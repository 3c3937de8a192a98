"""The counting rules the layer rules share: MACs and forward/backward FLOPs.

Every cost is the same 6-tuple, ``(macs, gemm_flops, bias_flops, elementwise_flops,
backward_macs, backward_flops)``. The helpers read only attributes linearkit layers share with
their PyTorch twins (``in_features``, ``weight``, ``bias``, ``requires_grad``, ``training``,
``p``, ``running_var``), so the ledger's PyTorch path counts with the same rules.
"""

from __future__ import annotations

import math

__all__ = ["ELEMENTWISE_FLOPS", "ZERO", "bilinear_cost", "elementwise_cost", "lead", "linear_cost",
           "norm_cost", "norm_module_cost", "rms_norm_cost"]

#: Nominal (forward, backward) FLOPs per element for the non-GEMM layers. No standard exists
#: (fvcore and thop ignore these layers, ptflops counts 1 per element); a transcendental
#: function (exp, tanh, erf) counts as one FLOP. Backward counts only the input gradient.
ELEMENTWISE_FLOPS = {
    "ReLU": (1, 1), "LeakyReLU": (2, 2), "Tanh": (1, 3), "Sigmoid": (3, 3), "SiLU": (4, 6),
    "GELU": (5, 8), "Softmax": (4, 4), "LogSoftmax": (4, 4), "Dropout": (1, 1),
    "Residual": (1, 1),
    # Normalization: statistics and normalizing 5/elt (mean, subtract, square, sum, scale), +1
    # each for weight and bias; backward dx 7/elt (+1 with a weight), dweight 2, dbias 1.
    # In eval mode BatchNorm is a per-channel scale and shift: 2/elt forward, 1 backward.
    "norm": (5, 7), "norm-eval": (2, 1),
    # RMSNorm: square, sum and scale 3/elt, +1 for the weight; backward dx 5/elt (g·xhat, sum,
    # xhat·mean, subtract, ·rstd; +1 with a weight), dweight 2.
    "rmsnorm": (3, 5),
}

#: The cost of a layer without arithmetic (Flatten, Identity, a container's own share).
ZERO = (0,) * 6


def lead(shape: tuple) -> int:
    """B: the product of the leading dimensions (1 for a 1-D input)."""
    return math.prod(shape[:-1])


def linear_cost(B, n_in, n_out, bias, need_dx, w_grad, b_grad):
    """(macs, gemm, bias, elementwise, bwd_macs, bwd_flops) of a Linear on B rows."""
    macs = B * n_in * n_out
    bias_flops = B * n_out if bias else 0
    bwd_macs = macs * (int(need_dx) + int(w_grad))
    return macs, 2 * macs, bias_flops, 0, bwd_macs, 2 * bwd_macs + (B * n_out if b_grad else 0)


def bilinear_cost(B, n1, n2, n_out, bias, need_dx, w_grad, b_grad):
    """(macs, gemm, bias, elementwise, bwd_macs, bwd_flops) of a Bilinear on B rows, as
    ``functional.bilinear`` and its backward contract: forward ``x1·W`` (B·n1·out·n2) then each
    row with x2 (B·out·n2); backward dW and dx2 from ``g = dy ⊗ x1`` (B·out·n1 products) one
    B·n1·out·n2 contraction each, dx1 through ``W·x2`` (one more) and a B·out·n1 one."""
    full = B * n1 * n_out * n2
    macs = full + B * n_out * n2
    bwd_macs = full * (int(w_grad) + 2 * int(need_dx)) + (B * n_out * n1 if need_dx else 0)
    bwd_flops = 2 * bwd_macs + (B * n_out * n1 if w_grad or need_dx else 0)
    bwd_flops += B * n_out if b_grad else 0
    return macs, 2 * macs, B * n_out if bias else 0, 0, bwd_macs, bwd_flops


def rms_norm_cost(numel, affine_w, need_dx, w_grad):
    """The cost of an RMSNorm on ``numel`` elements (see ELEMENTWISE_FLOPS['rmsnorm'])."""
    fwd, bwd = ELEMENTWISE_FLOPS["rmsnorm"]
    f = numel * (fwd + int(affine_w))
    b = numel * (bwd + int(affine_w)) if need_dx else 0
    b += numel * 2 if w_grad else 0
    return 0, 0, 0, f, 0, b


def norm_cost(numel, affine_w, affine_b, need_dx, w_grad, b_grad, eval_mode=False):
    """The cost of a LayerNorm / BatchNorm1d on ``numel`` elements (see ELEMENTWISE_FLOPS)."""
    fwd, bwd = ELEMENTWISE_FLOPS["norm-eval" if eval_mode else "norm"]
    f = numel * (fwd + int(affine_w) + int(affine_b))
    b = numel * (bwd + int(affine_w)) if need_dx else 0
    b += numel * (2 if w_grad else 0) + numel * (1 if b_grad else 0)
    return 0, 0, 0, f, 0, b


def norm_module_cost(m, numel, need_dx, eval_mode=False):
    """``norm_cost`` with the affine flags read from the module's ``weight`` and ``bias``."""
    w, b = m.weight, m.bias
    return norm_cost(numel, w is not None, b is not None, need_dx,
                     w is not None and w.requires_grad, b is not None and b.requires_grad,
                     eval_mode=eval_mode)


def elementwise_cost(name, numel, need_dx):
    """The cost of an elementwise layer ``name`` (a key of ELEMENTWISE_FLOPS)."""
    fwd, bwd = ELEMENTWISE_FLOPS[name]
    return 0, 0, 0, numel * fwd, 0, numel * bwd if need_dx else 0
