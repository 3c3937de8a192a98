"""The sweep group: one layer against batch size, and widths near a multiple of 8/16/64 -- two
popular claims, "small batches waste the hardware: sweep batch 1 to 64, find the knee" and
"250 -> 256 runs faster", measured here.

linearkit runs :func:`linearkit.analysis.layer_sweep.batch_sweep` / :func:`linearkit.analysis.layer_sweep.dim_sweep` (what
``linearkit sweep`` prints) under the default thread policy and at fixed BLAS thread counts
(``cases.SWEEP_THREADS``), because the policy (``linearkit.backend.threads``) runs a GEMM of fewer than
``SMALL_GEMM_MACS`` multiply-adds on one thread and a larger one on more: a width or batch step
that crosses that line changes the thread count as well as the shape. PyTorch runs the same
sweep (``nn.Linear``, its own threads) in its own process, timed by the same round-robin timer
(:func:`linearkit.analysis.timing.same_run_seconds`). Every result is a
:meth:`linearkit.analysis.layer_sweep.SweepResult.to_dict`-shaped dict.
"""

from __future__ import annotations

from . import cases


def _tag(threads: int | None) -> str:
    return "auto" if threads is None else f"{threads}t"


def linearkit_sweep(rec, lk) -> None:
    """Cases ``batch/auto``, ``batch/1t``, ``dims/auto``, ``dims/1t``, ``dims/2t`` (float32,
    forward and forward+backward) and ``policy`` (the thread policy's constants and state)."""
    from linearkit.analysis.layer_sweep import batch_sweep, dim_sweep, powers_of_two

    repeats = rec.cfg["sweep_repeats"]
    in_f, out_f = cases.SWEEP_LAYER
    batches = powers_of_two(cases.SWEEP_MAX_BATCH)
    for threads in cases.SWEEP_THREADS:
        tag = _tag(threads)
        if threads != 2:  # the batch sweep at 1 thread and under the policy (its switch)
            rec.guarded(f"batch/{tag}", lambda t=threads: {
                **batch_sweep(in_f, out_f, batches, backward=True, repeats=repeats,
                              threads=t).to_dict(), "policy": lk.threads.info()})
        rec.guarded(f"dims/{tag}", lambda t=threads: {
            **dim_sweep(list(cases.SWEEP_DIMS), cases.SWEEP_DIM_BATCH, backward=True,
                        repeats=repeats, threads=t).to_dict(), "policy": lk.threads.info()})
    rec.put("policy", lk.threads.info())


def _row(n: int, in_f: int, out_f: int, fwd_s: float, train_s: float) -> dict:
    flops = 2.0 * n * in_f * out_f
    return {"batch": n, "in_features": in_f, "out_features": out_f,
            "forward_ms": fwd_s * 1e3, "forward_samples_s": n / fwd_s,
            "forward_gflops": flops / fwd_s / 1e9, "train_ms": train_s * 1e3,
            "train_samples_s": n / train_s, "train_gflops": 3 * flops / train_s / 1e9}


def torch_sweep(rec, torch) -> None:
    """Cases ``batch/default`` and ``dims/default``: ``nn.Linear`` forward (``no_grad``) and
    forward+backward (``zero_grad``, forward, ``backward(dy)``, input gradient included, as
    linearkit's sweep step does), PyTorch's own thread count."""
    from linearkit.analysis.layer_sweep import find_knee, powers_of_two
    from linearkit.analysis.timing import same_run_seconds

    repeats = rec.cfg["sweep_repeats"]
    torch.manual_seed(0)

    def cases_for(shapes):
        fwd, train = [], []
        for n, in_f, out_f in shapes:
            layer = torch.nn.Linear(in_f, out_f)
            x = torch.randn(n, in_f, requires_grad=True)
            dy = torch.ones(n, out_f)

            def forward(layer=layer, x=x):
                with torch.no_grad():
                    layer(x)

            def step(layer=layer, x=x, dy=dy):
                layer.zero_grad()
                x.grad = None
                layer(x).backward(dy)

            fwd.append(forward)
            train.append(step)
        f = same_run_seconds(fwd, repeats)
        t = same_run_seconds(train, repeats)
        return [_row(n, i, o, a, b) for (n, i, o), a, b in zip(shapes, f, t)]

    def batch():
        in_f, out_f = cases.SWEEP_LAYER
        batches = powers_of_two(cases.SWEEP_MAX_BATCH)
        rows = cases_for([(n, in_f, out_f) for n in batches])
        return {"kind": "batch", "dtype": "float32", "backward": True,
                "threads": torch.get_num_threads(), "repeats": repeats, "rows": rows,
                "knee": find_knee(batches, [r["forward_samples_s"] for r in rows]),
                "knee_backward": find_knee(batches, [r["train_samples_s"] for r in rows])}

    def dims():
        n = cases.SWEEP_DIM_BATCH
        rows = cases_for([(n, d, d) for d in cases.SWEEP_DIMS])
        return {"kind": "dims", "dtype": "float32", "backward": True,
                "threads": torch.get_num_threads(), "repeats": repeats, "rows": rows}

    rec.guarded("batch/default", batch)
    rec.guarded("dims/default", dims)
