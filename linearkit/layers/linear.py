"""Linear, LazyLinear and Identity."""

from __future__ import annotations

import contextlib
import contextvars
import math

import numpy as np

from .. import functional as F
from .. import precision as P
from ..core.allocation import allocating, empty
from ..core.module import Module, Parameter
from ..core.random import block_size, fill_uniform, resolve
from ..errors import ShapeError
from ._checks import as_input, feature_count, float_dtype

__all__ = ["Identity", "LazyLinear", "Linear", "init_skipped", "linear_from", "uninitialized"]

# True inside ``uninitialized()``: a ContextVar, so another thread building layers meanwhile
# still gets the default init.
_init_skipped = contextvars.ContextVar("linearkit_init_skipped", default=False)


@contextlib.contextmanager
def uninitialized():
    """Inside, a new ``Linear`` (and a ``LazyLinear`` as it materializes, and a ``Bilinear``)
    keeps the arrays ``np.empty`` gave it — weight ``(out_features, in_features)``, bias
    ``(out_features,)``, values undefined — instead of drawing the default init.

    For loaders that overwrite every value next (``linearkit.load_model``): a
    ``(15000, 15000)`` layer then costs no random draw, and the library's random stream does
    not move. Only the current thread (context) is affected; ``forward``/``vjp`` are unchanged.
    """
    token = _init_skipped.set(True)
    try:
        yield
    finally:
        _init_skipped.reset(token)


def init_skipped() -> bool:
    """Whether a layer built now skips its random init (inside ``uninitialized()``)."""
    return _init_skipped.get()


def fill_weight_and_bias(module: Module, bound: float, rng: np.random.Generator) -> None:
    """``module.weight`` and ``module.bias`` (where not None) ~ U(-bound, bound), in that order:
    drawn in float64 and rounded once into each parameter's dtype, a block at a time
    (``core.random.fill_uniform``); a failed allocation names the module and the parameter."""
    for name in ("weight", "bias"):
        p = getattr(module, name)
        if p is not None:
            with allocating(module, name, p.shape, p.dtype, block_size(p.size) * 8,
                            " of float64 draws"):
                fill_uniform(p.data, -bound, bound, rng)


class Linear(Module):
    """Affine map ``y = x @ weight.T + bias``.

    Parameters
    ----------
    in_features, out_features : int
        Sizes of the last input and output dimension (non-negative ints).
    bias : bool
        Learn an additive bias (default True).
    dtype : float32 (default), float64, or float16 / bfloat16 (``"bfloat16"``) storage
        A 16-bit layer stores its parameters in 16 bits and computes in float32: it takes
        float32 (or storage-dtype) inputs and returns float32 (``linearkit.precision``).
    rng : numpy.random.Generator, optional
        Source of the initial values; defaults to the library's (``linearkit.manual_seed``).

    Shape
    -----
    x ``(*, in_features)`` -> y ``(*, out_features)``; ``*`` is any number of leading
    dimensions, including none (a 1-D input) and a batch of 0.

    Attributes
    ----------
    weight : Parameter ``(out_features, in_features)``, initialized U(-k, k), k = 1/sqrt(in_features)
    bias : Parameter ``(out_features,)`` or None, initialized U(-k, k) too — *not* zeros.
        Inside ``uninitialized()`` (a loader that assigns both next) neither is initialized.

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> layer = lk.Linear(3, 2, rng=np.random.default_rng(0))
    >>> layer(np.ones((5, 3), np.float32)).shape
    (5, 2)
    >>> layer.weight.shape, layer.bias.shape
    ((2, 3), (2,))
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 dtype=np.float32, rng: np.random.Generator | None = None):
        super().__init__()
        self.in_features = feature_count("in_features", in_features, lazy_hint=True)
        self.out_features = feature_count("out_features", out_features)
        self.dtype = float_dtype(dtype)
        weight, bias_ = _arrays(self, self.out_features, self.in_features, bias, self.dtype)
        self.weight = Parameter(weight)
        if bias:
            self.bias = Parameter(bias_)
        else:
            self.register_parameter("bias", None)
        if not _init_skipped.get():  # uninitialized(): the caller loads every value next
            self.reset_parameters(rng)

    def reset_parameters(self, rng: np.random.Generator | None = None) -> None:
        """PyTorch's default init: weight and bias ~ U(-1/sqrt(in_features), 1/sqrt(in_features)).

        This is what PyTorch writes as ``kaiming_uniform_(weight, a=sqrt(5))``: gain sqrt(1/3)
        times sqrt(3/fan_in) is 1/sqrt(fan_in).

        Drawn in float64 and rounded once into the storage dtype (to nearest even), a block at
        a time (``core.random.fill_uniform``): the values of one whole float64 draw, with only a
        block of float64 held beside the parameters.
        """
        rng = resolve(rng)
        bound = 1.0 / math.sqrt(self.in_features) if self.in_features > 0 else 0.0
        fill_weight_and_bias(self, bound, rng)

    @property
    def has_bias(self) -> bool:
        """Whether the layer adds a bias (``bias is not None``; a LazyLinear knows it before)."""
        return self.bias is not None

    # ------------------------------------------------------------------ input checks
    def check_input_shape(self, shape: tuple) -> None:
        """Raise the ShapeError ``forward`` would raise for an input of ``shape`` (no data needed).

        Tools that propagate shapes without running the model (the ledger) call this.
        """
        shape = tuple(shape)
        if len(shape) == 0 or shape[-1] != self.in_features:
            raise self._shape_error(shape)

    def checked_input(self, x) -> np.ndarray:
        """``x`` as this layer's input, ``(*, in_features)`` of the weight's dtype: returned as
        it is when it already is one (checked inline: the hot path of every route), else
        converted, or the ShapeError ``forward`` raises. A LazyLinear gets its weight here."""
        w = self.weight
        if w is not None and type(x) is np.ndarray and x.dtype is w.data.dtype and x.ndim \
                and x.shape[-1] == self.in_features:
            return x
        return self._input(x)

    def _input(self, x) -> np.ndarray:
        x = as_input(self, x, self.weight.data.dtype)
        if x.ndim == 0 or x.shape[-1] != self.in_features:  # check_input_shape, inlined (hot)
            raise self._shape_error(x.shape)
        return x

    def _shape_error(self, shape: tuple) -> ShapeError:
        expected = f"expected input of shape (*, {self.in_features}), got {shape}"
        hint = None
        if len(shape) == 0:
            hint = (f"a 0-d input (a scalar) has no feature dimension; pass shape "
                    f"({self.in_features},) or (N, {self.in_features})")
        elif len(shape) >= 3 and math.prod(shape[1:]) == self.in_features:
            hint = ("the trailing dimensions multiply to in_features: flatten it first: "
                    "x.reshape(len(x), -1) or Flatten()")
        elif shape[-1] == self.out_features:
            hint = (f"the last dimension equals out_features={self.out_features}: is the weight "
                    "transposed? weight is stored (out_features, in_features), as in PyTorch")
        elif len(shape) == 2 and shape[0] == self.in_features:
            hint = "the first dimension equals in_features: is the input transposed? try x.T"
        return ShapeError(expected, module=self, hint=hint)

    # ------------------------------------------------------------------ forward / backward
    def forward(self, x: np.ndarray) -> np.ndarray:
        """``(*, in_features) -> (*, out_features)``."""
        x = self.checked_input(x)
        w = self.weight.data
        b = self.bias
        if P.current.compute is not None:
            P.check_compute(self, w.dtype)
        return F.linear(x, w, None if b is None else b.data)

    def vjp(self, x: np.ndarray, input_grad: bool = True):
        """Forward plus a closure ``backward(dy (*, out)) -> dx (*, in)`` (None if not input_grad).

        The closure adds ``dW = dyᵀ x`` into ``weight.grad`` and ``db = Σ dy`` into ``bias.grad``,
        skipping the GEMM of a frozen weight and, for ``input_grad=False``, of ``dx``.
        """
        x = self.checked_input(x)
        w, b = self.weight, self.bias
        policy = P.current
        if policy.compute is not None:
            P.check_compute(self, w.data.dtype)
        if w.data.itemsize == 2 or policy.activations is not None:
            return self._vjp_policy(x, input_grad, policy)
        y = F.linear(x, w.data, None if b is None else b.data)
        # What to differentiate is fixed now, as autograd records it at forward time; the input
        # is kept only when dW needs it (a frozen layer holds no activation).
        need_dw = w.requires_grad
        need_db = b is not None and b.requires_grad
        saved_x = x if need_dw else None

        def backward(dy: np.ndarray):
            return linear_backward_into(w, b, dy, saved_x, need_dw, need_db, input_grad)

        return y, backward

    def _vjp_policy(self, x: np.ndarray, input_grad: bool, policy: P.Policy):
        """``vjp`` for 16-bit parameters or saved activations kept in 16 bits (the policy).

        The GEMMs run in float32. dx = dy @ W needs the weight again: a bfloat16 weight is
        upcast again in the backward (block by block: a cheap pass), while a float16 one keeps
        its float32 copy from the forward in the closure (4 bytes per weight element, counted
        among what the backward keeps), as torch's autocast caches its casts: NumPy's float16
        upcast is slow (a large share of a float32 GEMM), so doing it twice would slow the
        backward noticeably (docs/dtypes.md, "What the upcasts cost"; benchmarks/precision.py).
        Without ``input_grad`` no copy is kept. dW and db come out float32 and are stored as
        ``precision.grad_dtype`` said at forward time; x is kept in ``policy.activations``
        (upcast again for dW) when that is set.
        """
        w, b = self.weight, self.bias
        wd = w.data
        if wd.itemsize == 2 and x.itemsize == 2:
            x = P.compute_array(x)  # a 16-bit input of a 16-bit layer, upcast once
        bias = None if b is None else P.compute_array(b.data)
        w32 = P.compute_array(wd) if input_grad and wd.dtype == P.F16 else None
        y = F.linear(x, wd if w32 is None else w32, bias)
        need_dw = w.requires_grad
        need_db = b is not None and b.requires_grad
        saved_x = P.saved_activation(x) if need_dw else None
        gw = P.grad_dtype(wd.dtype)
        gb = None if b is None else P.grad_dtype(b.data.dtype)

        def backward(dy: np.ndarray):
            if need_dw:
                xs = P.compute_array(saved_x)
                w.add_grad(write=lambda out, acc: F.linear_weight_grad(dy, xs, out, acc),
                           dtype=gw)
            if need_db:
                b.add_grad(write=lambda out, acc: F.linear_bias_grad(dy, out, acc), dtype=gb)
            if not input_grad:
                return None
            return F.linear_input_grad(dy, w.data if w32 is None else w32)

        return y, backward

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


def linear_backward_into(weight: Parameter, bias: Parameter | None, dy: np.ndarray,
                         x: np.ndarray | None, need_dw: bool, need_db: bool,
                         input_grad: bool) -> np.ndarray | None:
    """A float32/float64 Linear's backward for ``dy (*, out)``: adds ``dW = dyᵀ x`` and
    ``db = Σ dy`` into ``.grad`` (when asked; straight into a zeroed ``.grad`` when there is one,
    ``Parameter.add_grad``) and returns ``dx = dy W (*, in)``, or None without ``input_grad``.
    ``Linear.vjp`` and the fused ``Linear -> ReLU`` step (``runtime/thin_path.py``) both end here."""
    if need_dw:
        weight.add_grad(write=lambda out, acc: F.linear_weight_grad(dy, x, out, acc))
    if need_db:
        bias.add_grad(write=lambda out, acc: F.linear_bias_grad(dy, out, acc))
    return F.linear_input_grad(dy, weight.data) if input_grad else None


def _arrays(owner, n_out: int, n_in: int, bias: bool, dtype: np.dtype):
    """A Linear's new arrays: weight ``(n_out, n_in)`` and bias ``(n_out,)`` (or None), their
    values undefined; an ``AllocationError`` naming ``owner`` when they do not fit."""
    weight = empty(owner, "weight", (n_out, n_in), dtype)
    return weight, empty(owner, "bias", (n_out,), dtype) if bias else None


def linear_from(weight: np.ndarray, bias: np.ndarray | None, dtype) -> Linear:
    """A ``Linear(in, out)`` holding ``weight (out, in)`` and ``bias (out,)`` (or none), cast to
    ``dtype`` (``weight`` may be a strided view, such as a transpose: it is copied once, into
    the layer). Built without a random init (``uninitialized``), so building one (a
    conversion, a transform) costs no draw and leaves the library's random stream where it was."""
    n_out, n_in = weight.shape
    with uninitialized():
        layer = Linear(n_in, n_out, bias=bias is not None, dtype=dtype)
    layer.weight.data[...] = weight
    if bias is not None:
        layer.bias.data[...] = bias
    return layer


class LazyLinear(Linear):
    """A Linear whose ``in_features`` is taken from the first input it sees.

    Before that call it holds no weight (``in_features`` is None), yet it can be printed,
    deep-copied and counted (0 parameters), and ``load_state_dict`` materializes it from the
    checkpoint's weight shape. After materialization it *is* a ``Linear`` (as in PyTorch), so a
    later input of another width gets a ShapeError. Build the optimizer after the first call
    (or after loading), since there is nothing to optimize before.

    Shape: x ``(*, in_features)`` -> y ``(*, out_features)``. ``dtype`` as Linear's (16-bit
    storage takes float32 inputs).
    """

    def __init__(self, out_features: int, bias: bool = True, *, dtype=np.float32,
                 rng: np.random.Generator | None = None):
        Module.__init__(self)
        self.in_features = None
        self.out_features = feature_count("out_features", out_features)
        self.dtype = float_dtype(dtype)
        self._has_bias = bool(bias)
        self._rng = rng
        self.register_parameter("weight", None)
        self.register_parameter("bias", None)

    def materialize(self, in_features: int, arrays: tuple | None = None) -> None:
        """Create the weight ``(out_features, in_features)`` and bias, with Linear's default init.

        ``arrays``: the ``(weight, bias)`` a load allocated beforehand, so that running out of
        memory happens before the load changes anything (the init still runs: a non-strict
        load may leave the bias as it is).
        """
        n_in = feature_count("in_features", in_features)
        if arrays is None:
            arrays = _arrays(self, self.out_features, n_in, self._has_bias, self.dtype)
        self.in_features = n_in
        self.weight = Parameter(arrays[0])
        if self._has_bias:
            self.bias = Parameter(arrays[1])
        if not _init_skipped.get():  # uninitialized(): the caller assigns both arrays next
            Linear.reset_parameters(self, self._rng)
        del self._rng, self._has_bias
        self.__class__ = Linear

    def reset_parameters(self, rng: np.random.Generator | None = None) -> None:
        if rng is not None:
            self._rng = rng

    @property
    def has_bias(self) -> bool:
        """Whether the layer will add a bias once materialized."""
        return self._has_bias

    def check_input_shape(self, shape: tuple) -> None:
        """Raise the ShapeError ``forward`` would raise for ``shape``; any width fits until
        materialized, only a 0-d input does not."""
        if len(shape) == 0:
            raise ShapeError(f"expected input of shape (*, in_features), got {tuple(shape)}",
                             module=self, hint="a 0-d input (a scalar) has no feature dimension")

    def _input(self, x) -> np.ndarray:
        x = as_input(self, x, self.dtype)
        self.check_input_shape(x.shape)
        self.materialize(x.shape[-1])
        return x

    def _load_targets(self, state_dict, prefix: str, errors: list[str]):
        # The checkpoint's weight decides in_features (its dim 1). The arrays are created only
        # when the whole load succeeds: a failing load leaves the LazyLinear lazy.
        key, out = prefix + "weight", self.out_features
        names = ("weight", "bias") if self._has_bias else ("weight",)
        shape = np.shape(state_dict[key]) if key in state_dict else None
        if shape is None or len(shape) != 2:
            if shape is not None:
                errors.append(f"size mismatch for {key}: a LazyLinear materializes from a 2-D "
                              f"weight of shape ({out}, in_features), got shape {shape}.")
            elif prefix + "bias" in state_dict and self._has_bias:
                errors.append(f"cannot load {prefix}bias into a LazyLinear without {key}: its "
                              "in_features comes from the weight's shape")
            # Reported missing when absent (as PyTorch does); never assigned (no getter).
            return {name: (None, self.dtype, None) for name in names}, None
        n_in = feature_count("in_features", shape[1])
        shapes = {"weight": (out, n_in), "bias": (out,)}
        targets = {name: (shapes[name], self.dtype, lambda name=name: getattr(self, name).data)
                   for name in names}
        # Allocated now, while nothing is changed yet: a MemoryError leaves the model as it was.
        arrays = _arrays(self, out, n_in, self._has_bias, self.dtype)
        return targets, lambda: self.materialize(n_in, arrays)

    def extra_repr(self) -> str:
        if self.in_features is None:
            return f"in_features=?, out_features={self.out_features}, bias={self._has_bias}"
        return super().extra_repr()


class Identity(Module):
    """Returns its input unchanged. Shape: any -> same. Takes (and ignores) any arguments."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x):
        """Return ``x`` itself (not a copy).

        Parameters
        ----------
        x : anything, usually an ndarray of shape ``(*)``

        Returns
        -------
        y : the same object as ``x``, shape ``(*)``
        """
        return x

    def vjp(self, x, input_grad: bool = True):
        """``(x, backward)`` with ``backward(dy) -> dy``.

        Parameters
        ----------
        x : ndarray, shape ``(*)``
        input_grad : bool
            False when the caller needs no ``dx``: ``backward`` then returns None.

        Returns
        -------
        y : ndarray, shape ``(*)``
            ``x`` itself.
        backward : callable
            ``backward(dy (*)) -> dx (*)``: ``dy`` itself; None when ``input_grad`` is False.
        """
        return x, (lambda dy: dy if input_grad else None)
