"""``factorize``: a Linear as two thin ones, from a truncated SVD of its weight.

A weight ``W (out, in)`` with singular values ``s_1 >= s_2 >= ...`` is, kept to its first ``r``
of them, ``W ≈ U_r Σ_r V_rᵀ`` — the best rank-``r`` approximation in the Frobenius norm
(Eckart–Young), with relative error ``sqrt(Σ_{i>r} s_i²) / sqrt(Σ s_i²)``. Splitting ``Σ_r``
evenly between the two factors::

    A = sqrt(Σ_r) V_rᵀ   (r, in)        B = U_r sqrt(Σ_r)   (out, r)        W ≈ B @ A

makes ``Linear(in, out)`` into ``Linear(in, r, bias=False)`` (weight ``A``) then
``Linear(r, out)`` (weight ``B``, the original bias), both factors equally scaled. It holds
``r·(in + out)`` weights instead of ``in·out``, so it saves only when ``r < in·out / (in + out)``;
a layer where it would not save is left as it is, and the report says so with both counts.
(Starting the two factors from ``randn``, as some tutorials do, gives a product whose scale
explodes with the width: we factor a trained weight instead.)

``rank_sweep`` (``linearkit.transforms.rank_sweep``, in ``factorize_sweep.py``, which imports
this module) measures accuracy, size and forward time against the rank.
"""

from __future__ import annotations

import numbers

import numpy as np

from ..analysis.timing import same_run_seconds
from ..core.module import Module
from ..layers import Linear, Sequential
from ..rules import rule_for
from .transform_report import TransformReport, hooks_off
from .walk import copy_model, finish, linear_from, named, select_linears, set_submodule

__all__ = ["factorize", "factorize_weight"]

NAME = "factorize"

#: Rows of the random batch each layer's speed-up is measured on, and the samples timed.
TIMING_ROWS = 256
TIMING_REPEATS = 5

#: ``energy=1.0`` (or 0.9) is met up to this much rounding of the cumulative sums.
ENERGY_TOL = 1e-12


# ---------------------------------------------------------------- the array tier
def check_choice(rank, energy, where: str) -> None:
    """Raise unless exactly one of ``rank`` (an int >= 1) and ``energy`` (0 < energy <= 1) is
    given."""
    if (rank is None) == (energy is None):
        got = "both" if rank is not None else "neither"
        raise ValueError(f"{where}: give exactly one of rank= (how many singular values to keep)"
                         f" and energy= (the fraction of spectral energy to keep, e.g. 0.9); "
                         f"got {got}")
    if rank is not None:
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
            raise TypeError(f"{where}: rank must be an int, got {rank!r}")
        if rank < 1:
            raise ValueError(f"{where}: rank must be >= 1, got {rank}")
    elif (isinstance(energy, bool) or not isinstance(energy, numbers.Real)
          or not 0 < energy <= 1):
        raise ValueError(f"{where}: energy is the fraction of spectral energy (sum of squared "
                         f"singular values) to keep: a number with 0 < energy <= 1, got "
                         f"{energy!r}")


def svd64(w, where: str = "the weight") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The thin SVD of ``w (out, in)`` in float64: ``u (out, m)``, ``s (m,)`` (descending),
    ``vt (m, in)``, ``m = min(out, in)``. Raises ValueError for a non-2-D, empty or
    non-finite weight."""
    w = np.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"{where} must be 2-D (out, in), got shape {w.shape}")
    if min(w.shape) == 0:
        raise ValueError(f"{where} has shape {w.shape}: no singular values to keep")
    w64 = np.asarray(w, dtype=np.float64)
    if not np.all(np.isfinite(w64)):
        raise ValueError(f"{where} holds NaN or inf: its SVD is meaningless; fix the weights "
                         "first (linearkit.detect_anomaly finds where they went bad)")
    return np.linalg.svd(w64, full_matrices=False)


def choose_rank(s: np.ndarray, energy: float) -> int:
    """The smallest ``r`` whose first ``r`` singular values ``s (m,)`` hold at least ``energy``
    of ``Σ s_i²`` (1 for an all-zero ``s``)."""
    sq = np.square(np.asarray(s, dtype=np.float64))
    total = sq.sum()
    if total == 0:
        return 1
    kept = np.cumsum(sq) / total
    return min(int(np.searchsorted(kept, energy - ENERGY_TOL)) + 1, len(sq))


def split_factors(u, s, vt, rank: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """``(a (r, in), b (out, r))`` = ``(sqrt(s_r) vt_r, u_r sqrt(s_r))`` in ``dtype``."""
    root = np.sqrt(s[:rank])
    return (root[:, None] * vt[:rank]).astype(dtype), (u[:, :rank] * root).astype(dtype)


def factor_info(w, s, a, b) -> dict:
    """``{rank, energy_kept, rel_error, singular_values}`` of factors ``a``, ``b`` of ``w``:
    ``rel_error`` is ``||w - b @ a||_F / ||w||_F`` computed from the factors as returned
    (their rounding included), in float64."""
    w64 = np.asarray(w, dtype=np.float64)
    sq = np.square(s)
    rank = a.shape[0]
    total = sq.sum()
    kept = float(sq[:rank].sum() / total) if total > 0 else 1.0
    norm = np.linalg.norm(w64)
    err = np.linalg.norm(w64 - np.asarray(b, np.float64) @ np.asarray(a, np.float64))
    rel = err / norm if norm > 0 else (0.0 if err == 0 else float("inf"))
    return {"rank": int(rank), "energy_kept": kept, "rel_error": float(rel),
            "singular_values": s}


def factorize_weight(w, rank: int | None = None, energy: float | None = None):
    """Truncated SVD of a weight, split into two factors: ``w ≈ b @ a``.

    ``a = sqrt(Σ_r) V_rᵀ`` and ``b = U_r sqrt(Σ_r)`` (the SVD ``w = U Σ Vᵀ`` computed in
    float64), so ``Linear(in, r, bias=False)`` with weight ``a`` then ``Linear(r, out)`` with
    weight ``b`` computes ``x (b a)ᵀ``.

    Parameters
    ----------
    w : array ``(out, in)``
        A weight in PyTorch's layout (``Linear.weight``); finite.
    rank : int, optional
        How many singular values to keep, ``1 <= rank <= min(out, in)``.
    energy : float, optional
        Keep the smallest ``r`` whose ``Σ_{i<=r} s_i² / Σ s_i²`` is at least ``energy``
        (``0 < energy <= 1``; met up to a rounding of 1e-12). Give exactly one of ``rank`` and
        ``energy``.

    Returns
    -------
    a : ndarray ``(r, in)``
    b : ndarray ``(out, r)``
        In ``w``'s dtype (float64 when ``w`` is not floating).
    info : dict
        ``rank`` (r), ``energy_kept`` (the fraction of ``Σ s_i²`` kept), ``rel_error``
        (``||w - b a||_F / ||w||_F``, of the factors as returned) and ``singular_values``
        (all ``min(out, in)`` of them, float64, descending).

    Raises
    ------
    ValueError
        Both or neither of ``rank`` and ``energy``, ``rank < 1`` or ``> min(out, in)``,
        ``energy`` outside ``(0, 1]``, or a weight that is not 2-D, empty or not finite.

    Examples
    --------
    A rank-1 weight is rebuilt exactly from one singular value:

    >>> import numpy as np
    >>> from linearkit.transforms.factorization import factorize_weight
    >>> w = np.outer([1., 2., 3.], [1., -1.])           # (3, 2), rank 1
    >>> a, b, info = factorize_weight(w, energy=1.0)
    >>> a.shape, b.shape, info["rank"], info["energy_kept"]
    ((1, 2), (3, 1), 1, 1.0)
    >>> bool(np.allclose(b @ a, w, rtol=0, atol=1e-12))
    True
    """
    check_choice(rank, energy, "factorize_weight()")
    w = np.asarray(w)
    if w.ndim == 2 and rank is not None and rank > min(w.shape):
        raise ValueError(f"factorize_weight(): rank {rank} > min(out, in) = {min(w.shape)}: a "
                         f"weight of shape {w.shape} has only {min(w.shape)} singular values")
    u, s, vt = svd64(w)
    r = rank if rank is not None else choose_rank(s, energy)
    dtype = w.dtype if np.issubdtype(w.dtype, np.floating) else np.dtype(np.float64)
    a, b = split_factors(u, s, vt, r, dtype)
    return a, b, factor_info(w, s, a, b)


# ---------------------------------------------------------------- the module tier
def factorize(model: Module, rank: int | None = None, energy: float | None = None,
              targets=None, *, probe=None, timing: bool = True
              ) -> tuple[Module, TransformReport]:
    """Replace each targeted ``Linear(in, out)`` by ``Sequential(Linear(in, r, bias=False),
    Linear(r, out))`` from the truncated SVD of its weight (``factorize_weight``).

    The pair sits at the layer's path, so its state keys are ``'<path>.0.weight'``,
    ``'<path>.1.weight'`` and ``'<path>.1.bias'`` (the original bias, copied). A layer where
    ``r·(in + out) >= in·out`` (it would not save) is left as it is, listed in ``report.left``
    with both counts. ``model`` itself is never modified.

    Parameters
    ----------
    model : Module
    rank : int, optional
        The rank of every factorized layer (``>= 1``).
    energy : float, optional
        Per layer, the smallest rank keeping this fraction of its spectral energy
        (``0 < energy <= 1``). Give exactly one of ``rank`` and ``energy``.
    targets : str or list of str, optional
        Which Linear layers (paths, their last components, or globs; see
        ``walk.select_linears``); default all.
    probe : ndarray ``(N, *in)``, optional
        A batch of real inputs to check the new model on, beside random ones.
    timing : bool
        Measure each factorized layer's forward speed-up on a random batch of 256 rows (the
        original layer's median time over the pair's, timed in turn); False skips it.

    Returns
    -------
    new_model : Module
    report : TransformReport
        ``layers``: per factorized layer a dict ``{path, rank, energy_kept, rel_error,
        params_before, params_after, speedup}`` (``rel_error`` of the weight, Frobenius;
        ``speedup`` None without timing). ``max_abs_error``/``max_rel_error``: the whole
        model's outputs on the probes.

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> from linearkit.transforms.factorization import factorize
    >>> model = lk.Sequential(lk.Linear(64, 64, rng=np.random.default_rng(0)), lk.ReLU())
    >>> new, report = factorize(model, rank=8, timing=False)
    >>> new[0]
    Sequential(
      (0): Linear(in_features=64, out_features=8, bias=False)
      (1): Linear(in_features=8, out_features=64, bias=True)
    )
    >>> report.layers[0]["params_before"], report.layers[0]["params_after"]
    (4160, 1088)
    """
    new, report, _ = factorize_with(model, rank, energy, targets, probe=probe, timing=timing)
    return new, report


def factorize_with(model: Module, rank, energy, targets, *, probe=None, timing: bool = True,
                   svds: dict | None = None, check: bool = True):
    """``factorize``, reusing the SVDs in ``svds`` (path -> ``(u, s, vt)``, filled as it goes;
    for ``rank_sweep``). Returns ``(new_model, report, layers)``; ``report`` is None when
    ``check`` is False (no probe comparison)."""
    check_choice(rank, energy, f"{NAME}()")
    new = copy_model(model, NAME)
    chosen = select_linears(new, targets, NAME)
    where = {}  # a Linear used at several paths is replaced at each of them, by one pair
    for path, m in new.named_modules(remove_duplicate=False):
        where.setdefault(id(m), []).append(path)
    changed, left, layers = [], [], []
    for path, layer in chosen:
        n_out, n_in = layer.weight.shape
        if min(n_in, n_out) == 0:
            left.append(f"{named(path, layer)}: has no weights to factorize")
            continue
        if rank is not None and rank * (n_in + n_out) >= n_in * n_out:
            left.append(_no_saving(path, layer, rank, f"rank {rank}"))
            continue
        svd = svds.get(path) if svds is not None else None
        if svd is None:
            svd = svd64(layer.weight.data, f"{NAME}(): the weight of {named(path, layer)}")
            if svds is not None:
                svds[path] = svd
        r = rank if rank is not None else choose_rank(svd[1], energy)
        if r * (n_in + n_out) >= n_in * n_out:
            left.append(_no_saving(path, layer, r, f"energy {energy:.1%} needs rank {r}, which"))
            continue
        a, b = split_factors(*svd, r, layer.weight.dtype)
        info = factor_info(layer.weight.data, svd[1], a, b)
        pair = _pair(layer, a, b)
        for p in where[id(layer)]:
            new = set_submodule(new, p, pair)
        with hooks_off(layer):  # the copy's layer keeps the user's hooks; timing fires none
            speedup = layer_speedup(layer, pair) if timing else None
        entry = {"path": path, "rank": r, "energy_kept": info["energy_kept"],
                 "rel_error": info["rel_error"], "params_before": _count(layer),
                 "params_after": _count(pair), "speedup": speedup}
        layers.append(entry)
        changed.append(_changed_line(entry, layer, pair))
    report = finish(NAME, model, new, probe, changed, left, layers) if check else None
    return new, report, layers


def _count(module: Module) -> int:
    return sum(p.data.size for p in module.parameters())


def _describe(module: Module) -> str:
    return rule_for(module).describe_module(module)


def _no_saving(path: str, layer: Linear, r: int, what: str) -> str:
    n_in, n_out = layer.in_features, layer.out_features
    return (f"{named(path, layer)}: {what} would not save: {r}·({n_in} + {n_out}) = "
            f"{r * (n_in + n_out):,} weights >= {n_in}·{n_out} = {n_in * n_out:,}; left as it "
            f"is (it saves below rank {-(-n_in * n_out // (n_in + n_out))})")


def _pair(layer: Linear, a: np.ndarray, b: np.ndarray) -> Sequential:
    """``Sequential(Linear(in, r, bias=False), Linear(r, out))`` holding ``a``, ``b`` and a copy
    of ``layer``'s bias, with its training mode and ``requires_grad`` flags."""
    bias = layer.bias
    first = linear_from(a, None, layer.weight.dtype)
    second = linear_from(b, None if bias is None else bias.data, layer.weight.dtype)
    first.weight.requires_grad = second.weight.requires_grad = layer.weight.requires_grad
    if bias is not None:
        second.bias.requires_grad = bias.requires_grad
    pair = Sequential(first, second)
    pair.train(layer.training)
    return pair


def layer_speedup(old: Module, new: Module, rows: int = TIMING_ROWS,
                  repeats: int = TIMING_REPEATS) -> float:
    """Median forward time of ``old`` over ``new`` on one random batch ``(rows, in_features)``
    of ``old``'s dtype, the two timed in turn (``timing.same_run_seconds``)."""
    x = np.random.default_rng(0).standard_normal((rows, old.in_features)).astype(
        old.weight.dtype)
    t_old, t_new = same_run_seconds([lambda: old(x), lambda: new(x)], repeats)
    return t_old / t_new


def _speed(speedup: float) -> str:
    return f"{speedup:.1f}x faster" if speedup >= 1 else f"{1 / speedup:.1f}x slower"


def _changed_line(entry: dict, layer: Linear, pair: Sequential) -> str:
    path = f"'{entry['path']}'" if entry["path"] else "the model"
    line = (f"{path}: {_describe(layer)} -> rank {entry['rank']} ({_describe(pair[0])}, "
            f"{_describe(pair[1])}); energy {entry['energy_kept']:.1%}, params "
            f"{entry['params_before']:,} -> {entry['params_after']:,}")
    if entry["speedup"] is not None:
        line += f", {_speed(entry['speedup'])}"
    return line
