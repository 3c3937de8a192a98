"""The one place that decides how a model runs, and says why.

A ``Sequential`` asks ``sequential`` (installed as its runner below) how to run its children: on
the thin path (``thin_path``: no guard per built-in child, ``Linear -> ReLU`` as one step) or,
when the kernels take the whole chain, as one compiled forward and backward
(``compiled_chain``); ``loop.step`` asks ``compiled_step`` whether the whole training step runs
as one compiled call. The forward GEMM's layout is ``backend.gemm.forward_layout``. Every route
gives the same bits as every child through its own guarded call.

``explain(model, x)`` shows, per child, the route taken and the first condition that excluded
each faster one; ``disabled(*routes)`` turns routes off for a block (how tests compare them).
"""

from ..layers import container as _container
from . import sequential as _sequential
from .explain import RouteReport, explain
from .switches import ROUTES, disabled, enabled

_container.install_runner(_sequential)

#: The attributes a Sequential's kept plans live in (caches, never state: a copy plans anew)
PLAN_ATTRIBUTES = ("_compiled_plan", "_thin_forward", "_thin_vjp")

__all__ = ["PLAN_ATTRIBUTES", "ROUTES", "RouteReport", "disabled", "enabled", "explain"]
