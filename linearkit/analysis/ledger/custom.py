"""The ledger's fallback for a linearkit module type it has no rule for: run it once, for real.

The module's ``vjp`` runs on a copy, on zeros; the calls of known layers inside are observed
through call hooks (``linearkit.core.hooks.observe``) and costed by their rules, and the bytes the
returned backward closure holds are measured by walking the closure. The model is left exactly
as it was.
"""

from __future__ import annotations

import copy

import numpy as np

from ... import precision as P
from ...core import hooks
from ...core.closures import kept_arrays
from ...errors import Located
from .linearkit_layers import add_note, describe, fill_row, rule_for

__all__ = ["run_custom"]


def run_custom(lpass, m, i, path, x, need, depth):
    """A module type the ledger has no rule for: run its real vjp once, on a copy.

    The copy shares the parameters (nothing is copied but buffers), the library's random
    generator is restored afterwards, so the model is left exactly as it was. Known layers
    called inside are recorded and costed by their rules; the bytes the returned closure
    holds are measured by walking it. ``lpass`` is the running pass (its ``acc``, ``override``,
    ``nbytes`` and ``params_of``); returns the output's shape, dtype and buffer key (None: new).

    It runs on zeros of ``x.dtype`` (the compute dtype) under the precision policy in force, so
    the closure's arrays are measured in the dtypes they are really kept in; under a
    ``dtype=`` override they are scaled to the override's compute dtype.
    """
    from ...core import random as lk_random

    acc, row = lpass.acc, lpass.acc.rows[i]
    row.kind = "custom"
    memo = {id(p): p for p in m.parameters()}
    clone = copy.deepcopy(m, memo)
    originals = dict(m.named_modules())
    own = next((p.dtype for p in m.parameters()), None)
    # the dtype it really computes in (x.dtype is the override's compute dtype under one)
    dtype = x.dtype if lpass.override is None or own is None else P.compute_dtype(own)
    gen = lk_random.default_generator()
    state = gen.bit_generator.state
    x0 = np.zeros(x.shape, dtype)
    records, observed = _recorder(clone)
    try:
        with observed:
            try:
                y, back = clone.vjp(x0, input_grad=need)
            except NotImplementedError:
                back, y = None, clone(x0)
                row.note = "no vjp(): forward only"
    except Located as err:
        sub_path = next((p for p, s in clone.named_modules() if s is err.module), None)
        if sub_path is not None:
            err.module = originals.get(sub_path, m)
        raise
    finally:
        gen.bit_generator.state = state
    y = np.asarray(y)
    ratio = x.dtype.itemsize / dtype.itemsize  # 1 without an override

    def counted(real):  # a dtype the copy really made, as the pass counts it
        real = np.dtype(real)
        return x.dtype if lpass.override is not None and P.is_float(real) else real

    for rec in records:
        sub_path, xs, ys, ig = rec["path"], rec["x"], rec["y"], rec["need"]
        orig = originals[sub_path]
        if ys is None:
            continue
        rule = rule_for(orig)
        if any(True for _ in orig.children()):  # containers: only their own arithmetic
            if rule is not None and rule.cost is not None:
                acc.add_cost(i, rule.cost(orig, xs, ig))
            continue
        full = f"{path}.{sub_path}" if path else sub_path
        if rule is None or rule.cost is None:
            acc.unaccounted.append(full)
            continue
        j = acc.row(full, describe(orig, rule), depth + 1 + sub_path.count("."), input_shape=xs,
                    output_shape=ys, output_bytes=lpass.nbytes(ys, counted(rec["dtype"])),
                    note="saved bytes counted at the custom parent")
        acc.own_params(j, lpass.params_of(orig))
        fill_row(acc, j, rule, orig, xs, ig)  # no keys: the parent's closure is measured
        acc.roll_up(i, [j])
    acc.own_params(i, [(id(p), p.numel(), p.requires_grad) for p in m.parameters()
                       if id(p) not in acc.param_owner])  # those no recorded layer owns
    if any(acc.param_owner.get(id(p)) == path for p in m.parameters()):
        # parameters no recorded layer uses: arithmetic of its own, which no rule counts
        acc.unaccounted.append(path)
        add_note(row, f"own FLOPs unknown: no rule for {type(m).__name__}")
    if back is not None:
        exclude = {id(p.data) for p in m.parameters()} | {id(b) for b in m.buffers()}
        for arr in _closure_arrays(back, exclude):
            key = x.key if arr is x0 else ("custom", i, id(arr))
            acc.keep(i, key, int(arr.nbytes * ratio) if P.is_float(arr.dtype) else arr.nbytes)
    add_note(row, "custom module: run once on zeros")
    return y.shape, counted(y.dtype), (x.key if y is x0 else None)


def _recorder(clone):
    """Records of each call of a module inside ``clone`` (pre-order: an entry is made before
    the call runs) and the ``observe`` context that makes them, through call hooks."""
    paths = {id(sub): p for p, sub in clone.named_modules() if sub is not clone}
    records, open_calls = [], []

    def pre(mod, args, kwargs):
        if id(mod) not in paths:
            return
        x = args[0] if args else next((v for k, v in kwargs.items() if k != "input_grad"), None)
        # Under vjp() the hooks' kwargs hold input_grad; under module(x) they are empty.
        rec = {"path": paths[id(mod)], "x": np.shape(x), "y": None, "dtype": np.float32,
               "need": bool(kwargs.get("input_grad", False))}
        records.append(rec)
        open_calls.append(rec)

    def post(mod, args, kwargs, out):
        if id(mod) in paths:
            rec = open_calls.pop()
            rec["y"], rec["dtype"] = np.shape(out), getattr(out, "dtype", np.float32)

    return records, hooks.observe(clone, forward_pre=pre, forward=post, with_kwargs=True)


def _closure_arrays(fn, exclude=frozenset()) -> list[np.ndarray]:
    """The distinct arrays (by underlying buffer) a closure keeps alive, parameters excluded."""
    found: dict[int, np.ndarray] = {}
    for obj in kept_arrays(fn):
        root = obj
        while isinstance(root.base, np.ndarray):
            root = root.base
        if id(root) not in exclude and id(obj) not in exclude:
            found[id(root)] = root
    return list(found.values())
