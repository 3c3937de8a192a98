"""Sequential's thin path: a chain of built-in layers run without a guard per child, and
``Linear -> ReLU`` run as one step.

``Sequential.vjp`` is itself guarded (``vjp_protocol``): its closure is used once, its ``dy``
is checked and cast, errors name its path. Inside, each child's ``vjp`` wrapper would check the
same things again for arrays the chain made itself. So, while nothing can observe a child on
its own — no call hooks (global or on the child), ``detect_anomaly`` off, the default
precision policy — the chain calls the built-in layers' unwrapped ``vjp`` directly, casting a
``dy`` whose dtype differs from what the child returned (as the guard would) and naming the
child in any error, and runs a ``Linear`` followed by a ``ReLU`` as one step:

* forward: the GEMM, then ``max(y + b, 0)`` in place over its fresh output (one compiled pass
  with ``linearkit.backend.fast``, else ``y += b`` and ``np.maximum(y, 0, out=y)``): no second array;
* backward: the ReLU mask applied in one compiled pass (``fast``), then ``db``, ``dW`` and ``dx``
  exactly as ``Linear``'s backward computes them.

The values are bitwise those of the guarded, unfused chain (tests/test_fused_chain.py runs
both). A custom module, a container, or a layer with hooks goes through its guard as before.
"""

from __future__ import annotations

import math

import numpy as np

from .. import functional as F
from .. import precision as P
from ..backend import fast
from ..backend import gemm as _gemm
from ..core import anomaly as _anomaly
from ..core import hooks as _hooks
from ..core import structure as _structure
from ..core.vjp_protocol import check_backward, dy_shape_error
from ..layers.activation import GELU, LeakyReLU, ReLU, Sigmoid, SiLU, Tanh
from ..layers.linear import Identity, Linear, linear_backward_into
from . import compiled_chain as _compiled
from . import switches as _switches

__all__ = ["DIRECT", "FUSED", "GUARDED", "UNGUARDED", "blocker", "chain_forward", "chain_vjp",
           "child_routes", "fuses_now", "thin_path"]

# Layers whose vjp needs no guard inside a guarded chain: their backward returns dx of their
# input's shape and never calls back into user code.
_TRUSTED = frozenset({Linear, Identity, ReLU, LeakyReLU, GELU, Tanh, Sigmoid, SiLU})

# How a child runs on the thin path (``child_routes``)
GUARDED = "guarded"                 # through its own __call__ / guarded vjp
DIRECT = "direct"                   # forward: its ``forward`` without ``__call__``'s checks
UNGUARDED = "unguarded"             # vjp: the built-in layer's vjp without its guard
FUSED = "fused_linear_relu"         # a Linear and the ReLU after it, as one step


def blocker() -> str | None:
    """Why nothing may skip the children's guards now (the first reason), or None: the thin
    path is switched off, a global call hook is registered, ``detect_anomaly`` is on, or a
    precision policy sets the compute or activation dtype."""
    if not _switches.on["thin_path"]:
        return "switched off (linearkit.runtime.disabled)"
    if _hooks.active:
        return "a global call hook is registered"
    if _anomaly.enabled:
        return "detect_anomaly() is on"
    policy = P.current
    if policy.compute is not None or policy.activations is not None:
        return "a precision policy sets the compute or activation dtype"
    return None


def thin_path() -> bool:
    """Whether nothing can observe a chain's children one by one (``blocker`` is None)."""
    return blocker() is None


def child_routes(modules: list, training: bool) -> list[tuple[str, str | None]]:
    """``(route, reason)`` per module of a chain on the thin path: the one decision both
    ``chain_forward`` (``training=False``) and ``chain_vjp`` run by, and ``explain`` shows.
    ``reason`` says why the next faster route was not taken (None for the fastest). The second
    module of a fused pair gets ``FUSED`` too."""
    routes = []
    fuse = _switches.on["fused_linear_relu"]
    i, n = 0, len(modules)
    while i < n:
        module = modules[i]
        kind = type(module)
        if module is None or module.has_hooks():
            routes.append((GUARDED, "a call hook is registered on it"))
        elif training and kind not in _TRUSTED:
            routes.append((GUARDED, "its vjp is not one the thin path may call unguarded (a "
                                    "container or a layer outside the built-in Linear and "
                                    "activations)"))
        elif kind is Linear and i + 1 < n and _fusable(modules[i + 1]) and fuse:
            routes += [(FUSED, None), (FUSED, None)]
            i += 2
            continue
        else:
            if kind is not Linear:
                why = None if kind is not ReLU else "no Linear right before it"
            elif not fuse:
                why = "fusing is switched off (linearkit.runtime.disabled)"
            else:
                why = "no plain ReLU right after it"
            routes.append((UNGUARDED if training else DIRECT, why))
        i += 1
    return routes


def _steps(modules: list, training: bool, owner) -> list:
    """``child_routes`` as ``(route, module)`` steps, one per fused pair (its Linear); kept on
    ``owner`` while no module anywhere changed (``core.structure.token``)."""
    key = "_thin_vjp" if training else "_thin_forward"
    if owner is not None:
        kept = owner.__dict__.get(key)
        if kept is not None and kept[0] is _structure.token and len(kept[2]) == len(modules):
            return kept[1]
    steps = []
    for module, (route, _) in zip(modules, child_routes(modules, training)):
        if route is FUSED and steps and steps[-1][0] is FUSED and steps[-1][2] is None:
            steps[-1] = (FUSED, steps[-1][1], module)      # the pair's ReLU
        else:
            steps.append((route, module, None))
    if owner is not None:
        object.__setattr__(owner, key, (_structure.token, steps, tuple(modules)))
    return steps


def fuses_now(linear) -> bool:
    """Whether a fused step's Linear runs fused with its ReLU on this call: not with 16-bit
    storage (its weight's dtype can change without the structure changing), where the pair
    runs as Linear's own path, then the ReLU's."""
    return linear.weight.data.itemsize != 2


def _fusable(following) -> bool:
    """Whether the module after a Linear is a plain ReLU the pair can absorb."""
    return type(following) is ReLU and not following.has_hooks()


def chain_vjp(modules: list, x, input_grad: bool, trains, owner=None) -> tuple:
    """Run ``modules`` as ``Sequential.vjp`` does (see there for ``input_grad``), on the thin
    path; returns ``(y, backward)``. ``trains(module)`` is Sequential's input_grad rule.

    An error needs no locating here: the Sequential's own guard names the failing child's path.
    A chain the compiled kernels take (runtime/compiled_chain.py) runs there instead, same bits;
    ``owner`` (the Sequential) keeps its plan.
    """
    if _switches.on["compiled_chain"]:
        compiled = _compiled.chain_vjp(modules, x, input_grad, trains, owner)
        if compiled is not None:
            return compiled
    steps = []     # (backward, output shape, output dtype, module, its Linear); shape None: guarded
    need = input_grad
    for route, module, relu in _steps(modules, True, owner):
        if route is GUARDED:
            x, backward = module.vjp(x, input_grad=need)     # guarded, as before
            steps.append((backward, None, None, module, None))
            need = need or trains(module)
            continue
        kind = type(module)
        if relu is not None and fuses_now(module):
            x, backward = _linear_relu_vjp(module, x, need)
            steps.append((backward, x.shape, x.dtype, relu, module))
            need = need or trains(module)
            continue
        x, backward = kind.vjp.__wrapped_vjp__(module, x, need)
        steps.append((backward, x.shape, x.dtype, module, module))
        need = need or (kind is Linear and trains(module))
        if relu is not None:
            x, backward = ReLU.vjp.__wrapped_vjp__(relu, x, need)
            steps.append((backward, x.shape, x.dtype, relu, relu))

    def backward(dy):
        for step, shape, dtype, module, checked in reversed(steps):
            if shape is not None:   # what the child's guard would check (dy from a guarded step)
                if type(dy) is not np.ndarray or dy.dtype != dtype:
                    dy = np.asarray(dy, dtype=dtype)
                if dy.shape != shape:
                    raise dy_shape_error(module, dy.shape, shape)
            dy = step(dy)
            if shape is not None and _anomaly.enabled:   # turned on after the forward
                check_backward(checked, dy)
            if dy is None:
                return None
        return dy

    return x, backward


def _linear_relu_vjp(linear: Linear, x, input_grad: bool):
    """``relu(linear(x))`` with its closure ``backward(dy (*, out)) -> dx (*, in)``.

    Keeps what the two layers would: the input (for dW) and the ReLU's output (its mask).
    Returns None from backward when neither a gradient nor dx is needed (a frozen prefix).
    """
    x = linear.checked_input(x)
    w, b = linear.weight, linear.bias
    kernels = fast.kernels() if fast.supports(w.data.dtype) else None
    y = _linear_relu(x, w, b, kernels)
    need_dw = w.requires_grad
    need_db = b is not None and b.requires_grad
    saved_x = x if need_dw else None
    if not (need_dw or need_db or input_grad):
        return y, lambda dy: None

    def backward(dy):
        return linear_backward_into(w, b, _relu_grad(dy, y, kernels), saved_x, need_dw, need_db,
                                    input_grad)

    return y, backward


def _linear_relu(x, w, b, kernels):
    """``relu(x @ W.T + b)`` into the GEMM's fresh output, in place (one compiled pass when
    ``kernels``; else ``y += b`` and ``np.maximum(y, 0, out=y)``: the same bits). A large
    output whose GEMM adds the bias (``backend.gemm.BIAS_FIRST``) gets the ReLU alone."""
    wd = w.data
    if b is not None and x.ndim > 1 and x.size * wd.shape[0] >= _gemm.BIAS_FIRST_MIN_OUT \
            and _gemm.forward_layout(math.prod(x.shape[:-1]), wd.shape[1], wd.shape[0], x.dtype,
                                     wd, b.data) is _gemm.BIAS_FIRST:
        y = F.linear(x, wd, b.data)
        b = None
    else:
        y = F.linear(x, wd, None)
    y2 = y.reshape(-1, y.shape[-1]) if y.ndim != 2 else y
    if kernels is not None and y2.flags.c_contiguous:
        if b is None:
            kernels.relu_(y2)
        else:
            kernels.bias_relu_(y2, b.data)
    else:
        if b is not None:
            y += b.data
        np.maximum(y, 0, out=y)
    return y


def chain_forward(modules: list, x, owner=None):
    """``Sequential.forward`` on the thin path: each hook-free child's ``forward`` without its
    ``__call__``, and a ``Linear`` followed by a plain ``ReLU`` as ``_linear_relu`` (bitwise
    the two calls; compiled only when the kernels are already loaded, so that inference alone
    never imports numba). An error names the child (located by the Sequential's own call).
    Once the kernels are loaded, a chain the compiled path takes runs as one call there
    (runtime/compiled_chain.py, the same bits); ``owner`` (the Sequential) keeps its plan."""
    if owner is not None and _switches.on["compiled_chain"]:
        y = _compiled.chain_forward(modules, x, owner)
        if y is not None:
            return y
    for route, module, relu in _steps(modules, False, owner):
        if route is GUARDED:
            x = module(x)
        elif relu is not None and fuses_now(module):
            x = module.checked_input(x)
            w = module.weight
            x = _linear_relu(x, w, module.bias,   # kernels only if training loaded them
                             fast.loaded() if fast.supports(w.data.dtype) else None)
        else:
            x = module.forward(x)
            if relu is not None:
                x = relu.forward(x)
    return x


def _relu_grad(dy, y, kernels):
    """``functional.relu_backward(dy, y)``, in one compiled pass when the kernels can take it."""
    if (kernels is None or dy.shape != y.shape or dy.dtype != y.dtype
            or not dy.flags.c_contiguous):
        return F.relu_backward(dy, y)
    dz = np.empty_like(y)
    shape2 = (-1, y.shape[-1]) if y.ndim else (1, 1)
    kernels.relu_backward_into(dy.reshape(shape2), y.reshape(shape2), dz.reshape(shape2))
    return dz
