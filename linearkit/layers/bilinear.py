"""Bilinear: ``y = x1ᵀ W x2 + b`` over two inputs, with PyTorch's semantics (init, repr,
errors)."""

from __future__ import annotations

import math

import numpy as np

from .. import functional as F
from .. import precision as P
from ..core.allocation import empty
from ..core.module import Module, Parameter
from ..core.random import resolve
from ..errors import DTypeError, ShapeError
from ._checks import as_input, feature_count, float_dtype
from .linear import fill_weight_and_bias, init_skipped

__all__ = ["Bilinear"]


class Bilinear(Module):
    """Bilinear map of two inputs: ``y[..., o] = x1[..., :] · weight[o] · x2[..., :] + bias[o]``.

    Parameters
    ----------
    in1_features : int
        Size of the last dimension of the first input (> 0, as in PyTorch: the init bound is
        ``1/sqrt(in1_features)``).
    in2_features, out_features : int
        Sizes of the last dimension of the second input and of the output (non-negative ints).
    bias : bool
        Learn an additive bias (default True).
    dtype : float32 (default), float64, or float16 / bfloat16 storage (computes in float32:
        float32 inputs and outputs; ``linearkit.precision``).
    rng : numpy.random.Generator, optional
        Source of the initial values; defaults to the library's (``linearkit.manual_seed``).

    Shape
    -----
    x1 ``(*, in1_features)`` and x2 ``(*, in2_features)`` with the same leading dimensions ``*``
    (any number, none included; no broadcasting, as in PyTorch) -> y ``(*, out_features)``.
    ``vjp(x1, x2)``'s backward returns the tuple ``(dx1, dx2)``.

    Attributes
    ----------
    weight : Parameter ``(out_features, in1_features, in2_features)``, initialized U(-k, k),
        k = 1/sqrt(in1_features)
    bias : Parameter ``(out_features,)`` or None, initialized U(-k, k) too.

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> layer = lk.Bilinear(3, 4, 2, rng=np.random.default_rng(0))
    >>> layer
    Bilinear(in1_features=3, in2_features=4, out_features=2, bias=True)
    >>> layer(np.ones((5, 3), np.float32), np.ones((5, 4), np.float32)).shape
    (5, 2)
    >>> layer.weight.shape
    (2, 3, 4)
    """

    def __init__(self, in1_features: int, in2_features: int, out_features: int,
                 bias: bool = True, *, dtype=np.float32, rng: np.random.Generator | None = None):
        super().__init__()
        self.in1_features = feature_count("in1_features", in1_features)
        if self.in1_features == 0:
            raise ValueError("in1_features must be > 0, but got (in1_features=0): the init "
                             "bound is 1/sqrt(in1_features), as in PyTorch; a first input "
                             "without features makes every output the bias alone")
        self.in2_features = feature_count("in2_features", in2_features)
        self.out_features = feature_count("out_features", out_features)
        self.dtype = float_dtype(dtype)
        shape = (self.out_features, self.in1_features, self.in2_features)
        self.weight = Parameter(empty(self, "weight", shape, self.dtype))
        if bias:
            self.bias = Parameter(empty(self, "bias", (self.out_features,), self.dtype))
        else:
            self.register_parameter("bias", None)
        if not init_skipped():  # uninitialized(): the caller loads every value next
            self.reset_parameters(rng)

    def reset_parameters(self, rng: np.random.Generator | None = None) -> None:
        """PyTorch's init: weight and bias ~ U(-1/sqrt(in1_features), 1/sqrt(in1_features))."""
        rng = resolve(rng)
        fill_weight_and_bias(self, 1.0 / math.sqrt(self.in1_features), rng)   # as Linear draws

    # ------------------------------------------------------------------ input checks
    def check_input_shape(self, shape: tuple, shape2: tuple | None = None) -> None:
        """Raise the ShapeError ``forward`` would raise for a first input of ``shape`` (and a
        second of ``shape2``, when given), without data. The ledger checks the first input."""
        shape = tuple(shape)
        n1, n2 = self.in1_features, self.in2_features
        if len(shape) == 0 or shape[-1] != n1:
            hint = None
            if shape2 is not None and len(shape2) and tuple(shape2)[-1] == n1 and shape[-1:] \
                    == (n2,):
                hint = "the inputs look swapped: call it as layer(x1, x2) with x1 (*, in1_features)"
            elif len(shape) == 0:
                hint = f"a 0-d input has no feature dimension; pass shape ({n1},) or (N, {n1})"
            raise ShapeError(f"expected input1 of shape (*, {n1}), got {shape}", module=self,
                             hint=hint)
        if shape2 is None:
            return
        shape2 = tuple(shape2)
        if len(shape2) == 0 or shape2[-1] != n2:
            raise ShapeError(f"expected input2 of shape (*, {n2}), got {shape2}", module=self)
        if shape2[:-1] != shape[:-1]:
            raise ShapeError(
                f"input1 and input2 must have the same leading dimensions, got input1 {shape} "
                f"and input2 {shape2}", module=self,
                hint="Bilinear does not broadcast (as in PyTorch): give both inputs the same "
                     "batch dimensions, e.g. np.broadcast_to(x2, x1.shape[:-1] + (in2,))")

    def _inputs(self, x1, x2) -> tuple[np.ndarray, np.ndarray, tuple]:
        """``(x1 (B, in1), x2 (B, in2), leading dims)`` in the compute dtype, checked."""
        dtype = self.weight.data.dtype
        xs = []
        for name, x in (("input1", x1), ("input2", x2)):
            try:
                xs.append(P.compute_array(as_input(self, x, dtype)))
            except DTypeError as err:
                err.detail = f"{name}: {err.detail}"
                raise
        x1, x2 = xs
        self.check_input_shape(x1.shape, x2.shape)
        lead = x1.shape[:-1]
        rows = math.prod(lead)
        return x1.reshape(rows, self.in1_features), x2.reshape(rows, self.in2_features), lead

    def _params(self):
        if P.current.compute is not None:
            P.check_compute(self, self.weight.data.dtype)
        b = self.bias
        return P.compute_array(self.weight.data), None if b is None else P.compute_array(b.data)

    # ------------------------------------------------------------------ forward / backward
    def forward(self, x1: np.ndarray, x2: np.ndarray) -> np.ndarray:
        """``(*, in1_features), (*, in2_features) -> (*, out_features)``."""
        a, c, lead = self._inputs(x1, x2)
        return F.bilinear(a, c, *self._params()).reshape(lead + (self.out_features,))

    def vjp(self, x1: np.ndarray, x2: np.ndarray, input_grad: bool = True):
        """Forward plus ``backward(dy (*, out)) -> (dx1 (*, in1), dx2 (*, in2))`` (None if not
        ``input_grad``); adds dweight and dbias into ``.grad``. What to differentiate is fixed
        here, when the forward runs; the inputs are kept only when dW or dx needs them."""
        a, c, lead = self._inputs(x1, x2)
        w, b = self.weight, self.bias
        wd, bd = self._params()
        y = F.bilinear(a, c, wd, bd).reshape(lead + (self.out_features,))
        need_dw = w.requires_grad
        need_db = b is not None and b.requires_grad
        keep = need_dw or input_grad
        saved = [P.saved_activation(v) if keep else None for v in (a, c)]
        gw = P.grad_dtype(w.data.dtype) if need_dw and w.data.itemsize == 2 else None
        gb = P.grad_dtype(b.data.dtype) if need_db and b.data.itemsize == 2 else None
        shapes = (lead + (self.in1_features,), lead + (self.in2_features,))
        rows = a.shape[0]

        def backward(dy: np.ndarray):
            s1, s2 = (None if s is None else P.compute_array(s) for s in saved)
            dx1, dx2, dw, db = F.bilinear_backward(
                dy.reshape(rows, self.out_features), s1, s2, P.compute_array(w.data), input_grad,
                need_dw, need_db)
            if need_dw:
                w.add_grad(dw, dtype=gw)
            if need_db:
                b.add_grad(db, dtype=gb)
            return (dx1.reshape(shapes[0]), dx2.reshape(shapes[1])) if input_grad else None

        return y, backward

    def extra_repr(self) -> str:
        return (f"in1_features={self.in1_features}, in2_features={self.in2_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}")
