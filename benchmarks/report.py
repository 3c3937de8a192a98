"""Tables and targets from the workers' results, as plain text (terminal) or Markdown (docs).

Every number comes from the results dict built by ``benchmarks.run`` (or loaded with
``--from-json``); nothing here is typed by hand but the performance targets themselves (their
limits live in ``benchmarks.cases``).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from . import cases
from .machine import summary as machine_line
from .paired import pair_key

FW_NAMES = {"numpy": "NumPy", "linearkit": "linearkit", "torch": "PyTorch", "jax": "JAX jit"}


# ----------------------------------------------------------------------------- access
class View:
    """The results of one pass; the ``forced`` pass takes NumPy and linearkit from the forced
    run and everything else (PyTorch, JAX, footprint, ...) from the clean one."""

    def __init__(self, results: dict, name: str = "clean"):
        runs = results.get("runs", {})
        clean = runs.get("clean", {})
        self.name = name
        self.meta = results.get("meta", {})
        if name == "forced":
            forced = runs.get("forced", {})
            self.info = forced.get("info", {})
            self.runs = {g: dict(fws) for g, fws in clean.items() if g != "info"}
            for group, fws in forced.items():
                if group != "info":
                    self.runs.setdefault(group, {}).update(fws)
            self.runs = {g: fws for g, fws in self.runs.items() if g in cases.BLAS_GROUPS}
        else:
            self.info = clean.get("info", {})
            self.runs = {g: fws for g, fws in clean.items() if g != "info"}
        self.notes: list[str] = []

    def worker(self, group: str, fw: str) -> dict | None:
        return self.runs.get(group, {}).get(fw)

    def get(self, group: str, fw: str, case: str) -> dict | None:
        w = self.worker(group, fw)
        if w is None:
            return None
        res = w.get("results", {}).get(case)
        if res is None:
            reason = (w.get("unavailable") or w.get("failed") or w.get("errors", {}).get(case)
                      or w.get("errors", {}).get("*") or "not measured")
            note = f"{FW_NAMES.get(fw, fw)} {group}/{case}: {reason}"
            if note not in self.notes:
                self.notes.append(note)
        return res

    def seconds(self, group: str, fw: str, case: str) -> float | None:
        res = self.get(group, fw, case)
        return None if res is None else res.get("median_s")

    def ratio(self, group: str, over: tuple[str, str], under: tuple[str, str]) -> float | None:
        """The time of ``over`` over that of ``under``, each a ``(framework, case)`` of
        ``group``: the median of the ratios of their repeats taken in turn (benchmarks/paired.py)
        when they were, else the ratio of the two medians."""
        rounds = self.paired_ratios(group, over, under)
        if rounds:
            return statistics.median(r for rs in rounds for r in rs)
        return div(self.seconds(group, *over), self.seconds(group, *under))

    def paired_ratios(self, group: str, over: tuple[str, str],
                      under: tuple[str, str]) -> list[list[float]]:
        """Per round, the ratios of the k-th repeats of ``over`` and ``under`` (each a
        ``(framework, case)``); empty unless both ran in the same interleaved run."""
        wa, wb = self.worker(group, over[0]), self.worker(group, under[0])
        if not wa or not wb or under[0] not in (wa.get("paired") or ()) \
                or over[0] not in (wb.get("paired") or ()) \
                or pair_key(over[1]) != pair_key(under[1]):
            return []
        a, b = self.get(group, *over), self.get(group, *under)
        if a is None or b is None:
            return []
        out = []
        for ra, rb in zip(a.get("round_repeats_s") or [a.get("repeats_s")],
                          b.get("round_repeats_s") or [b.get("repeats_s")]):
            if ra and rb and len(ra) == len(rb):
                out.append([x / y for x, y in zip(ra, rb) if _ok(x) and _ok(y) and y > 0])
        return [rs for rs in out if rs]

    def has(self, group: str) -> bool:
        return group in self.runs


# ----------------------------------------------------------------------------- formatting
def _ok(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def us(s) -> str:
    if not _ok(s):
        return "n/a"
    v = s * 1e6
    return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:,.0f}"


def rate(x) -> str:
    if not _ok(x):
        return "n/a"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"


def ratio(x) -> str:
    return f"{x:.2f}×" if _ok(x) else "n/a"


def pct(x) -> str:
    return f"{100 * x:.0f}%" if _ok(x) else "n/a"


def num(x, digits: int = 0) -> str:
    return f"{x:,.{digits}f}" if _ok(x) else "n/a"


def div(a, b):
    return a / b if _ok(a) and _ok(b) and b != 0 else None


def at_least(value, target: float) -> str:
    if not _ok(value):
        return "n/a"
    if value >= target:
        return f"MET (+{100 * (value / target - 1):.0f}%)"
    return f"MISSED by {100 * (1 - value / target):.0f}%"


def at_most(value, limit: float) -> str:
    if not _ok(value):
        return "n/a"
    if value <= limit:
        return f"MET ({100 * (1 - value / limit):.0f}% under)"
    return f"MISSED: {100 * (value / limit - 1):.0f}% over"


def flag(ok) -> str:
    return "n/a" if ok is None else "MET" if ok else "MISSED"


# ----------------------------------------------------------------------------- sections
def _section(title, header, rows, intro="", notes=()):
    return {"title": title, "intro": intro, "header": header, "rows": rows, "notes": list(notes)}


def large_section(v: View):
    rows = []
    for x_shape, out_f in cases.LARGE:
        for kind in ("fwd", "fwdbwd"):
            case = cases.large_id(kind, x_shape, out_f)
            flops = cases.linear_flops(x_shape, out_f, kind == "fwdbwd")
            gf = {fw: div(flops / 1e9, v.seconds("large", fw, case))
                  for fw in ("numpy", "linearkit", "torch", "jax")}
            into = div(flops / 1e9, v.seconds("large", "numpy", f"{case}:out"))
            row = [(f"{'fwd+bwd' if kind == 'fwdbwd' else 'fwd'} {cases.shape_name(x_shape)} "
                   f"-> {out_f}"), num(gf["numpy"])]
            for fw in ("linearkit", "torch", "jax"):
                row += [num(gf[fw]), pct(div(gf[fw], gf["numpy"]))]
            row += [num(into), pct(div(gf["linearkit"], into))]
            rows.append(row)
    return _section(
        "1. Large layers (GFLOP/s; % of bare NumPy)",
        ["case", "NumPy", "linearkit", "% NumPy", "PyTorch", "% NumPy", "JAX", "% NumPy",
         "NumPy out=", "linearkit % of out="], rows,
        "Linear forward and forward+backward (dX, dW, db). FLOPs: 2·M·K·N per GEMM. NumPy: one "
        "2-D GEMM, bias in place, every output a fresh array (`y = x2 @ W.T; y += b`; "
        "`dy2 @ W`, `dy2.T @ x2`, `dy2.sum(0)`), the contract of `layer(x)` and of PyTorch. "
        "NumPy out=: the same GEMMs into preallocated buffers, which no layer returning its "
        "result can do; the difference is the cost of fresh pages. linearkit: `layer(x)`; `vjp` "
        "+ `backward(dy)` + `zero_grad()`; its forward writes b into the fresh y and lets the "
        "GEMM add into it (one pass over y where NumPy's way makes three: docs/fast.md). "
        "PyTorch: `F.linear` (no_grad) and autograd. JAX: jitted.",
        notes=_policy_notes(v, "large"))


# what each per-case count of linearkit's BLAS-thread policy in --serve says (benchmarks/worker.py)
_POLICY_COUNTS = {
    "timed_backoffs": ("took threads away during timed repeats (the host or another process "
                       "kept a core busy at one of its looks), times per round"),
    "reduced_starts": ("had not given the threads back when a timed repeat started (its "
                       "warm-up still saw a busy core), repeats per round"),
}


def _policy_notes(v: View, group: str) -> list[str]:
    """How often linearkit's BLAS-thread policy backed off during the timed repeats of
    ``group``'s cases, and how many of those repeats started with it backed off, per round: a
    repeat where either happened ran some GEMMs on fewer threads."""
    results = sorted(((v.worker(group, "linearkit") or {}).get("results") or {}).items())
    notes = []
    for key, what in _POLICY_COUNTS.items():
        counts = []
        for case, res in results:
            rounds = res.get(f"round_{key}") or [res.get(key)]
            if any(rounds):
                counts.append(f"{case} " + " / ".join("n/a" if c is None else str(c)
                                                       for c in rounds))
        if counts:
            notes.append(f"linearkit's BLAS-thread policy {what}: " + "; ".join(counts) + ".")
    return notes


def precision_section(v: View):
    rows = []
    for x_shape, out_f in cases.PRECISION:
        for kind in ("fwd", "fwdbwd"):
            case = cases.large_id(kind, x_shape, out_f)
            got = {var: v.get("precision", "linearkit", f"{case}:{var}")
                   for var in ("float32", "bfloat16", "float16", "bfloat16-whole",
                               "float16-whole")}
            label = (f"{'fwd+bwd' if kind == 'fwdbwd' else 'fwd'} "
                     f"{cases.shape_name(x_shape)} -> {out_f}")
            row = [label, ms((got["float32"] or {}).get("median_s"))]
            for var in ("bfloat16", "float16"):
                r, whole = got[var] or {}, got[f"{var}-whole"] or {}
                row += [ms(r.get("median_s")), ratio(r.get("ratio")), ratio(whole.get("ratio")),
                        f"{mib(r.get('peak_bytes'))} / {mib(whole.get('peak_bytes'))}"]
            rows.append(row)
    return _section(
        "1b. 16-bit storage: Linear in bfloat16 / float16 vs float32 (ms; ratio to float32)",
        ["case", "float32", "bf16", "bf16/f32", "bf16 whole/f32",
         "bf16 peak MiB (blocked / whole)", "fp16", "fp16/f32", "fp16 whole/f32",
         "fp16 peak MiB (blocked / whole)"],
        rows,
        "`Linear(1024, 4096, dtype=...)`: parameters stored in 16 bits, GEMMs in float32 "
        "(`linearkit.precision`); `layer(x)`; `vjp` + `backward(dy)` + `zero_grad()`. The "
        "variants run interleaved in one process; a ratio is the median over rounds of the "
        "variant's time over float32's in the same round. *whole*: the weight upcast in one "
        "piece instead of blocks of 1M elements; peak: tracemalloc over one call.")


def ms(s) -> str:
    return f"{s * 1e3:.1f}" if _ok(s) else "n/a"


def mib(b) -> str:
    return f"{b / 2**20:.0f}" if _ok(b) else "n/a"


def small_section(v: View):
    rows = []
    for kind, label in (("fwd", "forward"), ("fwdbwd", "forward+backward")):
        t = {fw: v.seconds("small", fw, kind) for fw in ("numpy", "linearkit", "torch", "jax")}
        over = None if not (_ok(t["linearkit"]) and _ok(t["numpy"])) else \
            t["linearkit"] - t["numpy"]
        rows.append([label, us(t["numpy"]), us(t["linearkit"]), us(over), us(t["torch"]),
                     us(t["jax"])])
    x_shape, out_f = cases.SMALL
    return _section(
        f"2. Small calls: Linear({x_shape[-1]}, {out_f}) on x {x_shape} (µs per call)",
        ["call", "NumPy", "linearkit", "linearkit overhead", "PyTorch", "JAX jit"], rows,
        "linearkit overhead = linearkit − bare NumPy: the library's own Python bookkeeping. "
        "Forward+backward: `vjp` then `backward(dy)`, gradients accumulating (as autograd's do).")


def batch1_section(v: View):
    rows = []
    for in_f, out_f in cases.BATCH1:
        key = f"{in_f}->{out_f}"
        lk_t = v.seconds("batch1", "linearkit", f"bwd:{key}")
        pt_t = v.seconds("batch1", "torch", f"bwd:{key}")
        rows.append([f"Linear({in_f}, {out_f}), x (1, {in_f})",
                     us(v.seconds("batch1", "numpy", f"bwd:{key}")),
                     us(v.seconds("batch1", "numpy", f"bwd-gemm:{key}")),
                     us(lk_t), us(pt_t),
                     ratio(v.ratio("batch1", ("torch", f"bwd:{key}"), ("linearkit", f"bwd:{key}")))])
    return _section(
        "3. Batch-1 backward (µs per backward: dX, dW, db)",
        ["layer", "NumPy outer", "NumPy dy.T@x", "linearkit", "PyTorch", "PyTorch/linearkit"],
        rows, "Backward only: the forward closures/graphs are built outside the timed region. "
        "`NumPy dy.T@x` is the K=1 GEMM path that OpenBLAS runs slowly.")


def mlp_sections(v: View):
    fws = [("numpy", "train"), ("linearkit", "train"), ("torch", "train"), ("jax", "train")]
    rows = []
    for batch in cases.MLP_TRAIN_BATCHES:
        sps = {(fw, c): div(batch, v.seconds("mlp", fw, f"{c}:{batch}")) for fw, c in fws}
        fused = torch_fused(v, "mlp", batch)
        rows.append([str(batch)] + [rate(sps[k]) for k in fws[:3]] +
                    [rate(div(batch, v.seconds("mlp", "torch", fused.step))), fused.words,
                     rate(sps[("jax", "train")]),
                     ratio(v.ratio("mlp", ("torch", fused.step), ("linearkit", f"train:{batch}"))),
                     ratio(v.ratio("mlp", ("jax", f"train:{batch}"), ("linearkit", f"train:{batch}")))])
    train = _section(
        "4a. MLP 784-256-256-10 training, Adam, float32 (samples/s)",
        ["batch", "NumPy", "linearkit", "PyTorch", "PyTorch fused Adam", "its threads",
         "JAX jit", "lk / PT fused", "lk / JAX"], rows,
        "One step: forward, cross-entropy, backward, Adam (lr 1e-3), zero_grad; synthetic data. "
        "PyTorch's default Adam on CPU is its per-parameter for-loop; `fused=True` its fused "
        f"kernel, {TORCH_FUSED_WORDS}. NumPy: a hand-written loop, every buffer preallocated, "
        "one flat Adam. How much of each ratio is the machine's BLAS and how much the library: "
        "4c and 4d.")
    rows = []
    for batch in cases.MLP_INFER_BATCHES:
        runs = (("numpy", f"infer:{batch}"), ("linearkit", f"infer:{batch}"),
                ("linearkit", f"infer-no-kernels:{batch}"), ("torch", f"infer:{batch}"),
                ("jax", f"infer:{batch}"))
        _, ours, ours_no_kernels, torch_run, jax_run = runs
        rows.append([str(batch)] + [f"{rate(div(batch, s))} ({us(s)} µs)"
                                    for s in (v.seconds("mlp", *run) for run in runs)] +
                    [ratio(v.ratio("mlp", torch_run, ours)),
                     ratio(v.ratio("mlp", torch_run, ours_no_kernels)),
                     ratio(v.ratio("mlp", jax_run, ours))])
    infer = _section(
        "4b. MLP 784-256-256-10 inference (samples/s, µs per call)",
        ["batch", "NumPy", "linearkit", "linearkit, no kernels", "PyTorch", "JAX jit",
         "lk / PT", "lk no kernels / PT", "lk / JAX"], rows,
        "Forward only: linearkit `model(x)` in eval mode; PyTorch under `inference_mode`. "
        "*linearkit* runs the chain as one compiled call (fast.md), the kernels being loaded in "
        "its process by the group's training cases; *no kernels* is the same call under "
        "`LINEARKIT_FAST=0`, the NumPy path that a process running inference alone takes (a "
        "forward never imports numba) and so does an install without the `fast` extra.")
    return [train, infer]


def recipe_section(v: View):
    steps = v.meta.get("config", {}).get("recipe_steps", 6000)
    rows = []
    for fw, case, label in (("linearkit", "train-cli", "linearkit.recipes.train_mnist1d.train (`linearkit train`)"),
                            ("linearkit", "train", "linearkit, documented step loop"),
                            ("linearkit", "train-parts",
                             "linearkit, step loop, the step's kernels called one by one"),
                            ("linearkit", "train-thin",
                             "linearkit, step loop without the compiled chain (thin path)"),
                            ("linearkit", "train-flush",
                             "linearkit, step loop under lk.set_flush_denormal(True)"),
                            ("torch", "train", "PyTorch eager (default Adam)"),
                            ("torch", "train-fused", "PyTorch eager (fused Adam)"),
                            ("numpy", "train", "hand-written NumPy"),
                            ("jax", "train", "JAX jit"),
                            ("linearkit", "train-1thread", "linearkit, BLAS on 1 thread"),
                            ("numpy", "train-1thread", "hand-written NumPy, BLAS on 1 thread"),
                            ("torch", "train-1thread", "PyTorch eager, torch.set_num_threads(1)"),
                            ("torch", "train-fused-1thread",
                             "PyTorch eager (fused Adam), torch.set_num_threads(1)")):
        optional = case in ("train-1thread", "train-cli", "train-parts", "train-thin",
                            "train-flush", "train-fused-1thread")
        w = v.worker("recipe", fw) or {}
        if optional and case not in w.get("results", {}) and case not in w.get("errors", {}):
            continue
        res = v.get("recipe", fw, case)
        t = None if res is None else res["median_s"]
        est = None if t is None else t * 6000 / steps
        rows.append([label, num(t, 2), num(div(t, steps) and 1e3 * t / steps, 3),
                     num(est, 2), ratio(v.ratio("recipe", (fw, case), ("linearkit", "train")))])
    return _section(
        f"5. The `linearkit train` recipe: {steps:,} steps of batch 100 "
        "(40-100-res(100)-10, Adam lr 1e-2)",
        ["framework", f"seconds ({steps:,} steps)", "ms/step", "seconds per 6,000 steps",
         "time / linearkit"], rows,
        "MNIST-1D-shaped synthetic data (4,000 × 40, 10 classes), reshuffled every epoch, "
        "batches gathered by index each step; model built outside the timed region; median of "
        f"{v.meta.get('config', {}).get('recipe_repeats', 3)} runs, after a few untimed steps "
        "(JAX compiles its step, linearkit loads its compiled kernels: once per process, "
        "measured in 5b). `linearkit.recipes.train_mnist1d.train` is "
        "the command's own loop (its DataLoader, its BLAS-thread choice, evaluation off), timed "
        "by itself; the other rows are the documented step on pre-drawn index batches. "
        "linearkit's step runs as one compiled call (fast.md, \"The whole step in one call\"); "
        "*called one by one* turns that off (the compiled chain, the fused loss and Adam's "
        "kernel, each called from Python); the thin path turns the compiled chain off too. "
        "`set_flush_denormal(True)` treats subnormal floats as zero (as JAX's CPU backend does "
        "by default); the default keeps them, as PyTorch does; `linearkit train` flushes them "
        "(fast.md, \"Subnormal floats\").")


def e2e_section(v: View):
    lk_ = v.get("e2e", "linearkit", "train") or {}
    lk_t = lk_.get("median_s")
    lk_cold = (v.get("e2e", "linearkit", "train-cold") or {}) if lk_ else {}
    steps = lk_.get("steps") or v.meta.get("config", {}).get("recipe_steps")
    rows = []
    for fw, case, label in (("linearkit", "train", "`linearkit train --json` (linearkit.cli)"),
                            ("torch", "train", "PyTorch script, default Adam"),
                            ("torch", "train-fused", "PyTorch script, fused Adam"),
                            ("jax", "train", "JAX script, jit (compiled in the run)")):
        r = v.get("e2e", fw, case)
        if r is None:
            continue
        wall, loop, rest = r.get("median_s"), r.get("loop_s"), r.get("rest_s")
        if rest is None and _ok(wall) and _ok(loop):    # results saved before rest_s existed
            rest = wall - loop
        cold, cold_over = _e2e_cold(fw, r, lk_cold)
        rows.append([label, num(cold, 2), num(wall, 2), cold_over, num(loop, 2), num(rest, 2),
                     num(r.get("import_s"), 2), pct(r.get("test_accuracy")),
                     ratio(div(cold, lk_cold.get("median_s"))), ratio(div(wall, lk_t))])
    fast = (v.get("e2e", "linearkit", "fast") or {}) if v.has("e2e") else {}
    kernels = ("numba installed: the fused kernels load from numba's cache"
               if fast.get("numba") else "numba not installed: the NumPy path")
    if fast.get("LINEARKIT_FAST") == "0":
        kernels = "LINEARKIT_FAST=0: the NumPy path"
    repeats = v.meta.get("config", {}).get("e2e_repeats", "?")
    return _section(
        f"5b. The recipe end to end, a fresh process each ({num(steps)} steps; seconds)",
        ["command", "cold: wall", "warm: wall (launch to exit)", "cold / warm",
         "warm: training loop", "warm: the rest", "framework import", "test accuracy",
         "cold / linearkit cold", "warm / linearkit warm"], rows,
        "What a user waits for: interpreter start-up, imports, loading MNIST-1D, building the "
        "model, 6,000 steps of batch 100 (in a full run), test accuracy every 500 steps and at "
        "the end, train accuracy, saving the weights (benchmarks/e2e.py). Each command ran once "
        f"untimed (caches filled: {kernels}), then {repeats} timed run(s); medians over them "
        "(each column on its own, so they need not add up). *Warm*: those runs. *Cold*: "
        "linearkit's command with an empty kernel cache, as its first run after an install "
        "(`NUMBA_CACHE_DIR`, numba's own setting, at a new empty folder each run, so every "
        "kernel the run uses is compiled in it), each cold run just before a warm one; "
        "*cold / warm* is the median of each cold run's wall over the warm run's beside it. "
        "PyTorch keeps nothing between runs and JAX compiles in every run (its persistent "
        "compilation cache off), so their cold runs are their warm ones. A process a run "
        "leaves behind (a background compiler) is waited for before the next run and is not in "
        "the wall time (notes below). *The rest* = each "
        "run's wall − its loop's own timer (start-up, data, evaluation after the loop, saving). "
        "The PyTorch and JAX scripts use the benchmark's own model and step (`impl_torch`, "
        "`impl_jax`); JAX compiles inside the timed run.",
        notes=_e2e_cold_notes(lk_, lk_cold))


# a process a run left behind that outlived it by more than this many seconds is reported
LEFTOVER_S = 0.2


def _e2e_cold(fw: str, r: dict, lk_cold: dict) -> tuple[float | None, str]:
    """A row's cold wall time and its cold / warm cell."""
    if fw == "linearkit":
        cold = lk_cold.get("median_s")
        return cold, ratio(r.get("cold_over_warm") or div(cold, r.get("median_s")))
    if fw == "jax" and r.get("compilation_cache"):
        return None, f"n/a: JAX's compilation cache is on ({r['compilation_cache']})"
    return r.get("median_s"), "same runs" if fw == "torch" else "same runs (compiles each)"


def _e2e_cold_notes(lk_: dict, lk_cold: dict) -> list[str]:
    """What linearkit's cold runs left in their ``NUMBA_CACHE_DIR`` (numba cache files, or
    none: then nothing compiled into it, and the run was not cold), how long what a run left
    running (a background compiler) ran on after it exited, and whether a warm run left any."""
    notes = []
    files = lk_cold.get("cache_files")
    if files and not all(files):
        notes.append(f"linearkit's cold runs left {' / '.join(map(str, files))} numba cache "
                     "files in their NUMBA_CACHE_DIR: a run that left none compiled nothing "
                     "into it (numba missing, LINEARKIT_FAST=0, or kernels found elsewhere), so "
                     "it was not a cold run.")
    elif files:
        notes.append(f"linearkit's cold runs' NUMBA_CACHE_DIR held {' / '.join(map(str, files))} "
                     "numba cache files afterwards: their kernels were compiled into it.")
    after = lk_cold.get("after_s") or []
    if any(_ok(a) and a > LEFTOVER_S for a in after):
        notes.append("each cold run left a process running after it exited (a background "
                     f"compiler), for {' / '.join(num(a, 1) for a in after)} s; the benchmark "
                     "waited for it before the next run. Not in the cold wall time: nobody "
                     "waits for it.")
    warm = " / ".join(num(a, 1) for a in lk_.get("after_s") or [] if _ok(a) and a > LEFTOVER_S)
    if warm:
        notes.append(f"a warm run left a process running after it exited ({warm} s): its "
                     "kernels were not all cached, so it was not warm.")
    before = lk_.get("warm_up_after_s")
    if _ok(before) and before > LEFTOVER_S:
        notes.append(f"the untimed first run left a process running for {num(before, 1)} s "
                     "after it exited (numba's cache was cold; the timed runs came after it).")
    return notes


def split_sections(v: View):
    """The host/library split of the MLP and recipe steps' ratios (benchmarks/gemm_split.py)."""
    from .gemm_split import sections

    return sections(v)


def sweep_sections(v: View):
    """The sweep group's tables (benchmarks/sweep_report.py, which also writes docs/sweep.md)."""
    from .sweep_report import sections

    return sections(v)


BUSY_ROWS = (("linearkit", "default", "linearkit, default policy"),
             ("linearkit", "1thread", "linearkit, set_num_threads(1)"),
             ("linearkit", "2threads", "linearkit, set_num_threads(2)"),
             ("numpy", "default", "NumPy, BLAS default threads"),
             ("numpy", "1thread", "NumPy, BLAS on 1 thread"),
             ("torch", "default", "PyTorch, default threads"),
             ("torch", "1thread", "PyTorch, set_num_threads(1)"))


def busy_pair(v: View, fw: str, case: str):
    """``(idle_s, busy_s, idle_other_cores, busy_other_cores)`` of one busy-group case."""
    idle, busy = (v.get("busy", fw, f"{case}:{s}") for s in ("idle", "busy"))
    return (idle and idle.get("median_s"), busy and busy.get("median_s"),
            idle and idle.get("other_cores"), busy and busy.get("other_cores"))


def busy_sections(v: View):
    rows = []
    for step in cases.BUSY_STEPS:
        for fw, variant, label in BUSY_ROWS:
            idle, busy, oi, ob = busy_pair(v, fw, f"{step}/{variant}")
            if idle is None and busy is None:
                continue
            rows.append([step, label, num(idle and 1e3 * idle, 3), num(busy and 1e3 * busy, 3),
                         ratio(div(busy, idle)), f"{num(oi, 2)} / {num(ob, 2)}"])
    steps = "; ".join(f"`{k}`: {t}" for k, t in cases.BUSY_STEPS.items())
    main = _section(
        "9a. Busy machine: training steps idle and beside one spinning process (ms/step)",
        ["step", "framework, threads", "idle", "busy", "busy / idle",
         "others' cores idle / busy"], rows,
        "Each step timed twice in the same process: on the machine as it is (\"idle\"), then "
        "while the benchmark runs one background process spinning on a core (started before "
        "and killed by PID after the measurement). \"Others' cores\": CPU time of other "
        "processes on this process's cores during the measurement (/proc/stat minus this "
        "process's own), in cores: the spinner alone is ~1; more than ~0.2 in the idle column "
        f"means the machine was not idle and that figure is pessimistic. Steps: {steps}.")
    policy = (v.get("busy", "linearkit", "policy") or {}) if v.has("busy") else {}
    rows = []
    for m, k, n in cases.BUSY_GEMMS:
        t = {(th, st): busy_pair(v, "linearkit", f"gemm:{m}x{k}x{n}/{th}t")[st == "busy"]
             for th in (1, 2) for st in ("idle", "busy")}
        rows.append([f"{m}×{k} @ {k}×{n}", num(m * k * n / 1e6, 2),
                     us(t[(1, "idle")]), us(t[(2, "idle")]),
                     ratio(div(t[(1, "idle")], t[(2, "idle")])),
                     us(t[(1, "busy")]), us(t[(2, "busy")]),
                     ratio(div(t[(2, "busy")], t[(1, "busy")]))])
    gemms = _section(
        "9b. One forward GEMM at 1 and 2 BLAS threads, idle and busy (µs per call)",
        ["GEMM", "M MACs", "1 thread idle", "2 threads idle", "speed-up of 2 (idle)",
         "1 thread busy", "2 threads busy", "slow-down of 2 (busy)"], rows,
        "`linearkit.functional.linear(x, W)` under `linearkit.backend.threads.num_threads(t)`. The default "
        "policy runs a GEMM under `SMALL_GEMM_MACS` = "
        f"{num(policy.get('small_gemm_macs'))} multiply-adds on one thread, and a larger one on "
        "up to the BLAS's own count only while other processes leave the cores idle "
        "(docs/threads.md).")
    return [main, gemms] if any(r[2] != "n/a" for r in rows) else [main]


def busy_targets(v: View, add) -> None:
    for step in cases.BUSY_STEPS:
        idle, busy, _, _ = busy_pair(v, "linearkit", f"{step}/default")
        r = div(busy, idle)
        add(f"9. {step}: busy ≤ 3× idle (linearkit default)",
            f"{ratio(r)} ({num(idle and 1e3 * idle, 3)} → {num(busy and 1e3 * busy, 3)} ms)",
            at_most(r, 3.0))
    for step in cases.BUSY_STEPS:
        idle = busy_pair(v, "linearkit", f"{step}/default")[0]
        fixed = [busy_pair(v, "linearkit", f"{step}/{t}")[0] for t in ("1thread", "2threads")]
        fixed = [t for t in fixed if _ok(t)]
        best = min(fixed) if fixed else None
        r = div(idle, best)
        add(f"9. {step}: idle default ≤ 1.1× best fixed thread count",
            f"{ratio(r)} ({num(idle and 1e3 * idle, 3)} vs {num(best and 1e3 * best, 3)} ms)",
            at_most(r, 1.1))


def footprint_section(v: View):
    res = v.get("footprint", "linearkit", "import")
    if res is None:
        return None
    rows = []
    base = res.get("numpy", {})
    for key, label in (("python", "bare interpreter (no import)"), ("numpy", "import numpy"),
                       ("linearkit", "import linearkit"),
                       ("linearkit_cold", "import linearkit, no bytecode cache")):
        r = res.get(key)
        if r:
            own = key.startswith("linearkit") and base
            rows.append([label, num(1e3 * r["median_s"], 1),
                         num(1e3 * (r["median_s"] - base["median_s"]), 1) if own else "",
                         num(r["peak_rss_mib"], 1),
                         num(r["peak_rss_mib"] - base["peak_rss_mib"], 1) if own else "",
                         ", ".join(r["heavy"]) or "none", str(r["modules"])])
    notes = ["largest cumulative imports: " + ", ".join(
        f"{r['module']} {r['cumulative_us'] / 1e3:.1f} ms" for r in res.get("importtime_top", []))]
    return _section("6. Footprint (fresh interpreter each)",
                    ["what", "ms (median)", "ms over NumPy", "peak RSS MiB", "MiB over NumPy",
                     "optional deps loaded", "modules"],
                    rows, "Time measured inside the process around the import statement; peak "
                    "RSS is the process's VmHWM after it (interpreter included). Bytecode cached "
                    "except in the last row. linearkit's own share is its row minus NumPy's.",
                    notes)


def memory_section(v: View):
    r = v.get("memory", "linearkit", "train:recipe")
    if r is None:
        return None
    rows = [
        [f"growth of traced memory over {r['steps']} steps", f"{r['growth_bytes'] / 1024:.1f} KiB",
         f"{r['growth_per_step_bytes']:.0f} B/step"],
        ["transient peak of one step", f"{r['step_peak_bytes'] / 1024:.1f} KiB",
         (f"activations {r['activation_bytes'] / 1024:.1f} KiB, parameters "
         f"{r['param_bytes'] / 1024:.1f} KiB")],
        ["gradient buffers reused across steps", str(r["grads_reused"]), ""],
        ["optimizer state reused across steps", str(r["state_reused"]), ""],
        ["float32 parameters stay float32", str(r["dtype_kept"]), ""],
    ]
    notes = ["largest growth by line: " + "; ".join(r["top_growth"])] if r.get("top_growth") \
        else []
    return _section("7. Memory of a training step (recipe model, batch 100, tracemalloc)",
                    ["check", "value", "context"], rows,
                    "NumPy reports its buffers to tracemalloc. Reuse means the same memory "
                    "(np.shares_memory) holds the gradients / Adam moments in consecutive steps.",
                    notes)


def profile_sections(v: View):
    out = []
    for case, label in (("recipe", "recipe model 40-100-res(100)-10, batch 100"),
                        ("mlp:128", "MLP 784-256-256-10, batch 128")):
        r = v.get("profile", "linearkit", case)
        if r is None:
            continue
        rows = [[row["function"], num(row["calls_per_step"], 1), num(row["own_us"], 1),
                 num(row["cum_us"], 1)] for row in r["top_own"]]
        out.append(_section(
            f"8. Profile: linearkit training step, {label}",
            ["function (by own time)", "calls/step", "own µs/step", "cumulative µs/step"], rows,
            f"Unprofiled step: {r['step_us']:.0f} µs; under cProfile {r['profiled_step_us']:.0f} "
            f"µs, of which {r['linearkit_own_us']:.0f} µs is own time in linearkit's Python "
            "functions (NumPy ufunc calls count toward their caller)."))
    r = v.get("profile", "linearkit", "overheads")
    if r is not None:
        rows = [[k, num(val["median_us"], 2), num(val["min_us"], 2)] if isinstance(val, dict)
                else [k, str(val), ""] for k, val in r.items()]
        out.append(_section(
            "8c. Per-call costs around the same arithmetic (µs, no profiler)",
            ["what", "µs per call (median)", "µs (best repeat)"], rows,
            "Tiny arrays first, so that the difference between two rows is the Python cost of "
            "that layer of the protocol; then Adam and the loss at the recipe's sizes beside "
            "bare-NumPy fast versions; then the recipe step's phases (cumulative)."))
    return out


# ----------------------------------------------------------------------------- targets
def targets(v: View) -> list[list[str]]:
    """One row per target, ``[set, target, measured, status]``; the newer, tighter targets
    replace the older rows they tighten (small calls, MLP training, the recipe), the rest are
    kept."""
    rows = []

    def add(target_set, target, measured, status):
        rows.append([target_set, target, measured, status])

    if v.has("large"):
        large_targets(v, add)
    if v.has("precision"):
        for x_shape, out_f in cases.PRECISION:
            case = cases.large_id("fwdbwd", x_shape, out_f)
            for var, limit in cases.PRECISION_LIMITS.items():
                r = (v.get("precision", "linearkit", f"{case}:{var}") or {}).get("ratio")
                add("16-bit", f"{var} fwd+bwd {cases.shape_name(x_shape)}->{out_f} ≤ {limit}× "
                    "float32", ratio(r), at_most(r, limit))
    if v.has("small"):
        for kind, label in (("fwd", "forward"), ("fwdbwd", "forward+backward")):
            limit = cases.SMALL_LIMITS[kind]
            t, npt = v.seconds("small", "linearkit", kind), v.seconds("small", "numpy", kind)
            pt = v.seconds("small", "torch", kind)
            r = v.ratio("small", ("linearkit", kind), ("numpy", kind))
            add("R2", f"Linear(16,16) one row: {label} ≤ {limit}× the bare-NumPy floor",
                f"{ratio(r)} ({us(t)} vs {us(npt)} µs; PyTorch {us(pt)})", at_most(r, limit))
    if v.has("batch1"):
        for in_f, out_f in cases.BATCH1:
            key = f"bwd:{in_f}->{out_f}"
            r = v.ratio("batch1", ("torch", key), ("linearkit", key))
            add("R1, R2", f"batch-1 backward {in_f}->{out_f} no slower than PyTorch",
                f"{ratio(r)} PyTorch's speed", at_least(r, 1.0))
    if v.has("mlp"):
        mlp_targets(v, add)
    if v.has("recipe"):
        recipe_targets(v, add)
    if v.has("e2e"):
        e2e_targets(v, add)
    if v.has("busy"):
        busy_targets(v, lambda *row: add("busy, R2", *row))
    fp = v.get("footprint", "linearkit", "import") if v.has("footprint") else None
    if fp is not None:
        lk_ = fp["linearkit"]
        add("R1, R2", "import linearkit ≤ 100 ms", f"{1e3 * lk_['median_s']:.1f} ms",
            at_most(lk_["median_s"], 0.1))
        add("R1, R2", "import linearkit ≤ 35 MiB peak RSS", f"{lk_['peak_rss_mib']:.1f} MiB",
            at_most(lk_["peak_rss_mib"], 35.0))
        add("R1, R2", "no optional dependency imported (numba included)",
            ", ".join(lk_["heavy"]) or "none", flag(not lk_["heavy"]))
    mem = v.get("memory", "linearkit", "train:recipe") if v.has("memory") else None
    if mem is not None:
        limit = cases.MEMORY_GROWTH_LIMIT
        steps = mem["steps"]
        short = "" if steps >= cases.MEMORY_STEPS else f" (this run: {steps:,} steps)"
        add("R1, R2", f"no growth over {cases.MEMORY_STEPS:,} training steps (≤ {limit // 1024} "
            f"KiB in all){short}",
            f"{mem['growth_bytes']:,.0f} B over {steps:,} steps",
            at_most(max(mem["growth_bytes"], 0.0), float(limit)))
        add("R1", "gradient buffers reused across steps", str(mem["grads_reused"]),
            flag(mem["grads_reused"]))
        add("R1", "optimizer state reused across steps", str(mem["state_reused"]),
            flag(mem["state_reused"]))
    return rows


def round_ratios(v: View, group: str, case: str, base: str = "numpy",
                 fw: str = "linearkit") -> list[float]:
    """``base``'s time over ``fw``'s in each round both ran (``--rounds`` / the large group's
    own rounds pair up in order); one ratio when the case ran once."""
    paired = v.paired_ratios(group, (base, case), (fw, case))
    if paired:
        return [statistics.median(rs) for rs in paired]
    a, b = v.get(group, base, case), v.get(group, fw, case)
    if a is None or b is None:
        return []
    ra = a.get("round_medians_s") or [a.get("median_s")]
    rb = b.get("round_medians_s") or [b.get("median_s")]
    return [x / y for x, y in zip(ra, rb) if _ok(x) and _ok(y) and y > 0]


def rounds_status(ratios: list[float], target: float, need: int) -> str:
    """MET when each of at least ``need`` rounds reaches ``target``; MISSED as soon as one does
    not; n/a while fewer rounds ran and all reached it."""
    if not ratios:
        return "n/a"
    low = min(ratios)
    below = sum(r < target for r in ratios)
    if below:
        return f"MISSED in {below} of {len(ratios)} rounds (worst {pct(low)})"
    if len(ratios) < need:
        return f"n/a: {len(ratios)} of {need} rounds (all ≥ {pct(target)}; full run needed)"
    return f"MET in all {len(ratios)} rounds (worst {pct(low)})"


def large_targets(v: View, add) -> None:
    for x_shape, out_f in cases.LARGE:
        for kind in ("fwd", "fwdbwd"):
            case = cases.large_id(kind, x_shape, out_f)
            rs = round_ratios(v, "large", case)
            gf = div(cases.linear_flops(x_shape, out_f, kind == "fwdbwd") / 1e9,
                     v.seconds("large", "linearkit", case))
            into = div(v.seconds("large", "numpy", f"{case}:out"),
                       v.seconds("large", "linearkit", case))
            add("R1, R2", f"{'fwd+bwd' if kind == 'fwdbwd' else 'fwd'} "
                f"{cases.shape_name(x_shape)}->{out_f} ≥ 95% of NumPy (fresh outputs) in "
                f"{cases.LARGE_ROUNDS} consecutive runs",
                f"{' / '.join(pct(r) for r in rs) or 'n/a'} ({num(gf)} GFLOP/s; "
                f"{pct(into)} of NumPy into out=)",
                rounds_status(rs, 0.95, cases.LARGE_ROUNDS))


def mlp_targets(v: View, add) -> None:
    for batch in cases.MLP_TRAIN_BATCHES:
        limit = cases.MLP_VS_TORCH_FUSED[batch]
        fused = torch_fused(v, "mlp", batch)
        r = v.ratio("mlp", ("torch", fused.step), ("linearkit", f"train:{batch}"))
        add("R2", f"MLP train b{batch} ≥ {limit}× PyTorch fused Adam",
            f"{ratio(r)} (PyTorch on {fused.words})", at_least(r, limit))
        limit = cases.MLP_VS_JAX[batch]
        r = v.ratio("mlp", ("jax", f"train:{batch}"), ("linearkit", f"train:{batch}"))
        add("R2", f"MLP train b{batch} ≥ {limit}× JAX jit", ratio(r), at_least(r, limit))
    for batch in cases.MLP_TRAIN_BATCHES:      # the third round: rows only where it is tighter
        fused = torch_fused(v, "mlp", batch)
        if cases.MLP_VS_TORCH_FUSED[batch] < cases.R3_MLP_VS_TORCH_FUSED:
            r = v.ratio("mlp", ("torch", fused.step), ("linearkit", f"train:{batch}"))
            add("R3", f"MLP train b{batch} ≥ {cases.R3_MLP_VS_TORCH_FUSED}× PyTorch fused Adam",
                f"{ratio(r)} (PyTorch on {fused.words})", at_least(r, cases.R3_MLP_VS_TORCH_FUSED))
        if cases.MLP_VS_JAX[batch] < cases.R3_MLP_VS_JAX:
            r = v.ratio("mlp", ("jax", f"train:{batch}"), ("linearkit", f"train:{batch}"))
            add("R3", f"MLP train b{batch} ≥ {cases.R3_MLP_VS_JAX}× JAX jit", ratio(r),
                at_least(r, cases.R3_MLP_VS_JAX))
    batch = cases.MLP_GEMM_BATCH
    step = v.seconds("mlp", "linearkit", f"train:{batch}")
    gemms = own_gemms(v, batch)
    r = step_over_gemms(v, batch)
    add("R2", f"MLP train b{batch}: step ≤ {cases.MLP_GEMM_LIMIT}× its 8 GEMMs back to back",
        f"{ratio(r)} ({num(step and 1e3 * step, 2)} vs {num(gemms and 1e3 * gemms, 2)} ms)",
        at_most(r, cases.MLP_GEMM_LIMIT))
    r = v.ratio("mlp", ("torch", "infer:1"), ("linearkit", "infer:1"))
    add("R1", "MLP inference b1 ≥ 2× PyTorch", ratio(r), at_least(r, 2.0))
    r = v.ratio("mlp", ("jax", "infer:256"), ("linearkit", "infer:256"))
    add("R1", "MLP inference b256 ≥ JAX jit", ratio(r), at_least(r, 1.0))


# "PyTorch fused Adam" in the MLP targets and tables (cases.TORCH_FUSED), in words
TORCH_FUSED_WORDS = ("timed at torch's default thread count and on one thread "
                     "(`torch.set_num_threads(1)`), the faster of the two counting as "
                     "\"PyTorch fused Adam\" (*its threads*)")


@dataclass(frozen=True)
class TorchFused:
    """PyTorch fused Adam's step case, its GEMMs' case at the same thread count, that count
    (None when unknown) and whether it is torch's default."""

    step: str
    gemms: str
    threads: int | None
    default: bool

    @property
    def words(self) -> str:
        """``2 threads (default)``, ``1 thread``."""
        if self.threads is None:
            return "n/a"
        return (f"{self.threads} thread{'s' if self.threads != 1 else ''}"
                f"{' (default)' if self.default else ''}")


def case_name(group: str, base: str, batch: int) -> str:
    """A training case's name: ``base:batch`` in the mlp group, ``base`` in the recipe's."""
    return base if group == "recipe" else f"{base}:{batch}"


def per_step(res: dict | None) -> float | None:
    """Seconds per step of a result: a whole run's over its steps, else its median."""
    if not res or not _ok(res.get("median_s")):
        return None
    return res["median_s"] / (res.get("steps") or 1)


def torch_fused(v: View, group: str, batch: int) -> TorchFused:
    """The faster of ``cases.TORCH_FUSED``'s measured variants in ``group`` at ``batch`` (the
    default thread count's when neither was measured, so that the report says so)."""
    w = v.worker(group, "torch") or {}
    res = w.get("results", {})
    found = [(per_step(res.get(case_name(group, step, batch))), i, step, gemms)
             for i, (step, gemms) in enumerate(cases.TORCH_FUSED)]
    found = [f for f in found if _ok(f[0])]
    _, i, step, gemms = min(found) if found else (None, 0, *cases.TORCH_FUSED[0])
    gemms = case_name(group, gemms, batch)
    threads = (res.get(gemms) or {}).get("threads") or \
        (1 if i else (w.get("info") or {}).get("threads"))
    return TorchFused(case_name(group, step, batch), gemms, threads, i == 0)


def step_ratio(v: View, group: str, over: tuple[str, str], under: tuple[str, str]):
    """``View.ratio`` per step: a whole run (the recipe's) counts as its ``steps`` steps, a
    timed case's iteration as one (a step, or a step's GEMMs)."""
    r = v.ratio(group, over, under)
    a, b = v.get(group, *over), v.get(group, *under)
    if not _ok(r) or a is None or b is None:
        return None
    return r * (b.get("steps") or 1) / (a.get("steps") or 1)


def _gemms_framework(v: View, batch: int) -> str:
    """Whose 8 GEMMs the step is compared with: linearkit's own (its functions and thread
    policy), or bare NumPy's (default BLAS threads) when linearkit's were not measured."""
    w = v.worker("mlp", "linearkit") or {}
    return "linearkit" if f"gemms:{batch}" in w.get("results", {}) else "numpy"


def step_over_gemms(v: View, batch: int) -> float | None:
    """linearkit's MLP step over its own 8 GEMMs (``_gemms_framework``)."""
    return v.ratio("mlp", ("linearkit", f"train:{batch}"),
                   (_gemms_framework(v, batch), f"gemms:{batch}"))


def own_gemms(v: View, batch: int):
    """Seconds of the MLP step's 8 GEMMs alone (``_gemms_framework``)."""
    return v.seconds("mlp", _gemms_framework(v, batch), f"gemms:{batch}")


def recipe_targets(v: View, add) -> None:
    w = v.worker("recipe", "linearkit") or {}
    for case, label, target_set in (("train-cli", "`linearkit train` recipe", "R1, R2"),
                               ("train", "the documented step loop, same recipe", "R2")):
        if case == "train-cli" and case not in w.get("results", {}) \
                and case not in w.get("errors", {}):
            continue
        r = v.ratio("recipe", ("torch", "train"), ("linearkit", case))
        add(target_set, f"{label}: per step ≥ {cases.RECIPE_VS_TORCH:g}× PyTorch eager", ratio(r),
            at_least(r, cases.RECIPE_VS_TORCH))
        r = v.ratio("recipe", ("jax", "train"), ("linearkit", case))
        add("R2, R3", f"{label}: per step ≥ {cases.RECIPE_VS_JAX:g}× JAX jit", ratio(r),
            at_least(r, cases.RECIPE_VS_JAX))


def e2e_targets(v: View, add) -> None:
    lk_ = v.get("e2e", "linearkit", "train") or {}
    t = lk_.get("median_s")
    steps = lk_.get("steps")
    label = f"{steps:,} steps" if steps else "steps"
    torch_t = [x for x in (v.seconds("e2e", "torch", c) for c in ("train", "train-fused"))
               if _ok(x)]
    best = min(torch_t) if torch_t else None
    r = div(best, t)
    add("R2", f"`linearkit train`, fresh process, {label}: faster than PyTorch (either Adam), "
        "start-up included", f"{ratio(r)} ({num(t, 2)} vs {num(best, 2)} s)", at_least(r, 1.0))
    jx = v.seconds("e2e", "jax", "train")
    r = div(jx, t)
    add("R2", f"`linearkit train`, fresh process, {label}: faster than JAX jit, start-up "
        "included", f"{ratio(r)} ({num(t, 2)} vs {num(jx, 2)} s)", at_least(r, 1.0))
    cold = (v.get("e2e", "linearkit", "train-cold") or {}).get("median_s")
    over = lk_.get("cold_over_warm") or div(cold, t)
    add("R3", f"the first `linearkit train` (empty kernel cache), {label}: ≤ "
        f"{cases.R3_COLD_OVER_WARM:g}× a warm run", f"{ratio(over)} ({num(cold, 2)} vs {num(t, 2)} s)",
        at_most(over, cases.R3_COLD_OVER_WARM))
    r = div(jx, cold)
    add("R3", f"the first `linearkit train` (empty kernel cache), {label}: faster than JAX jit, "
        "start-up and compile included", f"{ratio(r)} ({num(cold, 2)} vs {num(jx, 2)} s)",
        at_least(r, 1.0))


TARGETS_TITLE = "Targets"
TARGETS_INTRO = (
    "Every target, one row each, measured in this run; *set* says which set of targets it "
    "belongs to (R1, R2 and R3: the first, second and third performance rounds, a later one "
    "tightening an earlier one's rows or adding its own; busy: the busy-machine targets; 16-bit: 16-bit storage). A ratio is the other implementation's time over "
    "linearkit's (above 1: linearkit faster) unless the target names a limit on linearkit's "
    "own time (≤). The large-layer rows hold \"in three consecutive runs\": NumPy and "
    "linearkit run that group in three rounds in a full run, each round's ratio shown (in a"
    " run with repeats in turn, the median of that round's paired repeats' ratios).")


def all_sections(v: View) -> list[dict]:
    sections = [_section(TARGETS_TITLE, ["set", "target", "measured", "status"],
                         targets(v), TARGETS_INTRO)]
    builders = [("large", large_section), ("precision", precision_section),
                ("small", small_section), ("batch1", batch1_section),
                ("mlp", mlp_sections), (("mlp", "recipe"), split_sections),
                ("recipe", recipe_section), ("e2e", e2e_section),
                ("footprint", footprint_section), ("memory", memory_section),
                ("profile", profile_sections), ("busy", busy_sections),
                ("sweep", sweep_sections)]
    for groups, build in builders:
        if not any(v.has(g) for g in ((groups,) if isinstance(groups, str) else groups)):
            continue
        made = build(v)
        for s in made if isinstance(made, list) else [made]:
            if s is not None:
                sections.append(s)
    return sections


def views(results: dict) -> list[View]:
    out = [View(results)]
    if "forced" in results.get("runs", {}):
        out.append(View(results, "forced"))
    return out


def _pass_title(v: View) -> str:
    threads = v.meta.get("threads")
    suffix = f"; {threads} thread(s) forced with --threads" if threads else ""
    if v.name == "clean":
        return ("Default kernel (OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset in the children"
                f"{suffix})")
    forced = ", ".join(f"{k}={val}" for k, val in (v.meta.get("forced") or {}).items())
    return (f"Forced kernel ({forced}{suffix}) — NumPy and linearkit rerun; PyTorch and JAX "
            "from the default run")


def _load_line(meta: dict) -> str:
    before, after = meta.get("load_before"), meta.get("load_after")
    if not before:
        return ""
    return (f"load average (1/5/15 min) before {'/'.join(f'{x:.1f}' for x in before)}, after "
            f"{'/'.join(f'{x:.1f}' for x in after or [])}")


# ----------------------------------------------------------------------------- rendering
def _text_table(header, rows, left: int = 1) -> str:
    """Columns aligned; the first ``left`` ones to the left, the rest to the right."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]

    def line(cells) -> str:
        return "  ".join(str(c).ljust(w) if i < left else str(c).rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(header), "  ".join("-" * w for w in widths)] +
                     [line(r) for r in rows])


def render_text(results: dict) -> str:
    meta = results.get("meta", {})
    out = []
    for v in views(results):
        out += ["", "=" * 100, _pass_title(v), "machine: " + machine_line(v.info)]
        if _load_line(meta):
            out.append(_load_line(meta))
        for s in all_sections(v):
            if not s["rows"]:
                continue
            out += ["", s["title"], _text_table(s["header"], s["rows"], _left(s["header"]))]
            out += [f"  note: {n}" for n in s["notes"]]
        if v.notes:
            out += ["", "not measured:"] + [f"  - {n}" for n in v.notes]
    if meta.get("forced_note"):
        out += ["", meta["forced_note"]]
    if "wall_s" in meta:
        out += ["", f"total wall time {meta['wall_s']:.0f} s ({_mode(meta)} run)"]
    return "\n".join(out)


def _left(header) -> int:
    """Columns up to and including "target" read as text (left-aligned); else the first."""
    return header.index("target") + 1 if "target" in header else 1


def _md_table(header, rows) -> str:
    esc = lambda c: str(c).replace("|", "\\|")
    left = _left(header)
    lines = ["| " + " | ".join(map(esc, header)) + " |",
             "|" + "|".join("---" if i < left else "---:" for i in range(len(header))) + "|"]
    return "\n".join(lines + ["| " + " | ".join(map(esc, r)) + " |" for r in rows])


def _ceiling(v: View) -> list[str]:
    lines = []
    best = {}
    for fw in ("numpy", "linearkit", "torch", "jax"):
        vals = []
        for x_shape, out_f in cases.LARGE:
            for kind in ("fwd", "fwdbwd"):
                case = cases.large_id(kind, x_shape, out_f)
                # NumPy's ceiling: the faster of fresh outputs and out= buffers
                for suffix in ("", ":out") if fw == "numpy" else ("",):
                    g = div(cases.linear_flops(x_shape, out_f, kind == "fwdbwd") / 1e9,
                            v.seconds("large", fw, case + suffix))
                    if _ok(g):
                        vals.append((g, f"{kind} {cases.shape_name(x_shape)}->{out_f}"
                                        + (" into out=" if suffix else "")))
        if vals:
            best[fw] = max(vals)
    if "numpy" in best:
        g, case = best["numpy"]
        lines.append(f"The measured float32 GEMM ceiling on this machine is bare NumPy's "
                     f"**{g:.0f} GFLOP/s** ({case}) with the BLAS kernel named above.")
        for fw in ("linearkit", "torch", "jax"):
            if fw in best:
                lines.append(f"Best {FW_NAMES[fw]}: {best[fw][0]:.0f} GFLOP/s ({best[fw][1]}), "
                             f"{100 * best[fw][0] / g:.0f}% of that ceiling.")
    return lines


def _mode(meta: dict) -> str:
    return {"smoke": "smoke: harness test only, numbers meaningless", True: "quick"}.get(
        meta.get("quick"), "full")


def _rounds(meta: dict) -> str:
    rounds = meta.get("rounds") or 1
    if rounds == 1:
        return ""
    return (f"; each case ran in {rounds} rounds of child processes, frameworks in alternating "
            "order, and the round with the lowest median is kept (`--rounds`: a burst of load "
            "from other processes can slow a whole round several times over)")


def _rendered(meta: dict) -> str:
    if not meta.get("rendered_from"):
        return ""
    text = ("; this page was rendered from that run's saved results "
            "(`python -m benchmarks --from-json FILE --write-docs`)")
    for merged in meta.get("merged", []):   # {"groups", "argv", "date"}: a later run's groups
        text += (f", with the {', '.join(merged['groups'])} group(s) from a later run "
                 f"(`{' '.join(merged['argv'])}` on {merged['date']})")
    return text


def page_header(meta: dict) -> str:
    """The line every generated page carries under its title (``experiments.provenance``): the
    command that measured the results, less ``--save FILE`` (which only keeps them), the commit
    it ran at and its date. Results saved before runs recorded their commit say ``unknown``."""
    from experiments.provenance import header_line

    argv = list(meta.get("argv", ["python", "-m", "benchmarks", "--write-docs"]))
    if "--save" in argv:
        del argv[argv.index("--save"):argv.index("--save") + 2]
    argv = [a for a in argv if not a.startswith("--save=")]
    return header_line(" ".join(argv), meta.get("commit", "unknown"),
                       str(meta.get("date", "unknown")))


def _minutes(meta: dict) -> str:
    return f"{meta['wall_s'] / 60:.0f} minutes" if "wall_s" in meta else "? minutes"


def _wall(meta: dict) -> str:
    return f", {meta['wall_s']:.0f} s in all" if "wall_s" in meta else ""


def render_markdown(results: dict) -> str:
    meta = results.get("meta", {})
    cfg = meta.get("config", {})
    argv = " ".join(meta.get("argv", ["python", "-m", "benchmarks", "--write-docs"]))
    out = [
        "# Performance",
        "",
        page_header(meta),
        "",
        ("<!-- Generated by `python -m benchmarks --write-docs` from measured results; do not "
        "edit by hand. -->"),
        "",
        (f"Measured with `{argv}`, started {meta.get('date', '?')}"
        f"{'' if _mode(meta) == 'full' else f' ({_mode(meta)} run)'}"
        f"{_wall(meta)}{_rendered(meta)}."),
        "",
        "## What is measured, and how",
        "",
        ("- linearkit against bare NumPy written the fastest way (the ceiling), PyTorch eager "
        "(default and fused Adam) and JAX `jit`, on the shapes and models the "
        "targets name. Each framework runs in its own child process "
        "(`python -m benchmarks.worker FRAMEWORK GROUP`), never two at once: two thread pools "
        "in one process slow each other down."),
        ("- Repeats in turn (groups " + ", ".join(cases.PAIRED_GROUPS) + "; "
         "benchmarks/paired.py): every framework's process builds and calibrates its cases "
         "alone, then waits while the parent asks each in turn for one repeat of the cases it "
         "compares (same shape or batch), 0.2 s apart so that the last one's BLAS threads stop "
         "spinning; linearkit runs its case untimed for 0.7 s and 3 calls at least before each "
         "repeat, so that its BLAS-thread policy sees the machine idle again after the others' "
         f"turns (the recipe's whole runs: {cfg.get('recipe_repeats', '?')} per round, no "
         "warm-up between them). A ratio in "
         "these groups is the median of the ratios of repeats taken together (seconds apart), "
         "not of two medians taken minutes apart: this machine's speed drifts by up to 1.5× "
         "over minutes."),
        ("- The children run with `OPENBLAS_CORETYPE` and `OPENBLAS_L2_SIZE` unset, so OpenBLAS "
        "picks its kernel itself; threadpoolctl reports which one (below). "
        "`--forced-kernel` reruns NumPy and linearkit with the values set in the parent."),
        (f"- Each number is the median of {cfg.get('repeats', '?')} repeats after warm-up, each "
         f"repeat lasting at least {cfg.get('min_time', '?')} s "
         f"({cfg.get('train_min_time', '?')} s for training steps){_rounds(meta)}. Data are "
         "synthetic, with the right shapes and dtypes (float32). "
         "`python -m benchmarks.selfcheck` checks that every implementation trains to the same "
         "weights as PyTorch."),
        ("- Rerun: `python -m benchmarks` (every group; the run above took "
         f"{_minutes(meta)}), `python -m benchmarks --quick` (fewer repeats, a 1,000-step "
         "recipe), one group: `python -m benchmarks --only mlp` (`--list` names them); "
         "regenerate this page: `python -m benchmarks --write-docs` (it also writes "
         "[sweep.md](sweep.md) from the sweep group, alone: `--only sweep --write-docs`); on a "
         "busy machine `--rounds 2` (and `--threads 1`) steady the figures. Needs "
         "`pip install -e '.[bench,torch]'`; JAX is measured when installed "
         "(`pip install jax`)."),
        "",
    ]
    for v in views(results):
        out += [f"## {_pass_title(v)}", "", f"Machine: {machine_line(v.info)}", ""]
        if _load_line(meta):
            out += [(f"During the run: {_load_line(meta)} (on a machine with "
                    f"{v.info.get('usable_cores', '?')} cores; a load above that means other "
                    "processes competed for the CPU and the figures are pessimistic)."), ""]
        ceiling = _ceiling(v)
        if ceiling:
            out += ["### Where the ceiling is", ""] + [" ".join(ceiling), ""]
        for s in all_sections(v):
            if not s["rows"]:
                continue
            out += [f"### {s['title']}", ""]
            if s["intro"]:
                out += [s["intro"], ""]
            out += [_md_table(s["header"], s["rows"]), ""]
            out += [f"- {n}" for n in s["notes"]]
            if s["notes"]:
                out.append("")
        if v.notes:
            out += ["### Not measured", ""] + [f"- {n}" for n in v.notes] + [""]
    if meta.get("forced_note"):
        out += [meta["forced_note"], ""]
    return "\n".join(out)


def render_busy_markdown(results: dict) -> str:
    """The busy group's tables for docs/threads.md (between its generated-block markers)."""
    meta = results.get("meta", {})
    v = View(results)
    argv = " ".join(meta.get("argv", ["python", "-m", "benchmarks", "--only", "busy"]))
    rows: list[list[str]] = []
    if v.has("busy"):
        busy_targets(v, lambda *r: rows.append(list(r)))
    out = [page_header(meta), "",
           (f"Measured with `{argv}`, started {meta.get('date', '?')}"
            f"{'' if _mode(meta) == 'full' else f' ({_mode(meta)} run)'}{_wall(meta)}"
            f"{_rendered(meta)}."), "", f"Machine: {machine_line(v.info)}", ""]
    if _load_line(meta):
        out += [f"During the run: {_load_line(meta)}.", ""]
    out += ["#### Targets on a busy machine", "", _md_table(["target", "measured", "status"], rows),
            ""]
    for s in busy_sections(v) if v.has("busy") else []:
        out += [f"#### {s['title']}", "", s["intro"], "", _md_table(s["header"], s["rows"]), ""]
    if v.notes:
        out += ["Not measured:", ""] + [f"- {n}" for n in v.notes] + [""]
    return "\n".join(out)
