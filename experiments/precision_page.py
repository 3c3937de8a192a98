"""The precision experiment's markdown page (docs/precision.md): every number from one ``run``."""

from __future__ import annotations

import math

from linearkit.analysis.render import markdown_table

__all__ = ["render_page"]


def _pct(x, digits: int = 1) -> str:
    return f"{100 * x:.{digits}f}%"


def _mib(n) -> str:
    return f"{n / 2 ** 20:,.1f} MiB" if n >= 2 ** 20 else f"{n / 1024:,.1f} KiB"


def _sci(x) -> str:
    """A small number; None (a float16 result that overflowed) as 'overflow'."""
    return "overflow" if x is None else f"{x:.2g}"


def _loss(x) -> str:
    """A loss, or 'NaN (diverged)' for a run that blew up."""
    return f"{x:.3g}" if math.isfinite(x) else "NaN (diverged)"


def _pow2(w) -> str:
    e = math.log2(w)
    return f"2^{e:.0f}" if e == int(e) else _sci(w)


def _scale(s) -> str:
    return "-" if s is None else _pow2(s)


def _header(result) -> list[str]:
    m, c = result.machine, result.config
    lines = ["# Half precision and memory, measured", "",
             ("Every number below comes from the run named above "
              "(`experiments/precision_exp.py`). The pieces are `linearkit.precision` (16-bit "
              "storage, float32 compute and master weights; the policy's `grads=` and "
              "`activations=`), `linearkit.amp.GradScaler`, `linearkit.accumulation`, "
              "`linearkit.checkpoint`, "
              "`linearkit.analysis.range_check` and `linearkit.detect_anomaly` (docs/dtypes.md). "
              "Each section quotes the claim, then says what was measured here."), ""]
    if c.quick_run:
        lines += ["**Quick run** (tiny sizes, a smoke test): the numbers mean nothing.", ""]
    lines += [(f"Machine: {m.get('cpus')} CPUs, Python {m['python']}, NumPy {m['numpy']}, BLAS "
               f"{m.get('blas', 'unknown')}, run on {c.threads} BLAS thread(s) throughout; "
               f"1-minute load average {m['load']:.2f} at the start, "
               f"{m.get('load_after', 0.0):.2f} at the end. The model of sections 1 and 4 is "
               "the MNIST-1D recipe (`linearkit train`: 40 -> 100 ReLU -> residual 100 ReLU -> "
               f"10, batch 100, seed {c.seed}); accuracies are on its 1,000 test rows."), ""]
    return lines


# ---------------------------------------------------------------- 1. loss scaling
def _loss_scaling(result) -> list[str]:
    s, c = result.sections["loss_scaling"], result.config
    plain, scaled = s["adam"]["plain"], s["adam"]["scaler"]
    lines = ["## 1. fp16 gradients and loss scaling (`GradScaler`)", "",
             ("**The claim**: \"梯度在FP16下容易下溢成0，解决办法是先把损失乘一个较大的"
              "系数，反向传播得到放大后的梯度，更新前再除回来\" — gradients easily underflow to 0 "
              "in FP16; the fix is to multiply the loss by a large factor, backpropagate the "
              "enlarged gradients and divide them back before the update."), "",
             (f"Measured: the recipe model stored in float16 with its `.grad` kept in float16 "
              "(`precision.policy(grads=\"storage\")`; the default keeps 16-bit parameters' "
              f"gradients in float32), Adam lr 1e-2, {c.steps} steps, without and with "
              "`GradScaler()` (initial scale 2^16, x2 after 2,000 clean steps). At each probe "
              "step, on the same 100 training rows, the float32 gradient of the current "
              "float16 weights is compared with what float16 stores: *flushed* is the share of "
              "the entries nonzero in float32 that are 0 in float16 (|g| <= 2^-25 ≈ 3e-8 rounds "
              "to 0; float16's smallest normal is 2^-14 ≈ 6.1e-5, its smallest subnormal "
              "2^-24 ≈ 6e-8), *subnormal* the share below the smallest normal (stored with "
              "fewer bits)."), ""]
    rows = []
    for a, b in zip(plain["probes"], scaled["probes"]):
        rows.append((str(a["step"]), f"{a['loss']:.3g}", _sci(a["median"]),
                     _pct(a["subnormal"]), _pct(a["flushed"], 2), _scale(b["scale"]),
                     _pct(b["subnormal"]), _pct(b["flushed"], 2)))
    lines += [markdown_table(("step", "batch loss", "median abs g", "subnormal", "flushed",
                              "scaler: scale", "subnormal (S·g)", "flushed"), rows), ""]
    worst = max(plain["probes"], key=lambda p: p["flushed"])
    first = plain["probes"][0]
    rec = s["recipes"]
    rows = [("float16, fp16 `.grad`, no scaler", _pct(plain["accuracy"]),
             _loss(plain["train_loss"]), "-", "-"),
            ("float16, fp16 `.grad`, `GradScaler`", _pct(scaled["accuracy"]),
             _loss(scaled["train_loss"]), str(scaled["skipped"]), _scale(scaled["final_scale"]))]
    for name, label in (("fp32", "`train(precision=\"fp32\")`"),
                        ("bf16", "`train(precision=\"bf16\")` (float32 `.grad`)"),
                        ("fp16", "`train(precision=\"fp16\")` (float32 `.grad`, scaler)")):
        rows.append((label, _pct(rec[name]["accuracy"]), _loss(rec[name]["train_loss"]),
                     str(rec[name]["skipped"]) if name == "fp16" else "-", "-"))
    lines += [f"After {c.steps} steps:", "",
              markdown_table(("run", "test accuracy", "training loss", "skipped steps",
                              "final scale"), rows, left={0}), ""]
    gap = plain["accuracy"] - scaled["accuracy"]
    stalls = plain["accuracy"] < 0.5 * rec["fp32"]["accuracy"]
    last = plain["probes"][-1]
    spread = [v["accuracy"] for v in rec.values()]
    spread = max(spread) - min(spread)
    # harmless: the scaler gains no more than storing the weights differently moves accuracy
    harmless = not stalls and abs(gap) <= spread
    lines += [(f"On this model {_pct(first['flushed'], 2)} of the float16 gradient entries are "
               f"flushed to 0 at step 0 and {_pct(last['flushed'], 2)} at step {last['step']} "
               "(median |g| "
               f"{_sci(first['median'])} -> {_sci(last['median'])}, batch loss "
               f"{first['loss']:.3g} -> {last['loss']:.3g}"
               + (": gradients shrink as the model fits its training rows"
                  if last["median"] < first["median"] else "")
               + f"), at most {_pct(worst['flushed'], 2)} (step "
               f"{worst['step']}); with the scaler at most "
               f"{_pct(max(p['flushed'] for p in scaled['probes']), 2)}. Training "
               + ("stalls" if stalls else "does not stall")
               + f": {_pct(plain['accuracy'])} without the scaler against "
               f"{_pct(scaled['accuracy'])} with it ({100 * gap:+.1f} points; the three "
               f"`train` runs, which differ only in how the weights are stored, spread over "
               f"{100 * spread:.1f} points) — Adam divides each update by "
               "the gradient's running RMS, so the entries that survive still take full-size "
               f"steps. By the end {_pct(last['subnormal'])} of the entries are float16 "
               "subnormals, kept with fewer significant bits."), ""]
    base = s["sgd_float32"]
    rows = []
    for row in s["sgd"]:
        p, q = row["plain"], row["scaler"]
        rows.append((_pow2(row["weight"]), _pct(p["flushed_first"]), _pct(p["flushed_last"]),
                     _pct(p["accuracy"]), _pct(q["accuracy"]), _pct(q["flushed_last"]),
                     _scale(q["final_scale"]), str(q["skipped"])))
    smallest = s["sgd"][-1]
    lines += [("**Where they do underflow.** The same model and data, the loss multiplied by a "
               "weight w (so every gradient is w times smaller), trained with SGD "
               f"(momentum 0.9) at lr {c.sgd_lr}/w for {c.sgd_steps} steps — in exact "
               "arithmetic w cancels, and with float32 gradients it does (w is a power of "
               f"two): float32 `.grad` at w = {_pow2(base['weight'])} reaches "
               f"{_pct(base['accuracy'])}. With float16 `.grad`:"), "",
              markdown_table(("loss weight w", "flushed at step 0", "flushed at the end",
                              "accuracy, no scaler", "accuracy, scaler",
                              "flushed with scaler (end)", "final scale", "skipped"), rows),
              "",
              (f"At w = {_pow2(smallest['weight'])} float16 stores "
               f"{_pct(smallest['plain']['flushed_first'])} of the gradient as 0 and training "
               + ("stalls" if smallest["plain"]["accuracy"] < 0.2 else "still moves")
               + f" ({_pct(smallest['plain']['accuracy'])}, chance is 10%); the scaler "
               f"restores {_pct(smallest['scaler']['accuracy'])}."
               + (" The claim's mechanism is real; on the recipe itself the entries "
                  "float16 flushes cost no more accuracy than how the weights are stored does."
                  if harmless else "")), ""]
    return lines


# ---------------------------------------------------------------- 2. float16 accumulation
def _dot(result) -> list[str]:
    from .precision_exp import DOT_KINDS

    s = result.sections["dot"]
    lines = ["## 2. Accumulating a dot product in float16 (累加溢出)", "",
             ("**The claim**: \"核心风险是累加溢出：两个FP16数相乘的结果在小范围内没问题，"
              "但几百项求和就可能超出FP16的表示范围。常见做法是乘法用半精度、累加用单精度\" — the "
              "core risk is accumulation overflow: the product of two FP16 numbers is fine, but "
              "a sum of a few hundred terms can leave FP16's range; the usual practice is to "
              "multiply in half precision and accumulate in single precision."), "",
             ("Measured: two float16 vectors of length n, their products summed one by one in "
              "float16 (`np.add.accumulate(a * b, dtype=float16)`), in float32, by NumPy's "
              "`np.dot` on the float16 arrays, and by a float16-stored `linearkit.Linear(n, 1)` "
              "(weight a, input b; the GEMM runs in float32), each as the relative error "
              "against the float64 sum of the same float16 values:"), ""]
    rows = []
    for r in s["rows"]:
        f16 = (f"inf after {r['overflow_at']:,} terms" if r["overflow_at"] is not None
               else f"{r['sum16']:.5g}")
        rows.append((DOT_KINDS[r["kind"]].split(":")[0], f"{r['n']:,}", f"{r['ref']:.6g}", f16,
                     _sci(r["err16"]),
                     _sci(r["err32"]), _sci(r["err_npdot16"]), _sci(r["err_linear"])))
    lines += [markdown_table(("data", "n", "exact sum", "float16 running sum",
                              "float16 rel. error", "float32 rel. error",
                              "np.dot(float16) rel. error", "Linear(float16) rel. error"),
                             rows, left={0}), ""]
    over = [r for r in s["rows"] if r["overflow_at"] is not None]
    pos = [r for r in s["rows"] if r["kind"] == "positive"]
    worst_f32 = max(r["err32"] for r in s["rows"])
    worst_lin = max(r["err_linear"] for r in s["rows"])
    worst_np = max((r["err_npdot16"] for r in s["rows"] if r["err_npdot16"] is not None),
                   default=0.0)
    text = []
    if over:
        first = min(over, key=lambda r: r["overflow_at"])
        beyond = all(abs(r["ref"]) > s["f16_max"] for r in over)
        text.append(f"The float16 running sum overflows (past {s['f16_max']:,.0f}) for "
                    f"{DOT_KINDS[first['kind']].split(': ')[1]}: inf after "
                    f"{first['overflow_at']:,} terms"
                    + (" — and in every such row the exact sum itself is beyond float16's "
                       "range, so no float16 *result* can hold it (NumPy's float16 `np.dot` "
                       "overflows too); the float16-stored Linear returns float32 and does."
                       if beyond else "."))
    else:
        text.append(f"No float16 sum overflowed (past {s['f16_max']:,.0f}) at these lengths.")
    if pos:
        last = pos[-1]
        stalled = last["err16"] is not None and last["err16"] > 0.1
        text.append((f"For products of order 1 the running sum *stalls* before it can "
                     f"overflow: at n = {last['n']:,} it reads {last['sum16']:.5g} against "
                     f"{last['ref']:.6g} — once the sum's spacing (2^-10 of it) exceeds twice "
                     f"a product, adding it changes nothing." if stalled else
                     f"For products of order 1 the running sum reads {last['sum16']:.5g} "
                     f"against {last['ref']:.6g} at n = {last['n']:,}.")
                    + " Adding ones stalls at "
                    f"{s['ones_4096']:,.0f} (the {s['ones_stall']:,}th one; 4,096 were added).")
    text.append(f"Zero-mean products stay in range but lose digits (the errors above). Float32 "
                f"accumulation of the same products errs by at most {_sci(worst_f32)}; "
                f"linearkit's float16-stored Linear, whose GEMM accumulates in float32, by at "
                f"most {_sci(worst_lin)}; NumPy's float16 `np.dot`, where its result fits, by at "
                f"most {_sci(worst_np)} "
                + ("(within float16's rounding of the result, 2^-11 ≈ 4.9e-4: consistent "
                   "with accumulating in higher precision and rounding once)."
                   if worst_np <= 2 ** -11 else
                   "(beyond one float16 rounding of the result)."))
    if over and pos:
        text.append("So float16 accumulation overflows when the products are large (here sums "
                    f"pass {s['f16_max']:,.0f} after about {first['overflow_at']:,} terms of "
                    "mean 64) and, for products of order 1, fails by stagnation long before "
                    "it could overflow; float32 accumulation — what linearkit's 16-bit layers "
                    "do — removes both.")
    lines += [" ".join(text), ""]
    return lines


# ---------------------------------------------------------------- 3. memory
def _case_name(r) -> str:
    name = {"float32": "float32", "bfloat16": "bf16 storage", "float16": "fp16 storage"}[
        r["storage"]]
    if r["activations"] is not None:
        name += f", activations={r['activations']}"
    if r["grads"] == "storage" and r["storage"] != "float32":
        name += ", grads=\"storage\""
    return name


def _memory(result) -> list[str]:
    rows_in, c = result.sections["memory"], result.config
    shape = "x".join(str(d) for d in c.memory_shape)
    n_in = c.memory_shape[-1]
    lines = ["## 3. Memory of 16-bit activations and gradients", "",
             ("**The claim**: \"把激活值和梯度的精度降到fp16，显存直接砍半\" — lower the "
              "activations and gradients to fp16 and the memory is cut in half; its example is "
              "`nn.Linear(1024, 4096)` on `[64, 128, 1024]`, whose float32 output is 128 MB."),
             "",
             (f"Measured: one Adam training step of `Linear({n_in}, {c.memory_out})` on an input "
              f"of shape {shape} (loss = mean of the output), per precision setting. "
              "*Ledger*: `analysis.ledger(model, shape, optimizer=\"adam\").memory` under the "
              "same policy. *Measured* (tracemalloc): the persistent state after a first step "
              "(weights, gradients, master copy, Adam's moments), what the backward holds "
              "after the forward beyond the output (the input is made inside the step, as a "
              "previous layer's output would be), the output itself, and the step's peak."), ""]
    rows = []
    for r in rows_in:
        L = r["ledger"]
        rows.append((_case_name(r), _mib(L["weights"]), _mib(L["grads"]), _mib(L["master"]),
                     _mib(L["optimizer"]), _mib(L["activations"]), _mib(L["total"]),
                     _mib(r["state"]), _mib(r["saved"]), _mib(r["output"]), _mib(r["peak"])))
    lines += [markdown_table(("setting", "weights", "grads", "master", "Adam", "activations",
                              "ledger total", "measured state", "measured saved", "output",
                              "measured step peak"), rows, left={0}), ""]
    f32 = rows_in[0]
    low = next(r for r in rows_in if r["activations"] is not None)
    bf = rows_in[1]
    La, Lb = f32["ledger"], low["ledger"]
    lines += [(f"With bf16 storage, float16 activations and 16-bit gradients the activations "
               f"drop {_mib(La['activations'])} -> {_mib(Lb['activations'])} "
               f"(x{Lb['activations'] / La['activations']:.2f}; measured "
               f"{_mib(f32['saved'])} -> {_mib(low['saved'])}) and the gradients "
               f"{_mib(La['grads'])} -> {_mib(Lb['grads'])} "
               f"(x{Lb['grads'] / La['grads']:.2f}) — those halve. The total does not: "
               f"{_mib(La['total'])} -> {_mib(Lb['total'])} "
               f"(x{Lb['total'] / La['total']:.2f}), because the float32 master copy "
               f"({_mib(Lb['master'])}) and Adam's float32 moments ({_mib(Lb['optimizer'])}) "
               "stay, as in PyTorch's mixed precision. 16-bit storage alone, with the default "
               f"float32 gradients, totals {_mib(bf['ledger']['total'])} — "
               + ("more than" if bf["ledger"]["total"] > La["total"] else "not much less than")
               + " float32's. The output is made in the compute dtype (float32: NumPy has no "
               f"half-precision GEMM), {_mib(f32['output'])} in every setting, and it and its "
               f"gradient ({_mib(2 * f32['output'])}) are part of every step's peak "
               f"({_mib(f32['peak'])} in float32, {_mib(low['peak'])} in 16 bits: "
               f"x{low['peak'] / f32['peak']:.2f}). In a "
               "network the output is the next layer's input, which that layer keeps in 16 "
               "bits under `activations=`."), ""]
    return lines


# ---------------------------------------------------------------- 4. accumulation
def _accumulation(result) -> list[str]:
    s = result.sections["accumulation"]
    k = s["k"]
    lines = ["## 4. Gradient accumulation that forgets to divide by k", "",
             ("**The claim**: \"梯度累积时别忘了把学习率按累积步数相应调整，或者在损失里"
              "除以累积步数，否则等效学习率会变成原来的若干倍，很容易训飞\" — when accumulating "
              "gradients, scale the learning rate or divide the loss by the number of "
              "accumulation steps, or the effective learning rate is multiplied and training "
              "blows up; and the accumulated gradient \"跟一次性算大 batch 是等价的（除了归一化层"
              "的统计量会有细微差别）\" — equals the big batch's, except for the normalization "
              "layers' statistics."), "",
             (f"Measured: batches of {100 * k} rows as k = {k} micro-batches of 100. The "
              f"forgetful loop backpropagates each micro-batch's mean loss from 1: its "
              f"gradient is x{s['norm_ratio']['float32']:.6f} the helper's in float32 "
              f"(x{s['norm_ratio']['float64']:.6f} in float64) — k exactly. "
              "`accumulated_step(..., micro_batches=k)` divides for the user. SGD "
              f"(momentum 0.9), {s['steps']} steps, the recipe model:"), ""]
    rows = []
    for r in s["rows"]:
        rows.append((str(r["lr"]),) + tuple(
            f"{_pct(r[m]['accuracy'])} (loss {_loss(r[m]['train_loss'])})"
            for m in ("big", "helper", "forgetful")))
    lines += [markdown_table(("lr", "one batch", "accumulated_step", "forgetful loop"), rows),
              ""]
    last = s["rows"][-1]
    blew = not math.isfinite(last["forgetful"]["train_loss"])
    bn = s["bn"]
    lines += [(f"The forgetful loop is SGD at k x the learning rate: in float64, after "
               f"{s['exact_steps']} steps at lr {s['exact_lr']}, its weights differ from a "
               f"one-batch run at lr {k * s['exact_lr']:g} by {_sci(s['dw_forgetful_bigk_f64'])}"
               f" (max |Δw|), and the helper's from the one-batch run at lr {s['exact_lr']} by "
               f"{_sci(s['dw_helper_big_f64'])}. In float32 the helper and the one batch are "
               "the same computation up to rounding, which training amplifies: after "
               f"{s['steps']} steps at lr {last['lr']}, {_pct(last['helper']['accuracy'])} "
               f"against {_pct(last['big']['accuracy'])}, max |Δw| "
               f"{_sci(last['dw_float32'])}. "
               + (f"At lr {last['lr']} the forgetful loop "
                  + ("diverges" if blew else "does not diverge")
                  + f" where one batch reaches {_pct(last['big']['accuracy'])}; at a small lr "
                  "the same mistake just trains faster — it is a silent k-fold learning rate."
                  if len(s["rows"]) > 1 else "")).rstrip(), "",
              (f"BatchNorm1d (a `40 -> 100 BatchNorm1d ReLU -> 10` model, one window of "
               f"{100 * k} rows): the big batch counts {bn['tracked_big']} batch in "
               f"`num_batches_tracked`, the accumulated window {bn['tracked_acc']}; the "
               f"running mean differs by up to {_sci(bn['mean_diff'])} (its entries are up to "
               f"{_sci(bn['mean_scale'])}): k updates with momentum {bn['momentum']:g} "
               f"move the running statistics {_pct(1 - (1 - bn['momentum']) ** k, 0)} of the "
               f"way to the micro-batch statistics, one update {_pct(bn['momentum'], 0)} — not "
               "a slight difference. The weights after the step differ by "
               f"{_sci(bn['weight_dw'])}: each micro-batch is normalized with its own "
               "statistics."), ""]
    return lines


# ---------------------------------------------------------------- 5. checkpointing
def _checkpointing(result) -> list[str]:
    s = result.sections["checkpointing"]
    rows = [("peak memory of the step (tracemalloc)", _mib(s["peak_plain"]),
             _mib(s["peak_ckpt"]), _mib(s["saved_measured"])),
            ("saved activations (ledger)", _mib(s["ledger_plain"]), _mib(s["ledger_ckpt"]),
             _mib(s["saved_ledger"])),
            ("step time (median of repeats)", f"{1e3 * s['time_plain']:.1f} ms",
             f"{1e3 * s['time_ckpt']:.1f} ms", f"x{s['time_ratio']:.2f}")]
    return ["## 5. Activation checkpointing", "",
            ("**The claim**: \"另一种思路是重计算（activation checkpointing），牺牲一些计算"
             "时间来换显存\" — recomputation trades some compute time for memory."), "",
            (f"Measured (`experiments.checkpoint_measure.measure_checkpointing`): {s['depth']} "
             f"blocks `Linear({s['width']}, {4 * s['width']}), ReLU, Linear({4 * s['width']}, "
             f"{s['width']})`, float32, input {s['batch']}x{s['width']}, one forward + backward;"
             f" `checkpoint_sequential(model, {s['depth']})` keeps only each segment's input "
             f"and recomputes the block in the backward ({s['repeats']} timed repeats, "
             "interleaved):"), "",
            markdown_table(("", "plain", "checkpointed", "saved / ratio"), rows, left={0}), "",
            (f"Checkpointing saves {_mib(s['saved_measured'])} of the step's peak (the ledger "
             f"predicts {_mib(s['saved_ledger'])}) for x{s['time_ratio']:.2f} the step time: "
             "one extra forward of every checkpointed block."), ""]


# ---------------------------------------------------------------- 6. the init pitfall
def _pitfall(result) -> list[str]:
    s = result.sections["pitfall"]
    plain = s["plain"]
    first_bad = next((i for i, st in enumerate(plain) if not st["finite"]), None)
    bad_grad_step = next((i for i, st in enumerate(plain) if st["bad_grads"]), None)
    problem = s["first_problem"]
    lines = ["## 6. The init that is fine in float32 and breaks float16", "",
             ("**The claim**: \"单精度下正常的初始化转到半精度后，如果数值范围不合适，前几个 "
              "step 直接变成无效值。表现是损失变成 NaN，但报错信息往往指向后面的层……切精度时先把"
              "前向跑一遍，逐层打印输出范围，确认都在安全区间内再开始训练\" — an init that is "
              "fine in single precision turns into invalid values within the first steps in "
              "half precision; the loss becomes NaN but the error points at a later layer; "
              "the cure is one forward printing each layer's output range before training."),
             "",
             (f"Measured on `40 -> 256 ReLU -> 256 BatchNorm1d ReLU -> 10` whose first Linear "
              f"is initialized N(0, {s['std']:g}²) — contrived on purpose: the BatchNorm after "
              "the second Linear makes the first layer's scale irrelevant in float32, where "
              f"it trains to {_pct(s['float32']['accuracy'])} in {s['steps']} steps (Adam lr "
              "1e-2). `range_check(model, x, np.float16)` on 100 training rows, before any "
              "training:"), "",
             s["range_table"], ""]
    if problem is not None:
        lines += [(f"It names layer `{problem['path']}` ({problem['type']}): {problem['flag']}, "
                   f"max |output| {problem['max_abs']:,.0f} against float16's 65,504."), ""]
    story = ("The plain float16 run (weights in float16, activations kept in float16 for the "
             "backward with `policy(activations=np.float16)`, Adam, no scaler): ")
    if bad_grad_step is not None:
        st = plain[bad_grad_step]
        name = st["bad_grads"][0]
        story += (f"at step {bad_grad_step + 1} the loss is "
                  + (f"finite ({st['loss']:.3g})" if st["finite"] else "NaN")
                  + f" but the gradient of `{name}` is not finite — "
                  + (f"a later layer than `{problem['path']}`, whose output it keeps as its "
                     f"input" if problem and not name.startswith(problem["path"] + ".")
                     else "the layer range_check names")
                  + ("; after the update its weights are non-finite" if name in st["bad_weights"]
                     else ""))
        if first_bad is not None:
            story += (f", and from step {first_bad + 1} the loss is NaN "
                      f"({len(plain[first_bad]['bad_weights'])} parameter tensors are "
                      "non-finite).")
        else:
            story += "."
    else:
        story += f"all {len(plain)} steps stayed finite."
    lines += [story, ""]
    if s["anomaly"] is not None:
        where = s["anomaly"]["path"]
        lines += [("`with linearkit.detect_anomaly():` stops that first step at module "
                   f"`{where}`"
                   + (f" — the later layer again, whose kept float16 copy of its input is the "
                      f"first non-finite array; its message sends you to range_check, which "
                      f"names `{problem['path']}`" if problem and where != problem["path"]
                      else "") + ":"), "", "```", s["anomaly"]["message"], "```", ""]
    else:
        lines += ["`detect_anomaly()` raised nothing in that step.", ""]
    f32act = s["fp16_f32_act"]
    fixed = f"fp16, activations=float16, layer `{problem['path'] if problem else '0'}` default init"
    rows = [("float32", _pct(s["float32"]["accuracy"]), _pct(s["float32"]["train_accuracy"]),
             "-"),
            ("bf16 storage, activations=bfloat16", _pct(s["bf16"]["accuracy"]),
             _pct(s["bf16"]["train_accuracy"]), "bfloat16 has float32's range"),
            ("fp16 storage, float32 activations (scaler)", _pct(f32act["accuracy"]),
             _pct(f32act["train_accuracy"]),
             f"BatchNorm running_var finite: {_pct(f32act['running_var_finite'], 0)}"),
            (fixed, _pct(s["fp16_fixed"]["accuracy"]),
             _pct(s["fp16_fixed"]["train_accuracy"]),
             "the layer range_check named, re-initialized")]
    lines += [f"What else was tried ({s['steps']} steps each, Adam lr 1e-2):", "",
              markdown_table(("setting", "test accuracy", "train accuracy (eval mode)", "note"),
                             rows, left={0, 3}), ""]
    if s["fp16_fixed"]["accuracy"] > s["float32"]["accuracy"] + 0.02:
        lines += [("The re-initialized run beats the float32 one, likely because with std "
                   f"{s['std']:g} Adam's steps (about its lr, 1e-2) barely move the first "
                   "layer's weights: the large init was harmless in float32, not helpful."), ""]
    if f32act["running_var_finite"] < 1:
        lines += [("Keeping activations in float32 avoids the overflow in training — and hides "
                   "a second one: the BatchNorm's running variance (up to "
                   f"{s['float32']['running_var_max']:.2g} in the float32 run) is stored in "
                   "float16 with the other buffers and becomes inf, so the model in eval mode "
                   "is broken "
                   f"({_pct(f32act['accuracy'])}) although its training loss "
                   f"({f32act['final_loss']:.3g}) looks fine. "
                   + (f"`range_check` caught this one too, before training: it checks each "
                      f"layer's buffers, and the BatchNorm's running variance after its one "
                      f"forward already overflows float16 (layer "
                      f"{', '.join(repr(p) for p in s['norm_flags'])} in the table above)."
                      if s.get("norm_flags") else
                      "`range_check`'s `headroom` flag on the Linear feeding the BatchNorm is "
                      "the hint.")), ""]
    return lines


def render_page(result) -> str:
    """The whole page as markdown."""
    parts = (_header(result) + _loss_scaling(result) + _dot(result) + _memory(result)
             + _accumulation(result) + _checkpointing(result) + _pitfall(result))
    return "\n".join(parts).rstrip() + "\n"
