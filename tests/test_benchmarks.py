"""benchmarks/: the targets' MET/MISSED logic, the large group's rounds, the sweep page's findings
and the docs writer, on synthetic results (no timing here: the numbers are made up), plus the
end-to-end PyTorch script on a few steps."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # benchmarks/ is not installed with the package
    sys.path.insert(0, str(ROOT))

from benchmarks import cases, report, run, sweep_report


def _w(results: dict) -> dict:
    return {"results": results, "errors": {}}


def synthetic(lk: float = 1.0) -> dict:
    """Results of every group but profile, linearkit's times scaled by ``lk``; at ``lk=1`` every
    target is met by a margin of about 10%."""
    runs: dict = {"info": {"usable_cores": 2}}
    large = {fw: {} for fw in ("numpy", "linearkit", "torch", "jax")}
    for x_shape, out_f in cases.LARGE:
        for kind in ("fwd", "fwdbwd"):
            case = cases.large_id(kind, x_shape, out_f)
            large["numpy"][case] = {"median_s": 1.0, "round_medians_s": [1.0, 1.0, 1.0]}
            large["linearkit"][case] = {"median_s": lk, "round_medians_s": [lk, lk, lk]}
            large["torch"][case] = large["jax"][case] = {"median_s": 1.2}
    runs["large"] = {fw: _w(r) for fw, r in large.items()}
    prec = {}
    for x_shape, out_f in cases.PRECISION:
        for kind in ("fwd", "fwdbwd"):
            case = cases.large_id(kind, x_shape, out_f)
            for var in ("float32", "bfloat16", "float16", "bfloat16-whole", "float16-whole"):
                prec[f"{case}:{var}"] = {"median_s": 0.05, "ratio": 1.1 * lk,
                                         "peak_bytes": 2**24}
    runs["precision"] = {"linearkit": _w(prec)}
    runs["small"] = {
        "numpy": _w({"fwd": {"median_s": 2e-6}, "fwdbwd": {"median_s": 6e-6}}),
        "linearkit": _w({"fwd": {"median_s": 2.7e-6 * lk}, "fwdbwd": {"median_s": 8.7e-6 * lk}}),
        "torch": _w({"fwd": {"median_s": 5e-6}, "fwdbwd": {"median_s": 26e-6}}),
        "jax": _w({"fwd": {"median_s": 9e-6}, "fwdbwd": {"median_s": 30e-6}})}
    b1 = {f"bwd:{i}->{o}": {"median_s": 90e-6 * lk} for i, o in cases.BATCH1}
    runs["batch1"] = {"linearkit": _w(b1), "numpy": _w(b1),
                      "torch": _w({k: {"median_s": 100e-6} for k in b1})}
    mlp = {"linearkit": {}, "torch": {}, "jax": {}, "numpy": {}}
    for b in cases.MLP_TRAIN_BATCHES:
        mlp["linearkit"][f"train:{b}"] = {"median_s": 1e-3 * lk}
        mlp["torch"][f"train-fused:{b}"] = {"median_s": 1.1e-3 * cases.MLP_VS_TORCH_FUSED[b]}
        mlp["torch"][f"train:{b}"] = {"median_s": 2e-3}
        mlp["jax"][f"train:{b}"] = {"median_s": 1.1e-3 * cases.MLP_VS_JAX[b]}
        mlp["numpy"][f"train:{b}"] = {"median_s": 1.2e-3}
        # the target reads linearkit's own GEMMs (its thread policy), not bare NumPy's
        mlp["linearkit"][f"gemms:{b}"] = {"median_s": 1e-3 / (cases.MLP_GEMM_LIMIT - 0.1)}
        mlp["numpy"][f"gemms:{b}"] = {"median_s": 1e-4}
    for b, pt, jx in ((1, 2.2e-4, 1.1e-4), (256, 1.2e-3, 1.1e-3)):
        mlp["linearkit"][f"infer:{b}"] = {"median_s": 1e-4 if b == 1 else 1e-3}
        mlp["torch"][f"infer:{b}"], mlp["jax"][f"infer:{b}"] = {"median_s": pt}, {"median_s": jx}
        mlp["numpy"][f"infer:{b}"] = {"median_s": 1e-4}
    runs["mlp"] = {fw: _w(r) for fw, r in mlp.items()}
    runs["recipe"] = {
        "linearkit": _w({"train": {"median_s": lk}, "train-cli": {"median_s": lk}}),
        "torch": _w({"train": {"median_s": 4.4}, "train-fused": {"median_s": 4.0}}),
        "jax": _w({"train": {"median_s": 1.32}}), "numpy": _w({"train": {"median_s": 1.2}})}
    e2e = {"steps": 6000, "loop_s": 1.0, "import_s": 0.5, "test_accuracy": 0.7}
    runs["e2e"] = {
        "linearkit": _w({"train": {**e2e, "median_s": 2.0 * lk},
                         "fast": {"numba": True, "LINEARKIT_FAST": None}}),
        "torch": _w({"train": {**e2e, "median_s": 3.0}, "train-fused": {**e2e, "median_s": 2.2}}),
        "jax": _w({"train": {**e2e, "median_s": 2.2}})}
    busy = {}
    for step in cases.BUSY_STEPS:
        for variant, idle, loaded in (("default", 1.0, 1.5), ("1thread", 1.0, 1.2),
                                      ("2threads", 1.2, 3.0)):
            busy[f"{step}/{variant}:idle"] = {"median_s": idle * lk, "other_cores": 0.0}
            busy[f"{step}/{variant}:busy"] = {"median_s": loaded * lk, "other_cores": 1.0}
    runs["busy"] = {"linearkit": _w(busy)}
    imp = {"median_s": 0.07 * lk, "peak_rss_mib": 30.0, "heavy": [], "modules": 200}
    runs["footprint"] = {"linearkit": _w({"import": {
        "linearkit": imp, "numpy": {**imp, "median_s": 0.05}, "importtime_top": []}})}
    runs["memory"] = {"linearkit": _w({"train:recipe": {
        "steps": cases.MEMORY_STEPS, "growth_bytes": 800.0 * lk, "growth_per_step_bytes": 0.8,
        "step_peak_bytes": 1e5, "activation_bytes": 8e4, "param_bytes": 6e4,
        "grads_reused": True, "state_reused": True, "dtype_kept": True, "top_growth": []}})}
    groups = [g for g in cases.GROUPS if g in runs]
    return {"meta": {"groups": groups, "config": cases.config(False), "quick": False},
            "runs": {"clean": runs}}


def status_of(rows, words: str) -> str:
    found = [r for r in rows if words in r[1]]
    assert len(found) == 1, (words, [r[1] for r in rows])
    return found[0][3]


SECOND_ROUND = [  # one phrase per performance target (performance.md's "Targets" table), in its order
    "MLP train b32 ≥ 1.5× PyTorch fused", "MLP train b128 ≥ 1.15× PyTorch fused",
    "MLP train b512 ≥ 1.1× PyTorch fused", "MLP train b32 ≥ 1.1× JAX", "MLP train b128 ≥ 0.95× JAX",
    "MLP train b512 ≥ 0.9× JAX", "step ≤ 1.15× its 8 GEMMs",
    "`linearkit train` recipe: per step ≥ 4× PyTorch eager",
    "`linearkit train` recipe: per step ≥ 1.2× JAX jit",
    "fresh process, 6,000 steps: faster than PyTorch", "fresh process, 6,000 steps: faster than JAX",
    "forward ≤ 1.5× the bare-NumPy floor", "forward+backward ≤ 1.6× the bare-NumPy floor",
    "batch-1 backward 1024->1024", "batch-1 backward 1024->4096",
    "fwd 256x1024->4096 ≥ 95%", "fwd+bwd 256x1024->4096 ≥ 95%", "fwd 1024x1024->4096 ≥ 95%",
    "fwd+bwd 1024x1024->4096 ≥ 95%", "fwd 64x128x1024->4096 ≥ 95%",
    "fwd+bwd 64x128x1024->4096 ≥ 95%", "import linearkit ≤ 100 ms", "≤ 35 MiB",
    "no growth over 1,000 training steps", "recipe: busy ≤ 3× idle", "mlp128: busy ≤ 3× idle",
]


def test_every_second_round_target_is_one_row_and_met_when_linearkit_is_fast_enough():
    rows = report.targets(report.View(synthetic()))
    assert all(len(r) == 4 for r in rows)
    for words in SECOND_ROUND:
        assert status_of(rows, words).startswith("MET"), words
    assert all(r[3].startswith("MET") for r in rows), [r for r in rows if "MET" not in r[3]]
    # the superseded, looser small-call limits are gone
    assert not [r for r in rows if "≤ 2 µs" in r[1] or "≤ 6 µs" in r[1]]


def test_a_slower_linearkit_misses_the_targets_with_the_margin():
    rows = report.targets(report.View(synthetic(lk=1.3)))
    for words in SECOND_ROUND[:15]:
        assert status_of(rows, words).startswith("MISSED"), words
    large = status_of(rows, "fwd 256x1024->4096 ≥ 95%")
    assert large == "MISSED in 3 of 3 rounds (worst 77%)"
    assert status_of(rows, "MLP train b512 ≥ 1.1× PyTorch fused") == "MISSED by 15%"


def test_large_rounds_need_three_and_fail_on_any():
    assert report.rounds_status([1.0, 0.97, 1.2], 0.95, 3) == "MET in all 3 rounds (worst 97%)"
    assert report.rounds_status([1.0, 0.90, 1.2], 0.95, 3).startswith("MISSED in 1 of 3")
    assert report.rounds_status([1.0], 0.95, 3).startswith("n/a: 1 of 3 rounds")
    assert report.rounds_status([0.5], 0.95, 3).startswith("MISSED")
    assert report.rounds_status([], 0.95, 3) == "n/a"


def test_rounds_stay_paired_when_one_round_failed():
    ok = lambda t: {"results": {"c": {"median_s": t}}}
    merged = run.merge_rounds([ok(2.0), {"results": {}, "errors": {"c": "boom"}}, ok(1.0)])
    assert merged["results"]["c"]["median_s"] == 1.0
    assert merged["results"]["c"]["round_medians_s"] == [2.0, None, 1.0]
    assert "c" not in merged.get("errors", {})
    res = {"meta": {}, "runs": {"clean": {"large": {
        "numpy": {"results": {"c": {"median_s": 1.0, "round_medians_s": [1.0, 1.0, 1.0]}}},
        "linearkit": merged}}}}
    assert report.round_ratios(report.View(res), "large", "c") == [0.5, 1.0]


def test_the_full_report_renders_from_synthetic_results():
    results = synthetic()
    text = report.render_text(results)
    md = report.render_markdown(results)
    assert report.TARGETS_TITLE in text and f"### {report.TARGETS_TITLE}" in md
    assert "| set | target | measured | status |\n|---|---|---:|---:|" in md
    assert "5b. The recipe end to end" in md and "4a. MLP" in md


# ----------------------------------------------------------------------------- the sweep
def _sweep_rows(kind, keys, ms):
    rows = []
    for k, t in zip(keys, ms):
        n, d = (k, 1024) if kind == "batch" else (cases.SWEEP_DIM_BATCH, k)
        rows.append({"batch": n, "in_features": d, "out_features": d, "forward_ms": t,
                     "forward_samples_s": n / t * 1e3, "forward_gflops": 1.0,
                     "train_ms": 3 * t, "train_samples_s": n / (3 * t) * 1e3,
                     "train_gflops": 1.0})
    return {"kind": kind, "rows": rows, "knee": keys[-1] if kind == "batch" else None,
            "knee_backward": keys[-1] if kind == "batch" else None}


def sweep_results(auto_256: float) -> dict:
    """linearkit's dims: 256 at 0.10 ms on 1 thread and 0.06 on 2 (250: 0.10 both);
    ``auto_256`` is what the default policy measured at 256."""
    dims = list(cases.SWEEP_DIMS)
    base = {d: 0.1 * (d / 250) ** 2 for d in dims}
    one = [base[d] for d in dims]
    two = [base[d] if d == 250 else 0.6 * base[d] for d in dims]
    auto = [auto_256 if d == 256 else t for d, t in zip(dims, one)]
    batches = [1, 2, 4, 8, 16, 32, 64]
    lat = [0.2, 0.2, 0.21, 0.22, 0.3, 0.5, 1.0]
    lk = {"dims/1t": _sweep_rows("dims", dims, one), "dims/2t": _sweep_rows("dims", dims, two),
          "dims/auto": _sweep_rows("dims", dims, auto),
          "batch/auto": _sweep_rows("batch", batches, lat),
          "batch/1t": _sweep_rows("batch", batches, lat),
          "policy": {"small_gemm_macs": 1 << 22, "num_threads": 2, "other_busy_cores": 0.9}}
    pt = {"dims/default": _sweep_rows("dims", dims, one),
          "batch/default": _sweep_rows("batch", batches, lat)}
    return {"meta": {"groups": ["sweep"], "config": cases.config(False)},
            "runs": {"clean": {"info": {}, "sweep": {"linearkit": _w(lk), "torch": _w(pt)}}}}


def test_the_250_256_pair_straddles_the_thread_threshold():
    assert 64 * 250 * 250 < (1 << 22) <= 64 * 256 * 256  # linearkit.backend.threads.SMALL_GEMM_MACS
    v = report.View(sweep_results(auto_256=0.06 * (256 / 250) ** 2))
    lines = sweep_report.thread_findings(v)
    switch = [line for line in lines if "straddles" in line]
    assert len(switch) == 1 and "250" in switch[0]
    assert "mostly the switch to two threads, not alignment" in switch[0]
    assert any("batch 4 (4·1024·1024 = 4,194,304)" in line for line in lines)
    (traffic,) = sweep_report.weight_traffic(v)  # 4 MiB in 0.2 ms at batch 1
    assert "streams at 21.0 GB/s" in traffic and "matrix-vector" not in traffic


def test_no_switch_claimed_when_the_policy_stayed_on_one_thread():
    v = report.View(sweep_results(auto_256=0.1 * (256 / 250) ** 2))
    (switch,) = [line for line in sweep_report.thread_findings(v) if "straddles" in line]
    assert "kept 256 on one thread too" in switch and "0.90 cores" in switch
    assert "mostly the switch" not in switch


def test_width_verdicts():
    assert sweep_report._verdict(0.9, 1.05) == "faster per call"
    assert sweep_report._verdict(1.05, 1.05) == "the same per call (within 5%) although it " \
        "does more work"
    assert sweep_report._verdict(1.06, 1.0486).startswith("slower in proportion")
    assert sweep_report._verdict(1.3, 1.05).startswith("slower per FLOP")


def test_write_docs_writes_the_sweep_page_and_never_a_partial_performance_page(
        tmp_path, monkeypatch):
    for name in ("DOCS", "SWEEP_DOC", "THREADS_DOC"):
        monkeypatch.setattr(run, name, tmp_path / f"{name}.md")
    monkeypatch.setattr(run, "ROOT", tmp_path)
    run.write_docs(sweep_results(auto_256=0.06))
    page = (tmp_path / "SWEEP_DOC.md").read_text()
    assert not (tmp_path / "DOCS.md").exists()
    assert page.startswith("# Batch size and layer width")
    assert "把维度从 250 改成 256" in page and "## Alignment, or the thread switch?" in page
    assert "| 250 → 256 |" in page


# ----------------------------------------------------------------------------- end to end
def test_the_e2e_pytorch_script_trains_evaluates_and_saves(tmp_path):
    pytest.importorskip("torch")

    import numpy as np

    from benchmarks import e2e

    gen = np.random.default_rng(0)
    data = tmp_path / "d.npz"
    np.savez(data, x_train=gen.standard_normal((300, 40)).astype(np.float32),
             y_train=gen.integers(0, 10, 300), x_test=gen.standard_normal((50, 40)).astype(
                 np.float32), y_test=gen.integers(0, 10, 50))
    out = tmp_path / "w.pt"
    cmd = e2e.script_command("torch", str(data), str(out), 7, "--eval-every", "3")
    got = e2e.fresh(cmd)
    assert got["wall_s"] > 0 and out.exists()
    assert set(got["report"]) >= {"import_s", "train_s", "test_accuracy", "train_accuracy"}
    assert e2e.linearkit_command("m.st", 6000)[-2:] == ["--out", "m.st"]
    assert e2e.linearkit_command("m.st", 50)[-2:] == ["--steps", "50"]
    with pytest.raises(RuntimeError, match="exited with"):
        e2e.fresh(e2e.script_command("torch", str(tmp_path / "missing.npz"), str(out), 1))
    json.dumps(got)


def test_a_page_rendered_from_merged_results_says_which_groups_came_later():
    from benchmarks.report import _rendered

    assert _rendered({}) == ""
    text = _rendered({"rendered_from": "run.json",
                      "merged": [{"groups": ["e2e"], "argv": ["python", "-m", "benchmarks",
                                                              "--only", "e2e"], "date": "D"}]})
    assert "saved results" in text and "e2e group(s) from a later run" in text
    assert "`python -m benchmarks --only e2e` on D" in text


def _paired_result(numpy_repeats, lk_repeats, paired=True):
    def worker(fw, repeats):
        out = {"results": {"c": {"median_s": sorted(repeats)[len(repeats) // 2],
                                 "repeats_s": repeats}}}
        if paired:
            out["paired"] = ["numpy", "linearkit"]
        return out
    return {"meta": {}, "runs": {"clean": {"small": {
        "numpy": worker("numpy", numpy_repeats), "linearkit": worker("linearkit", lk_repeats)}}}}


def test_repeats_taken_in_turn_give_the_median_of_their_ratios():
    # the machine slows down 3x over the run; linearkit is 1.1x NumPy's time at every moment
    drift = [1.0, 1.5, 2.0, 2.5, 3.0]
    lk = [1.1 * t for t in drift]
    v = report.View(_paired_result(drift, lk))
    assert v.ratio("small", ("linearkit", "c"), ("numpy", "c")) == pytest.approx(1.1)
    assert report.round_ratios(v, "small", "c") == [pytest.approx(1 / 1.1)]
    # the same numbers, not taken in turn: only the medians can be compared
    v = report.View(_paired_result(drift, lk[::-1], paired=False))
    assert v.ratio("small", ("linearkit", "c"), ("numpy", "c")) == pytest.approx(1.1)
    # taken in turn, a repeat is compared with the other framework's repeat of the same moment
    v = report.View(_paired_result(drift, [1.1, 1.65, 3.0, 2.75, 3.3]))
    assert v.paired_ratios("small", ("linearkit", "c"), ("numpy", "c")) == \
        [[pytest.approx(1.1), pytest.approx(1.1), pytest.approx(1.5), pytest.approx(1.1),
          pytest.approx(1.1)]]
    # a framework that was not in the same interleaved run: no pairing
    assert v.paired_ratios("small", ("linearkit", "c"), ("torch", "c")) == []


def test_merged_rounds_keep_each_rounds_repeats_for_pairing():
    ok = lambda reps: {"results": {"c": {"median_s": sorted(reps)[1], "repeats_s": reps}}}
    merged = run.merge_rounds([ok([3.0, 2.0, 1.0]), ok([1.0, 1.0, 1.0])])
    assert merged["results"]["c"]["round_repeats_s"] == [[3.0, 2.0, 1.0], [1.0, 1.0, 1.0]]


def test_pair_keys_group_the_cases_that_targets_compare():
    from benchmarks.paired import pair_key

    assert pair_key("train:32") == pair_key("train-fused:32") == pair_key("gemms:32") == "32"
    assert pair_key("fwd:256x1024->4096") != pair_key("fwd:1024x1024->4096")
    assert pair_key("train-cli") == pair_key("train") == pair_key("fwd") == ""


def test_interleaved_children_time_their_repeats_in_turn():
    """Two real --serve workers (smoke config); one that has no such group answers so."""
    from benchmarks.paired import run_paired

    outs = run_paired(["numpy"], "precision", ["--smoke"], ROOT, run.child_env(None, None),
                      timeout=120, repeats=2)
    assert "not written for numpy" in outs["numpy"]["unavailable"]
    outs = run_paired(["numpy", "linearkit"], "small", ["--smoke"], ROOT,
                      run.child_env(None, None), timeout=120, repeats=2)
    for fw in ("numpy", "linearkit"):
        assert outs[fw]["paired"] == ["numpy", "linearkit"], outs[fw]
        for case in ("fwd", "fwdbwd"):
            res = outs[fw]["results"][case]
            # seconds per call of Linear(16, 16) on one row: microseconds, not a placeholder
            assert len(res["repeats_s"]) == 2
            assert all(0 < t < 0.01 for t in res["repeats_s"]), res
