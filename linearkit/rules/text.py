"""Type texts more than one rule writes (a rule's ``describe`` and its torch twin's)."""

from __future__ import annotations

__all__ = ["bilinear_text", "linear_text"]


def linear_text(n_in, n_out, bias: bool) -> str:
    """The type text of a Linear: 'Linear(784, 256)', 'Linear(784, 256, bias=False)'."""
    return f"Linear({n_in}, {n_out}" + ("" if bias else ", bias=False") + ")"


def bilinear_text(n1, n2, n_out, bias: bool) -> str:
    """The type text of a Bilinear: 'Bilinear(20, 30, 40)', 'Bilinear(20, 30, 40, bias=False)'."""
    return f"Bilinear({n1}, {n2}, {n_out}" + ("" if bias else ", bias=False") + ")"
