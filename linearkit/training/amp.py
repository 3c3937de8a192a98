"""Loss scaling: ``GradScaler``, with ``torch.amp.GradScaler``'s names, semantics and arithmetic.

Small gradients underflow to zero in float16 (its smallest subnormal is 2⁻²⁴ ≈ 6e-8, its
smallest normal 2⁻¹⁴ ≈ 6e-5). Loss scaling multiplies the loss by a large factor ``S`` before
the backward, so every gradient is ``S`` times larger while it is produced and stored, and
divides the gradients by ``S`` before the optimizer uses them. ``S`` adapts: a step whose
gradients hold an inf or NaN is skipped and ``S`` is halved (``backoff_factor``); after
``growth_interval`` clean steps in a row ``S`` doubles (``growth_factor``).

A linearkit backward starts from the loss's backward closure (``loss, loss_back =
loss_fn.vjp(pred, y)``; ``loss_back(dy=1)`` returns ``dL/dpred``). The backward of the scaled
loss ``S·L`` is ``loss_back(dy=S)``; ``scaler.scale(loss_back)`` returns exactly that closure,
so a training step reads as PyTorch's ``scaler.scale(loss).backward()``::

    scaler = GradScaler()
    for x, y in batches:
        pred, back = model.vjp(x, input_grad=False)
        loss, loss_back = loss_fn.vjp(pred, y)
        back(scaler.scale(loss_back)())          # every .grad is now S times the gradient
        scaler.unscale_(opt)                     # optional: divide them by S now ...
        clip_grad_norm_(model.parameters(), 1.0) # ... so clipping sees the true norm
        scaler.step(opt)                         # unscales (if not yet); skipped on inf/NaN
        scaler.update()                          # back off, or grow after clean steps
        opt.zero_grad()

``linearkit.training.accumulation.accumulated_step`` does this (with micro-batches and clipping) in one
call. ``scaler.scale(value)`` on a number or an array multiplies it by ``S`` (torch's
``scale(tensor)``): the scaled loss for logging, or any upstream gradient you pass yourself.

Arithmetic (torch's CPU kernels, reproduced bit for bit): ``S`` is a float32 value;
``unscale_`` multiplies each gradient by ``inv = float32(1 / float64(S))`` (a float32 gradient
in float32, a float64 one in float64, a 16-bit one in float32); the inf/NaN check reads the
gradients *before* that multiplication; ``update`` computes ``float32(S · factor)`` and never
grows ``S`` to inf.

Gradient dtypes (any float dtype, including ``ml_dtypes.bfloat16``):

* float32, float64, bfloat16 ``.grad`` arrays are unscaled in place (bfloat16 in float32 math,
  rounded back; it has float32's exponent range, so nothing underflows).
* A float16 ``.grad`` is *not* rounded back: unscaled, the small values the scale protected
  would flush to zero again (the reason torch refuses to unscale float16 gradients). From
  ``unscale_`` until ``step`` (or ``update``) returns, ``p.grad`` is a new float32 array
  holding the exact unscaled gradient, so clipping and the optimizer (whose master weights are
  float32) see it; then the parameter's own float16 buffer is put back, holding that gradient
  rounded to float16, so the storage policy and ``zero_grad(set_to_none=False)`` buffer reuse
  are kept. Replacing ``p.grad`` in between opts that parameter out of the swap back.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = ["GradScaler"]

_READY, _UNSCALED, _STEPPED = "ready", "unscaled", "stepped"
_WHERE = "linearkit.training.amp.GradScaler"


def _f32(value: float) -> float:
    """``value`` rounded to float32, as a Python float (inf past float32's range)."""
    with np.errstate(over="ignore"):
        return float(np.float32(value))


def _is_float(dtype: np.dtype) -> bool:
    try:
        from ..precision import is_float
    except ImportError:      # before the precision policy lands
        return dtype.kind == "f" or dtype.name == "bfloat16"
    return bool(is_float(dtype))


def _fresh_state() -> dict:
    return {"stage": _READY, "found_inf": None, "swapped": []}


class GradScaler:
    """Dynamic loss scaling, as ``torch.amp.GradScaler("cpu", ...)`` (no ``device`` argument).

    Parameters
    ----------
    init_scale : float
        The first scale ``S`` (default ``2.**16``), stored rounded to float32 on the first
        ``scale()`` call; finite and > 0.
    growth_factor : float
        Multiplies ``S`` after ``growth_interval`` consecutive clean steps (default 2.0, > 1).
    backoff_factor : float
        Multiplies ``S`` after a step with inf/NaN gradients (default 0.5, in (0, 1)).
    growth_interval : int
        Clean steps in a row before ``S`` grows (default 2000, >= 1).
    enabled : bool
        False makes every method a pass-through: ``scale`` returns its input, ``step`` calls
        ``optimizer.step()``, ``get_scale()`` is 1.0, ``state_dict()`` is ``{}``.

    Notes
    -----
    One iteration is ``scale`` (any number of times: micro-batches, several losses) → backward
    → optionally ``unscale_(opt)`` (once per optimizer) → ``step(opt)`` (once per optimizer) →
    ``update()``. Misuse raises RuntimeError naming the fix: ``unscale_``/``step``/``update``
    before any ``scale``, ``unscale_`` twice or after ``step``, ``step`` twice, ``update``
    with no ``step``/``unscale_`` since the last update, a closure passed to ``step``.

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> from linearkit.training.amp import GradScaler
    >>> model = lk.Linear(3, 1, rng=np.random.default_rng(0))
    >>> opt = lk.optim.SGD(model.parameters(), lr=0.1)
    >>> scaler = GradScaler(init_scale=1024.0, growth_interval=2)
    >>> x, y = np.ones((4, 3), np.float32), np.zeros((4, 1), np.float32)
    >>> for poison in [False, True, False, False]:
    ...     pred, back = model.vjp(x, input_grad=False)
    ...     loss, loss_back = lk.MSELoss().vjp(pred, y)
    ...     back(scaler.scale(loss_back)())
    ...     if poison:                              # an overflow in this step's gradients
    ...         model.bias.grad[0] = np.inf
    ...     scaler.step(opt)                        # skipped when poisoned
    ...     scaler.update()
    ...     opt.zero_grad()
    ...     print(scaler.get_scale())
    1024.0
    512.0
    512.0
    1024.0
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True):
        if isinstance(init_scale, str):
            raise TypeError(f"{_WHERE}: init_scale must be a number, got {init_scale!r}; "
                            "linearkit's GradScaler has no device argument (it is torch's "
                            "GradScaler('cpu', ...)): drop the device string")
        self._enabled = bool(enabled)
        if not self._enabled:
            return
        init_scale = _real("init_scale", init_scale)
        if not (math.isfinite(init_scale) and init_scale > 0):
            raise ValueError(f"{_WHERE}: init_scale must be finite and > 0, got {init_scale!r}")
        growth_factor = _real("growth_factor", growth_factor)
        if not growth_factor > 1.0:
            raise ValueError(f"{_WHERE}: growth_factor must be > 1.0, got {growth_factor!r} "
                             "(the factor the scale grows by after clean steps)")
        backoff_factor = _real("backoff_factor", backoff_factor)
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"{_WHERE}: backoff_factor must be in (0, 1), got "
                             f"{backoff_factor!r} (the factor the scale shrinks by on inf/NaN)")
        self._init_scale = float(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = _interval(growth_interval)
        self._init_growth_tracker = 0
        self._scale: float | None = None            # float32 value, set by the first scale()
        self._growth_tracker: int | None = None
        self._per_optimizer_states: dict[int, dict] = {}

    # ------------------------------------------------------------------ scaling
    def scale(self, outputs):
        """Multiply by the scale ``S``; for a loss's backward closure, return its ``S``-scaled one.

        Parameters
        ----------
        outputs : callable, number, ndarray, or a list/tuple of these
            A loss backward closure ``loss_back(dy=None)`` (from ``loss_fn.vjp``) becomes
            ``lambda dy=None: loss_back(S if dy is None else dy * S)``, the backward of the
            scaled loss ``S·L``: its result is ``S · dL/dpred``. A number becomes
            ``number * S`` (a Python float); an array ``array * S`` in the array's dtype (a
            float16 array can overflow to inf here, as torch's float16 tensors do).

        Returns
        -------
        The scaled closure, number or array (a list/tuple of them); ``outputs`` itself when the
        scaler is disabled.
        """
        if not self._enabled:
            return outputs
        if self._scale is None:
            self._scale = _f32(self._init_scale)
            self._growth_tracker = self._init_growth_tracker
        return self._apply(outputs, self._scale)

    def _apply(self, value, s: float):
        from ..core.module import Module

        if isinstance(value, Module):
            raise TypeError(f"{_WHERE}.scale: got the module {type(value).__name__}; pass the "
                            "loss's backward closure: loss, loss_back = loss_fn.vjp(pred, y); "
                            "back(scaler.scale(loss_back)())")
        if callable(value):
            backward = value

            def scaled_backward(dy=None):
                """The scaled loss's backward: ``backward(dy * S)`` (``dy`` defaults to 1)."""
                return backward(s if dy is None else _times(dy, s))

            return scaled_backward
        if isinstance(value, (list, tuple)):
            return type(value)(self._apply(v, s) for v in value)
        if isinstance(value, (numbers.Number, np.ndarray, np.generic)) \
                and not isinstance(value, bool):
            return _times(value, s)
        raise TypeError(f"{_WHERE}.scale: expected a loss backward closure, a number, an array "
                        f"or a list/tuple of them, got {type(value).__name__}")

    # ------------------------------------------------------------------ unscaling
    def unscale_(self, optimizer) -> None:
        """Divide every gradient of ``optimizer``'s parameters by the scale, and check for inf/NaN.

        Optional: ``step`` unscales when you did not. Call it to work with true gradients
        before the step — clipping above all (``clip_grad_norm_`` on scaled gradients clips a
        norm ``S`` times too large). At most once per optimizer per iteration, after all of its
        gradients have been accumulated (every micro-batch). Parameters whose ``.grad`` is None
        are skipped. See the module docstring for 16-bit gradients.

        Raises
        ------
        RuntimeError
            Before any ``scale()``; a second time for this optimizer since the last
            ``update()``; after ``step(optimizer)``.
        """
        if not self._enabled:
            return
        scale = self._require_scale("unscale_")
        state = self._per_optimizer_states.setdefault(id(optimizer), _fresh_state())
        if state["stage"] == _UNSCALED:
            raise RuntimeError(
                f"{_WHERE}.unscale_: already called on this optimizer since the last update(); "
                "the gradients are already unscaled (a second call would divide them by the "
                "scale again). Call it once per iteration, after the last micro-batch")
        if state["stage"] == _STEPPED:
            raise RuntimeError(
                f"{_WHERE}.unscale_: called after step(optimizer) in this iteration; unscale_ "
                "belongs between the backward and step (call update() to start the next one)")
        # torch: float32(1 / float64(S)); a scale backed off to 0 gives inf (as torch's
        # reciprocal does), so every gradient is non-finite and the step is skipped again.
        inv = _f32(1.0 / scale) if scale else np.float32(np.inf)
        found = False
        for p in _params(optimizer):
            g = p.grad
            if g is None:
                continue
            if not isinstance(g, np.ndarray) or not _is_float(g.dtype):
                raise TypeError(f"{_WHERE}.unscale_: a gradient must be a float ndarray, got "
                                f"{type(g).__name__} of dtype {getattr(g, 'dtype', None)}")
            if g.dtype.itemsize >= 4:                # float32 / float64: in place
                found = found or not bool(np.isfinite(g).all())
                if inv != 1.0:
                    g *= np.asarray(inv, g.dtype)
                continue
            wide = g.astype(np.float32)              # 16-bit: float32 math
            found = found or not bool(np.isfinite(wide).all())
            if inv != 1.0:
                wide *= np.float32(inv)
            if g.dtype == np.float16:
                p.grad = wide                        # exact until step(); see the module doc
                state["swapped"].append((p, g, wide))
            else:
                g[...] = wide
        state["found_inf"] = found
        state["stage"] = _UNSCALED

    # ------------------------------------------------------------------ stepping
    def step(self, optimizer, *args, **kwargs):
        """Unscale (unless ``unscale_`` already did) and step, unless a gradient is inf/NaN.

        Returns
        -------
        ``optimizer.step()``'s result (None), or None when the step was skipped — as torch, the
        return value does not tell the two apart: a skipped step shows as a smaller
        ``get_scale()`` after ``update()``.

        Raises
        ------
        RuntimeError
            Before any ``scale()``; a second ``step`` for this optimizer since the last
            ``update()``; a closure (torch refuses closures with an enabled scaler too).
        """
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if args or "closure" in kwargs:
            raise RuntimeError(f"{_WHERE}.step: closures are not supported with an enabled "
                               "scaler (as in torch): run the forward and backward yourself, "
                               "then call scaler.step(optimizer)")
        self._require_scale("step")
        state = self._per_optimizer_states.setdefault(id(optimizer), _fresh_state())
        if state["stage"] == _STEPPED:
            raise RuntimeError(f"{_WHERE}.step: already called for this optimizer since the "
                               "last update(); call scaler.update() once per iteration, after "
                               "stepping every optimizer")
        if state["stage"] == _READY:
            self.unscale_(optimizer)
        result = None
        try:
            if not state["found_inf"]:
                result = optimizer.step(**kwargs)
        finally:
            _swap_back(state)
            state["stage"] = _STEPPED
        return result

    def update(self, new_scale: float | None = None) -> None:
        """Set the next iteration's scale: backoff after inf/NaN, growth after clean steps.

        With the inf/NaN checks of every optimizer unscaled this iteration: if any found one,
        ``S ← float32(S · backoff_factor)`` and the clean-step count resets to 0; otherwise the
        count goes up by one and, on reaching ``growth_interval``, ``S ← float32(S ·
        growth_factor)`` (kept when that would be inf) and the count resets. ``new_scale``
        (a number > 0) sets ``S`` instead and leaves the count alone, as torch.

        Raises
        ------
        RuntimeError
            Before any ``scale()``; when no optimizer was unscaled or stepped since the last
            update (and ``new_scale`` is None).
        """
        if not self._enabled:
            return
        scale = self._require_scale("update")
        if new_scale is not None:
            if isinstance(new_scale, np.ndarray) and new_scale.size == 1:
                new_scale = new_scale.reshape(()).item()
            value = _real("new_scale", new_scale)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{_WHERE}.update: new_scale must be finite and > 0, got "
                                 f"{new_scale!r}")
            self._scale = _f32(value)
        else:
            checks = [s["found_inf"] for s in self._per_optimizer_states.values()
                      if s["found_inf"] is not None]
            if not checks:
                raise RuntimeError(f"{_WHERE}.update: no inf/NaN checks were recorded since the "
                                   "last update(); call scaler.step(optimizer) (or unscale_) "
                                   "before update()")
            if any(checks):
                self._scale = _f32(scale * self._backoff_factor)
                self._growth_tracker = 0
            else:
                successful = self._growth_tracker + 1
                if successful == self._growth_interval:
                    grown = _f32(scale * self._growth_factor)
                    if math.isfinite(grown):
                        self._scale = grown
                    self._growth_tracker = 0
                else:
                    self._growth_tracker = successful
        for state in self._per_optimizer_states.values():
            _swap_back(state)                         # unscale_ without step, then update
        self._per_optimizer_states = {}

    def _require_scale(self, what: str) -> float:
        if self._scale is None:
            raise RuntimeError(f"{_WHERE}.{what}: the scaler has not scaled anything yet; call "
                               "scaler.scale(loss_back) and run the backward with it first "
                               "(back(scaler.scale(loss_back)()))")
        return self._scale

    # ------------------------------------------------------------------ accessors
    def get_scale(self) -> float:
        """The current scale (``init_scale`` before the first ``scale()``); 1.0 when disabled."""
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else self._scale

    def get_growth_factor(self) -> float:
        """The factor the scale grows by."""
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        """Set the factor the scale grows by."""
        self._growth_factor = float(new_factor)

    def get_backoff_factor(self) -> float:
        """The factor the scale shrinks by."""
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        """Set the factor the scale shrinks by."""
        self._backoff_factor = float(new_factor)

    def get_growth_interval(self) -> int:
        """Clean steps in a row before the scale grows."""
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        """Set the number of clean steps in a row before the scale grows."""
        self._growth_interval = _interval(new_interval)

    def _get_growth_tracker(self) -> int:
        if not self._enabled:
            return 0
        return self._init_growth_tracker if self._growth_tracker is None else \
            self._growth_tracker

    def is_enabled(self) -> bool:
        """Whether scaling is on."""
        return self._enabled

    # ------------------------------------------------------------------ state dict
    def state_dict(self) -> dict:
        """torch's five keys: ``scale``, ``growth_factor``, ``backoff_factor``,
        ``growth_interval``, ``_growth_tracker`` (``{}`` when disabled). Save it after
        ``update()``."""
        if not self._enabled:
            return {}
        return {"scale": self.get_scale(), "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval,
                "_growth_tracker": self._get_growth_tracker()}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore a ``state_dict()`` (this scaler's or torch's); a no-op when disabled.

        Every key is checked before anything is assigned: missing or unknown keys, or values
        of the wrong type, raise (RuntimeError for an empty dict, saved from a disabled
        scaler, as torch; ValueError otherwise) and leave the scaler as it was.
        """
        if not self._enabled:
            return
        if not isinstance(state_dict, dict):
            raise TypeError(f"{_WHERE}.load_state_dict: expected a dict, got "
                            f"{type(state_dict).__name__}")
        if len(state_dict) == 0:
            raise RuntimeError(f"{_WHERE}.load_state_dict: the state dict is empty, possibly "
                               "because it was saved from a disabled GradScaler")
        keys = {"scale", "growth_factor", "backoff_factor", "growth_interval",
                "_growth_tracker"}
        missing, unexpected = keys - set(state_dict), set(state_dict) - keys
        if missing or unexpected:
            raise ValueError(f"{_WHERE}.load_state_dict: expected the keys {sorted(keys)}; "
                             f"missing {sorted(missing)}, unexpected {sorted(unexpected)}")
        scale = _real("scale", state_dict["scale"])
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"{_WHERE}.load_state_dict: scale must be finite and > 0, got "
                             f"{scale!r}")
        growth, backoff = (_real(k, state_dict[k]) for k in ("growth_factor", "backoff_factor"))
        interval = _interval(state_dict["growth_interval"])
        tracker = state_dict["_growth_tracker"]
        if isinstance(tracker, bool) or not isinstance(tracker, (int, np.integer)) \
                or tracker < 0:
            raise ValueError(f"{_WHERE}.load_state_dict: _growth_tracker must be an int >= 0, "
                             f"got {tracker!r}")
        self._init_scale = scale
        if self._scale is not None:
            self._scale = _f32(scale)
        self._growth_factor, self._backoff_factor = growth, backoff
        self._growth_interval = interval
        self._init_growth_tracker = int(tracker)
        if self._growth_tracker is not None:
            self._growth_tracker = int(tracker)

    def __repr__(self) -> str:
        if not self._enabled:
            return "GradScaler(enabled=False)"
        return (f"GradScaler(scale={self.get_scale()}, growth_factor={self._growth_factor}, "
                f"backoff_factor={self._backoff_factor}, "
                f"growth_interval={self._growth_interval})")


# ---------------------------------------------------------------------- helpers
def _params(optimizer):
    groups = getattr(optimizer, "param_groups", None)
    if groups is None:
        raise TypeError(f"{_WHERE}: expected an optimizer (with param_groups), got "
                        f"{type(optimizer).__name__}")
    for group in groups:
        yield from group["params"]


def _swap_back(state: dict) -> None:
    """Put each float16 parameter's own buffer back, holding the unscaled gradient rounded."""
    for p, own, wide in state["swapped"]:
        if p.grad is wide:
            own[...] = wide
            p.grad = own
    state["swapped"] = []


def _times(value, s: float):
    if isinstance(value, np.ndarray):
        return np.asarray(np.multiply(value, s))
    if isinstance(value, np.generic):
        return value * s
    return float(value) * s


def _real(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{_WHERE}: {name} must be a real number, got {value!r}")
    return float(value)


def _interval(value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{_WHERE}: growth_interval must be an int >= 1, got {value!r}")
    return int(value)
