"""The README's performance paragraph, written by ``python -m benchmarks --write-docs`` from the
same run as docs/performance.md, between ``BEGIN`` and ``END``, so that its figures are that
page's and change only when it does.

It states what a user meets first — the end-to-end time of ``linearkit train``, warm and on
the first run after an install (an empty kernel cache), against the same recipe in PyTorch and
in JAX — and the step ratios behind it: the recipe's step and the MLP 784-256-256-10's, against
JAX jit and PyTorch fused Adam (the faster of its thread counts: ``report.torch_fused``).
"""

from __future__ import annotations

from . import cases
from .report import View, _ok, div, num, page_header, ratio, torch_fused

__all__ = ["BEGIN", "END", "render", "replace_block"]

BEGIN = "<!-- begin: written by python -m benchmarks --write-docs, do not edit by hand -->"
END = "<!-- end: written by python -m benchmarks --write-docs -->"


def _seconds(t) -> str:
    return f"{num(t, 2)} s" if _ok(t) else "n/a"


def render(results: dict) -> str:
    """The paragraph (markdown, no markers) from a run's results (``run.measure_all``)."""
    v = View(results)
    meta = v.meta
    lk_ = v.get("e2e", "linearkit", "train") or {}
    warm = lk_.get("median_s")
    cold = (v.get("e2e", "linearkit", "train-cold") or {}).get("median_s")
    cold_over = lk_.get("cold_over_warm") or div(cold, warm)
    torch_e2e = v.seconds("e2e", "torch", "train-fused")
    jax_e2e = v.seconds("e2e", "jax", "train")
    recipe_jax = v.ratio("recipe", ("jax", "train"), ("linearkit", "train-cli"))
    recipe_torch = v.ratio("recipe", ("torch", "train"), ("linearkit", "train-cli"))
    batches = cases.MLP_TRAIN_BATCHES
    mlp_torch, mlp_jax = [], []
    for batch in batches:
        fused = torch_fused(v, "mlp", batch)
        mlp_torch.append(v.ratio("mlp", ("torch", fused.step), ("linearkit", f"train:{batch}")))
        mlp_jax.append(v.ratio("mlp", ("jax", f"train:{batch}"), ("linearkit", f"train:{batch}")))
    info = results.get("runs", {}).get("clean", {}).get("info") or {}
    host = (f"{info['cpu']} ({info.get('usable_cores')} usable cores)" if info.get("cpu")
            else "this machine")
    load = meta.get("load_before")
    load = f", load average {load[0]:.1f} before the run" if load else ""
    steps = lk_.get("steps") or meta.get("config", {}).get("recipe_steps")
    per_batch = "/".join(str(b) for b in batches)
    return (
        f"End to end — a fresh process: start-up, data, {num(steps)} steps, evaluation, saving — "
        f"`linearkit train` takes **{_seconds(warm)}**, and its first run after an install (an "
        f"empty kernel cache) **{_seconds(cold)}** ({ratio(cold_over)} a warm run: it trains on "
        "the NumPy path while numba compiles the kernels in the background for the next run, "
        "[docs/fast.md](docs/fast.md)), against "
        f"**{_seconds(torch_e2e)}** for the same recipe in PyTorch eager with fused Adam and "
        f"**{_seconds(jax_e2e)}** in JAX with the step `jit`-compiled (its compile included). "
        f"One step of the recipe: **{ratio(recipe_jax)}** JAX jit's speed, {ratio(recipe_torch)} "
        "PyTorch eager's; the MLP 784-256-256-10 with Adam at batch "
        f"{per_batch}: {'/'.join(ratio(r) for r in mlp_torch)} PyTorch fused Adam's (the faster of "
        f"its default threads and one thread), {'/'.join(ratio(r) for r in mlp_jax)} JAX jit's. "
        f"Measured on {host}{load}; every figure, every target met or missed, and which part of "
        "a ratio is the host's BLAS and which the library, in "
        "[docs/performance.md](docs/performance.md) ("
        + page_header(meta).removeprefix("> G").replace("enerated", "generated", 1).rstrip(".")
        + ")."
    )


def replace_block(text: str, block: str) -> str:
    """``text`` (the README) with what lies between its markers replaced by ``block``."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the README lacks the markers {BEGIN!r} ... {END!r}")
    return text[:start + len(BEGIN)] + "\n" + block + "\n" + text[end:]
