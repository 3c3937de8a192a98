"""The surgery experiment's markdown page (docs/surgery.md): every number from one ``run``."""

from __future__ import annotations

from linearkit.analysis.render import markdown_table

__all__ = ["render_page"]


def _kib(n) -> str:
    return f"{n / 1024:,.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):,.2f} MiB"


def _pct(x) -> str:
    return f"{100 * x:.1f}%"


def _ms(seconds) -> str:
    return f"{1e3 * seconds:.3f}"


def _header(result) -> list[str]:
    m, c = result.machine, result.config
    lines = ["# Model surgery, measured", "",
             ("Every number below comes from the run named above (`experiments/surgery.py`). "
              "The transforms are `linearkit.transforms` (see the README); each returns the new "
              "model and a report that checks it against the original on probe inputs."), ""]
    if c.quick_run:
        lines += ["**Quick run** (tiny models, a smoke test): the numbers mean nothing.", ""]
    lines += [(f"Machine: {m.get('cpus')} CPUs, Python {m['python']}, NumPy {m['numpy']}, BLAS "
               f"{m.get('blas', 'unknown')}, run on {c.threads} BLAS thread(s) throughout (fixed, "
               "so that no speed-up depends on the adaptive thread policy's choice of the "
               f"moment); 1-minute load average {m['load']:.2f} at the start, "
               f"{m.get('load_after', float('nan')):.2f} at the end (times are medians of "
               f"{c.repeats} repeats, compared candidates timed round-robin in the same run)."), ""]
    rows = [(name, f"{t['train_rows']:,} / {t['test_rows']:,}", f"{t['params']:,}",
             _pct(t["accuracy"]), f"{t['seconds']:.1f} s")
            for name, t in result.tasks.items()]
    lines += [(f"Base models, trained here with `linearkit.recipes.train_mnist1d` (Adam, lr 1e-2, "
               f"batch 100, "
               f"{c.steps} steps): `in -> {c.hidden} ReLU -> {c.hidden} ReLU -> 10`."), "",
              markdown_table(("task", "train / test rows", "params", "test accuracy",
                              "training time"), rows, left={0}), ""]
    return lines


def _factorization(result) -> list[str]:
    s, c = result.sections, result.config
    lines = ["## Low-rank factorization (`factorize`, `rank_sweep`)", "",
             ("Each `Linear(in, out)` becomes `Linear(in, r, bias=False)` then `Linear(r, out)` "
              "from a truncated SVD, Σ split between the factors; a layer where rank r would not "
              "save (`r·(in+out) >= in·out`) keeps its weight. *Tuned*: the factorized model "
              f"fine-tuned {c.tune_steps} steps (Adam, lr 1e-3) on the training set."), ""]
    for sweep in s["factorization"]:
        lines += [f"**{sweep['task']}** (test set):", "", sweep["table"], ""]
    lines += [("**The claim**: a quarter of the parameters costs *under one point* of "
               "accuracy. Measured, at the rank nearest a quarter of the parameters:"), ""]
    rows = [(q["task"], str(q["rank"]), _pct(q["params_fraction"]),
             f"{100 * q['drop']:+.1f} points", f"{100 * q['drop_tuned']:+.1f} points",
             "yes" if q["drop"] < 0.01 else ("after tuning" if q["drop_tuned"] < 0.01 else "no"),
             f"{q['speedup']:.2f}x") for q in s["quarter"]]
    lines += [markdown_table(("task", "rank", "params kept", "accuracy drop",
                              "drop after tuning", "under one point?", "forward speed-up"),
                             rows, left={0}), ""]
    big = s["big_layer"]
    lines += [f"**The claim**: rank 64 takes a 100 MB layer *under 10 MB* and runs "
              f"it *3× faster*. Measured on a float32 `Linear({big['n']}, {big['n']})` "
              f"({_kib(big['bytes_before'])}) at rank {big['rank']}: "
              f"{_kib(big['bytes_after'])} after ({big['size_ratio']:.0f}× smaller); forward "
              "speed-up " + ", ".join(f"{v['speedup']:.1f}× at batch {b}"
                                      for b, v in big["batches"].items())
              + f" (the SVD itself took {big['svd_seconds']:.0f} s). Size and speed hold for "
              f"any matrix; the *accuracy* does not: a random weight keeps "
              f"{_pct(big['energy_kept'])} of its spectral energy at this rank — "
              "factorize trained weights whose spectrum decays, and check the report's error "
              "(the article's `randn` factors start with an exploding output variance; SVD "
              "factors of the trained weight do not).", ""]
    return lines


def _int8(result) -> list[str]:
    rows = [(r["task"], r["mode"], _pct(r["accuracy_fp32"]), _pct(r["accuracy_int8"]),
             f"{_kib(r['bytes_before'])} -> {_kib(r['bytes_after'])}",
             f"{_kib(r['file_before'])} -> {_kib(r['file_after'])}",
             f"{r['max_rel_error']:.2g}") for r in result.sections["int8"]]
    return ["## int8 (`quantize(model, \"int8\")`)", "",
            ("Weight-only symmetric int8 per output channel (scale = max|row| / 127), float32 "
             "accumulation; *dynamic* also rounds each input row to int8. The bytes are the "
             "state dict's; the file is `linearkit.save`'s, architecture included."), "",
            markdown_table(("task", "mode", "float32 accuracy", "int8 accuracy", "weights",
                            "file", "output rel. error"), rows, left={0, 1}), ""]


def _fold_merge(result) -> list[str]:
    f = result.sections["fold_merge"]
    lat = []
    for b in (1, 100):
        orig, folded, merged = f[f"latency_{b}"]
        lat.append((f"batch {b}", _ms(orig), f"{_ms(folded)} ({orig / folded:.2f}x)",
                    f"{_ms(merged)} ({orig / merged:.2f}x)"))
    return ["## Fold and merge (`fold_norm`, `merge_linear`)", "",
            (f"A {f['task']} model `{' -> '.join(f['layers_before'])}` trained, put in eval mode, "
             "then `fold_norm` (the BatchNorm1d into the Linear before it) and `merge_linear` "
             "(the Linear-Dropout-Linear head, Dropout being the identity at inference) gives "
             f"`{' -> '.join(f['layers_after'])}`."), "",
            (f"- exactness on the {f['task']} test set: max abs error {f['max_abs_error']:.2g}, "
             f"max rel error {f['max_rel_error']:.2g}; {_pct(f['same_predictions'])} of the "
             f"predictions unchanged; accuracy {_pct(f['accuracy_before'])} -> "
             f"{_pct(f['accuracy_after'])}"),
            (f"- parameters {f['params_before']:,} -> {f['params_after']:,}; forward FLOPs per "
             f"row (the ledger) {f['flops_before']:,} -> {f['flops_after']:,}"),
            f"- reports: `{f['fold']}`; `{f['merge']}`", "",
            ("**The claim**: folding a norm into the Linear cuts small-model latency "
             "(one operator fewer). Measured forward latency (ms, speed-up against the "
             "original):"), "",
            markdown_table(("input", "original", "folded", "folded + merged"), lat, left={0}),
            ""]


def _qkv(result) -> list[str]:
    rows = [(str(r["d"]), str(r["batch"]), _ms(r["three_gemms_s"]), _ms(r["fused_s"]),
             f"{r['ratio']:.2f}x") for r in result.sections["qkv"]]
    return ["## Fused QKV (`fuse_qkv`, `split_qkv`)", "",
            ("**The usual layout** fuses the three projections into one `Linear(d, 3d)` "
             "(`qkv.chunk(3, dim=-1)`). `fuse_qkv` does it exactly (weights concatenated "
             "`[q | k | v]`; `split_qkv` copies them back bitwise). One fused GEMM against three, "
             "float32 (ms per forward; ratio > 1: fusing wins):"), "",
            markdown_table(("d", "batch", "three GEMMs", "one fused", "ratio"), rows, left=set()),
            ""]


def _sparse(result) -> list[str]:
    s = result.sections
    init = s["sparse_init"]
    lines = ["## Sparsity (`prune`, `to_sparse`, `SparseLinear`)", "",
             (f"**The claim**: `nn.init.sparse_(w, sparsity=0.99)` cuts memory by "
              f"90%. It does not: on a `{init['shape'][0]}x{init['shape'][1]}` float32 weight it "
              f"writes {_pct(init['zeros'])} zeros into the same dense array — "
              f"{_kib(init['bytes_before_init'])} before, {_kib(init['bytes_after_init'])} after; "
              "every zero is still stored and multiplied (so with `prune()` and "
              "`torch.nn.utils.prune`). Only a compressed layout saves: `to_sparse` stores it as "
              f"CSR (float32 values + int32 column indices) in {_kib(init['csr_bytes'])}. CSR is "
              "smaller than the dense matrix only below 50% density (float32)."), ""]
    rows = [(str(r["batch"]), _pct(r["sparsity"]), _ms(r["dense_ms"] / 1e3),
             _ms(r["sparse_ms"] / 1e3), f"{r['speedup']:.2f}x", f"{r['file_ratio']:.3f}")
            for r in s["sparse_speed"]]
    n = result.config.sparse_size
    lines += [(f"`SparseLinear` (SciPy CSR kernels) against the dense `Linear({n}, {n})` holding "
               "the same zeros (ms per forward; speed-up > 1: sparse wins; file: sparse / dense "
               "bytes of `linearkit.save`):"), "",
              markdown_table(("batch", "sparsity", "dense", "sparse", "speed-up", "file"), rows,
                             left=set()), ""]
    wins = {}
    for r in s["sparse_speed"]:
        if r["speedup"] > 1 and r["batch"] not in wins:
            wins[r["batch"]] = r["sparsity"]
    if wins:
        lines += ["Sparse first wins on this machine at "
                  + ", ".join(f"{_pct(v)} sparsity for batch {k}" for k, v in wins.items())
                  + " (of the sparsities measured).", ""]
    rows = [(r["task"], _pct(r["amount"]), _pct(r["accuracy"]),
             f"{_kib(r['file_dense'])} -> {_kib(r['file_sparse'])}") for r in s["pruning"]]
    lines += ["Magnitude pruning of the trained models (no fine-tuning), stored sparse:", "",
              markdown_table(("task", "pruned", "test accuracy", "file"), rows, left={0}), ""]
    return lines


def _lora(result) -> list[str]:
    r, c = result.sections["lora"], result.config
    rows = [(name, f"{v['trainable']:,} of {v['total']:,}", _kib(v["training_state"]),
             _pct(v["accuracy"]), f"{v['seconds']:.1f} s")
            for name, v in (("LoRA", r["lora"]), ("full fine-tune", r["full"]))]
    return ["## LoRA (`add_lora`, `merge_lora`, `extract_lora`)", "",
            (f"The {r['task']} base model on a shifted task — the labels of classes 0/1 and 2/3 "
             f"swapped — scores {_pct(r['base_on_shifted'])} (it scores "
             f"{_pct(r['base_on_original'])} on the original). Adapters of rank {c.lora_rank} "
             f"(alpha {2 * c.lora_rank}) on every Linear, against full fine-tuning, "
             f"{c.lora_steps} steps of Adam (lr 1e-3) each; training state = weights + "
             "gradients + Adam's moments of the trainable parameters (the ledger):"), "",
            markdown_table(("method", "trainable params", "training state", "test accuracy",
                            "time"), rows, left={0}), "",
            (f"`merge_lora` folds the adapters into plain Linears: max rel error "
             f"{r['merge_rel_error']:.2g}, accuracy {_pct(r['merged_accuracy'])}; the base "
             f"weights are bitwise unchanged by LoRA training: {r['base_unchanged']}."), ""]


def render_page(result) -> str:
    """The whole page as markdown."""
    parts = (_header(result) + _factorization(result) + _int8(result) + _fold_merge(result)
             + _qkv(result) + _sparse(result) + _lora(result))
    return "\n".join(parts).rstrip() + "\n"
