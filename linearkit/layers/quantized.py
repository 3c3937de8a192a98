"""QuantizedLinear: int8 weights with one float scale per output channel, for inference only.

The arithmetic (``linearkit.transforms.quantize_weight`` is the public array-level entry):

* weights, symmetric per output channel: ``scale[o] = max|w[o, :]| / 127`` and
  ``q = clip(round_half_even(w / scale[:, None]), -127, 127)`` as int8, so ``|w - q·scale| <=
  scale / 2`` elementwise and the largest weight of each row is exactly ``±127·scale``. A row
  whose ``max|w| / 127`` is 0 (all zeros) gets scale 1: its ``q`` is 0 and it dequantizes to
  exactly 0.
* weight-only forward: ``y = (x @ q.T) * scale + b``, the GEMM in float32 on ``q`` cast to
  float32 for the call (the integers are exact in float32; no float copy of the weight is kept).
* ``activations='dynamic'``: each input row is quantized the same way on the fly
  (``s_x = max|x_row| / 127``, ``x_q = clip(round_half_even(x / s_x), -127, 127)``) and
  ``y = (x_q @ q.T) * s_x[:, None] * scale[None, :] + b``. The products ``x_q·q`` are integers
  of magnitude <= 127² and float32 adds them exactly while every partial sum stays below 2²⁴,
  which is guaranteed when ``in_features·127² < 2²⁴`` (``in_features <= 1040``); wider layers
  round the accumulation as any float32 GEMM does (relative error ~1e-7 per add).

This differs from PyTorch's ``torch.ao`` observers (``PerChannelMinMaxObserver`` with
``qscheme=torch.per_channel_symmetric``, ``dtype=torch.qint8``), which compute
``scale = max|w| / 127.5`` and clamp to ``[-128, 127]``: there a row's extreme weight lands on
±127.5, which rounds to 128 and is clamped to 127 on the positive side but may become -128 on
the negative one (asymmetric, and the extreme is off by up to half a step); here the range is
symmetric, ``[-127, 127]``, and the extreme weight of each row is exactly ``±127·scale``.
Rounding and clamping themselves are PyTorch's (``torch.quantize_per_channel`` with the same
scales gives the same integers; tests/test_transforms_quantize.py checks it).
"""

from __future__ import annotations

import math

import numpy as np

from .. import functional as F
from ..core.allocation import filled
from ..core.module import Module
from ..errors import Located, ShapeError
from ._checks import as_input, feature_count, float_dtype
from .linear import Linear, uninitialized

__all__ = ["ACTIVATION_MODES", "QuantizedLinear", "QuantizedTrainingError", "int8_rows"]

#: ``activations=``: None (weight-only) or 'dynamic' (per-row int8 activations too).
ACTIVATION_MODES = (None, "dynamic")

_QMAX = 127


class QuantizedTrainingError(Located, RuntimeError):
    """``vjp`` of a quantized layer: int8 weights have no gradient and nothing to step."""


def int8_rows(a: np.ndarray, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 quantization of each row of ``a (rows, n)``: ``(q, scale)``.

    ``scale (rows,)`` in ``dtype`` is ``max|a[r]| / 127`` (1 where that is 0); ``q (rows, n)``
    holds ``clip(round_half_even(a / scale[:, None]), -127, 127)`` as whole numbers in the
    dtype the division ran in (``a``'s, at least float32) — cast it to int8 to store it.
    """
    # max|a[r]| as max(max a[r], -min a[r]), and q rounded in place: no temporary of a's size
    # besides q itself
    amax = np.maximum(a.max(axis=1, initial=0), -a.min(axis=1, initial=0))
    scale = (amax / _QMAX).astype(dtype)
    scale[scale == 0] = 1
    q = a / scale[:, None].astype(np.promote_types(a.dtype, np.float32))
    np.rint(q, out=q)
    np.clip(q, -_QMAX, _QMAX, out=q)
    return q, scale


class QuantizedLinear(Module):
    """``y = x @ dequant(weight).T + bias`` with int8 weights, one scale per output channel.

    Made by ``QuantizedLinear.from_linear(linear)`` or ``linearkit.transforms.quantize(model,
    'int8')``; the constructor makes zeros (scale 1) for ``load_state_dict`` to fill. The
    arithmetic, and how it differs from torch.ao's, is in the module docstring.

    Parameters
    ----------
    in_features, out_features : int
    bias : bool
        Whether the layer adds a bias.
    activations : None or 'dynamic'
        None: weight-only (float32 input and GEMM); 'dynamic': each input row is also quantized
        to int8 on the fly.
    dtype : float32 (default) or float64
        Of the input, output, scales and bias (what a float64 model quantizes to).

    Shape
    -----
    x ``(*, in_features)`` -> y ``(*, out_features)``.

    Attributes (buffers: nothing here trains)
    ----------
    weight : int8 ``(out_features, in_features)``
    weight_scale : ``(out_features,)``, float32
    bias : ``(out_features,)``, float32, or None

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> from linearkit.layers.quantized import QuantizedLinear
    >>> q = QuantizedLinear.from_linear(lk.Linear(3, 2, rng=np.random.default_rng(0)))
    >>> q.weight.dtype, q.weight_scale.shape, q(np.ones((5, 3), np.float32)).shape
    (dtype('int8'), (2,), (5, 2))
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 activations: str | None = None, *, dtype=np.float32):
        super().__init__()
        if activations not in ACTIVATION_MODES:
            raise ValueError(f"activations must be None (weight-only int8) or 'dynamic' "
                             f"(per-row int8 activations too), got {activations!r}")
        self.in_features = feature_count("in_features", in_features)
        self.out_features = feature_count("out_features", out_features)
        self.activations = activations
        self.dtype = float_dtype(dtype)
        n_out, n_in = self.out_features, self.in_features
        self.register_buffer("weight", filled(self, "weight", (n_out, n_in), np.int8, 0))
        self.register_buffer("weight_scale", filled(self, "weight_scale", n_out, self.dtype, 1))
        self.register_buffer("bias", filled(self, "bias", n_out, self.dtype, 0) if bias else None)

    @classmethod
    def from_linear(cls, linear: Linear, activations: str | None = None) -> QuantizedLinear:
        """The int8 twin of ``linear`` (left unchanged). Its float64 weights give a float64
        layer (scales and bias), any other dtype a float32 one."""
        if not isinstance(linear, Linear) or linear.in_features is None:
            raise TypeError(f"QuantizedLinear.from_linear() takes a Linear with its weights, got "
                            f"{type(linear).__name__}; call a LazyLinear once first")
        w = linear.weight.data
        if not np.isfinite(w).all():
            raise ValueError(f"cannot quantize {linear._signature()}: its weight holds NaN or "
                             "Inf (no finite scale represents it)")
        dtype = np.float64 if w.dtype == np.float64 else np.float32
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None,
                    activations, dtype=dtype)
        q, scale = int8_rows(w, np.float32)
        layer.weight[...] = q
        layer.weight_scale[...] = scale
        if linear.bias is not None:
            layer.bias[...] = linear.bias.data
        return layer

    @property
    def has_bias(self) -> bool:
        return self.bias is not None

    def dequantize(self) -> Linear:
        """A float ``Linear`` holding ``weight * weight_scale[:, None]`` and the bias (in the
        layer's dtype); the library's random stream is not advanced."""
        with uninitialized():  # every value is assigned next
            out = Linear(self.in_features, self.out_features, self.has_bias, dtype=self.dtype)
        # computed in the compute dtype straight into the new weight (no full-size temporary)
        np.multiply(self.weight, self.weight_scale[:, None], out=out.weight.data,
                    dtype=self._compute)
        if self.has_bias:
            out.bias.data[...] = self.bias
        return out

    # ------------------------------------------------------------------ shapes
    @property
    def _compute(self) -> np.dtype:
        return np.promote_types(self.dtype, np.float32)

    def check_input_shape(self, shape: tuple) -> None:
        """Raise the ShapeError ``forward`` would raise for an input of ``shape``."""
        shape = tuple(shape)
        if len(shape) == 0 or shape[-1] != self.in_features:
            hint = None
            if len(shape) == 0:
                hint = f"a 0-d input has no feature dimension; pass (N, {self.in_features})"
            elif len(shape) >= 3 and math.prod(shape[1:]) == self.in_features:
                hint = "flatten it first: x.reshape(len(x), -1) or Flatten()"
            elif shape[-1] == self.out_features:
                hint = f"the last dimension equals out_features={self.out_features}"
            raise ShapeError(f"expected input of shape (*, {self.in_features}), got {shape}",
                             module=self, hint=hint)

    # ------------------------------------------------------------------ forward
    def forward(self, x: np.ndarray) -> np.ndarray:
        """``(*, in_features) -> (*, out_features)``, in the layer's dtype (float32)."""
        x = as_input(self, x, self.dtype)
        self.check_input_shape(x.shape)
        compute = self._compute
        x = x.astype(compute, copy=False)
        q = self.weight.astype(compute)  # exact: |q| <= 127; lives for this call only
        if self.activations is None:
            y = F.linear(x, q)
            y *= self.weight_scale
        else:
            rows = x.reshape(math.prod(x.shape[:-1]), self.in_features)
            xq, sx = int8_rows(rows, compute)
            y = F.linear(xq, q)
            y *= sx[:, None]
            y *= self.weight_scale
            y = y.reshape(*x.shape[:-1], self.out_features)
        if self.bias is not None:
            y += self.bias
        return y

    def vjp(self, x, input_grad: bool = True):
        """Refused: a quantized layer does not train (see ``QuantizedTrainingError``)."""
        raise QuantizedTrainingError(
            "training a quantized model is not supported: this layer stores its weight as int8 "
            "with a per-channel scale, which has no gradient (rounding is flat almost "
            "everywhere) and no Parameter an optimizer could step",
            module=self,
            hint="train the float model and quantize after (linearkit.transforms.quantize); "
                 "layer.dequantize() gives a float Linear back")

    def extra_repr(self) -> str:
        mode = "" if self.activations is None else f", activations={self.activations!r}"
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.has_bias}, weight=int8 per-channel{mode}")
