"""The ledger's findings: redundant linear structure, each with the fix, what it saves, and the
``linearkit.transforms`` call that applies the fix (``Finding.transform``).

* ``mergeable-linear``: two Linears with only pass-through layers between are one affine map;
* ``bias-before-batchnorm`` and ``fold-batchnorm``: a Linear followed by a BatchNorm1d;
* ``alignment``: Linear sizes that are not multiples of 8;
* ``low-rank``: a weight that is rank-deficient or has 99% of its energy in a low rank.
"""

from __future__ import annotations

import numpy as np

from .accumulator import Acc
from .costs import lead
from .report import Finding, Row

__all__ = ["collect_findings"]


def collect_findings(acc: Acc, rank_check: bool) -> list[Finding]:
    """Every finding over the rows of ``acc`` (``rank_check``: also the low-rank one)."""
    rows, out = acc.rows, []
    nested = {j for _, chain in acc.chains for j in chain}
    for seq, chain in acc.chains:
        if seq in nested:
            continue  # a Sequential inside a Sequential is part of its parent's chain
        for a, b, between in _pairs(rows, _flatten_chain(rows, chain, acc.chains)):
            ra, rb = rows[a], rows[b]
            if ra.kind != "linear" or "in" not in ra.info:  # not a Linear, or still lazy
                continue
            if rb.kind == "linear" and "out" in rb.info:
                out.append(_merge_finding(ra, rb, between))
            elif rb.kind == "batchnorm" and not between:
                c, B = ra.info["out"], lead(ra.output_shape) if ra.output_shape else 0
                if ra.info["bias"]:
                    out.append(Finding(
                        "bias-before-batchnorm", (ra.path, rb.path),
                        "the Linear's bias is cancelled exactly by the BatchNorm1d that follows "
                        "(the batch mean removes any per-feature constant).",
                        "construct the Linear with bias=False; for a trained model also subtract "
                        "the bias from running_mean so eval mode is unchanged",
                        saving_params=c, saving_flops=B * c,
                        transform="transforms.fold_norm(model, keep_batchnorm=True)"))
                out.append(Finding(
                    "fold-batchnorm", (ra.path, rb.path),
                    "in eval mode the BatchNorm1d is a fixed per-feature affine map that can be "
                    "folded into the preceding Linear for inference.",
                    "W' = W * s[:, None], b' = (b - running_mean) * s + beta with s = gamma / "
                    "sqrt(running_var + eps) (a bias appears if the Linear had none); keep the "
                    "BatchNorm for training",
                    saving_params=rb.params - (0 if ra.info["bias"] else c),
                    saving_flops=(rb.flops or 0) - (0 if ra.info["bias"] else B * c),
                    transform="transforms.fold_norm(model) (linearkit compress --fold)"))
    unaligned, where, cost = [], [], 0
    for i, w in acc.linear_weights.items():
        row = rows[i]
        n_out, n_in = w.shape
        if n_in % 8 or n_out % 8:
            p_in, p_out = -(-n_in // 8) * 8, -(-n_out // 8) * 8
            where.append(row.path or "(model)")
            unaligned.append(f"{where[-1]}: {n_in}x{n_out} -> {p_in}x{p_out}")
            cost += p_in * p_out - n_in * n_out
        if rank_check:
            f = _rank_finding(row, w)
            if f is not None:
                out.append(f)
    if unaligned:
        out.append(Finding(
            "alignment", tuple(where),
            "Linear sizes (in x out) that are not multiples of 8: GEMM kernels (tensor cores, "
            "vectorized BLAS) run best on multiples of 8 (fp16), 16 or 64 — "
            + "; ".join(unaligned) + ".",
            "pad the hot layers (zero rows/columns, slice the output) — a first layer's input and "
            "a classifier's output are fixed by the data, so pad those only if they dominate",
            saving_params=-cost))
    return out


def _flatten_chain(rows, chain, chains):
    inner = dict(chains)
    flat = []
    for i in chain:
        if rows[i].kind == "sequential" and i in inner:
            flat.extend(_flatten_chain(rows, inner[i], chains))
        else:
            flat.append(i)
    return flat


def _pairs(rows, flat):
    """Adjacent (a, b, [types between]) with only shape-keeping pass-through layers between."""
    for n, a in enumerate(flat):
        between = []
        for b in flat[n + 1:]:
            r = rows[b]
            passthrough = r.kind in ("identity", "dropout") or (  # a Flatten that keeps the
                r.kind == "flatten" and r.input_shape is not None  # shape (known only with
                and r.input_shape == r.output_shape)  # an input shape)
            if not passthrough:
                yield a, b, between
                break
            between.append(r.type)


def _merge_finding(ra: Row, rb: Row, between) -> Finding:
    n_in, h, b1 = ra.info["in"], ra.info["out"], ra.info["bias"]
    n_out, b2 = rb.info["out"], rb.info["bias"]
    before = n_in * h + h * b1 + h * n_out + n_out * b2
    after = n_in * n_out + (n_out if (b1 or b2) else 0)
    B = lead(ra.input_shape) if ra.input_shape else 0
    fl_before = 2 * B * (n_in * h + h * n_out) + B * (h * b1 + n_out * b2)
    fl_after = 2 * B * n_in * n_out + (B * n_out if (b1 or b2) else 0)
    via = ""
    if between:
        via = f" (only {', '.join(between)} between"
        via += ", and Dropout is the identity at inference)" if any(
            t.startswith("Dropout") for t in between) else ")"
    msg = (f"two linear maps with no nonlinearity between them{via} are one affine map, "
           f"y = x (W2 W1)^T + (W2 b1 + b2) (W2 W1, not W1 W2), of rank <= {min(h, n_in, n_out)}.")
    if after <= before:
        fix = (f"merge them into one Linear({n_in}, {n_out}) with weight W2 @ W1 and bias "
               "W2 @ b1 + b2 — or add the nonlinearity that was meant to be there")
    else:
        fix = (f"nothing to merge for size: this is a rank-{h} factorization of a {n_out}x{n_in} "
               f"map and cheaper than one Linear ({before:,} vs {after:,} params); keep it if "
               "intended, else add the missing nonlinearity")
    transform = ("transforms.merge_linear(model) (linearkit compress --merge)" if after <= before
                 else "")
    return Finding("mergeable-linear", (ra.path, rb.path), msg, fix,
                   saving_params=before - after, saving_flops=fl_before - fl_after,
                   transform=transform)


def _rank_tolerance(s: np.ndarray, dtype: np.dtype, n_out: int, n_in: int) -> float:
    """Singular values at or below this are rounding: ``s_max * max(n_out, n_in) * eps`` for
    float32/float64 (NumPy's ``matrix_rank`` convention, floored at 1e-7 * s_max).

    For float16/bfloat16 storage that bound (64 x 2^-7 = 0.5 s_max for a 64-wide bfloat16
    weight) would call a random weight low-rank; rounding each entry to the nearest 16-bit value
    moves every singular value by at most ``||E||_2 <= ||E||_F <= (eps / 2) ||W||_F`` (Weyl), the
    tolerance used there. bfloat16 (kind 'V', which ``np.finfo`` refuses) reads ml_dtypes' eps
    (loaded wherever a bfloat16 array exists).
    """
    if dtype.itemsize != 2:
        return s[0] * max(max(n_out, n_in) * np.finfo(dtype).eps, 1e-7)
    if dtype.kind == "f":
        eps = float(np.finfo(dtype).eps)
    else:
        import ml_dtypes

        eps = float(ml_dtypes.finfo(dtype).eps)
    return max(eps / 2 * float(np.sqrt(np.sum(s**2))), 1e-7 * s[0])


def _rank_finding(row: Row, w: np.ndarray, max_elements: int = 1 << 20) -> Finding | None:
    """Rank-deficient or 99%-energy-in-rank-r weights, where factorizing saves parameters."""
    n_out, n_in = w.shape
    k = min(n_out, n_in)
    if k < 2 or w.size > max_elements:
        return None
    # Singular values from the eigenvalues of the k x k Gram matrix, in float64: cheaper than an
    # SVD and exact enough for these thresholds (it resolves s down to ~1e-8 * s_max).
    w64 = np.asarray(w, dtype=np.float64)
    gram = w64 @ w64.T if n_out <= n_in else w64.T @ w64
    if not np.all(np.isfinite(gram)):
        return None
    s = np.sqrt(np.clip(np.linalg.eigvalsh(gram)[::-1], 0.0, None))
    if s[0] == 0:
        return None
    tol = _rank_tolerance(s, w.dtype, n_out, n_in)
    rank = int(np.sum(s > tol))
    energy = np.cumsum(s**2)
    r99 = int(np.searchsorted(energy, 0.99 * energy[-1]) + 1)
    full = n_out * n_in
    if rank < k and rank * (n_in + n_out) < full:
        r, what = rank, f"rank-deficient: rank {rank} of {k} (singular values below {tol:.1e})"
        err = "exactly (up to rounding)"
    elif r99 * (n_in + n_out) <= full // 2:
        r, what = r99, f"low effective rank: 99% of the energy (sum of s^2) in rank {r99} of {k}"
        err = "with relative Frobenius error <= 10%"
    else:
        return None
    return Finding(
        "low-rank", (row.path,), f"weight {n_out}x{n_in} is {what}.",
        f"factorize W ~= U_r diag(s_r) V_r^T into Linear({n_in}, {r}, bias=False) then "
        f"Linear({r}, {n_out}) (truncated SVD), which reproduces it {err}",
        saving_params=full - r * (n_in + n_out),
        saving_flops=2 * lead(row.input_shape) * (full - r * (n_in + n_out))
        if row.input_shape else 0,
        transform=f"transforms.factorize(model, rank={r}, targets=[{row.path!r}]) (linearkit "
                  f"compress --rank {r})")
