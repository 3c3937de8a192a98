"""Fused QKV: three projections of the same input <-> one ``Linear`` laid out ``[q | k | v]``.

``fuse_qkv_weights`` concatenates along the output axis; ``fuse_qkv(q, k, v)`` builds the fused
layer and proves on probes that its output equals the three outputs concatenated;
``split_qkv(fused)`` copies the rows back out (exact: nothing is recomputed). The sizes may
differ (grouped-query attention: ``dk = dv < dq``).
"""

from __future__ import annotations

import itertools

import numpy as np

from ..core.module import Module
from ..layers import Linear
from .walk import finish, linear_from, lists, named

__all__ = ["fuse_qkv", "fuse_qkv_weights", "split_qkv"]

_NAMES = ("q", "k", "v")


def fuse_qkv_weights(wq, bq, wk, bk, wv, bv) -> tuple[np.ndarray, np.ndarray | None]:
    """One weight and bias for three projections of the same input: ``(w, b)``.

    Shapes: ``wq (dq, d)``, ``wk (dk, d)``, ``wv (dv, d)``, biases ``(dq,)``, ``(dk,)``,
    ``(dv,)`` or None -> ``w (dq+dk+dv, d)`` with rows ``[q | k | v]``, ``b (dq+dk+dv,)`` or
    None (all three None). A missing bias among present ones becomes zeros. The three weights
    must share ``d`` and dtype (ValueError naming which differs).

    Examples
    --------
    >>> import numpy as np
    >>> from linearkit.transforms import fuse_qkv_weights
    >>> w, b = fuse_qkv_weights(np.ones((2, 3)), None, np.zeros((1, 3)), None,
    ...                         np.ones((1, 3)), np.array([5.0]))
    >>> w.shape, b.tolist()
    ((4, 3), [0.0, 0.0, 0.0, 5.0])
    """
    ws = [np.asarray(w) for w in (wq, wk, wv)]
    bs = [None if b is None else np.asarray(b) for b in (bq, bk, bv)]
    for name, w, b in zip(_NAMES, ws, bs):
        if w.ndim != 2:
            raise ValueError(f"fuse_qkv_weights(): w{name} must be 2-D (out, in), got shape "
                             f"{w.shape}")
        if b is not None and b.shape != (w.shape[0],):
            raise ValueError(f"fuse_qkv_weights(): b{name} has shape {b.shape}, expected "
                             f"({w.shape[0]},) to match w{name} {w.shape}")
    _same("in_features", [w.shape[1] for w in ws], "fuse_qkv_weights()")
    _same("dtype", [w.dtype for w in ws], "fuse_qkv_weights()")
    w = np.concatenate(ws, axis=0)
    if all(b is None for b in bs):
        return w, None
    b = np.concatenate([np.zeros(w_.shape[0], w.dtype) if b_ is None else b_.astype(w.dtype)
                        for w_, b_ in zip(ws, bs)])
    return w, b


def _same(what: str, values: list, where: str, names=_NAMES) -> None:
    if len(set(values)) > 1:
        listed = ", ".join(f"{n}: {v}" for n, v in zip(names, values))
        raise ValueError(f"{where}: q, k and v must have the same {what}, got {listed}; all "
                         "three project the same input, so their in_features and dtypes agree")


class _Concat(Module):
    """The three layers side by side: ``x (*, d) -> [q(x) | k(x) | v(x)] (*, dq+dk+dv)`` — the
    reference the fused layer is checked against."""

    def __init__(self, q, k, v):
        super().__init__()
        self.q, self.k, self.v = q, k, v

    def forward(self, x):
        return np.concatenate([self.q(x), self.k(x), self.v(x)], axis=-1)


def _check_linear(name: str, layer, transform: str) -> None:
    """A TypeError unless ``layer``'s own rule lists ``transform`` (a plain, materialized
    Linear: a subclass may compute something else)."""
    if not lists(layer, transform):
        raise TypeError(f"{transform}(): {name} must be a materialized linearkit Linear, got "
                        f"{type(layer).__name__}")


def fuse_qkv(q: Linear, k: Linear, v: Linear, *, probe=None):
    """``(fused, report)``: one ``Linear(d, dq+dk+dv)`` computing ``[q(x) | k(x) | v(x)]``.

    ``q``, ``k``, ``v``: ``Linear(d, dq)``, ``Linear(d, dk)``, ``Linear(d, dv)`` with the same
    ``d`` and dtype (ValueError naming the one that differs); they are not modified. Biases:
    all or none; a mix fills the missing ones with zeros (said in ``report.changed``), and
    ``split_qkv`` then gives all three a bias (zeros where there was none). The report compares
    the fused output with the three outputs concatenated on probe inputs (64 random rows plus
    ``probe``): the same dot products, so ``max_abs_error`` is 0 wherever the BLAS sums them in
    the same order for both shapes, and float32 rounding where it does not (OpenBLAS's Haswell
    kernel, at some sizes: ``max_rel_error`` about 1e-7).

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> from linearkit.transforms import fuse_qkv
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = lk.Linear(8, 8, rng=rng), lk.Linear(8, 2, rng=rng), lk.Linear(8, 2, rng=rng)
    >>> fused, report = fuse_qkv(q, k, v)
    >>> fused, report.max_abs_error
    (Linear(in_features=8, out_features=12, bias=True), 0.0)
    """
    for name, layer in zip(_NAMES, (q, k, v)):
        _check_linear(name, layer, "fuse_qkv")
    _same("in_features", [m.in_features for m in (q, k, v)], "fuse_qkv()")
    _same("dtype", [m.weight.dtype for m in (q, k, v)], "fuse_qkv()")
    w, b = fuse_qkv_weights(*(a for m in (q, k, v)
                              for a in (m.weight.data, None if m.bias is None else m.bias.data)))
    fused = linear_from(w, b, q.weight.dtype)
    sizes = [m.out_features for m in (q, k, v)]
    a, b_ = sizes[0], sizes[0] + sizes[1]
    changed = [(f"{', '.join(named(n, m) for n, m in zip(_NAMES, (q, k, v)))} -> "
                f"Linear({q.in_features}, {sum(sizes)}) laid out [q | k | v] = rows "
                f"[0:{a} | {a}:{b_} | {b_}:{sum(sizes)}]")]
    missing = [n for n, m in zip(_NAMES, (q, k, v)) if m.bias is None]
    if b is not None and missing:
        changed.append(f"{', '.join(repr(n) for n in missing)} had no bias: zeros fill "
                       f"{'its' if len(missing) == 1 else 'their'} part of the fused bias "
                       "(split_qkv then gives all three a bias)")
    report = finish("fuse_qkv", _Concat(q, k, v), fused, probe, changed, [],
                    [{"sizes": tuple(sizes), "bias": b is not None, "zero_filled": missing}])
    return fused, report


def split_qkv(fused: Linear, sizes=None, *, probe=None):
    """``((q, k, v), report)``: the rows of ``fused`` (``Linear(d, dq+dk+dv)``, layout
    ``[q | k | v]``) as three ``Linear`` layers, weights and biases copied (new contiguous
    arrays: editing a split layer leaves ``fused`` alone).

    ``sizes``: ``(dq, dk, dv)``, positive ints summing to ``out_features``; default three equal
    thirds (an ``out_features`` not divisible by 3 then needs ``sizes``). The report checks the
    three outputs concatenated against ``fused`` on probes (the weights are copied bitwise; the
    outputs agree exactly or to float32 rounding, as ``fuse_qkv``'s report says).
    """
    _check_linear("fused", fused, "split_qkv")
    n_out = fused.out_features
    if sizes is None:
        if n_out % 3:
            raise ValueError(f"split_qkv(): {named('fused', fused)} has out_features={n_out}, "
                             "not divisible by 3, so the parts cannot be equal thirds; pass "
                             "sizes=(dq, dk, dv) (grouped-query attention has dk = dv < dq)")
        sizes = (n_out // 3,) * 3
    sizes = tuple(sizes)
    if (len(sizes) != 3 or any(isinstance(s, bool) or not isinstance(s, (int, np.integer))
                               or s < 1 for s in sizes) or sum(sizes) != n_out):
        raise ValueError(f"split_qkv(): sizes must be three positive ints (dq, dk, dv) summing "
                         f"to out_features={n_out} of {named('fused', fused)}, got {sizes}")
    w = fused.weight.data
    b = None if fused.bias is None else fused.bias.data
    bounds = np.cumsum((0,) + sizes)
    parts = tuple(linear_from(w[lo:hi], None if b is None else b[lo:hi], w.dtype)
                  for lo, hi in itertools.pairwise(bounds))
    changed = [f"{named('fused', fused)} -> " + ", ".join(
        f"{n}: Linear({fused.in_features}, {s})" for n, s in zip(_NAMES, sizes))]
    report = finish("split_qkv", fused, _Concat(*parts), probe, changed, [],
                    [{"sizes": sizes, "bias": b is not None}])
    return parts, report

