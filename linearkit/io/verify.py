"""``verify``: run a model and a reference on the same known input and report how far apart they are.

Shapes cannot tell a weight loaded in the wrong layout when the layer is square; a forward pass
on a known input can. ``verify`` is that check, with torch.testing's default tolerances.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from ..core.module import Module

__all__ = ["VerifyReport", "verify"]

# torch.testing.assert_close's defaults (rtol, atol) per dtype.
_TOLERANCES = {np.dtype(np.float16): (1e-3, 1e-5), np.dtype(np.float32): (1.3e-6, 1e-5),
               np.dtype(np.float64): (1e-7, 1e-7)}


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
            if p.data.dtype.kind == "f":
                return p.data.dtype
    return np.dtype(np.float32)


def _as_array(y) -> np.ndarray:
    if hasattr(y, "detach"):  # a torch tensor (one that requires grad too)
        y = y.detach().cpu().numpy()
    return np.asarray(y)


def _reference_call(reference_fn):
    """``reference_fn`` as ndarray -> ndarray; a torch module is called on a tensor, no grad."""
    torch = sys.modules.get("torch")  # a torch module can exist only if torch is imported
    if torch is not None and isinstance(reference_fn, torch.nn.Module):
        def call(x):
            with torch.no_grad():
                return reference_fn(torch.from_numpy(np.ascontiguousarray(x)))
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
        The random probe's shape; needed exactly when ``probe`` is None.
    rtol, atol : float, optional
        Default to torch.testing's for the probe's dtype: float32 1.3e-6 / 1e-5, float64
        1e-7 / 1e-7, float16 1e-3 / 1e-5.

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
    """
    if probe is None:
        if input_shape is None:
            raise ValueError("verify needs a probe array or input_shape=(batch, in_features) "
                             "for a random standard-normal one")
        shape = (input_shape,) if isinstance(input_shape, int) else tuple(input_shape)
        probe = np.random.default_rng(seed).standard_normal(shape).astype(_model_dtype(model))
    elif input_shape is not None:
        raise ValueError("verify: give either probe or input_shape, not both")
    probe = np.asarray(probe)
    y = _as_array(model(probe))
    ref = _as_array(_reference_call(reference_fn)(probe))
    dtype = probe.dtype if probe.dtype in _TOLERANCES else np.dtype(np.float32)
    default_rtol, default_atol = _TOLERANCES[dtype]
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
