"""Memory of linearkit's training step, traced with ``tracemalloc`` (NumPy reports its buffers to
it): growth across 1,000 steps (``cases.MEMORY_STEPS``), the transient peak of one step, and whether gradient buffers and
optimizer state are reused from one step to the next (the same memory, not fresh arrays)."""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np

from . import cases, data


def _arrays(obj):
    """Every ndarray reachable through dicts, lists and tuples."""
    if isinstance(obj, np.ndarray):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _arrays(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _arrays(value)


def _reused(before: list, after: list) -> bool | None:
    if not before or len(before) != len(after):
        return None
    return all(a is not None and b is not None and np.shares_memory(a, b)
               for a, b in zip(before, after))


def training_memory(lk, build_model, trainer, steps: int = 100) -> dict:
    r = cases.RECIPE
    sizes = (r["in"], r["hidden"], r["hidden"], r["classes"])
    batch = r["batch"]
    tracemalloc.start()
    try:
        model = build_model(sizes, residual=True)
        params = list(model.parameters())
        loss_fn = lk.CrossEntropyLoss()
        opt = lk.optim.Adam(params, lr=r["lr"])
        batches = data.classification_batches(batch, sizes[0], sizes[-1], data.rng(1))

        def step(i: int) -> tuple[list, list]:
            x, y = batches[i % len(batches)]
            pred, back = model.vjp(x, input_grad=False)
            _loss, loss_back = loss_fn.vjp(pred, y)
            back(loss_back())
            grads = [p.grad for p in params]
            opt.step()
            state = list(_arrays(getattr(opt, "state", {})))
            opt.zero_grad(set_to_none=False)  # as README: reuse the gradient buffers
            return grads, state

        for i in range(10):
            grads0, state0 = step(i)
        gc.collect()
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        grads1, state1 = step(10)
        one_step_peak = tracemalloc.get_traced_memory()[1] - base
        gc.collect()
        base = tracemalloc.get_traced_memory()[0]
        before = tracemalloc.take_snapshot()
        for i in range(11, 11 + steps):
            step(i)
        gc.collect()
        growth = tracemalloc.get_traced_memory()[0] - base
        diff = tracemalloc.take_snapshot().compare_to(before, "lineno")
    finally:
        tracemalloc.stop()
    act = batch * (2 * sizes[1] + 3 * sizes[2] + sizes[3])  # every module output of a forward
    return {
        "steps": steps,
        "growth_bytes": growth,
        "growth_per_step_bytes": growth / steps,
        "step_peak_bytes": one_step_peak,
        "activation_bytes": 4 * act,
        "param_bytes": 4 * sum(p.data.size for p in params),
        "grads_reused": _reused(grads0, grads1),
        "state_reused": _reused(state0, state1),
        "dtype_kept": all(p.data.dtype == np.float32 for p in params),
        "top_growth": [f"{stat.traceback[0].filename.rsplit('/', 2)[-1]}:"
                       f"{stat.traceback[0].lineno} {stat.size_diff:+d} B"
                       for stat in diff[:3] if stat.size_diff],
    }
