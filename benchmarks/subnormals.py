"""Subnormal floats in Adam's state, measured on the ``linearkit train`` recipe.

``python -m benchmarks.subnormals [--steps N]`` trains the recipe model (40-100-res(100)-10,
Adam lr 1e-2, batch 100, the benchmarks' synthetic data) for N steps, then reports for each
parameter the fraction of ``exp_avg`` / ``exp_avg_sq`` entries that are subnormal, and times
``optimizer.step()`` on that state: as it is, under ``lk.set_flush_denormal(True)``, and after
the subnormals were set to 0 (what flushing leaves), interleaved, median of quiet repeats.
docs/fast.md quotes a run.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import numpy as np

from . import cases, impl_linearkit, impl_numpy


def _median_us(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=400)
    args = parser.parse_args(argv)
    impl_linearkit.check()
    lk = impl_linearkit.lk
    sizes, r = impl_linearkit.recipe_parts()
    model = impl_linearkit.build_model(sizes, residual=True)
    opt = lk.optim.Adam(model.parameters(), lr=r["lr"])
    loss_fn = lk.CrossEntropyLoss()
    next_batch = impl_numpy.recipe_stream()
    for _ in range(args.steps):
        lk.loop.step(model, loss_fn, opt, *next_batch())
    tiny = np.finfo(np.float32).tiny
    print(f"after {args.steps:,} steps of the recipe ({cases.RECIPE['batch']} rows, "
          f"lr {r['lr']}):")
    total = 0
    for name, p in model.named_parameters():
        state = opt.state[p]
        parts = []
        for key in ("exp_avg", "exp_avg_sq"):
            a = state[key]
            sub = int(np.count_nonzero((a != 0) & (np.abs(a) < tiny)))
            total += sub
            parts.append(f"{key} {sub:,}/{a.size:,} subnormal ({100 * sub / a.size:.0f}%)")
        print(f"  {name:<16} " + ", ".join(parts))
    # Time the step on copies of this state: gradients fixed, so every repeat does the same work.
    models = {}
    for variant in ("as is", "flushing", "zeroed"):
        m = copy.deepcopy(model)
        o = lk.optim.Adam(m.parameters(), lr=r["lr"])
        o.load_state_dict(copy.deepcopy(opt.state_dict()))
        for p, q in zip(m.parameters(), model.parameters()):
            p.grad = q.grad.copy()
        if variant == "zeroed":
            for state in o.state.values():
                for key in ("exp_avg", "exp_avg_sq"):
                    a = state[key]
                    a[np.abs(a) < tiny] = 0
        models[variant] = o
    timings = {k: [] for k in models}
    for _ in range(5):
        for variant, o in models.items():
            if variant == "flushing":
                lk.set_flush_denormal(True)
            try:
                timings[variant].append(_median_us(o.step, args.repeats // 5))
            finally:
                lk.set_flush_denormal(False)
    print(f"{total:,} subnormal state entries; Adam.step() (µs, median):")
    for variant, values in timings.items():
        print(f"  {variant:<9} {statistics.median(values):8.1f}")
    print("load average (1/5/15 min): " + "/".join(f"{x:.1f}" for x in os.getloadavg()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
