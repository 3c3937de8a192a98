"""Magnitude pruning, and the conversion that makes its zeros save something.

Zeros in a dense matrix save nothing: ``prune`` (like ``torch.nn.utils.prune``) and
``linearkit.init.sparse_`` write zeros into an ordinary ``(out, in)`` array, which still stores
every one of them and still multiplies by them (same ``nbytes``, same GEMM). Memory and time are
saved only once ``to_sparse`` puts the weight in compressed (CSR) form, as a ``SparseLinear``
holding just the nonzeros — and even then only below 50% density at float32: each stored entry
costs its 4-byte value *and* a 4-byte column index.

Tier 1, on arrays: ``prune_weight(w, amount, structured=False) -> mask``.
Tier 2, on models: ``prune(model, amount)`` and ``to_sparse(model)``, each returning
``(new_model, report)``; the input model is never modified.
"""

from __future__ import annotations

import numbers
import sys

import numpy as np

from .. import precision
from ..layers.sparse import SparseLinear
from .walk import copy_model, finish, named, paths_text, replace_everywhere, select_linears, uses

__all__ = ["csr_bytes", "prune", "prune_weight", "to_sparse"]

#: Bytes of one CSR index (``weight_indices``, ``weight_indptr`` are int32).
INDEX_BYTES = 4


def _prune_count(amount, units: int, what: str) -> int:
    """``torch.nn.utils.prune``'s count: an int is that many ``what``; a float in [0, 1] is
    ``round(amount·units)`` (Python's round, as torch's ``_compute_nparams_toprune``)."""
    if isinstance(amount, bool) or not isinstance(amount, numbers.Real):
        raise TypeError(f"amount must be a float in [0, 1] (a fraction) or an int (a count of "
                        f"{what}), got {amount!r} ({type(amount).__name__})")
    if isinstance(amount, numbers.Integral):
        if amount < 0:
            raise ValueError(f"amount={amount} must be a fraction in [0, 1] or a non-negative "
                             f"count of {what}")
        if amount > units:
            raise ValueError(f"amount={amount} is more than the {units:,} {what} there are")
        return int(amount)
    amount = float(amount)
    if not 0.0 <= amount <= 1.0:  # NaN fails too
        raise ValueError(f"amount={amount} must be a fraction in [0, 1] or a non-negative "
                         f"count of {what}")
    return round(amount * units)


def prune_weight(w, amount, structured: bool = False) -> np.ndarray:
    """The mask that magnitude pruning keeps: ``True`` = kept, ``False`` = to zero.

    Unstructured (``torch.nn.utils.prune.l1_unstructured``): the ``k`` entries of smallest
    ``|w|`` are pruned. Structured (``ln_structured(n=2, dim=0)``): the ``k`` output rows
    ``w[i]`` of smallest L2 norm are pruned whole. ``k`` is ``amount`` itself for an int (a count
    of entries, or of rows when structured), ``round(amount·total)`` for a float in [0, 1].
    Ties (equal magnitudes) are broken by position, which torch leaves unspecified.

    Parameters
    ----------
    w : ndarray ``(out, in)`` (any shape unstructured; at least 2-D structured), floating:
        float16, bfloat16, float32 or float64 (16-bit weights are ranked in float32, exactly)
    amount : float in [0, 1] or int >= 0
    structured : bool

    Returns
    -------
    mask : bool ndarray, ``w``'s shape

    Examples
    --------
    >>> import numpy as np
    >>> from linearkit.transforms import prune_weight
    >>> w = np.array([[0.5, -0.1, 2.0], [0.3, -4.0, 0.2]])
    >>> prune_weight(w, 0.5).astype(int)
    array([[1, 0, 1],
           [0, 1, 0]])
    >>> prune_weight(w, 1, structured=True).astype(int)
    array([[0, 0, 0],
           [1, 1, 1]])
    """
    w = np.asarray(w)
    if w.dtype.kind != "f" and not precision.is_float(w.dtype):
        raise TypeError(f"prune_weight() takes a floating-point array (float16, bfloat16, "
                        f"float32 or float64), got dtype {w.dtype}")
    if precision.is_16bit(w.dtype):
        w = w.astype(np.float32)  # exact; NumPy's sorts and norms then work for bfloat16 too
    if structured:
        if w.ndim < 2:
            raise ValueError(f"structured pruning removes output rows of a weight with at least "
                             f"2 dimensions, got shape {w.shape}; use structured=False")
        k = _prune_count(amount, w.shape[0], "output rows")
        norms = np.sqrt(np.sum(np.square(w.reshape(w.shape[0], -1), dtype=np.float64), axis=1))
        mask = np.ones(w.shape, bool)
        mask[np.argsort(norms, kind="stable")[:k]] = False
        return mask
    k = _prune_count(amount, w.size, "weights")
    mask = np.ones(w.size, bool)
    if k:
        mask[np.argsort(np.abs(w).ravel(), kind="stable")[:k]] = False
    return mask.reshape(w.shape)


def prune(model, amount, structured: bool = False, *, targets=None, probe=None):
    """Zero the smallest-magnitude weights of every targeted ``Linear`` (``prune_weight``).

    The weights stay dense: the report's ``params_after`` equals ``params_before`` because the
    matrix still stores every zero — no memory or time is saved until ``to_sparse``. The error
    measured on the probes is the pruning's own change of the function.

    Parameters
    ----------
    model : Module
    amount : float in [0, 1] (fraction of each layer's weights, or rows) or int (a count per
        layer)
    structured : bool
        Prune whole output rows by L2 norm instead of single entries (biases are kept).
    targets : None, str or list of str
        The layers (paths, path endings or globs; ``walk.select_linears``). Default: every
        plain ``Linear``.
    probe : ndarray, optional
        A batch of real inputs for the error check (besides random ones).

    Returns
    -------
    (new_model, TransformReport) — per layer in ``report.layers``: ``path``, ``weights``,
    ``pruned``, ``rows_pruned`` (structured), ``sparsity`` (fraction of zeros after),
    ``dense_params`` (values the weight still stores).
    """
    try:
        _prune_count(amount, sys.maxsize, "weights")  # the type and range, before any copy
    except (TypeError, ValueError) as err:
        raise type(err)(f"prune(): {err}") from None
    new = copy_model(model, "prune")
    changed, left, layers = [], [], []
    for path, layer in select_linears(new, targets, "prune"):
        w = layer.weight.data
        where = named(path, layer)
        if not np.all(np.isfinite(w.astype(np.float32) if precision.is_16bit(w.dtype) else w)):
            raise ValueError(f"prune(): {where} has non-finite weights, whose magnitude ranks "
                             "nothing; fix the model (linearkit.detect_anomaly) first")
        try:
            mask = prune_weight(w, amount, structured)
        except ValueError as err:
            raise ValueError(f"prune(): cannot prune {where}: {err}") from None
        pruned = int(w.size - np.count_nonzero(mask))
        w[~mask] = 0
        sparsity = 1.0 - np.count_nonzero(w) / w.size if w.size else 0.0
        info = {"path": path, "weights": int(w.size), "pruned": pruned,
                "sparsity": float(sparsity), "dense_params": int(w.size)}
        if structured:
            info["rows_pruned"] = int(np.count_nonzero(~mask.any(axis=1))) if w.size else 0
        if pruned == 0:
            left.append(f"{where}: amount={amount!r} prunes none of its {w.size:,} weights")
            continue
        unit = (f"{info['rows_pruned']} of {w.shape[0]} rows ({pruned:,} weights)" if structured
                else f"{pruned:,} of {w.size:,} weights")
        changed.append(f"{where}: {unit} zeroed, sparsity {sparsity:.3f}; still a dense "
                       "matrix that stores every zero (no memory saved until to_sparse)")
        layers.append(info)
    return new, finish("prune", model, new, probe, changed, left, layers)


def csr_bytes(nnz: int, out_features: int, itemsize: int) -> int:
    """Bytes of a CSR weight: ``nnz`` values + ``nnz`` int32 column indices + ``out + 1``
    int32 row pointers."""
    return nnz * (itemsize + INDEX_BYTES) + (out_features + 1) * INDEX_BYTES


def to_sparse(model, *, targets=None, min_sparsity: float = 0.0, probe=None):
    """Replace every targeted ``Linear`` whose weight is sparse enough by a ``SparseLinear``
    holding only its nonzeros (same function, up to float rounding of the sums' order).

    A layer is converted when its fraction of zero weights is at least ``min_sparsity`` *and*
    CSR takes fewer bytes than the dense matrix. Each nonzero costs its value and a 4-byte
    column index, so at float32 CSR is smaller only below 50% density (float64: below 2/3);
    a denser layer is left, with that reason, in ``report.left``. A Linear used at several
    paths (tied) becomes one ``SparseLinear``, put at each of them.

    Parameters
    ----------
    model : Module
    targets : None, str or list of str (``walk.select_linears``)
    min_sparsity : float in [0, 1]
    probe : ndarray, optional

    Returns
    -------
    (new_model, TransformReport): ``bytes_before/after`` are the state dicts' real bytes (CSR:
    values + int32 indices + indptr); per layer ``path``, ``nnz``, ``sparsity``,
    ``dense_bytes``, ``csr_bytes``.
    """
    if (isinstance(min_sparsity, bool) or not isinstance(min_sparsity, numbers.Real)
            or not 0.0 <= float(min_sparsity) <= 1.0):
        raise ValueError(f"to_sparse(): min_sparsity must be a fraction in [0, 1], got "
                         f"{min_sparsity!r}")
    new = copy_model(model, "to_sparse")
    used_at = uses(new)
    changed, left, layers = [], [], []
    for path, layer in select_linears(new, targets, "to_sparse"):
        w = layer.weight.data
        where = named(path, layer)
        if w.dtype not in (np.float32, np.float64):
            left.append(f"{where}: {w.dtype} weights; SciPy's sparse kernels take float32 or "
                        "float64 (convert with model.to(np.float32))")
            continue
        nnz = int(np.count_nonzero(w))
        sparsity = 1.0 - nnz / w.size if w.size else 0.0
        dense, csr = w.nbytes, csr_bytes(nnz, layer.out_features, w.itemsize)
        if sparsity < min_sparsity:
            left.append(f"{where}: sparsity {sparsity:.3f} < min_sparsity={min_sparsity}")
            continue
        if csr >= dense:
            even = w.itemsize / (w.itemsize + INDEX_BYTES)
            left.append(f"{where}: too dense to win: {1 - sparsity:.1%} nonzero, CSR would take "
                        f"{csr:,} B against {dense:,} B dense ({w.dtype} value + int32 index "
                        f"per nonzero: smaller only below {even:.0%} density)")
            continue
        paths = used_at[id(layer)]
        new = replace_everywhere(new, paths, SparseLinear.from_linear(layer))
        tied = (f"; one layer used at {paths_text(paths)} (tied): the same SparseLinear at each"
                if len(paths) > 1 else "")
        changed.append(f"{where} -> SparseLinear: {nnz:,} of {w.size:,} weights stored "
                       f"(sparsity {sparsity:.3f}), weight {dense:,} B -> {csr:,} B{tied}")
        layers.append({"path": path, "nnz": nnz, "sparsity": float(sparsity),
                       "dense_bytes": int(dense), "csr_bytes": int(csr)})
    return new, finish("to_sparse", model, new, probe, changed, left, layers)
