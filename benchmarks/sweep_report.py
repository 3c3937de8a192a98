"""The sweep group's tables and findings: for the report (docs/performance.md) and for
docs/sweep.md, two popular claims about batch size and layer width beside what this machine
measured.

Every number and every verdict is computed from the results of ``python -m benchmarks``
(``--only sweep`` is enough); nothing here is typed by hand but the claims themselves, quoted
and translated.
"""

from __future__ import annotations

from . import cases
from .report import View, _md_table, _ok, _section, div, machine_line, num, rate, ratio

PAGE_CMD = "python -m benchmarks --only sweep --write-docs"
VARIANTS = (("linearkit", "auto", "linearkit, default policy"), ("linearkit", "1t", "1 thread"),
            ("linearkit", "2t", "2 threads"), ("torch", "default", "PyTorch"))
# how close (as a ratio) two timings must be to count as "the same" in a verdict
SAME = 0.05

CLAIMS = [  # (who says it, their words with the commas restored, in English)
    ("a popular tutorial on linear layers",
     ("线性层的计算量是B × in × out次乘加，理论上 B 越小越快。但实测经常相反，B=1 时吞吐量远低于 "
      "B=32。……小 batch 时算子变成读一次权重只算一次，权重读取时间远大于计算时间，硬件算力严重闲置。"
      "……我一般会做一个小规模的扫描：固定输入长度，把 batch 从 1 试到 64，记录吞吐和延迟，找拐点。"),
     ("A linear layer costs B × in × out multiply-adds, so in theory a smaller B is faster; "
      "measured, it is often the opposite: throughput at B=1 is far below B=32 ... with a small "
      "batch the operator reads the weights once to compute once; reading the weights takes far "
      "longer than the arithmetic, and the hardware sits idle ... I sweep the batch from 1 to "
      "64, record throughput and latency, and look for the knee.")),
    ("a popular tutorial on linear layers",
     ("很多矩阵乘实现在某些维度上会走特殊路径，维度是特定数值的整数倍时性能明显更好。把维度从 250 "
      "改成 256，参数量多一点，速度可能快不少。"),
     ("Many matrix-multiply implementations take special paths for some dimensions: when a "
      "dimension is a multiple of particular numbers, performance is clearly better. Changing a "
      "dimension from 250 to 256 costs a few more parameters and may run quite a bit faster.")),
]


# ----------------------------------------------------------------------------- access
def _result(v: View, fw: str, kind: str, tag: str) -> dict | None:
    return v.get("sweep", fw, f"{kind}/{tag}") if v.has("sweep") else None


def _by_key(res: dict | None) -> dict:
    """``{batch or width: row}`` of one sweep result (empty when it did not run)."""
    if not res:
        return {}
    key = "batch" if res.get("kind") == "batch" else "in_features"
    return {r[key]: r for r in res.get("rows", [])}


def _policy(v: View) -> dict:
    return (v.get("sweep", "linearkit", "policy") or {}) if v.has("sweep") else {}


def policy_threads(macs: int, policy: dict) -> str:
    """The thread count linearkit's default policy gives a GEMM of ``macs`` multiply-adds:
    1 under ``SMALL_GEMM_MACS``, else up to the BLAS's own count while cores are idle."""
    small, ceiling = policy.get("small_gemm_macs"), policy.get("num_threads")
    if not _ok(small):
        return "n/a"
    return "1" if macs < small else f"≤ {ceiling}" if _ok(ceiling) and ceiling > 1 else "1"


def ran_like(auto, one, two) -> str:
    """Which fixed thread count the default policy's time is closest to (log distance), or
    "either" when the two fixed counts are within SAME of each other."""
    if not (_ok(auto) and _ok(one) and _ok(two)):
        return "n/a"
    if abs(one / two - 1) <= SAME:
        return "either"
    return "1 thread" if abs(auto / one - 1) <= abs(auto / two - 1) else "2 threads"


def policy_ran_like(macs: int, policy: dict, auto, one, two) -> str:
    """:func:`ran_like`, except below the threshold, where the policy is known to run one
    thread whatever the timings say."""
    if policy_threads(macs, policy) == "1":
        return "1 thread (by rule)"
    return ran_like(auto, one, two)


def _cell(row: dict | None, what: str) -> str:
    """``samples/s (ms)`` of a batch-sweep row; ``what`` is ``forward`` or ``train``."""
    if not row:
        return "n/a"
    return f"{rate(row.get(f'{what}_samples_s'))} ({num(row.get(f'{what}_ms'), 3)} ms)"


def _ms(row: dict | None, what: str):
    return (row or {}).get(f"{what}_ms")


# ----------------------------------------------------------------------------- tables
def batch_table(v: View) -> dict | None:
    got = {(fw, tag): _result(v, fw, "batch", tag) for fw, tag in
           (("linearkit", "auto"), ("linearkit", "1t"), ("torch", "default"))}
    if not any(got.values()):
        return None
    rows_of = {k: _by_key(r) for k, r in got.items()}
    policy = _policy(v)
    in_f, out_f = cases.SWEEP_LAYER
    batches = sorted({b for rows in rows_of.values() for b in rows})
    rows = []
    for b in batches:
        macs = b * in_f * out_f
        row = [str(b), num(macs / 1e6, 1), policy_threads(macs, policy)]
        for what in ("forward", "train"):
            row += [_cell(rows_of[k].get(b), what) for k in got]
        rows.append(row)
    knees = ["knee (90% of best)", "", ""]
    for field in ("knee", "knee_backward"):
        knees += [f"batch {r[field]}" if r and r.get(field) else "n/a" for r in got.values()]
    rows.append(knees)
    return _section(
        f"10a. Batch sweep: Linear({in_f}, {out_f}) float32, batch 1 to "
        f"{cases.SWEEP_MAX_BATCH} (samples/s, ms per call)",
        ["batch", "M MACs per GEMM", "policy's threads", "fwd: linearkit (policy)",
         "fwd: linearkit, 1 thread", "fwd: PyTorch", "fwd+bwd: linearkit (policy)",
         "fwd+bwd: linearkit, 1 thread", "fwd+bwd: PyTorch"], rows,
        "`linearkit.analysis.layer_sweep.batch_sweep` (what `linearkit sweep --backward` prints): one layer, "
        "inputs of each batch size, every batch timed once per round (medians of "
        f"{v.meta.get('config', {}).get('sweep_repeats', '?')} rounds). fwd+bwd: `zero_grad`, "
        "`vjp`, the closure (dX, dW, db). The knee is the smallest batch whose throughput "
        "reaches 90% of the sweep's best. *Policy's threads*: what `linearkit.backend.threads` gives "
        "each of these GEMMs (1 under `SMALL_GEMM_MACS` multiply-adds; above it up to the "
        "BLAS's own count while the cores are idle). PyTorch: `nn.Linear`, its own threads, "
        "in its own process.")


def dims_table(v: View) -> dict | None:
    got = {(fw, tag): _result(v, fw, "dims", tag) for fw, tag, _ in VARIANTS}
    if not any(got.values()):
        return None
    rows_of = {k: _by_key(r) for k, r in got.items()}
    policy = _policy(v)
    n = cases.SWEEP_DIM_BATCH
    rows = []
    for d in cases.SWEEP_DIMS:
        macs = n * d * d
        row = [str(d), num(macs / 1e6, 2), policy_threads(macs, policy)]
        for what in ("forward", "train"):
            ms = {k: _ms(rows_of[k].get(d), what) for k in got}
            row += [num(ms[k], 3) for k in got]
            row.append(policy_ran_like(macs, policy, ms[("linearkit", "auto")],
                                       ms[("linearkit", "1t")], ms[("linearkit", "2t")]))
        rows.append(row)
    header = ["width d", "M MACs per GEMM", "policy's threads"]
    for what in ("fwd", "fwd+bwd"):
        header += [f"{what}: {label}" for _, _, label in VARIANTS] + [f"{what}: policy ran like"]
    return _section(
        f"10b. Width sweep: square Linear(d, d) float32 at batch {n} (ms per call)",
        header, rows,
        "`linearkit.analysis.layer_sweep.dim_sweep` (what `linearkit sweep --dims ...` prints), under the "
        "default thread policy and with the BLAS fixed at 1 and at 2 threads "
        "(`linearkit.backend.threads.num_threads`); every width timed once per round. *Policy ran "
        "like*: the fixed count whose time the policy's is closest to (\"either\" when 1 and 2 "
        "threads are within 5% of each other); below the threshold the policy runs one thread "
        "by rule.")


def pairs(v: View) -> list[dict]:
    """Each (narrow, wide) width pair: FLOP ratio and, per variant and pass, the wide layer's
    time over the narrow one's."""
    got = {(fw, tag): _by_key(_result(v, fw, "dims", tag)) for fw, tag, _ in VARIANTS}
    dims = cases.SWEEP_DIMS
    out = []
    for narrow, wide in zip(dims[::2], dims[1::2]):
        item = {"narrow": narrow, "wide": wide, "work": (wide / narrow) ** 2, "time": {}}
        for k, rows in got.items():
            for what in ("forward", "train"):
                item["time"][(k, what)] = div(_ms(rows.get(wide), what),
                                              _ms(rows.get(narrow), what))
        out.append(item)
    return out


def pairs_table(v: View) -> dict | None:
    items = pairs(v)
    if not any(_ok(t) for it in items for t in it["time"].values()):
        return None
    rows = []
    for it in items:
        row = [f"{it['narrow']} → {it['wide']}", ratio(it["work"])]
        for what in ("forward", "train"):
            row += [ratio(it["time"][((fw, tag), what)]) for fw, tag, _ in VARIANTS]
        rows.append(row)
    header = ["widths", "work ratio"]
    for what in ("fwd", "fwd+bwd"):
        header += [f"{what}: {label}" for _, _, label in VARIANTS]
    return _section(
        f"10c. Wider over narrower: time ratio of each width pair at batch "
        f"{cases.SWEEP_DIM_BATCH}",
        header, rows,
        "The wider layer's time per call over the narrower one's (the width sweep's table). "
        "Below 1: the "
        "wider, aligned layer is faster per call, as the article claims for 250 → 256; equal "
        "to the work ratio ((wide/narrow)², the extra FLOPs): no alignment effect; between the "
        "two: faster per FLOP but not per call.")


def sections(v: View) -> list[dict]:
    made = [batch_table(v), dims_table(v), pairs_table(v)]
    out = [s for s in made if s is not None]
    if out:
        out[-1]["notes"] = findings(v)
    return out


# ----------------------------------------------------------------------------- findings
def _verdict(r, work) -> str:
    if not _ok(r):
        return "not measured"
    if r < 1 - SAME:
        return "faster per call"
    per_flop = work / r
    if r <= 1 + SAME:
        return "the same per call (within 5%) although it does more work"
    if per_flop > 1 + SAME:
        return f"slower per call, but {per_flop:.2f}× the rate per FLOP"
    if per_flop >= 1 - SAME:
        return "slower in proportion to its extra work (no alignment effect)"
    return f"slower per FLOP ({per_flop:.2f}× the rate)"


def batch_findings(v: View) -> list[str]:
    lines = []
    for (fw, tag), label in ((("linearkit", "1t"), "linearkit at 1 thread"),
                             (("linearkit", "auto"), "linearkit under its thread policy"),
                             (("torch", "default"), "PyTorch")):
        res = _result(v, fw, "batch", tag)
        rows = _by_key(res)
        if not rows or 1 not in rows or 32 not in rows:
            continue
        gain = div(rows[32]["forward_samples_s"], rows[1]["forward_samples_s"])
        gain_t = div(rows[32].get("train_samples_s"), rows[1].get("train_samples_s"))
        knee, knee_b = res.get("knee"), res.get("knee_backward")
        lat = div(rows.get(knee, {}).get("forward_ms"), rows[1]["forward_ms"])
        last = max(rows)
        edge = [name for name, k in (("forward", knee), ("forward+backward", knee_b))
                if k == last]
        lines.append(
            f"Batch, {label}: batch 32 gives {ratio(gain)} the forward throughput of batch 1 "
            f"({ratio(gain_t)} forward+backward); the knee is batch {knee} forward, batch "
            f"{knee_b} forward+backward, where one call takes {ratio(lat)} as long as at "
            "batch 1." + (f" The {' and '.join(edge)} knee is the largest batch swept: "
                          f"throughput was still rising at {last}." if edge else ""))
    lines += weight_traffic(v)
    return lines


def weight_traffic(v: View) -> list[str]:
    """The article's reason (the weights are read once per call) checked on the 1-thread sweep:
    how the time per call grows with the batch, and the weight bandwidth at batch 1."""
    rows = _by_key(_result(v, "linearkit", "batch", "1t"))
    if 1 not in rows or len(rows) < 3:
        return []
    in_f, out_f = cases.SWEEP_LAYER
    weight = 4 * in_f * out_f
    one, last = rows[1], rows[max(rows)]
    second = rows[min(b for b in rows if b > 1)]
    growth = div(last["forward_ms"], second["forward_ms"])
    gbs = div(weight / 1e9, one["forward_ms"] / 1e3)
    text = (f"The article's reason, checked at 1 thread: every call reads the "
            f"{weight / 2**20:.0f} MiB float32 weight once and does 2·batch·{in_f}·{out_f} "
            f"FLOPs (batch/2 FLOPs per byte of weight). At batch 1 one call takes "
            f"{num(one['forward_ms'], 3)} ms, i.e. the weight streams at {num(gbs, 1)} GB/s "
            f"for {num(one['forward_gflops'], 1)} GFLOP/s; from batch {second['batch']} to "
            f"{last['batch']} the rows grow {last['batch'] // second['batch']}× while the time "
            f"per call grows {ratio(growth)} ({num(last['forward_gflops'], 1)} GFLOP/s at "
            f"{last['batch']}).")
    step = div(second["forward_ms"], one["forward_ms"])
    if _ok(step) and step > 2:
        text += (f" Batch {second['batch']} costs {ratio(step)} batch 1 per call: a one-row "
                 "product is a matrix-vector one, which the BLAS runs by a different, "
                 "bandwidth-bound kernel than the GEMM of two rows and more.")
    return [text]


def width_findings(v: View) -> list[str]:
    lines = []
    for it in pairs(v):
        one = it["time"][(("linearkit", "1t"), "forward")]
        pt = it["time"][(("torch", "default"), "forward")]
        one_b = it["time"][(("linearkit", "1t"), "train")]
        if not _ok(one) and not _ok(pt):
            continue
        lines.append(
            f"Width {it['narrow']} → {it['wide']} (work {ratio(it['work'])}): forward at 1 "
            f"thread {ratio(one)} the time — {_verdict(one, it['work'])}; forward+backward "
            f"{ratio(one_b)} — {_verdict(one_b, it['work'])}; PyTorch forward {ratio(pt)} — "
            f"{_verdict(pt, it['work'])}.")
    return lines


def thread_findings(v: View) -> list[str]:
    """Whether the policy's thread switch lands between a width pair (or inside the batch
    sweep), and what it did to the comparison in this run."""
    policy = _policy(v)
    small = policy.get("small_gemm_macs")
    if not _ok(small):
        return []
    n = cases.SWEEP_DIM_BATCH
    lines = []
    crossing = [it for it in pairs(v) if n * it["narrow"] ** 2 < small <= n * it["wide"] ** 2]
    for it in crossing:
        d, big = it["narrow"], it["wide"]
        rows = {tag: _by_key(_result(v, "linearkit", "dims", tag)) for tag in ("auto", "1t", "2t")}
        t = {(tag, w): _ms(rows[tag].get(w), "forward") for tag in rows for w in (d, big)}
        like = {w: policy_ran_like(n * w * w, policy, t[("auto", w)], t[("1t", w)],
                                   t[("2t", w)]) for w in (d, big)}
        r_auto = it["time"][(("linearkit", "auto"), "forward")]
        r_one = it["time"][(("linearkit", "1t"), "forward")]
        r_two = it["time"][(("linearkit", "2t"), "forward")]
        two_over_one = div(t[("2t", big)], t[("1t", big)])
        text = (f"The thread switch: `linearkit.backend.threads` runs a GEMM under SMALL_GEMM_MACS = "
                f"{small:,} multiply-adds on one thread. At batch {n}, Linear({d}, {d})'s "
                f"GEMMs are {n}·{d}² = {n * d * d:,} multiply-adds (always one thread) and "
                f"Linear({big}, {big})'s {n}·{big}² = {n * big * big:,} (up to "
                f"{policy.get('num_threads')} threads while the cores are idle): this pair "
                "straddles the threshold. Measured forward, wider over narrower: "
                f"{ratio(r_auto)} under the policy, {ratio(r_one)} at 1 thread, "
                f"{ratio(r_two)} at 2 threads; the policy's times ran like {like[d]} at {d} and "
                f"{like[big]} at {big} (at {big}, 2 threads took {ratio(two_over_one)} the "
                "1-thread time). ")
        if like[big] == "2 threads" and like[d] != "2 threads" and _ok(r_auto) and _ok(r_one) \
                and abs(r_auto / r_one - 1) > SAME:
            text += (f"So under the default policy the {d} → {big} difference is mostly the "
                     f"switch to two threads, not alignment: with the thread count fixed, "
                     f"{big} takes {ratio(r_one)} the time of {d}.")
        elif like[big] == "1 thread":
            others = policy.get("other_busy_cores")
            seen = (f" (other processes kept {num(others, 2)} cores busy at its last look)"
                    if _ok(others) else "")
            text += (f"In this run the policy kept {big} on one thread too{seen}: the machine "
                     "was not idle, so the switch did not change the comparison. On an idle "
                     f"machine the policy gives {big} two threads and {d} one, and the "
                     f"comparison measures the thread count as well as the width; compare "
                     "widths with `--threads 1`.")
        else:
            text += ("Here the switch did not move the ratio by more than 5%; compare widths "
                     "with `--threads 1` all the same.")
        lines.append(text)
    in_f, out_f = cases.SWEEP_LAYER
    first = next((b for b in (2 ** i for i in range(12)) if b * in_f * out_f >= small), None)
    if first is not None and first <= cases.SWEEP_MAX_BATCH:
        lines.append(f"In the batch sweep, Linear({in_f}, {out_f}) reaches the threshold at "
                     f"batch {first} ({first}·{in_f}·{out_f} = {first * in_f * out_f:,}): from "
                     "there on the policy may use more threads, which moves the knee as well; "
                     "the 1-thread columns show the batch effect alone.")
    return lines


def findings(v: View) -> list[str]:
    return batch_findings(v) + width_findings(v) + thread_findings(v)


# ----------------------------------------------------------------------------- the page
def render_markdown(results: dict) -> str:
    """docs/sweep.md: the claims, how to rerun, the tables, the findings (all from ``results``)."""
    from .report import _load_line, _mode, _rendered, _wall, page_header

    meta = results.get("meta", {})
    v = View(results)
    argv = " ".join(meta.get("argv", PAGE_CMD.split()))
    generated = (f"Measured with `{argv}`, started {meta.get('date', '?')}"
                 f"{'' if _mode(meta) == 'full' else f' ({_mode(meta)} run)'}{_wall(meta)}"
                 f"{_rendered(meta)}.")
    out = ["# Batch size and layer width: popular claims, measured here", "",
           page_header(meta), "",
           (f"<!-- Generated by `{PAGE_CMD}` (or a full `python -m benchmarks --write-docs`) "
            "from measured results; do not edit by hand. -->"), "",
           generated, "", f"Machine: {machine_line(v.info)}", ""]
    if _load_line(meta):
        out += [(f"During the run: {_load_line(meta)} (a shared machine: a load above its "
                 f"{v.info.get('usable_cores', '?')} cores means others competed and the "
                 "figures are noisy)."), ""]
    out += ["## What is claimed", ""]
    for where, zh, en in CLAIMS:
        out += [f"> {zh}", ">", f"> — {where} (its commas restored); in English: *{en}*", ""]
    layer = (f"--in-features {cases.SWEEP_LAYER[0]} --out-features {cases.SWEEP_LAYER[1]} "
             f"--max-batch {cases.SWEEP_MAX_BATCH}")
    dims = f"--dims {','.join(map(str, cases.SWEEP_DIMS))} --batch {cases.SWEEP_DIM_BATCH}"
    out += [("The article speaks of accelerator cards; this page measures the CPU this library "
             "runs on, with NumPy's BLAS. Check your own machine with the same measurement:"), "",
            "```", f"linearkit sweep {layer} --backward",
            f"linearkit sweep {dims} --backward --threads 1", "```", ""]
    found = {"batch": batch_findings(v), "width": width_findings(v),
             "threads": thread_findings(v)}
    if not v.has("sweep"):
        out += ["*The sweep group did not run: nothing measured.*", ""]
    for title, table, key in (("Batch size: the knee", batch_table(v), "batch"),
                              ("Width: 250 vs 256, 1000 vs 1024, 4000 vs 4096", dims_table(v),
                               "width"),
                              (None, pairs_table(v), None),
                              ("Alignment, or the thread switch?", None, "threads")):
        if title:
            out += [f"## {title}", ""]
        if table is not None:
            out += [f"### {table['title'].split('. ', 1)[-1]}", "", table["intro"], "",
                    _md_table(table["header"], table["rows"]), ""]
        if key:
            out += [f"- {line}" for line in found[key]] + ([""] if found[key] else [])
    if v.notes:
        out += ["## Not measured", ""] + [f"- {n}" for n in v.notes] + [""]
    return "\n".join(out)
