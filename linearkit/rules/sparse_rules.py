"""The rule of ``SparseLinear`` (CSR weight): ledger row, cost, and how model files rebuild it.

Its kind is ``'sparse_linear'``, not ``'linear'``: the findings read a 'linear' row as a dense
``(out, in)`` weight (merging two of them multiplies dense matrices, a low-rank finding takes an
SVD), and neither is true of a layer that stores only its nonzeros.
"""

from __future__ import annotations

import math

from ..layers.sparse import SparseLinear
from .cost_rules import lead
from .rebuild import Rebuild
from .registry import LayerRule

__all__ = ["RULES", "SPARSE_LINEAR", "sparse_text"]


def sparse_text(n_in: int, n_out: int, density: float, bias: bool) -> str:
    """'SparseLinear(784, 256, density=0.10)' (two significant digits below 1%)."""
    shown = f"{density:.2f}" if density >= 0.01 or density == 0 else f"{density:.2g}"
    return (f"SparseLinear({n_in}, {n_out}, density={shown}" + ("" if bias else ", bias=False")
            + ")")


def _out(m, shape):
    m.check_input_shape(shape)
    return shape[:-1] + (m.out_features,)


def _cost(m, shape, need_dx):
    # One multiply-add per stored entry and row, forward and for each of dX and d(values).
    B = lead(shape)
    bias = m.bias is not None
    macs = B * m.nnz
    bwd_macs = macs * (int(need_dx) + int(m.weight_values.requires_grad))
    db = B * m.out_features if bias and m.bias.requires_grad else 0
    return macs, 2 * macs, B * m.out_features if bias else 0, 0, bwd_macs, 2 * bwd_macs + db


def _args(m) -> dict:
    # nnz makes the rebuilt placeholder's arrays the shapes of the file's, so they load.
    return {"in_features": m.in_features, "out_features": m.out_features, "nnz": m.nnz,
            "bias": m.bias is not None, "dtype": m.weight_values.dtype.name}


SPARSE_LINEAR = LayerRule(
    kind="sparse_linear",
    describe=lambda m: sparse_text(m.in_features, m.out_features, m.density,
                                   m.bias is not None),
    output_shape=_out,
    cost=_cost,
    # The closure holds x (for d values) only when the values train.
    saved=lambda m, shape, need_dx: ([("input", math.prod(shape))]
                                     if m.weight_values.requires_grad else []),
    info=lambda m, shape: {"in": m.in_features, "out": m.out_features,
                           "bias": m.bias is not None, "nnz": m.nnz, "density": m.density},
    note=lambda m, shape: (f"CSR: {m.nnz:,} of {m.in_features * m.out_features:,} weights "
                           "stored"),
    rebuild=Rebuild(_args),
)

RULES = [(SparseLinear, SPARSE_LINEAR)]
