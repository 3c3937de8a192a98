"""``verify``: run a model and a reference on the same known input and report how far apart they are.

Shapes cannot tell a weight loaded in the wrong layout when the layer is square; a forward pass
on a known input can. ``verify`` is that check, with torch.testing's default tolerances.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from .. import precision
from ..core.module import Module
from ..rules import first_input

__all__ = ["VerifyReport", "verify"]

# torch.testing.assert_close's defaults (rtol, atol) per dtype; bfloat16's are added by name
# (``_tolerances``), since naming its dtype needs ml_dtypes.
_TOLERANCES = {np.dtype(np.float16): (1e-3, 1e-5), np.dtype(np.float32): (1.3e-6, 1e-5),
               np.dtype(np.float64): (1e-7, 1e-7)}
_BF16_TOLERANCES = (1.6e-2, 1e-5)

#: Rows of the random probe drawn when neither ``probe`` nor ``input_shape`` is given.
PROBE_ROWS = 16


@dataclass(frozen=True)
class VerifyReport:
    """What ``verify`` measured.

    Attributes
    ----------
    ok : bool
        Every element satisfies ``|y - ref| <= atol + rtol * |ref|`` (NaN never does) and the
        shapes agree.
    max_abs_error, max_rel_error : float
        ``max |y - ref|`` and ``max |y - ref| / |ref|`` (inf where ``ref`` is 0 and ``y`` is not;
        inf when the shapes differ).
    mismatched, total : int
        Elements beyond tolerance, and elements compared.
    rtol, atol : float
    probe_shape, output_shape, reference_shape : tuple
    dtype : numpy.dtype
        The probe's dtype.
    worst : str
        Where the largest error is, with both values ('' when ok).
    """

    ok: bool
    max_abs_error: float
    max_rel_error: float
    mismatched: int
    total: int
    rtol: float
    atol: float
    probe_shape: tuple
    output_shape: tuple
    reference_shape: tuple
    dtype: np.dtype
    worst: str = ""

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        head = "verify: ok" if self.ok else "verify: NOT ok"
        text = (f"{head} - max abs error {self.max_abs_error:.3g}, max rel error "
                f"{self.max_rel_error:.3g}; {self.mismatched} of {self.total} elements beyond "
                f"rtol={self.rtol:g}, atol={self.atol:g} (probe {self.probe_shape} "
                f"{self.dtype}, output {self.output_shape})")
        if self.worst:
            text += f"\n  {self.worst}"
        return text


def _model_dtype(model) -> np.dtype:
    if isinstance(model, Module):
        for p in model.parameters():
            if precision.is_float(p.data.dtype):  # bfloat16 (kind 'V') included
                return p.data.dtype
    return np.dtype(np.float32)


def _tolerances(dtype: np.dtype) -> tuple[np.dtype, tuple[float, float]]:
    """The dtype the report names and torch.testing's default ``(rtol, atol)`` for it."""
    if dtype in _TOLERANCES:
        return dtype, _TOLERANCES[dtype]
    if precision.is_16bit(dtype):  # ml_dtypes.bfloat16
        return dtype, _BF16_TOLERANCES
    return np.dtype(np.float32), _TOLERANCES[np.dtype(np.float32)]


def _as_array(y) -> np.ndarray:
    if hasattr(y, "detach"):  # a torch tensor (one that requires grad too); bfloat16 by its bits
        from .torch import tensor_to_numpy
        return tensor_to_numpy(y)
    return np.asarray(y)


def _default_shape(model) -> tuple:
    """``(PROBE_ROWS, *in)`` for a model whose input width its layers tell (``rules.first_input``);
    a ValueError asking for a probe otherwise — an unmaterialized LazyLinear first among them
    named by its path."""
    module = isinstance(model, Module)
    path, layer, width = first_input(model) if module else ("", None, None)
    if width is not None:
        return (PROBE_ROWS, *width)
    if layer is not None:  # a lazy layer comes first: its width is the input's, still unknown
        where = f"'{path}'" if path else "the model"
        raise ValueError(f"verify: {where} ({type(layer).__name__}) is not materialized, so the "
                         "model's input width is unknown; pass a probe array (a batch of real "
                         "inputs) or input_shape=(batch, in_features)")
    why = ("no layer with in_features or a normalized shape" if module
           else "not a linearkit Module")
    raise ValueError(f"verify: cannot tell the input width of {type(model).__name__} ({why}); "
                     "pass a probe array, or input_shape=(batch, in_features) for a random "
                     "standard-normal one")


def _reference_call(reference_fn):
    """``reference_fn`` as ndarray -> ndarray; a torch module is called on a tensor, no grad."""
    torch = sys.modules.get("torch")  # a torch module can exist only if torch is imported
    if torch is not None and isinstance(reference_fn, torch.nn.Module):
        from .torch import array_to_tensor

        def call(x):
            with torch.no_grad():
                return reference_fn(array_to_tensor(np.ascontiguousarray(x)))
        return call
    if not callable(reference_fn):
        raise TypeError(f"verify: reference_fn must be callable (array -> array) or a torch "
                        f"module, got {type(reference_fn).__name__}")
    return reference_fn


def verify(model, reference_fn, probe=None, *, input_shape=None, rtol=None, atol=None,
           seed: int = 0) -> VerifyReport:
    """Run ``model`` and ``reference_fn`` on one input and compare their outputs.

    Parameters
    ----------
    model : Module or callable
        The model under test, called as ``model(probe)``. Modes are left as they are: call
        ``eval()`` on both sides first when they hold Dropout or BatchNorm.
    reference_fn : callable or torch.nn.Module
        ndarray ``(*shape)`` -> array-like (a torch tensor is converted back). A torch module
        is accepted directly: it is called on ``torch.from_numpy(probe)`` under ``no_grad``.
    probe : ndarray, optional
        The known input. When omitted, a standard normal array of shape ``input_shape`` is
        drawn from ``numpy.random.default_rng(seed)`` in the model's parameter dtype.
    input_shape : tuple of int, optional
        The random probe's shape. Default, when ``probe`` is None too: ``(16, in_features)``,
        the width read off a linearkit ``model`` — its first layer's ``in_features`` (or a
        norm's normalized shape), as the transforms' probes do. A model whose width cannot be
        read (a plain callable, an unmaterialized ``LazyLinear`` first) is a ValueError asking
        for ``probe`` or ``input_shape``.
    rtol, atol : float, optional
        Default to torch.testing's for the probe's dtype: float32 1.3e-6 / 1e-5, float64
        1e-7 / 1e-7, float16 1e-3 / 1e-5, bfloat16 1.6e-2 / 1e-5.

    Returns
    -------
    VerifyReport
        ``ok``, ``max_abs_error``, ``max_rel_error`` and a readable ``str``. Disagreeing
        outputs are a report (``ok=False``), never an exception.

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> layer = lk.Linear(3, 2)
    >>> w, b = layer.weight.data, layer.bias.data
    >>> verify(layer, lambda x: x @ w.T + b, input_shape=(4, 3)).ok
    True
    >>> verify(layer, lambda x: x @ w.T + b).probe_shape  # the width read off the layer
    (16, 3)
    """
    if probe is None:
        if input_shape is None:
            shape = _default_shape(model)
        else:
            shape = (input_shape,) if isinstance(input_shape, int) else tuple(input_shape)
        probe = np.random.default_rng(seed).standard_normal(shape).astype(_model_dtype(model))
    elif input_shape is not None:
        raise ValueError("verify: give either probe or input_shape, not both")
    probe = np.asarray(probe)
    y = _as_array(model(probe))
    ref = _as_array(_reference_call(reference_fn)(probe))
    dtype, (default_rtol, default_atol) = _tolerances(probe.dtype)
    rtol = default_rtol if rtol is None else float(rtol)
    atol = default_atol if atol is None else float(atol)
    common = {"rtol": rtol, "atol": atol, "probe_shape": probe.shape, "output_shape": y.shape,
              "reference_shape": ref.shape, "dtype": dtype}
    if y.shape != ref.shape:
        return VerifyReport(False, np.inf, np.inf, max(y.size, ref.size), max(y.size, ref.size),
                            worst=f"shapes differ: model {y.shape}, reference {ref.shape}",
                            **common)
    a, b = y.astype(np.float64), ref.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        diff = np.where(a == b, 0.0, np.abs(a - b))  # equal infinities agree
        diff = np.where(np.isnan(diff), np.inf, diff)  # NaN never agrees (equal_nan=False)
        rel = np.where(diff == 0, 0.0, diff / np.abs(b))
        bad = ~(diff <= atol + rtol * np.abs(b))
    mismatched = int(bad.sum())
    worst = ""
    if mismatched and diff.size:
        i = np.unravel_index(int(np.argmax(np.where(bad, diff, -1.0))), diff.shape)
        worst = (f"worst at index {tuple(int(k) for k in i)}: model {a[i]:.6g}, "
                 f"reference {b[i]:.6g}")
    return VerifyReport(mismatched == 0, float(diff.max(initial=0.0)),
                        float(rel.max(initial=0.0)), mismatched, int(diff.size),
                        worst=worst, **common)
