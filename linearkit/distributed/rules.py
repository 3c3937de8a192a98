"""The rules of the tensor-parallel layers: per-rank ledger rows. Registered when
``linearkit.distributed`` is imported (the only way to have one of these layers), so the rules
room never imports distributed.

A rank's ledger counts what that rank holds and does: its shard's parameters (so the parameter
and memory columns are per rank), the GEMMs of its shard, and — in the row's note — the bytes
its collectives carry per call: the payload of each all-gather / all-reduce (the array every
rank ends up with), and in brackets what a ring algorithm moves per rank (``2(N-1)/N`` of an
all-reduce's payload, ``(N-1)/N`` of an all-gather's).

Their kinds are not ``'linear'``: the findings and the transforms read a 'linear' row as a whole
``(out, in)`` weight, and a shard is not one (``gather_linear`` rebuilds it).
"""

from __future__ import annotations

import math

from ..errors import ShapeError
from ..rules.cost_rules import lead, linear_cost
from ..rules.registry import LayerRule, register_rule
from .parallel_linear import ColumnParallelLinear, RowParallelLinear

__all__ = ["COLUMN_PARALLEL_LINEAR", "ROW_PARALLEL_LINEAR", "RULES", "comm_bytes", "register_rules"]


def _check(m, shape, width: int) -> None:
    if len(shape) == 0 or shape[-1] != width:
        raise ShapeError(f"expected input of shape (*, {width}), got {tuple(shape)}", module=m)


def _in_width(m) -> int:
    if isinstance(m, RowParallelLinear) and m.input_is_parallel:
        return m.hi - m.lo
    return m.in_features


def comm_bytes(m, shape) -> dict:
    """Payload bytes of ``m``'s collectives for one call on an input of ``shape``:
    ``{'forward': (op, bytes) or None, 'backward': (op, bytes) or None}`` (backward assumes
    the input gradient is needed; without it a column layer sends nothing back)."""
    rows, size = lead(shape), m.weight.data.itemsize
    out, full_in = rows * m.out_features * size, rows * m.in_features * size
    if m.world_size == 1:
        return {"forward": None, "backward": None}
    if isinstance(m, ColumnParallelLinear):
        return {"forward": ("all-gather", out) if m.gather_output else None,
                "backward": ("all-reduce", full_in)}
    return {"forward": ("all-reduce", out),
            "backward": None if m.input_is_parallel else ("all-gather", full_in)}


def _note(m, shape) -> str:
    from ..analysis.ledger.report import human_bytes

    side = "out" if isinstance(m, ColumnParallelLinear) else "in"
    text = f"rank {m.rank}/{m.world_size}, {side}[{m.lo}:{m.hi}]"
    if shape is None:
        return text
    n = m.world_size
    parts = []
    for where, entry in comm_bytes(m, shape).items():
        if entry is not None:
            op, payload = entry
            ring = payload * (2 * (n - 1) if op == "all-reduce" else n - 1) // n
            label = "forward" if where == "forward" else "backward (when dx is needed)"
            parts.append(f"{label} {op} {human_bytes(payload)} (ring {human_bytes(ring)}/rank)")
    return text + ("; " + ", ".join(parts) if parts else "; no communication")


def _out(m, shape):
    _check(m, shape, _in_width(m))
    if isinstance(m, ColumnParallelLinear) and not m.gather_output:
        return shape[:-1] + (m.hi - m.lo,)
    return shape[:-1] + (m.out_features,)


def _cost(m, shape, need_dx):
    n_in = m.in_features if isinstance(m, ColumnParallelLinear) else m.hi - m.lo
    n_out = m.hi - m.lo if isinstance(m, ColumnParallelLinear) else m.out_features
    bias = m.bias is not None
    return linear_cost(lead(shape), n_in, n_out, bias, need_dx, m.weight.requires_grad,
                       bias and m.bias.requires_grad)


def _saved(m, shape, need_dx):
    if not m.weight.requires_grad:
        return []
    if isinstance(m, RowParallelLinear) and not m.input_is_parallel:
        return [("input_slice", lead(shape) * (m.hi - m.lo))]  # its own contiguous copy
    return [("input", math.prod(shape))]


def _info(m, shape) -> dict:
    info = {"in": m.in_features, "out": m.out_features, "bias": m.bias is not None,
            "rank": m.rank, "world_size": m.world_size, "lo": m.lo, "hi": m.hi}
    if shape is not None:
        info["comm_bytes"] = comm_bytes(m, shape)
    return info


def _rule(kind: str, name: str) -> LayerRule:
    return LayerRule(
        kind=kind,
        describe=lambda m: f"{name}({m.in_features}, {m.out_features}"
                           + ("" if m.bias is not None else ", bias=False") + ")",
        output_shape=_out, cost=_cost, saved=_saved, info=_info, note=_note,
        # gather_linear reads the shard's weight, bias and split, which every subclass keeps
        transforms=("gather_linear",), transforms_inherited=True)


COLUMN_PARALLEL_LINEAR = _rule("column_parallel_linear", "ColumnParallelLinear")
ROW_PARALLEL_LINEAR = _rule("row_parallel_linear", "RowParallelLinear")

RULES = [(ColumnParallelLinear, COLUMN_PARALLEL_LINEAR), (RowParallelLinear, ROW_PARALLEL_LINEAR)]


def register_rules() -> None:
    """Register both layers' rules (``linearkit.distributed`` does, once, when imported)."""
    for layer_type, rule in RULES:
        register_rule(layer_type, rule)
