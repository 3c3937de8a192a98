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

from ..core import anomaly as _anomaly
from ..backend import fast
from ..backend import gemm as _gemm
from .. import functional as F
from ..core import hooks as _hooks
from .. import precision as P
from ..core.vjp_protocol import check_backward, dy_shape_error
from . import compiled_chain as _compiled
from ..layers.activation import GELU, LeakyReLU, ReLU, Sigmoid, SiLU, Tanh
from ..layers.linear import Identity, Linear, linear_backward_into

__all__ = ["chain_forward", "chain_vjp", "thin_path"]

# Layers whose vjp needs no guard inside a guarded chain: their backward returns dx of their
# input's shape and never calls back into user code.
_TRUSTED = frozenset({Linear, Identity, ReLU, LeakyReLU, GELU, Tanh, Sigmoid, SiLU})


def thin_path() -> bool:
    """Whether nothing can observe a chain's children one by one (hooks, anomaly, policy)."""
    policy = P.current
    return (not _hooks.active and not _anomaly.enabled and policy.compute is None
            and policy.activations is None)


def _fusable(following) -> bool:
    """Whether the module after a Linear is a plain ReLU the pair can absorb."""
    return type(following) is ReLU and not following._hooks


def chain_vjp(modules: list, x, input_grad: bool, trains, owner=None) -> tuple:
    """Run ``modules`` as ``Sequential.vjp`` does (see there for ``input_grad``), on the thin
    path; returns ``(y, backward)``. ``trains(module)`` is Sequential's input_grad rule.

    An error needs no locating here: the Sequential's own guard names the failing child's path.
    A chain the compiled kernels take (runtime/compiled_chain.py) runs there instead, same bits;
    ``owner`` (the Sequential) keeps its plan.
    """
    compiled = _compiled.chain_vjp(modules, x, input_grad, trains, owner)
    if compiled is not None:
        return compiled
    steps = []     # (backward, output shape, output dtype, module, its Linear); shape None: guarded
    need = input_grad
    i, n = 0, len(modules)
    while i < n:
        module = modules[i]
        kind = type(module)
        if kind not in _TRUSTED or module._hooks:
            x, backward = module.vjp(x, input_grad=need)     # guarded, as before
            steps.append((backward, None, None, module, None))
            need = need or trains(module)
            i += 1
            continue
        if (kind is Linear and i + 1 < n and _fusable(modules[i + 1])
                and module.weight.data.itemsize != 2):    # 16-bit storage: Linear's own path
            x, backward = _linear_relu_vjp(module, x, need)
            steps.append((backward, x.shape, x.dtype, modules[i + 1], module))
            i += 2
        else:
            x, backward = kind.vjp.__wrapped_vjp__(module, x, need)
            steps.append((backward, x.shape, x.dtype, module, module))
            i += 1
        need = need or (kind is Linear and trains(module))

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
    w, b = linear.weight, linear.bias
    if not (type(x) is np.ndarray and x.dtype is w.data.dtype and x.ndim
            and x.shape[-1] == linear.in_features):     # Linear.forward's inline check
        x = linear._input(x)
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
    if owner is not None:
        y = _compiled.chain_forward(modules, x, owner)
        if y is not None:
            return y
    i, n = 0, len(modules)
    while i < n:
        module = modules[i]
        if module._hooks:
            x = module(x)
        elif (type(module) is Linear and i + 1 < n and _fusable(modules[i + 1])
              and module.weight.data.itemsize != 2):    # 16-bit storage: Linear's own path
            w = module.weight
            if not (type(x) is np.ndarray and x.dtype is w.data.dtype and x.ndim
                    and x.shape[-1] == module.in_features):     # Linear.forward's check
                x = module._input(x)
            x = _linear_relu(x, w, module.bias,   # kernels only if training loaded them
                             fast.loaded() if fast.supports(w.data.dtype) else None)
            i += 1
        else:
            x = module.forward(x)
        i += 1
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
