"""Per-layer statistics and what looks wrong in them.

:class:`LayerStats` holds one layer's statistics; :func:`find_flags` turns a list of them into
:class:`Flag` findings. The flag kinds and their thresholds are described in
:mod:`linearkit.analysis.stats`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["Flag", "LayerStats", "find_flags"]


@dataclass
class LayerStats:
    """Statistics of one layer (one call position), averaged over the recorded steps."""

    path: str
    type: str
    call: int
    shape: tuple | None
    steps: int
    mean: float | None
    std: float | None
    max_abs: float | None
    zero_fraction: float | None
    grad_out_norm: float | None
    grad_in_norm: float | None
    param_grad_norms: dict[str, float] = field(default_factory=dict)
    param_norms: dict[str, float] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The path, with ``#k`` appended for the k-th reuse of a module within a step."""
        return self.path if self.call == 0 else f"{self.path}#{self.call}"

    @property
    def param_grad_norm(self) -> float | None:
        """Norm of all this layer's parameter gradients together (None without any)."""
        if not self.param_grad_norms:
            return None
        return math.sqrt(sum(v * v for v in self.param_grad_norms.values()))


@dataclass
class Flag:
    """One finding: ``kind`` (listed in :mod:`linearkit.analysis.stats`), the layer, the value,
    a message."""

    kind: str
    layer: str
    value: float
    message: str

    def __str__(self) -> str:
        return self.message


def find_flags(layers: list[LayerStats], *, ratio: float = 10.0, grad_rtol: float = 1e-5,
               dead_fraction: float = 0.99) -> list[Flag]:
    """The flags for a list of layer statistics (thresholds: :mod:`linearkit.analysis.stats`)."""
    flags: list[Flag] = []
    with_std = [s for s in layers if s.std is not None]
    ref = next((s for s in with_std if s.std > 0), None)
    if ref is not None:
        for s in with_std:
            r = s.std / ref.std
            if r < 1.0 / ratio:
                flags.append(Flag("vanishing_activation", s.name, r,
                                  f"{s.name}: activation std {s.std:.3g} is {1 / r:.3g}x smaller "
                                  f"than at the first layer {ref.name} ({ref.std:.3g})"
                                  if r > 0 else
                                  f"{s.name}: activation std is 0 (first layer {ref.name}: "
                                  f"{ref.std:.3g})"))
            elif r > ratio:
                flags.append(Flag("exploding_activation", s.name, r,
                                  f"{s.name}: activation std {s.std:.3g} is {r:.3g}x larger than "
                                  f"at the first layer {ref.name} ({ref.std:.3g})"))
    with_grad = [s for s in layers if s.grad_out_norm is not None]
    last = next((s for s in reversed(with_grad) if s.grad_out_norm > 0), None)
    if last is not None:
        for s in with_grad:
            r = s.grad_out_norm / last.grad_out_norm
            if r < 1.0 / ratio:
                flags.append(Flag("vanishing_gradient", s.name, r,
                                  f"{s.name}: gradient norm at the output {s.grad_out_norm:.3g} is "
                                  f"{1 / r:.3g}x smaller than at the last layer {last.name} "
                                  f"({last.grad_out_norm:.3g})" if r > 0 else
                                  f"{s.name}: gradient at the output is exactly 0"))
            elif r > ratio:
                flags.append(Flag("exploding_gradient", s.name, r,
                                  f"{s.name}: gradient norm at the output {s.grad_out_norm:.3g} is "
                                  f"{r:.3g}x larger than at the last layer {last.name} "
                                  f"({last.grad_out_norm:.3g})"))
    for s in layers:
        for n, g in s.param_grad_norms.items():
            p = s.param_norms.get(n)
            if p is None:
                continue
            rel = g / p if p > 0 else (0.0 if g == 0 else math.inf)
            if rel < grad_rtol:
                flags.append(Flag("small_param_grad", f"{s.name}.{n}", rel,
                                  f"{s.name}.{n}: ‖grad‖/‖param‖ = {rel:.3g} < {grad_rtol:g} "
                                  f"(‖grad‖ = {g:.3g}); this parameter will barely move"))
        if s.zero_fraction is not None and s.zero_fraction >= dead_fraction:
            flags.append(Flag("dead_units", s.name, s.zero_fraction,
                              f"{s.name}: {100 * s.zero_fraction:.1f}% of the outputs are "
                              "exactly 0"))
    return flags
