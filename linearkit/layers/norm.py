"""LayerNorm, RMSNorm and BatchNorm1d, with PyTorch's semantics (statistics, running buffers,
repr)."""

from __future__ import annotations

import contextlib
import math
import numbers

import numpy as np

from .. import functional as F
from .. import precision as P
from ..core.allocation import filled
from ..core.module import Module, Parameter
from ..errors import ShapeError
from ._checks import as_input, feature_count, float_dtype

__all__ = ["BatchNorm1d", "LayerNorm", "RMSNorm", "check_batch_norm_input",
           "check_trailing_shape", "running_stats_frozen"]

_frozen = 0  # > 0: BatchNorm1d updates no running statistics (see running_stats_frozen)


@contextlib.contextmanager
def running_stats_frozen():
    """Inside, BatchNorm1d in training still normalizes with the batch's statistics but neither
    updates its running statistics nor counts ``num_batches_tracked``: a checkpoint's recompute
    (``linearkit.training.checkpointing``) runs a batch the forward already counted."""
    global _frozen
    _frozen += 1
    try:
        yield
    finally:
        _frozen -= 1


def _ones_zeros(module: Module) -> None:
    """The affine parameters' init: weight <- ones, bias <- zeros (in place; None is skipped)."""
    for p, value in ((module.weight, 1), (module.bias, 0)):
        if p is not None:
            p.data[...] = value


def _compute_params(module: Module) -> tuple:
    """``(weight, bias)`` arrays in the compute dtype (float32 copies of 16-bit ones) or None."""
    return tuple(None if p is None else P.compute_array(p.data)
                 for p in (module.weight, module.bias))


def _backward(grads, w: Parameter | None, b: Parameter | None, input_grad: bool):
    """The vjp closure: ``grads(dy, w_data, need_dx, need_dw, need_db) -> (dx, dw, db)``, then
    dw and db are added into ``.grad`` (``Parameter.add_grad``); returns dx (None if not wanted).

    Which parameters get a gradient is fixed here, when the forward runs (as autograd records
    it): freezing a weight between ``vjp`` and ``backward`` does not change this backward; so is
    the dtype a 16-bit parameter's gradient is stored in (``precision.grad_dtype``). ``grads``
    gets the weight in its compute dtype (float32 for 16-bit storage) and returns float32
    gradients for it.
    """
    need_dw = w is not None and w.requires_grad
    need_db = b is not None and b.requires_grad
    gw = P.grad_dtype(w.data.dtype) if need_dw and w.data.itemsize == 2 else None
    gb = P.grad_dtype(b.data.dtype) if need_db and b.data.itemsize == 2 else None

    def backward(dy: np.ndarray):
        dx, dw, db = grads(dy, None if w is None else P.compute_array(w.data), input_grad,
                           need_dw, need_db)
        if need_dw:
            w.add_grad(dw, dtype=gw)
        if need_db:
            b.add_grad(db, dtype=gb)
        return dx

    return backward


def check_trailing_shape(module, shape: tuple) -> None:
    """LayerNorm's and RMSNorm's input rule, on a shape alone: ``shape`` must end with the
    module's ``normalized_shape``, else a ShapeError naming the module (and, when the size is
    elsewhere in ``shape``, which dim to move last)."""
    norm = module.normalized_shape
    shape, k = tuple(shape), len(norm)
    if len(shape) < k or shape[len(shape) - k:] != norm:
        dims = ", ".join(map(str, norm))
        hint = None
        if k == 1 and norm[0] in shape:
            axis = shape.index(norm[0])
            hint = (f"{type(module).__name__} normalizes the last dimension; the size "
                    f"{norm[0]} is at dim {axis}: move it last with np.moveaxis(x, {axis}, -1)")
        raise ShapeError(f"expected input of shape (*, {dims}), got {shape}", module=module,
                         hint=hint)


def check_batch_norm_input(module, shape: tuple) -> bool:
    """BatchNorm1d's input rules, on a shape alone (the layer and the ledger share them).

    Raises ShapeError unless ``shape`` is ``(N, C)`` or ``(N, C, L)`` and, when batch statistics
    are used, holds more than one value per channel. Returns whether batch statistics are used
    (training mode, or no running statistics).
    """
    c = module.num_features
    if len(shape) not in (2, 3) or shape[1] != c:
        hint = None
        if len(shape) == 1 and shape[0] == c:
            hint = "a single sample: add a batch dimension with x[None]"
        elif len(shape) == 3 and shape[2] == c:
            hint = "channels go in dim 1: x.transpose(0, 2, 1) turns (N, L, C) into (N, C, L)"
        raise ShapeError(f"expected input of shape (N, {c}) or (N, {c}, L), got {tuple(shape)}",
                         module=module, hint=hint)
    batch_stats = (module.training or module.running_mean is None
                   or module.running_var is None)
    if batch_stats and math.prod(shape) // max(c, 1) == 1:
        raise ShapeError(f"Expected more than 1 value per channel when training, got input "
                         f"of shape {tuple(shape)}", module=module,
                         hint="use a batch of at least 2 samples, or call .eval() first "
                              "to normalize with the running statistics")
    return batch_stats


class LayerNorm(Module):
    """Normalize over the trailing ``normalized_shape`` dims: ``(x - E[x]) / sqrt(Var[x] + eps)``.

    Parameters
    ----------
    normalized_shape : int or tuple of ints
        The trailing dimensions to normalize over (an int means a tuple of one).
    eps : float
        Added to the variance for stability (default 1e-5).
    elementwise_affine : bool
        Learn a per-element ``weight`` (and ``bias``) applied after normalizing (default True).
    bias : bool
        Learn the ``bias`` too (default True; ignored when ``elementwise_affine=False``).
    dtype : float32 (default), float64, or float16 / bfloat16 storage (computes in float32:
        float32 inputs and outputs; ``linearkit.precision``).

    Shape
    -----
    x ``(*, *normalized_shape)`` -> y of the same shape. ``*`` may be empty or hold a 0.
    The variance is biased (divides by the number of normalized elements), as in PyTorch.

    Attributes
    ----------
    weight : Parameter ``normalized_shape`` or None, initialized to ones.
    bias : Parameter ``normalized_shape`` or None, initialized to zeros.

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> ln = lk.LayerNorm(4)
    >>> ln
    LayerNorm((4,), eps=1e-05, elementwise_affine=True, bias=True)
    >>> ln(np.arange(8, dtype=np.float32).reshape(2, 4)).mean(axis=-1)
    array([0., 0.], dtype=float32)
    """

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, *, dtype=np.float32):
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(feature_count("normalized_shape", d)
                                      for d in normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.dtype = float_dtype(dtype)
        shape = self.normalized_shape
        self.register_parameter("weight", Parameter(filled(self, "weight", shape, self.dtype, 1))
                                if elementwise_affine else None)
        self.register_parameter("bias", Parameter(filled(self, "bias", shape, self.dtype, 0))
                                if elementwise_affine and bias else None)

    def reset_parameters(self) -> None:
        """weight <- ones, bias <- zeros."""
        _ones_zeros(self)

    def check_input_shape(self, shape: tuple) -> None:
        """Raise the ShapeError ``forward`` would raise for an input of ``shape`` (no data)."""
        check_trailing_shape(self, shape)

    def _input(self, x) -> np.ndarray:
        x = P.compute_array(as_input(self, x, self.dtype))  # 16-bit storage: float32 compute
        self.check_input_shape(x.shape)
        return x

    def _params(self):
        return _compute_params(self)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """``(*, *normalized_shape) -> (*, *normalized_shape)``."""
        return F.layer_norm(self._input(x), self.normalized_shape, *self._params(), self.eps)

    def vjp(self, x: np.ndarray, input_grad: bool = True):
        """Forward plus ``backward(dy) -> dx``; adds dweight and dbias into ``.grad``."""
        x = self._input(x)
        y, xhat, rstd = F.layer_norm_forward(x, self.normalized_shape, *self._params(), self.eps)
        shape = self.normalized_shape
        xhat = P.saved_activation(xhat)  # kept in 16 bits under policy(activations=...)
        return y, _backward(lambda dy, w, *need: F.layer_norm_backward(
                                dy, P.compute_array(xhat), rstd, shape, w, *need),
                            self.weight, self.bias, input_grad)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}, bias={self.bias is not None}")


class RMSNorm(Module):
    """Root-mean-square normalization over the trailing ``normalized_shape`` dims:
    ``y = x / sqrt(mean(x²) + eps) * weight``, as ``torch.nn.RMSNorm`` (no mean is subtracted,
    no bias).

    Parameters
    ----------
    normalized_shape : int or tuple of ints
        The trailing dimensions to normalize over (an int means a tuple of one).
    eps : float or None
        Added to the mean square for stability. None (the default) is the machine epsilon of
        the compute dtype, as in PyTorch: ``np.finfo(np.float32).eps`` for float32 and 16-bit
        storage, ``np.finfo(np.float64).eps`` for float64.
    elementwise_affine : bool
        Learn a per-element ``weight`` applied after normalizing (default True).
    dtype : float32 (default), float64, or float16 / bfloat16 storage (computes in float32:
        float32 inputs and outputs; ``linearkit.precision``).

    Shape
    -----
    x ``(*, *normalized_shape)`` -> y of the same shape. ``*`` may be empty or hold a 0. The
    mean square is accumulated in float64 (a float32 one would overflow for ``|x|`` beyond
    ~1.8e19, where PyTorch's float32 RMSNorm returns zeros).

    Attributes
    ----------
    weight : Parameter ``normalized_shape`` or None, initialized to ones.

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> norm = lk.RMSNorm(4)
    >>> norm
    RMSNorm((4,), eps=None, elementwise_affine=True)
    >>> y = norm(np.array([[1., -1., 1., -1.], [2., 0., 0., 0.]], np.float32))
    >>> np.sqrt((y ** 2).mean(axis=-1)).round(6)
    array([1., 1.], dtype=float32)
    """

    def __init__(self, normalized_shape, eps: float | None = None,
                 elementwise_affine: bool = True, *, dtype=np.float32):
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(feature_count("normalized_shape", d)
                                      for d in normalized_shape)
        if eps is not None and (isinstance(eps, bool) or not isinstance(eps, numbers.Real)):
            raise TypeError(f"RMSNorm: eps must be a float or None (the compute dtype's machine "
                            f"epsilon), got {eps!r} ({type(eps).__name__})")
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.dtype = float_dtype(dtype)
        self.register_parameter("weight", Parameter(
            filled(self, "weight", self.normalized_shape, self.dtype, 1))
            if elementwise_affine else None)

    def reset_parameters(self) -> None:
        """weight <- ones."""
        if self.weight is not None:
            self.weight.data[...] = 1

    def check_input_shape(self, shape: tuple) -> None:
        """Raise the ShapeError ``forward`` would raise for an input of ``shape`` (no data)."""
        check_trailing_shape(self, shape)

    def _input(self, x) -> np.ndarray:
        x = P.compute_array(as_input(self, x, self.dtype))  # 16-bit storage: float32 compute
        self.check_input_shape(x.shape)
        return x

    def _weight(self):
        return None if self.weight is None else P.compute_array(self.weight.data)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """``(*, *normalized_shape) -> (*, *normalized_shape)``."""
        return F.rms_norm(self._input(x), self.normalized_shape, self._weight(), self.eps)

    def vjp(self, x: np.ndarray, input_grad: bool = True):
        """Forward plus ``backward(dy) -> dx``; adds dweight into ``.grad``."""
        x = self._input(x)
        y, xhat, rstd = F.rms_norm_forward(x, self.normalized_shape, self._weight(), self.eps)
        shape = self.normalized_shape
        xhat = P.saved_activation(xhat)  # kept in 16 bits under policy(activations=...)

        def grads(dy, w, need_dx, need_dw, need_db):
            dx, dw = F.rms_norm_backward(dy, P.compute_array(xhat), rstd, shape, w, need_dx,
                                         need_dw)
            return dx, dw, None

        return y, _backward(grads, self.weight, None, input_grad)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


class BatchNorm1d(Module):
    """Normalize each channel over the batch (and length), as ``torch.nn.BatchNorm1d``.

    Parameters
    ----------
    num_features : int
        ``C``, the number of channels (dim 1 of the input).
    eps : float
        Added to the variance for stability (default 1e-5).
    momentum : float or None
        Weight of the new batch in the running statistics (default 0.1);
        None means a cumulative average, ``1 / num_batches_tracked``.
    affine : bool
        Learn a per-channel ``weight`` and ``bias`` (default True).
    track_running_stats : bool
        Keep running statistics and use them in eval mode (default True). When False, batch
        statistics are used in both modes and the buffers are None.
    bias : bool, keyword-only
        Learn the ``bias`` too (default True; ignored when ``affine=False``), as PyTorch 2.13.
    dtype : float32 (default), float64, or float16 / bfloat16 storage (computes in float32;
        the running statistics are stored in it too, as PyTorch's ``.to`` leaves them).

    Shape
    -----
    x ``(N, C)`` or ``(N, C, L)`` -> y of the same shape. Training needs more than one value
    per channel (``N * L > 1``); an empty batch gives an empty output.

    Attributes
    ----------
    weight, bias : Parameter ``(C,)`` or None, initialized to ones and zeros.
    running_mean, running_var : buffer ``(C,)`` or None, initialized to zeros and ones; updated in
        training as ``(1 - momentum) * running + momentum * batch`` with the *unbiased* batch
        variance (the normalization itself uses the biased one).
    num_batches_tracked : buffer, 0-d int64: training forward calls so far.

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> bn = lk.BatchNorm1d(3)
    >>> y = bn(np.arange(12, dtype=np.float32).reshape(4, 3))
    >>> bn.running_mean.round(3), int(bn.num_batches_tracked)
    (array([0.45, 0.55, 0.65], dtype=float32), 1)
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True, *, bias: bool = True,
                 dtype=np.float32):
        super().__init__()
        self.num_features = c = feature_count("num_features", num_features)
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        self.dtype = float_dtype(dtype)
        self.register_parameter("weight", Parameter(filled(self, "weight", c, self.dtype, 1))
                                if affine else None)
        self.register_parameter("bias", Parameter(filled(self, "bias", c, self.dtype, 0))
                                if affine and bias else None)
        tracked = track_running_stats
        self.register_buffer("running_mean", filled(self, "running_mean", c, self.dtype, 0)
                             if tracked else None)
        self.register_buffer("running_var", filled(self, "running_var", c, self.dtype, 1)
                             if tracked else None)
        self.register_buffer("num_batches_tracked", np.array(0, np.int64) if tracked else None)

    def reset_running_stats(self) -> None:
        """running_mean <- 0, running_var <- 1, num_batches_tracked <- 0 (in place)."""
        if self.track_running_stats:
            self.running_mean[...] = 0
            self.running_var[...] = 1
            self.num_batches_tracked[...] = 0

    def reset_parameters(self) -> None:
        """Reset the running statistics, then weight <- ones, bias <- zeros."""
        self.reset_running_stats()
        _ones_zeros(self)

    def _prepare(self, x):
        """Check x, bump num_batches_tracked in training; -> (x, F.batch_norm's arguments)."""
        x = P.compute_array(as_input(self, x, self.dtype))  # 16-bit storage: float32 compute
        batch_stats = check_batch_norm_input(self, x.shape)
        running = self.running_mean, self.running_var
        factor = 0.0
        if self.training and self.track_running_stats and _frozen:
            running = None, None  # batch statistics, nothing updated: running_stats_frozen()
        elif self.training and self.track_running_stats:
            self.num_batches_tracked += 1
            factor = (1.0 / int(self.num_batches_tracked) if self.momentum is None
                      else self.momentum)
        # 16-bit running statistics (after model.to(...)): F works on float32 copies, and
        # _write_back rounds the updated values into the buffers
        running = tuple(None if r is None else P.compute_array(r) for r in running)
        return x, (*running, *_compute_params(self), batch_stats, factor, self.eps)

    def _write_back(self, args) -> None:
        """Round the float32 copies of 16-bit running statistics (``args[:2]``) into them."""
        for stored, value in zip((self.running_mean, self.running_var), args[:2]):
            if value is not None and value is not stored:
                stored[...] = value

    def forward(self, x: np.ndarray) -> np.ndarray:
        """``(N, C[, L]) -> (N, C[, L])``; in training also updates the running statistics."""
        x, args = self._prepare(x)
        y = F.batch_norm(x, *args)
        self._write_back(args)
        return y

    def vjp(self, x: np.ndarray, input_grad: bool = True):
        """Forward plus ``backward(dy) -> dx``; adds dweight and dbias into ``.grad``.

        In training (or without running statistics) the gradient flows through the batch mean
        and variance; in eval mode the running statistics are constants.
        """
        x, args = self._prepare(x)
        y, xhat, rstd = F.batch_norm_forward(x, *args)
        self._write_back(args)
        batch_stats = args[4]
        xhat = P.saved_activation(xhat)  # kept in 16 bits under policy(activations=...)
        return y, _backward(lambda dy, w, *need: F.batch_norm_backward(
                                dy, P.compute_array(xhat), rstd, w, batch_stats, *need),
                            self.weight, self.bias, input_grad)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, bias={self.bias is not None}, "
                f"track_running_stats={self.track_running_stats}")
