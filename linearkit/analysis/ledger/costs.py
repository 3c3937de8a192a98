"""The ledger's counting conventions, as printed with every table.

The formulas themselves live with the layer rules (``linearkit.rules.cost_rules``), which both the
linearkit and the PyTorch path cost with; they are re-exported here.
"""

from __future__ import annotations

from ...rules.cost_rules import (
    ELEMENTWISE_FLOPS,
    ZERO,
    elementwise_cost,
    lead,
    linear_cost,
    norm_cost,
    norm_module_cost,
)

__all__ = ["CONVENTIONS", "ELEMENTWISE_FLOPS", "ZERO", "elementwise_cost", "lead", "linear_cost",
           "norm_cost", "norm_module_cost"]

CONVENTIONS = (
    "MACs = multiply-adds of the matmuls (Linear: B*in*out, B = product of the leading dims). "
    "FLOPs = 2 per multiply-add + 1 per output element for each bias (Linear: 2*B*in*out + "
    "B*out) + nominal elementwise costs (ReLU 1/elt, norms 5-7/elt, see ELEMENTWISE_FLOPS). "
    "Backward = dX GEMM 2*B*in*out (skipped for the first layer / a frozen prefix) + dW GEMM "
    "2*B*in*out (skipped for a frozen weight) + B*out per trainable bias + elementwise. "
    "torch FlopCounterMode = 2*MACs (it counts 2*M*N*K per matmul and no bias adds); "
    "fvcore/thop 'FLOPs' = MACs. Saved = bytes the backward closures hold for this batch, "
    "each array once, parameters excluded."
)
