"""The ledger's fallback for a linearkit module type it has no rule for: run it once, for real.

The module's ``vjp`` runs on a copy, on zeros; calls of known layers inside are recorded (and
costed by their rules), and the bytes the returned backward closure holds are measured by walking
the closure. The model is left exactly as it was.
"""

from __future__ import annotations

import copy

import numpy as np

from ...errors import _Located
from ...layers import Linear
from ...module import Module, Parameter
from .linearkit_layers import describe, layer_cost, linear_info

__all__ = ["run_custom"]


def run_custom(lpass, m, i, path, x, need, depth):
    """A module type the ledger has no rule for: run its real vjp once, on a copy.

    The copy shares the parameters (nothing is copied but buffers), the library's random
    generator is restored afterwards, so the model is left exactly as it was. Known layers
    called inside are recorded and costed by their rules; the bytes the returned closure
    holds are measured by walking it. ``lpass`` is the running pass (its ``acc``, ``itemsize``,
    ``nbytes`` and ``params_of``); returns the output's shape and its buffer key (None: new).
    """
    from ... import random as lk_random

    acc, row = lpass.acc, lpass.acc.rows[i]
    row.kind = "custom"
    memo = {id(p): p for p in m.parameters()}
    clone = copy.deepcopy(m, memo)
    records, originals = [], dict(m.named_modules())
    dtype = next((p.dtype for p in m.parameters()), np.dtype(np.float32))
    for sub_path, sub in clone.named_modules():
        if sub is not clone:
            _record(sub, sub_path, records)
    gen = lk_random.default_generator()
    state = gen.bit_generator.state
    x0 = np.zeros(x.shape, dtype)
    try:
        try:
            y, back = clone.vjp(x0, input_grad=need)
        except NotImplementedError:
            back, y = None, clone(x0)
            row.note = "no vjp(): forward only"
    except _Located as err:
        sub_path = next((p for p, s in clone.named_modules() if s is err.module), None)
        if sub_path is not None:
            err.module = originals.get(sub_path, m)
        raise
    finally:
        gen.bit_generator.state = state
    y = np.asarray(y)
    for rec in records:
        sub_path, xs, ys, ig = rec["path"], rec["x"], rec["y"], rec["need"]
        orig = originals[sub_path]
        if ys is None:
            continue
        cost = layer_cost(orig, xs, ig)
        if any(True for _ in orig.children()):  # containers: only their own arithmetic
            if cost is not None:
                acc.add_cost(i, cost)
            continue
        full = f"{path}.{sub_path}" if path else sub_path
        if cost is None:
            acc.unaccounted.append(full)
            continue
        j = acc.row(full, describe(orig), depth + 1 + sub_path.count("."),
                    kind="linear" if isinstance(orig, Linear) else "layer", input_shape=xs,
                    output_shape=ys, output_bytes=lpass.nbytes(ys),
                    note="saved bytes counted at the custom parent")
        if isinstance(orig, Linear):
            acc.rows[j].info = linear_info(orig)
            acc.linear_weights[j] = orig.weight.data
        acc.own_params(j, lpass.params_of(orig))
        acc.add_cost(j, cost)
        acc.roll_up(i, [j])
    acc.own_params(i, [(id(p), p.numel(), p.requires_grad) for p in m.parameters()
                       if id(p) not in acc.param_owner])  # those no recorded layer owns
    if back is not None:
        exclude = {id(p.data) for p in m.parameters()} | {id(b) for b in m.buffers()}
        ratio = lpass.itemsize / dtype.itemsize
        for arr in _closure_arrays(back, exclude):
            key = x.key if arr is x0 else ("custom", i, id(arr))
            acc.keep(i, key, int(arr.nbytes * ratio))
    row.note = (row.note + "; " if row.note else "") + "custom module: run once on zeros"
    return y.shape, (x.key if y is x0 else None)


def _record(sub, sub_path, records):
    """Record each call of ``sub`` (pre-order: the entry is made before the call runs)."""
    orig_vjp, orig_fwd = sub.vjp, sub.forward

    def call(method, x, need, args, kwargs):
        rec = {"path": sub_path, "x": np.shape(x), "y": None, "need": need}
        records.append(rec)
        out = method(x, *args, **kwargs)
        rec["y"] = np.shape(out[0] if method is orig_vjp else out)
        return out

    def vjp(x, input_grad=True, *args, **kwargs):
        return call(orig_vjp, x, input_grad, (input_grad,) + args, kwargs)

    def forward(x, *args, **kwargs):
        return call(orig_fwd, x, False, args, kwargs)

    object.__setattr__(sub, "vjp", vjp)
    object.__setattr__(sub, "forward", forward)


def _closure_arrays(fn, exclude=frozenset()) -> list[np.ndarray]:
    """The distinct arrays (by underlying buffer) a closure keeps alive, parameters excluded."""
    found: dict[int, np.ndarray] = {}
    seen: set[int] = set()
    stack = [fn]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, Module | Parameter):
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            root = obj
            while isinstance(root.base, np.ndarray):
                root = root.base
            if id(root) not in exclude and id(obj) not in exclude:
                found[id(root)] = root
        elif callable(obj) and getattr(obj, "__closure__", None):
            stack.extend(c.cell_contents for c in obj.__closure__ if _filled(c))
        elif isinstance(obj, list | tuple | set):
            stack.extend(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
    return list(found.values())


def _filled(cell) -> bool:
    """False for a closure cell whose variable was never assigned."""
    try:
        _ = cell.cell_contents
    except ValueError:
        return False
    return True
