"""Weight initialization: ``torch.nn.init``'s functions, names, argument names and formulas.

Every function works **in place** on a :class:`linearkit.Parameter` (it writes into
``p.data[...]``) or on a floating-point ``numpy.ndarray``, and returns what it was given, so
``init.zeros_(layer.bias)`` and ``w = init.normal_(np.empty((3, 4), np.float32))`` both work.
The array keeps its dtype (a float32 weight stays float32; values are drawn in float64 and
rounded once into it). The uniform and normal fills draw a block at a time
(``core.random.fill_uniform``): the same values as one whole draw, with only a small float64
block held beside the array. ``trunc_normal_`` holds its float64 draws whole (its rejection
sampling sizes each round by what is left), ``orthogonal_`` a float64 matrix and its QR
factors, ``sparse_`` a row permutation per column. Random functions take a keyword ``rng=``: a ``numpy.random.Generator`` (or an int seed);
when omitted they draw from the library's generator (``linearkit.manual_seed``). The global
``np.random`` state is never used. Same generator state, same values.

Fans follow PyTorch (:func:`fan_in_and_fan_out`): for a weight of shape
``(out, in, *kernel)``, ``fan_in = in * prod(kernel)`` and ``fan_out = out * prod(kernel)``.

PyTorch's names are kept one for one: :func:`calculate_gain`, :func:`uniform_`,
:func:`normal_`, :func:`trunc_normal_`, :func:`constant_`, :func:`zeros_`, :func:`ones_`,
:func:`eye_`, :func:`xavier_uniform_`, :func:`xavier_normal_`, :func:`kaiming_uniform_`,
:func:`kaiming_normal_`, :func:`orthogonal_`, :func:`sparse_`. PyTorch's private
``_calculate_fan_in_and_fan_out`` is public here as :func:`fan_in_and_fan_out`.

Linear's default init
---------------------
``Linear(in_features, out_features)`` draws weight **and** bias from
``U(-1/sqrt(in_features), 1/sqrt(in_features))`` — the bias is *not* zeros, and the bound is
not ``sqrt(6/fan_in)`` (an article claims both; PyTorch does neither). PyTorch writes the weight
part as ``kaiming_uniform_(weight, a=sqrt(5))``: the gain ``sqrt(2/(1+5)) = sqrt(1/3)`` times
``sqrt(3/fan_in)`` is ``1/sqrt(fan_in)``. To re-initialize a model, use the PyTorch pattern::

    def init_weights(m):
        if isinstance(m, linearkit.Linear):
            linearkit.init.xavier_uniform_(m.weight)
            linearkit.init.zeros_(m.bias)

    model.apply(init_weights)
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from .core.module import Parameter
from .core.random import fill_normal, fill_uniform, resolve

__all__ = [
    "calculate_gain", "constant_", "eye_", "fan_in_and_fan_out", "kaiming_normal_",
    "kaiming_uniform_", "normal_", "ones_", "orthogonal_", "sparse_", "trunc_normal_",
    "uniform_", "xavier_normal_", "xavier_uniform_", "zeros_",
]

T = TypeVar("T", Parameter, np.ndarray)
if TYPE_CHECKING:   # annotations only: evaluating it would import numpy.random (slow to import)
    RNG = np.random.Generator | int | None  # an int is a seed for a fresh Generator

_LINEAR_FNS = ("linear", "conv1d", "conv2d", "conv3d",
               "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
_NONLINEARITIES = _LINEAR_FNS + ("sigmoid", "tanh", "relu", "leaky_relu", "selu")
_MODES = ("fan_in", "fan_out")


# ---------------------------------------------------------------------------- helpers
def _array(tensor, *, random: bool = True) -> np.ndarray:
    """The ndarray to write into: ``tensor.data`` for a Parameter, ``tensor`` for an ndarray."""
    data = tensor.data if isinstance(tensor, Parameter) else tensor
    if not isinstance(data, np.ndarray):
        raise TypeError(
            f"init functions take a linearkit.Parameter or a numpy.ndarray, got "
            f"{type(tensor).__name__}; for a new array, pass np.empty(shape, np.float32)")
    if random and data.dtype.kind != "f":
        raise TypeError(
            f"random init needs a floating-point array, got dtype {data.dtype}; "
            "cast it first, e.g. np.empty(shape, np.float32)")
    return data


def _shape_of(array_or_shape) -> tuple[int, ...]:
    if isinstance(array_or_shape, Parameter):
        return array_or_shape.shape
    if hasattr(array_or_shape, "shape"):  # ndarray, torch tensor, ...
        return tuple(int(s) for s in array_or_shape.shape)
    if isinstance(array_or_shape, (numbers.Integral, np.integer)):
        return (int(array_or_shape),)
    try:
        return tuple(int(s) for s in array_or_shape)
    except TypeError:
        raise TypeError(
            f"expected an array, a Parameter or a shape tuple, got "
            f"{type(array_or_shape).__name__}") from None


def _no_op_if_empty(data: np.ndarray) -> bool:
    """Warn (as PyTorch does) and report True when there is nothing to initialize."""
    if data.size == 0:
        warnings.warn("Initializing zero-element arrays is a no-op", stacklevel=3)
        return True
    return False


def _correct_fan(data: np.ndarray, mode: str) -> int:
    mode = mode.lower() if isinstance(mode, str) else mode
    if mode not in _MODES:
        raise ValueError(f"Mode {mode} not supported, please use one of {list(_MODES)}")
    fan_in, fan_out = fan_in_and_fan_out(data)
    return fan_in if mode == "fan_in" else fan_out


def _require_2d(data: np.ndarray, name: str) -> None:
    if data.ndim != 2:
        raise ValueError(
            f"{name} supports only 2-D arrays (out_features, in_features), got an array of "
            f"shape {data.shape} ({data.ndim}-D)")


# ---------------------------------------------------------------------------- gains and fans
def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The recommended gain for a nonlinearity (PyTorch's table).

    ============================  =====================================
    nonlinearity                  gain
    ============================  =====================================
    linear, conv{1,2,3}d,         1
    conv_transpose{1,2,3}d
    sigmoid                       1
    tanh                          5/3
    relu                          sqrt(2)
    leaky_relu                    sqrt(2 / (1 + negative_slope**2))
    selu                          3/4
    ============================  =====================================

    Parameters
    ----------
    nonlinearity : str
        One of the names above.
    param : float, optional
        ``negative_slope`` for ``leaky_relu`` (default 0.01); ignored otherwise.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        For an unknown name, or a ``param`` that is not a real number (bools are refused).

    Examples
    --------
    >>> from linearkit import init
    >>> init.calculate_gain("tanh")
    1.6666666666666667
    >>> round(init.calculate_gain("leaky_relu", 0.2), 6)
    1.38675
    """
    if nonlinearity in _LINEAR_FNS or nonlinearity == "sigmoid":
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            negative_slope = 0.01
        elif isinstance(param, numbers.Real) and not isinstance(param, (bool, np.bool_)):
            negative_slope = float(param)
        else:
            raise ValueError(f"negative_slope {param!r} not a valid number; pass an int or a float")
        return math.sqrt(2.0 / (1 + negative_slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(
        f"Unsupported nonlinearity {nonlinearity!r}; use one of {list(_NONLINEARITIES)}")


def fan_in_and_fan_out(array_or_shape) -> tuple[int, int]:
    """``(fan_in, fan_out)`` of a weight, as PyTorch's ``_calculate_fan_in_and_fan_out``.

    For shape ``(out, in, *kernel)``: ``fan_in = in * prod(kernel)``,
    ``fan_out = out * prod(kernel)``; for a Linear weight ``(out_features, in_features)`` that is
    ``(in_features, out_features)``.

    Parameters
    ----------
    array_or_shape : ndarray, Parameter, anything with ``.shape``, or a shape tuple
        At least 2-D.

    Returns
    -------
    (int, int)

    Raises
    ------
    ValueError
        For fewer than 2 dimensions (a bias has no fan_out).

    Examples
    --------
    >>> from linearkit import init
    >>> init.fan_in_and_fan_out((10, 3))
    (3, 10)
    >>> init.fan_in_and_fan_out((16, 8, 3, 3))
    (72, 144)
    """
    shape = _shape_of(array_or_shape)
    if len(shape) < 2:
        raise ValueError(
            f"Fan in and fan out can not be computed for an array with fewer than 2 dimensions "
            f"(got shape {shape}); they need a weight of shape (out, in, *kernel)")
    receptive_field = math.prod(shape[2:])
    return shape[1] * receptive_field, shape[0] * receptive_field


# ---------------------------------------------------------------------------- plain fills
def uniform_(tensor: T, a: float = 0.0, b: float = 1.0, *, rng: RNG = None) -> T:
    """Fill with draws from ``U(a, b)`` (half-open ``[a, b)``, as ``torch.nn.init.uniform_``).

    Parameters
    ----------
    tensor : Parameter or float ndarray
        Filled in place.
    a, b : float
        Lower and upper bound, ``a <= b``.
    rng : numpy.random.Generator or int, optional
        Defaults to the library's generator.

    Returns
    -------
    The ``tensor`` passed in.
    """
    data = _array(tensor)
    if not a <= b:
        raise ValueError(f"uniform_ expects a <= b (the range [a, b)), got a={a} > b={b}")
    fill_uniform(data, a, b, resolve(rng))
    return tensor


def normal_(tensor: T, mean: float = 0.0, std: float = 1.0, *, rng: RNG = None) -> T:
    """Fill with draws from ``N(mean, std**2)``.

    Parameters
    ----------
    tensor : Parameter or float ndarray
        Filled in place.
    mean, std : float
        ``std >= 0``.
    rng : numpy.random.Generator or int, optional
        Defaults to the library's generator.

    Returns
    -------
    The ``tensor`` passed in.
    """
    data = _array(tensor)
    if not std >= 0:
        raise ValueError(f"normal_ expects std >= 0.0, got std={std}")
    fill_normal(data, mean, std, resolve(rng))
    return tensor


def constant_(tensor: T, val: float) -> T:
    """Fill with the value ``val``."""
    _array(tensor, random=False)[...] = val
    return tensor


def zeros_(tensor: T) -> T:
    """Fill with 0."""
    return constant_(tensor, 0)


def ones_(tensor: T) -> T:
    """Fill with 1."""
    return constant_(tensor, 1)


def eye_(tensor: T) -> T:
    """Fill a 2-D array with the identity: ones on the main diagonal, zeros elsewhere.

    Non-square arrays get ``min(rows, cols)`` ones, as ``torch.eye(rows, cols)``. A Linear with
    an identity weight (and zero bias) passes its input through unchanged.

    Raises
    ------
    ValueError
        If the array is not 2-D.
    """
    data = _array(tensor, random=False)
    _require_2d(data, "eye_")
    data[...] = 0
    k = min(data.shape)
    data[np.arange(k), np.arange(k)] = 1
    return tensor


# ---------------------------------------------------------------------------- truncated normal
def _standard_normal_mass(lo: float, hi: float) -> float:
    """P(lo <= Z <= hi) for Z ~ N(0, 1), without cancellation in the tails."""
    if lo >= 0:
        return 0.5 * (math.erfc(lo / math.sqrt(2)) - math.erfc(hi / math.sqrt(2)))
    return 0.5 * (math.erf(hi / math.sqrt(2)) - math.erf(lo / math.sqrt(2)))


def _truncated_standard_normal(lo: float, hi: float, n: int,
                               rng: np.random.Generator) -> np.ndarray:
    """``n`` exact draws of Z ~ N(0, 1) conditioned on ``lo <= Z <= hi`` (``lo < hi``).

    Rejection sampling with the best of three proposals (Robert, 1995): the normal itself when
    the interval holds enough mass, a uniform on a narrow interval, a shifted exponential in a
    far tail. Every branch accepts at least ~30% of its proposals.
    """
    if hi <= 0:  # mirror into the right half
        return -_truncated_standard_normal(-hi, -lo, n, rng)
    if lo >= 0 and hi * hi - lo * lo <= 2.0:
        method, rate = "uniform", math.exp(-1.0)
    elif lo < 0.5 and _standard_normal_mass(lo, hi) >= 0.2:
        method, rate = "normal", _standard_normal_mass(lo, hi)
    elif lo < 0:  # narrow interval around 0: density nearly flat
        method, rate = "uniform", 0.5
    else:
        method, rate = "exponential", 0.3
    lam = (lo + math.sqrt(lo * lo + 4.0)) / 2.0
    out = np.empty(n)
    filled = 0
    while filled < n:
        m = int((n - filled) / rate * 1.2) + 16
        if method == "normal":
            z = rng.standard_normal(m)
            keep = (z >= lo) & (z <= hi)
        elif method == "uniform":
            z = rng.uniform(lo, hi, m)
            top = lo * lo if lo >= 0 else 0.0  # -(closest point to 0)^2
            keep = rng.random(m) <= np.exp((top - z * z) / 2.0)
        else:
            z = lo + rng.exponential(1.0 / lam, m)
            keep = (rng.random(m) <= np.exp(-((z - lam) ** 2) / 2.0)) & (z <= hi)
        z = z[keep][: n - filled]
        out[filled:filled + z.size] = z
        filled += z.size
    return out


def trunc_normal_(tensor: T, mean: float = 0.0, std: float = 1.0, a: float = -2.0,
                  b: float = 2.0, *, rng: RNG = None) -> T:
    """Fill with draws from ``N(mean, std**2)`` truncated to ``[a, b]``.

    ``a`` and ``b`` are absolute bounds, not multiples of ``std`` (as in PyTorch): with the
    defaults and ``std=0.02`` nothing is truncated in practice.

    The draws are exact for every interval, including ones far in a tail (rejection sampling
    with a normal, uniform or exponential proposal). PyTorch inverts the CDF in float32 and
    warns that its values "may be incorrect" when ``mean`` is more than 2 std outside
    ``[a, b]``; here no warning is needed.

    Parameters
    ----------
    tensor : Parameter or float ndarray
        Filled in place.
    mean, std : float
        Of the normal before truncation, ``std > 0``.
    a, b : float
        The interval, ``a <= b`` (``-inf``/``inf`` allowed).
    rng : numpy.random.Generator or int, optional
        Defaults to the library's generator.

    Returns
    -------
    The ``tensor`` passed in.
    """
    data = _array(tensor)
    if not std > 0:
        raise ValueError(f"trunc_normal_ expects std > 0, got std={std}")
    if not a <= b:
        raise ValueError(f"trunc_normal_ expects a <= b (the interval [a, b]), got a={a} > b={b}")
    if a == b:
        data[...] = a
        return tensor
    lo, hi = (a - mean) / std, (b - mean) / std
    z = _truncated_standard_normal(lo, hi, data.size, resolve(rng))
    z *= std  # in place: the values of mean + std * z, without two more float64 arrays
    z += mean
    data[...] = z.reshape(data.shape)
    np.clip(data, a, b, out=data)  # the cast to float32 may round one ulp past a bound
    return tensor


# ---------------------------------------------------------------------------- Xavier / Kaiming
def xavier_uniform_(tensor: T, gain: float = 1.0, *, rng: RNG = None) -> T:
    """Glorot & Bengio (2010), uniform: ``U(-bound, bound)``.

    ``bound = gain * sqrt(6 / (fan_in + fan_out))``, i.e. ``std = gain * sqrt(2 / (fan_in +
    fan_out))``. Fans from :func:`fan_in_and_fan_out`; a zero-element array is left alone with a
    warning.

    Parameters
    ----------
    tensor : Parameter or float ndarray, at least 2-D
        Filled in place.
    gain : float
        Scale, e.g. ``calculate_gain("tanh")``.
    rng : numpy.random.Generator or int, optional
        Defaults to the library's generator.

    Returns
    -------
    The ``tensor`` passed in.
    """
    data = _array(tensor)
    fan_in, fan_out = fan_in_and_fan_out(data)
    if _no_op_if_empty(data):
        return tensor
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    fill_uniform(data, -bound, bound, resolve(rng))
    return tensor


def xavier_normal_(tensor: T, gain: float = 1.0, *, rng: RNG = None) -> T:
    """Glorot & Bengio (2010), normal: ``N(0, std**2)``.

    ``std = gain * sqrt(2 / (fan_in + fan_out))``. Parameters and return as
    :func:`xavier_uniform_`.
    """
    data = _array(tensor)
    fan_in, fan_out = fan_in_and_fan_out(data)
    if _no_op_if_empty(data):
        return tensor
    std = gain * math.sqrt(2.0 / (fan_in + fan_out))
    fill_normal(data, 0.0, std, resolve(rng))
    return tensor


def kaiming_uniform_(tensor: T, a: float = 0, mode: str = "fan_in",
                     nonlinearity: str = "leaky_relu", *, rng: RNG = None) -> T:
    """He et al. (2015), uniform: ``U(-bound, bound)``.

    ``bound = gain * sqrt(3 / fan)``, with ``gain = calculate_gain(nonlinearity, a)`` and
    ``fan`` = fan_in or fan_out per ``mode``; i.e. ``std = gain / sqrt(fan)``. With
    ``a=sqrt(5)`` (and the default ``leaky_relu``) the bound is ``1/sqrt(fan_in)``: Linear's
    default weight init.

    Parameters
    ----------
    tensor : Parameter or float ndarray, at least 2-D
        Filled in place; a zero-element array is left alone with a warning.
    a : float
        Negative slope of the leaky_relu that follows (used only for ``leaky_relu``).
    mode : {"fan_in", "fan_out"}
        ``fan_in`` keeps the forward activations' variance, ``fan_out`` the backward gradients'.
    nonlinearity : str
        A name :func:`calculate_gain` knows; ``"relu"`` or ``"leaky_relu"`` recommended.
    rng : numpy.random.Generator or int, optional
        Defaults to the library's generator.

    Returns
    -------
    The ``tensor`` passed in.

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> w = lk.init.kaiming_uniform_(np.empty((4, 9), np.float32), a=5 ** 0.5, rng=0)
    >>> bool(np.abs(w).max() <= 1 / 3), w.dtype
    (True, dtype('float32'))
    """
    data = _array(tensor)
    fan = _correct_fan(data, mode)
    gain = calculate_gain(nonlinearity, a)
    if _no_op_if_empty(data):
        return tensor
    bound = math.sqrt(3.0) * gain / math.sqrt(fan)
    fill_uniform(data, -bound, bound, resolve(rng))
    return tensor


def kaiming_normal_(tensor: T, a: float = 0, mode: str = "fan_in",
                    nonlinearity: str = "leaky_relu", *, rng: RNG = None) -> T:
    """He et al. (2015), normal: ``N(0, std**2)``, ``std = gain / sqrt(fan)``.

    ``gain = calculate_gain(nonlinearity, a)``; ``fan`` per ``mode``. Parameters and return as
    :func:`kaiming_uniform_`.
    """
    data = _array(tensor)
    fan = _correct_fan(data, mode)
    gain = calculate_gain(nonlinearity, a)
    if _no_op_if_empty(data):
        return tensor
    std = gain / math.sqrt(fan)
    fill_normal(data, 0.0, std, resolve(rng))
    return tensor


# ---------------------------------------------------------------------------- structured
def orthogonal_(tensor: T, gain: float = 1.0, *, rng: RNG = None) -> T:
    """A (semi-)orthogonal matrix, Saxe et al. (2013), times ``gain``.

    The array is viewed as ``(rows, cols) = (shape[0], size // shape[0])``. A Gaussian matrix's
    QR decomposition gives Q; multiplying Q's columns by ``sign(diag(R))`` makes it uniformly
    (Haar) distributed. Then ``W.T @ W = gain**2 * I`` when ``rows >= cols`` and
    ``W @ W.T = gain**2 * I`` otherwise. A zero-element array is left alone.

    Parameters
    ----------
    tensor : Parameter or float ndarray, at least 2-D
        Filled in place.
    gain : float
        Scale.
    rng : numpy.random.Generator or int, optional
        Defaults to the library's generator.

    Returns
    -------
    The ``tensor`` passed in.
    """
    data = _array(tensor)
    if data.ndim < 2:
        raise ValueError(
            f"orthogonal_ supports only arrays with 2 or more dimensions, got shape {data.shape}")
    if data.size == 0:
        return tensor
    rows = data.shape[0]
    cols = data.size // rows
    flat = resolve(rng).standard_normal((rows, cols))
    if rows < cols:
        flat = flat.T
    q, r = np.linalg.qr(flat)
    q *= np.where(np.diagonal(r) < 0, -1.0, 1.0)  # sign(0) taken as +1: no zeroed column
    if rows < cols:
        q = q.T
    data[...] = (gain * q).reshape(data.shape)
    return tensor


def sparse_(tensor: T, sparsity: float, std: float = 0.01, *, rng: RNG = None) -> T:
    """A 2-D array from ``N(0, std**2)`` with a fraction ``sparsity`` of each column set to 0.

    Martens (2010). In every column, ``ceil(sparsity * rows)`` entries chosen at random are
    zeroed; the rest are normal draws.

    The result is still a **dense** ndarray: the zeros are stored like any other value, so no
    memory or compute is saved (an article says otherwise; it is wrong), and training will make
    the zeros nonzero unless you mask the gradient yourself.

    Parameters
    ----------
    tensor : Parameter or float ndarray, 2-D
        Filled in place.
    sparsity : float in [0, 1]
        Fraction of each column set to zero.
    std : float
        Of the nonzero entries, ``std >= 0``.
    rng : numpy.random.Generator or int, optional
        Defaults to the library's generator.

    Returns
    -------
    The ``tensor`` passed in.
    """
    data = _array(tensor)
    _require_2d(data, "sparse_")
    if not 0 <= sparsity <= 1:
        raise ValueError(f"sparse_ expects sparsity in [0, 1], got {sparsity}")
    if not std >= 0:
        raise ValueError(f"sparse_ expects std >= 0.0, got std={std}")
    rng = resolve(rng)
    rows, cols = data.shape
    num_zeros = math.ceil(sparsity * rows)
    fill_normal(data, 0.0, std, rng)
    if num_zeros and cols:
        # an independent random permutation of the rows per column; its first num_zeros go to 0
        order = rng.permuted(np.broadcast_to(np.arange(rows)[:, None], (rows, cols)), axis=0)
        data[order[:num_zeros], np.arange(cols)] = 0
    return tensor
