"""Which routes the runtime may take: every route is on unless ``disabled`` turns it off for a
block. Tests and benchmarks compare routes through this switch (and ``LINEARKIT_FAST=0``, which
turns every compiled kernel off); nothing else changes a route.

The routes, fastest first:

* ``"compiled_step"`` — ``loop.step`` as one compiled call (runtime/compiled_step.py);
* ``"compiled_chain"`` — a ``Sequential`` of Linear/ReLU/Residual as one compiled forward and
  one compiled backward (runtime/compiled_chain.py);
* ``"fused_linear_relu"`` — on the thin path, ``Linear -> ReLU`` as one step;
* ``"thin_path"`` — a ``Sequential``'s built-in children called without a guard each;
* ``"weight_first"``, ``"bias_first"`` — two layouts of the forward GEMM (backend/gemm.py).

With all of them off, every child runs through its own guarded call and every GEMM is
``np.dot``/``np.matmul`` then ``y += b``: the reference the fast routes are compared against
bit for bit.
"""

from __future__ import annotations

from contextlib import contextmanager

from ..backend import gemm as _gemm
from ..core import structure as _structure

__all__ = ["ROUTES", "disabled", "enabled"]

ROUTES = ("compiled_step", "compiled_chain", "fused_linear_relu", "thin_path", "weight_first",
          "bias_first")

#: route -> on; read by the runtime on every call (one dict lookup)
on = {route: True for route in ROUTES[:4]}


def enabled(route: str) -> bool:
    """Whether ``route`` (one of ``ROUTES``) may be taken now."""
    if route in on:
        return on[route]
    if route in _gemm.rules:
        return _gemm.rules[route]
    raise ValueError(f"unknown route {route!r}; the routes are {', '.join(ROUTES)}")


@contextmanager
def disabled(*routes: str):
    """Turn ``routes`` off inside the block (all of ``ROUTES`` when none is named); each is
    restored as it was on exit, so blocks nest.

    >>> import numpy as np, linearkit as lk
    >>> model = lk.Sequential(lk.Linear(4, 3), lk.ReLU())
    >>> with lk.runtime.disabled("thin_path"):
    ...     lk.runtime.explain(model, np.ones((2, 4), np.float32)).routes()
    ['guarded', 'guarded']
    """
    names = routes or ROUTES
    for route in names:
        enabled(route)                      # raises for an unknown name, before any change
    saved = {route: enabled(route) for route in names}
    try:
        for route in names:
            _set(route, False)
        yield
    finally:
        for route, value in saved.items():
            _set(route, value)


def _set(route: str, value: bool) -> None:
    _structure.changed()            # every kept plan was made under the old switches
    if route in on:
        on[route] = value
    else:
        _gemm.rules[route] = value
