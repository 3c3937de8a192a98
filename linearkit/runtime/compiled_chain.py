"""Sequential's compiled path: a chain of ``Linear [-> ReLU]`` units, and ``Residual`` blocks of
them, run as one compiled forward and one compiled backward (``linearkit.backend.fast``).

On the thin path (runtime/thin_path.py: no hooks, no anomaly mode, the default precision policy) a
``Sequential`` whose steps are only ``Linear``, a ``ReLU`` right after a ``Linear``, nested
``Sequential`` of those and ``Residual`` around them (not nested) runs through
``backend/fast/chain_kernel.py`` when its input is a C-contiguous 2-D array of the weights' dtype
(float32 or float64) with at least 2 rows, every width is at least 2, and no parameter appears
twice, the input, weights and biases being C-contiguous, aligned and writeable (numba would
compile another version for any other kind). A plain forward (``Sequential.forward``, one row
included) runs the same forward kernel once a training step has loaded the kernels. The
kernels call NumPy's own BLAS with NumPy's arguments (backend/fast/blas.py) and repeat the NumPy path's
elementwise operations: outputs, ``dx`` and gradients are bitwise the thin path's
(tests/test_compiled_chain.py, tests/test_compiled_forward.py). Gradients are written through
``Parameter.grad_buffer`` (into a zeroed ``.grad``, into a new one, or added), as ``add_grad``
would.

The BLAS thread policy (linearkit.backend.threads) is asked once per kernel, for the chain's largest
GEMM, instead of once per GEMM. Anything else takes the thin path, which also raises every
error (a wrong width, a Residual that changes the shape) naming the child. So does every chain
while ``tracemalloc`` is tracing: it cannot see the arrays numba allocates (the backward's
temporaries), and memory measurements (the ledger's checks, the checkpointing experiment) must
see what the thin path allocates; the kernels allocate the same arrays at the same points.
"""

from __future__ import annotations

from _tracemalloc import is_tracing  # the C half of tracemalloc: no import cost

import numpy as np

from .. import functional as F
from ..backend import fast
from ..backend import gemm as _gemm
from ..backend import threads as _threads
from ..backend.fast import blas as _blas
from ..backend.fast import chain_flags as K
from ..core import anomaly as _anomaly
from ..core import structure as _structure
from ..core.vjp_protocol import check_backward, check_finite
from ..layers.activation import ReLU
from ..layers.linear import Linear

__all__ = ["Plan", "chain_forward", "chain_vjp", "describe", "plan_for", "plain_array"]

_containers = None      # (Sequential, Residual, trains), imported on first use (container
#                         imports us)


class Plan:
    """What the kernels need besides the arrays a backward keeps (bookkeeping, not memory the
    ledger counts as saved activations): the layers' arrays, flags and the largest GEMM."""

    __slots__ = ("biases", "by_rows", "flags", "macs_per_row", "one", "units", "weights",
                 "ws_per_row", "zero")

    def __init__(self, units, weights, biases, flags, macs_per_row, ws_per_row):
        self.units, self.weights, self.biases, self.flags = units, weights, biases, flags
        dtype = weights[0].dtype
        self.one, self.zero = dtype.type(1), dtype.type(0)    # the GEMMs' alpha and beta
        self.macs_per_row = macs_per_row   # the largest layer's in * out
        self.ws_per_row = ws_per_row       # workspace elements per row of x
        self.by_rows = {}                  # rows -> flags_for(rows)

    def flags_for(self, rows: int) -> np.ndarray:
        """``flags`` for an input of ``rows`` rows: WEIGHT_FIRST or BIAS_FIRST added to each
        layer whose forward GEMM ``backend.gemm.forward_layout`` lays out that way at that many
        rows (the one decision ``functional.linear`` also asks)."""
        flags = self.by_rows.get(rows)
        if flags is None:
            flags = self.flags.copy()
            for i, w in enumerate(self.weights):
                n_out, n_in = w.shape
                layout = _gemm.forward_layout(rows, n_in, n_out, w.dtype, w,
                                              self.biases[i] if flags[i] & K.BIAS else None)
                if layout is _gemm.WEIGHT_FIRST:
                    flags[i] |= K.WEIGHT_FIRST
                elif layout is _gemm.BIAS_FIRST:
                    flags[i] |= K.BIAS_FIRST
            if len(self.by_rows) >= 8:       # batch sizes seen: a few, bounded anyway
                self.by_rows.clear()
            self.by_rows[rows] = flags
        return flags


def chain_vjp(modules: list, x, input_grad: bool, trains, owner=None):
    """``(y, backward)`` as ``fused.chain_vjp`` returns them, or None when the chain or ``x``
    is not one the kernels take (the caller then runs the thin path). ``owner`` (the
    Sequential) keeps the last plan, reused while its layers, arrays and flags are the same.

    The backward keeps what the thin path's closures would: ``x`` when the first layer needs
    dW, each unit's output (in one workspace ``ws``), the final output only as a ReLU's mask.
    """
    plan = plan_for(modules, x, input_grad, trains, owner)
    if plan.__class__ is not Plan:
        return None
    kernels = fast.kernels()
    if kernels is None or _blas.functions(x.dtype) is None:   # NumPy's BLAS, bit-checked
        return None
    k = kernels.chain
    rows, dtype = x.shape[0], x.dtype
    flags = plan.flags_for(rows)
    macs = rows * plan.macs_per_row
    one, zero = plan.one, plan.zero
    ws = np.empty(rows * plan.ws_per_row, dtype)
    out = np.empty((rows, plan.weights[-1].shape[0]), dtype)
    if macs >= _threads.switch_macs:
        _threads.before_gemm(macs)
    try:
        k.chain_forward(one, zero, x, plan.weights, plan.biases, flags, ws, out)
    except Exception as err:       # numba could not type these arrays: the thin path, for good
        if not type(err).__module__.startswith("numba"):
            raise
        if owner is not None:
            owner._compiled_plan.plan = None
        return None
    last = flags[-1]
    mask = out if last & K.RELU and not last & K.RES_END else _nothing(dtype)
    saved_x = x if flags[0] & K.NEED_DW else _nothing(dtype)

    def backward(dy):
        if not plain_array(dy):
            dy = np.array(dy, order="C")      # a copy the kernel may read as the usual type
        weight_grads, bias_grads, modes, apart = _grad_targets(plan)
        if macs >= _threads.switch_macs:
            _threads.before_gemm(macs)
        dx, has_dx = k.chain_backward(one, zero, dy, saved_x, plan.weights,
                                      plan.flags_for(rows), ws, mask, weight_grads, bias_grads,
                                      modes, _gemm.ones_vector(dy.shape[0], dy.dtype))
        for param, grad in apart:
            param.add_grad(grad)
        if _anomaly.enabled:      # turned on after the forward: each layer's gradients, then dx
            for linear, _ in reversed(plan.units):
                check_backward(linear, None)
            if has_dx:
                check_finite(plan.units[0][0], dx, "backward (input gradient)")
        return dx if has_dx else None

    return out, backward


# Why a chain is not one the kernels run (``plan_for``'s answer, which ``explain`` shows);
# a tuple ``(reason, module)`` names the module the reason is about.
NOT_A_UNIT = "a step the kernels do not run (they take Linear, a ReLU after a Linear, Sequential, " \
             "and Residual around those, not nested)"
HOOKED = "a call hook is registered on it"
EMPTY_RESIDUAL = "a Residual around no Linear"
INPUT = ("the input is not a C-contiguous, aligned, writeable 2-D float32/float64 array of at "
         "least {rows} rows")
TRACING = "tracemalloc is tracing (it cannot see the arrays numba allocates)"
LAZY = "an unmaterialized LazyLinear"
LAYOUT = ("a weight of another dtype, layout, or a width under 2, or one that does not match the "
          "input")
TWICE = "a parameter appears twice (a shared layer)"
RESIDUAL_SHAPE = "a Residual whose block changes the width (the thin path raises its ShapeError)"
KEEPS = "the workspace would keep an output no thin-path closure keeps"
NOT_LOADED = "the kernels are not loaded (a plain forward never imports numba; a training step " \
             "loads them)"
NO_KERNELS = "no compiled kernels (numba missing, or LINEARKIT_FAST=0)"
NO_BLAS = "NumPy's BLAS is not the one backend/fast/blas.py binds"
OFF = "switched off (linearkit.runtime.disabled)"
EMPTY = "no Linear in the chain (an empty Sequential, or only Sequentials of nothing)"


def describe(reason, paths: dict | None = None) -> str:
    """``plan_for``'s reason as a sentence; ``paths`` (module -> its path in the model, by id)
    names the module a ``(reason, module)`` is about."""
    if not isinstance(reason, tuple):
        return str(reason)
    text, module = reason
    name = type(module).__name__
    path = (paths or {}).get(id(module))
    return f"{text}: {name}" + (f" at '{path}'" if path else "")


def _units(modules, units: list, in_residual: bool):
    """Append ``[linear, flags]`` for each unit of ``modules`` (in call order); None, or
    ``(reason, module)`` for the first step that is not one the kernels run."""
    sequential, residual, _ = _containers or _import_containers()
    i, n = 0, len(modules)
    while i < n:
        module = modules[i]
        kind = type(module)
        if module is None:
            return NOT_A_UNIT, module
        if module.has_hooks():
            return HOOKED, module
        if kind is Linear:
            relu = i + 1 < n and type(modules[i + 1]) is ReLU and not modules[i + 1].has_hooks()
            units.append([module, K.RELU if relu else 0])
            i += 2 if relu else 1
            continue
        if kind is sequential:
            why = _units(module.steps(), units, in_residual)
            if why is not None:
                return why
        elif kind is residual and not in_residual:
            start = len(units)
            why = _units([module.module], units, True)
            if why is not None:
                return why
            if len(units) == start:
                return EMPTY_RESIDUAL, module
            units[start][1] |= K.RES_START
            units[-1][1] |= K.RES_END
        else:
            return NOT_A_UNIT, module
        i += 1
    return None


def plan_for(modules: list, x, input_grad: bool, trains, owner, min_rows: int = 2):
    """The kernels' plan for running ``modules`` on ``x`` (the one ``owner`` kept, or a new
    one), or why the thin path must run (a reason, or ``(reason, module)``): ``x`` not a
    C-contiguous, aligned, writeable 2-D float32/float64 array of at least ``min_rows`` rows,
    ``tracemalloc`` tracing, or a chain or layout the kernels do not take (``_units``,
    ``_plan``).

    While no module anywhere changed its structure or hooks (``_structure.token``) and none of
    the plan's Parameters changed its array or flags, the kept plan is returned without walking
    the modules again (``_Kept.fits``: a fraction of the walk's cost; docs/fast.md)."""
    if not (type(x) is np.ndarray and x.ndim == 2 and x.shape[0] >= min_rows and plain_array(x)
            and fast.supports(x.dtype)):
        return INPUT.format(rows=min_rows)
    if is_tracing():
        return TRACING
    if owner is not None:
        kept = owner.__dict__.get("_compiled_plan")
        if kept is not None and kept.fits(x, input_grad):
            return kept.plan
    units = []
    why = _units(modules, units, False)
    if why is not None:
        return why
    if not units:
        return EMPTY
    return _cached_plan(owner, units, x, input_grad, trains)


def _import_containers():
    global _containers
    from ..layers.container import Residual, Sequential, trains
    _containers = (Sequential, Residual, trains)
    return _containers


def chain_forward(modules: list, x, owner):
    """``fused.chain_forward(modules, x)`` as one compiled call: ``y``, the same bits; or None
    when the chain or ``x`` is not one the kernels take (the thin path runs), and always while
    the kernels are not loaded yet (a forward never imports numba: a training step loads them).

    ``x`` may have a single row here (the kernel calls the GEMV ``np.dot`` calls for it); the
    plan is the one ``chain_vjp`` keeps on ``owner`` (the Sequential) for ``input_grad=False``.
    """
    kernels = fast.loaded()
    if kernels is None:
        return None
    plan = plan_for(modules, x, False, (_containers or _import_containers())[2], owner,
                    min_rows=1)
    if plan.__class__ is not Plan or _blas.functions(x.dtype) is None:
        return None
    rows, dtype = x.shape[0], x.dtype
    macs = rows * plan.macs_per_row
    if macs >= _threads.switch_macs:
        _threads.before_gemm(macs)
    out = np.empty((rows, plan.weights[-1].shape[0]), dtype)
    try:
        kernels.chain.chain_forward(plan.one, plan.zero, x, plan.weights, plan.biases,
                                    plan.flags_for(rows), np.empty(rows * plan.ws_per_row, dtype),
                                    out)
    except Exception as err:       # numba could not type these arrays: the thin path, for good
        if not type(err).__module__.startswith("numba"):
            raise
        owner._compiled_plan.plan = None
        return None
    return out


def _cached_plan(owner, units, x, input_grad: bool, trains):
    """``_plan``, or the one ``owner`` kept when nothing it was made from changed: the same
    modules, Parameters and arrays (by identity: the plan holds them, so no id is reused while
    it is kept), the same requires_grad and writeable flags, input dtype, width and
    ``input_grad``. The kept plan holds the arrays it was made from: an array replaced since
    (``p.data = new``) stays alive until the Sequential's next ``vjp`` replaces the plan."""
    key = [x.dtype.char, x.shape[1], input_grad, _gemm.rules[_gemm.WEIGHT_FIRST],
           _gemm.rules[_gemm.BIAS_FIRST]]
    for linear, structure in units:
        params = linear._parameters
        w, b = params["weight"], params["bias"]
        key += (id(linear), structure, id(w), id(b))
        if w is not None:
            key += (id(w.data), w.requires_grad, w.data.flags.writeable)
        if b is not None:
            key += (id(b.data), b.requires_grad, b.data.flags.writeable)
    if owner is None:
        return _plan(units, x, input_grad, trains)
    kept = owner.__dict__.get("_compiled_plan")
    plan = kept.plan if kept is not None and kept.key == key else _plan(units, x, input_grad,
                                                                        trains)
    object.__setattr__(owner, "_compiled_plan", _Kept(key, plan, units, x, input_grad))
    return plan


class _Kept:
    """The plan a Sequential keeps (``_compiled_plan``), with what says it still fits: the
    structure token it was made under, the input's dtype and width, ``input_grad``, and each
    Parameter with the array, ``requires_grad`` and writeable flag it had."""

    __slots__ = ("char", "input_grad", "key", "params", "plan", "token", "width")

    def __init__(self, key: list, plan: Plan | None, units, x, input_grad: bool):
        self.key, self.plan, self.token = key, plan, _structure.token
        self.char, self.width, self.input_grad = x.dtype.char, x.shape[1], input_grad
        self.params = tuple((p, p.data, p.requires_grad, p.data.flags.writeable)
                            for linear, _ in units for p in linear._parameters.values()
                            if p is not None)

    def fits(self, x, input_grad: bool) -> bool:
        if (self.token is not _structure.token or x.shape[1] != self.width
                or x.dtype.char != self.char or input_grad != self.input_grad):
            return False
        for p, data, requires_grad, writeable in self.params:
            if (p.data is not data or p.requires_grad is not requires_grad
                    or data.flags.writeable is not writeable):
                return False
        return True


def _plan(units, x, input_grad: bool, trains):
    """The kernels' plan for ``units`` on ``x``, or why not (``(reason, module)``): a width,
    dtype or layout is not theirs, a parameter is used twice, or the workspace would keep an
    output that no thin-path closure keeps (a Residual's inner output without a ReLU, a frozen
    layer's input)."""
    dtype = x.dtype
    width = x.shape[1]
    weights, biases, flags = [], [], []
    seen = set()
    need = input_grad
    macs_per_row = 0
    start_width = width
    for linear, structure in units:
        params = linear._parameters
        w, b = params["weight"], params["bias"]
        if w is None:
            return LAZY, linear
        wd = w.data
        n_out, n_in = wd.shape
        if id(w) in seen:
            return TWICE, linear
        if wd.dtype != dtype or not plain_array(wd) or n_in != width or n_out < 2 or n_in < 2:
            return LAYOUT, linear
        seen.add(id(w))
        f = structure
        if structure & K.RES_START:
            start_width = width
        if structure & K.RES_END and n_out != start_width:
            return RESIDUAL_SHAPE, linear
        if b is not None:
            bd = b.data
            if id(b) in seen:
                return TWICE, linear
            if bd.dtype != dtype or not plain_array(bd):
                return LAYOUT, linear
            seen.add(id(b))
            f |= K.BIAS | (K.NEED_DB if b.requires_grad else 0)
            biases.append(bd)
        else:
            biases.append(_nothing(dtype, 1))
        if w.requires_grad:
            f |= K.NEED_DW
        if need:
            f |= K.NEED_DX
        need = need or trains(linear)
        weights.append(wd)
        flags.append(f)
        macs_per_row = max(macs_per_row, n_out * n_in)
        width = n_out
    if not _keeps_only_what_the_thin_path_keeps(flags):
        return KEEPS
    per_row = K.workspace_per_row([w.shape[0] for w in weights], flags)
    return Plan(units, tuple(weights), tuple(biases), np.array(flags, np.int64), macs_per_row,
                 per_row)


def plain_array(a: np.ndarray) -> bool:
    """C-contiguous, aligned and writeable: the one array type the kernels' tuples hold (numba
    cannot index a tuple mixing read-only or unaligned arrays with others)."""
    flags = a.flags
    return flags.c_contiguous and flags.aligned and flags.writeable


def _keeps_only_what_the_thin_path_keeps(flags) -> bool:
    """Whether every array the workspace holds is one a thin-path closure would keep: a unit's
    output is a ReLU's mask (when its layer computes anything) or the next layer's input (when
    that layer needs dW); a residual's sum, the next layer's input."""
    needs = K.NEED_DW | K.NEED_DB | K.NEED_DX
    last = len(flags) - 1
    for i, f in enumerate(flags):
        next_dw = i < last and flags[i + 1] & K.NEED_DW
        as_mask = f & K.RELU and f & needs
        if f & K.RES_END:
            if not as_mask or (i < last and not next_dw):
                return False
        elif i < last and not (as_mask or next_dw):
            return False
    return True


def _grad_targets(plan: Plan):
    """What the backward kernel writes dW/db into, per layer, and how (``grad_modes``); a
    gradient whose ``.grad`` it cannot take is computed into a new array, added afterwards."""
    flags = plan.flags
    modes = np.zeros((len(flags), 2), np.int64)
    weight_grads, bias_grads, apart = [], [], []
    for i, (linear, _) in enumerate(plan.units):
        f = flags[i]
        params = linear._parameters
        for column, (param, wanted, dummy, out) in enumerate((
                (params["weight"], f & K.NEED_DW, plan.weights[i], weight_grads),
                (params["bias"], f & K.NEED_DB, plan.biases[i], bias_grads))):
            if not wanted:
                out.append(dummy)
                continue
            target = param.grad_buffer()
            if target is None:
                target = (np.empty(param.data.shape, param.data.dtype), False)
                apart.append((param, target[0]))
            out.append(target[0])
            modes[i, column] = 2 if target[1] else 1
    return tuple(weight_grads), tuple(bias_grads), modes, apart


_placeholders: dict = {}


def _nothing(dtype, ndim: int = 2) -> np.ndarray:
    """An empty array of ``dtype`` where the kernels want an array they will not read (the
    bias of a layer without one, an input or output the backward does not keep)."""
    key = (dtype.char, ndim)
    a = _placeholders.get(key)
    if a is None:
        a = _placeholders[key] = np.zeros((0,) * ndim, dtype)
    return a
