"""How a ``Sequential`` runs: the runner ``layers/container.py`` calls for every forward and
``vjp``. While nothing observes the children one by one (``thin_path.blocker``), the thin path
runs them (and, inside it, the compiled chain when the kernels take the whole chain); otherwise
each child goes through its own guarded call (``Sequential.forward_each`` / ``vjp_each``)."""

from __future__ import annotations

from ..layers.container import trains
from . import thin_path as _thin

__all__ = ["forward", "vjp"]


def forward(seq, x):
    """``seq(x)``'s forward: ``(*, in) -> (*, out)`` of the chain."""
    if _thin.blocker() is None:
        return _thin.chain_forward(seq.steps(), x, seq)
    return seq.forward_each(x)


def vjp(seq, x, input_grad: bool):
    """``seq.vjp(x, input_grad)``'s ``(y, backward)``."""
    if _thin.blocker() is None:
        return _thin.chain_vjp(seq.steps(), x, input_grad, trains, seq)
    return seq.vjp_each(x, input_grad)
