"""The precision group: a Linear whose parameters are stored in bfloat16 or float16 (computing in
float32, ``linearkit.precision``) against the same layer in float32, forward and forward+backward.

The dtypes run interleaved in one process — each round times every variant once, in an order
that rotates — so a burst of load on this shared machine slows all of them alike; a variant's
ratio is the median over rounds of its time over float32's time in the same round. Besides the
library's own path (the weight upcast block by block), ``<dtype>-whole`` converts the whole
weight at once (``functional.BLOCK_ELEMENTS_16BIT`` raised for that variant), to show whether
blocking is faster or only smaller; ``peak_bytes`` is tracemalloc's peak over one call, the
layer's temporaries and outputs (the float32 copy of the weight among them when it is whole).
"""

from __future__ import annotations

import statistics
import time
import tracemalloc

from . import cases, data

#: the variants, float32 first (the reference of every ratio)
VARIANTS = ("float32", "bfloat16", "float16", "bfloat16-whole", "float16-whole")


def _step(lk, x_shape, out_f: int, variant: str, backward: bool):
    """One call of the case: ``layer(x)``, or ``vjp`` + ``backward(dy)`` + ``zero_grad()``."""
    dtype = variant.split("-")[0]
    gen = data.rng(1)
    w, b = data.linear_params(x_shape[-1], out_f, data.rng())
    m = lk.Linear(x_shape[-1], out_f, dtype=dtype)
    m.weight.data[...] = w   # rounded to the storage dtype, to nearest even
    m.bias.data[...] = b
    x = data.uniform(x_shape, gen)
    dy = data.uniform(x_shape[:-1] + (out_f,), gen)

    def forward_backward():
        _, back = m.vjp(x)
        back(dy)
        m.zero_grad()

    return forward_backward if backward else (lambda: m(x))


def _whole(lk, variant: str):
    """A context in which ``variant`` runs: '-whole' converts a weight in one block."""
    F = lk.functional

    class _Ctx:
        def __enter__(self):
            self.saved = F.BLOCK_ELEMENTS_16BIT
            if variant.endswith("-whole"):
                F.BLOCK_ELEMENTS_16BIT = 1 << 62
            return self

        def __exit__(self, *exc):
            F.BLOCK_ELEMENTS_16BIT = self.saved

    return _Ctx()


def _peak(lk, step, variant: str) -> int:
    with _whole(lk, variant):
        step()
        tracemalloc.start()
        try:
            step()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()


def interleaved(lk, steps: dict, rounds: int, min_time: float) -> dict:
    """``{variant: {median_s, min_s, ratio, ratios, n}}``: per-call seconds over ``rounds``
    rounds of every variant, each repeat ``n`` calls lasting about ``min_time``."""
    counts = {}
    for variant, step in steps.items():
        with _whole(lk, variant):
            step()                                           # warm up: first-call costs
            start = time.perf_counter()
            step()
            one = max(time.perf_counter() - start, 1e-7)
        counts[variant] = max(1, round(min_time / one))
    times: dict[str, list[float]] = {v: [] for v in steps}
    order = list(steps)
    for r in range(rounds):
        shift = r % len(order)
        for variant in order[shift:] + order[:shift]:
            step, n = steps[variant], counts[variant]
            with _whole(lk, variant):
                start = time.perf_counter()
                for _ in range(n):
                    step()
                times[variant].append((time.perf_counter() - start) / n)
    base = times[order[0]]
    out = {}
    for variant, ts in times.items():
        ratios = [t / b for t, b in zip(ts, base)]
        out[variant] = {"median_s": statistics.median(ts), "min_s": min(ts), "n": counts[variant],
                        "repeats_s": ts, "ratio": statistics.median(ratios), "ratios": ratios}
    return out


def run(rec, lk) -> None:
    """Every case of ``cases.PRECISION``, forward and forward+backward, into ``rec``."""
    rounds = max(5, 2 * rec.cfg["repeats"])
    for x_shape, out_f in cases.PRECISION:
        for kind in ("fwd", "fwdbwd"):
            case = cases.large_id(kind, x_shape, out_f)
            try:
                steps = {v: _step(lk, x_shape, out_f, v, kind == "fwdbwd") for v in VARIANTS}
                result = interleaved(lk, steps, rounds, rec.cfg["min_time"])
                for v, step in steps.items():
                    result[v]["peak_bytes"] = _peak(lk, step, v)
            except Exception as err:  # noqa: BLE001 - reported in the table as "error"
                rec.fail(case, err)
                continue
            for v, res in result.items():
                rec.put(f"{case}:{v}", res)
