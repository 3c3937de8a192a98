"""The wrapper every ``vjp`` a Module subclass defines gets (``Module.__init_subclass__``).

Its closure refuses a second call (``BackwardError``), checks ``dy``'s shape against the output
and casts ``dy`` to the output's dtype (as autograd does), names the module's path in the model
on any error, runs the call hooks (``linearkit.core.hooks``), and under ``detect_anomaly()`` checks
the output, the 16-bit arrays the closure keeps, and the gradients for NaN/Inf.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from ..errors import AnomalyError, BackwardError, Located, ShapeError
from . import anomaly as _anomaly
from . import hooks as _hooks

__all__ = ["check_backward", "check_finite", "dy_shape_error", "guarded_vjp"]


def guarded_vjp(vjp: Callable) -> Callable:
    """Wrap a module's ``vjp`` with the protocol's checks (see the module docstring)."""

    @functools.wraps(vjp)
    def entry(self, *args, **kwargs):
        # Hooks fire once per call: for the class's own vjp, not for a super().vjp inside it.
        hooked = (_hooks.active or self._hooks) and type(self).vjp is entry
        if hooked:
            args, kwargs = _hook_arguments(vjp, self, args, kwargs)
            args, kwargs = _hooks.run_forward_pre(self, args, kwargs)
        try:
            y, backward = vjp(self, *args, **kwargs)
        except Located as err:
            err.locate(self)
            raise
        if _anomaly.enabled:
            check_finite(self, y, "forward")
        if hooked:
            _hooks.run_forward(self, args, kwargs, y, replace_ok=False)
        shape = y.shape if isinstance(y, np.ndarray) else None
        dtype = y.dtype if shape is not None else None
        used = False

        def guarded_backward(*grad):
            nonlocal used
            if used:
                raise BackwardError(
                    "this backward closure was already called; each vjp() call gives one "
                    "backward. Run vjp() again for another backward pass (gradients accumulate "
                    "in .grad until zero_grad()).",
                    module=self,
                ).with_root(self)
            used = True
            if grad and shape is not None:
                dy = grad[0]
                if not isinstance(dy, np.ndarray) or dy.dtype != dtype:
                    dy = np.asarray(dy, dtype=dtype)
                if dy.shape != shape:
                    raise dy_shape_error(self, dy.shape, shape)
                grad = (dy,) + grad[1:]
            hooked_now = hooked and (_hooks.active or self._hooks)
            if hooked_now:
                grad = _hooks.run_backward_pre(self, grad)
            try:
                dx = backward(*grad)
            except Located as err:
                err.locate(self)
                raise
            if _anomaly.enabled:
                check_backward(self, dx)
            if hooked_now:
                several = isinstance(dx, tuple)
                dx = _hooks.run_backward(self, dx if several else (dx,), grad)
                dx = dx if several else dx[0]
            return dx

        if _anomaly.enabled:  # what the closure keeps (a 16-bit copy may be inf), children's not
            _anomaly.check_kept(self, backward, guarded_backward.__code__)
        return y, guarded_backward

    entry.__wrapped_vjp__ = vjp
    return entry


@functools.cache
def _input_grad_position(vjp: Callable) -> int | None:
    """The positional index (after self) of a vjp's ``input_grad`` parameter; None if it has none."""
    import inspect  # only when a hook is registered: slow to import (docs/measurements.md)

    names = [p.name for p in inspect.signature(vjp).parameters.values()
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return names.index("input_grad") - 1 if "input_grad" in names else None


def _hook_arguments(vjp: Callable, module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Split a vjp call into the data ``args`` hooks see and ``kwargs`` holding ``input_grad``."""
    position = _input_grad_position(vjp)
    kwargs = dict(kwargs)
    if position is not None and len(args) > position:
        kwargs["input_grad"] = args[position]
        args = args[:position] + args[position + 1:]
    kwargs.setdefault("input_grad", True)
    return args, kwargs


def check_finite(module, value, where: str) -> None:
    problem = _anomaly.first_nonfinite(value)
    if problem is not None:
        raise AnomalyError(f"detect_anomaly: {where} {problem}", module=module).with_root(module)


def dy_shape_error(module, got: tuple, shape: tuple) -> ShapeError:
    """The error for a backward's ``dy`` of shape ``got`` where the output had ``shape``."""
    return ShapeError(f"backward got dy of shape {got}, but the forward output has shape "
                      f"{shape}; dy must have the output's shape", module=module).with_root(module)


def check_backward(module, dx) -> None:
    """``detect_anomaly``'s checks after ``module``'s backward: its input gradient ``dx`` and
    each of its own parameters' ``.grad`` (an AnomalyError naming the module and which)."""
    check_finite(module, dx, "backward (input gradient)")
    for name, p in module.named_parameters(recurse=False, remove_duplicate=False):
        if p.grad is not None:
            check_finite(module, p.grad, f"backward (gradient of {name})")

