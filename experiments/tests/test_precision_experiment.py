"""The precision experiment (docs/precision.md) in quick mode: every section measured and on the
page, the page's numbers are the run's, and --write-docs refuses a quick run."""

import re

import numpy as np
import pytest

from experiments import EXPERIMENTS, get
from experiments import precision_exp as E
from experiments import precision_page as P

pytest.importorskip("ml_dtypes")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("precision")
    result = E.run(out, quick=True, log=lambda *a: None)
    return result, (out / "precision_quick.md").read_text(encoding="utf-8")


def test_registered_under_its_cli_name():
    assert EXPERIMENTS["precision"] == "precision_exp" and get("precision") is E


def test_quick_run_measures_every_section_and_writes_the_page(quick):
    result, page = quick
    assert set(result.sections) == {"loss_scaling", "dot", "memory", "accumulation",
                                    "checkpointing", "pitfall"}
    # each numbered section opens by quoting the claim it measures
    claims = ("梯度在FP16下容易下溢成0", "核心风险是累加溢出", "把激活值和梯度的精度降到fp16",
              "梯度累积时别忘了", "另一种思路是重计算", "单精度下正常的初始化")
    for n, claim in enumerate(claims, start=1):
        head = page.index(f"## {n}. ")
        section = page[head:page.find("\n## ", head + 1)]
        assert f'**The claim**: "{claim}' in section, (n, claim)
    assert "**Quick run**" in page
    # Python's formatting of a NaN or an infinity in a table cell means a number went wrong
    assert not re.search(r"\bnan\b", page), "an unformatted NaN on the page"
    assert not re.search(r"\|\s*-?inf\s*\|", page), "an unformatted inf in a table"


def test_the_page_reports_what_the_run_measured(quick):
    result, page = quick
    s = result.sections
    # 1. every probe's flushed share, and each run's accuracy, as printed
    adam = s["loss_scaling"]["adam"]
    for probe in adam["plain"]["probes"]:
        assert f"| {probe['step']} | {probe['loss']:.3g} |" in page
    assert f"| float16, fp16 `.grad`, no scaler | {P._pct(adam['plain']['accuracy'])} |" in page
    smallest = s["loss_scaling"]["sgd"][-1]
    assert smallest["plain"]["flushed_first"] > 0.99          # w = 2^-24: all underflow
    assert smallest["scaler"]["flushed_last"] < 0.05           # the scaler keeps them
    assert f"| 2^-24 | {P._pct(smallest['plain']['flushed_first'])} |" in page
    # 2. float16 accumulation: ones stall at 2048; the large products overflow, float32 does not
    dot = s["dot"]
    assert dot["ones_4096"] == 2048.0
    large = next(r for r in dot["rows"] if r["kind"] == "large" and r["n"] == 4096)
    assert large["overflow_at"] is not None and large["err32"] < 1e-5
    assert f"inf after {large['overflow_at']:,} terms" in page
    # 3. memory: 16-bit activations and gradients halve, the total does not
    f32, bf16, low, _ = s["memory"]
    assert low["ledger"]["activations"] * 2 == f32["ledger"]["activations"]
    assert low["ledger"]["grads"] * 2 == f32["ledger"]["grads"]
    assert low["ledger"]["total"] > 0.6 * f32["ledger"]["total"]
    assert bf16["ledger"]["grads"] == f32["ledger"]["grads"]  # default: float32 .grad
    assert low["saved"] < 0.6 * f32["saved"] and abs(low["state"] - low["ledger"][
        "training_state"]) < 0.05 * low["ledger"]["training_state"]
    assert P._mib(low["ledger"]["total"]) in page
    # 4. accumulation: k exactly; the helper is the big batch; forgetful is k x the lr
    acc = s["accumulation"]
    assert acc["norm_ratio"]["float64"] == pytest.approx(acc["k"], rel=1e-12)
    assert acc["dw_helper_big_f64"] < 1e-12 and acc["dw_forgetful_bigk_f64"] < 1e-12
    assert acc["bn"]["tracked_acc"] == acc["k"] and acc["bn"]["tracked_big"] == 1
    assert f"x{acc['norm_ratio']['float32']:.6f}" in page
    # 5. checkpointing saves what the ledger says, roughly
    ck = s["checkpointing"]
    assert ck["saved_ledger"] > 0 and abs(ck["saved_measured"] - ck["saved_ledger"]) < 0.2 * \
        ck["saved_ledger"]
    assert f"x{ck['time_ratio']:.2f}" in page
    # 6. the pitfall: range_check names layer 0, the plain run breaks at a later layer
    pit = s["pitfall"]
    assert pit["first_problem"]["path"] == "0" and pit["first_problem"]["flag"] == "overflow"
    assert pit["plain"][0]["bad_grads"][:1] == ["2.weight"] and not pit["plain"][-1]["finite"]
    assert pit["anomaly"]["path"] == "2"
    assert np.isfinite(pit["fp16_fixed"]["final_loss"])
    assert "| 0 | Linear(40, 256) |" in page and "overflow |" in page


def test_write_docs_refuses_a_quick_run(capsys):
    with pytest.raises(SystemExit) as exit_:
        E.main(["--write-docs", "--quick"])
    assert exit_.value.code == 2 and "--write-docs" in capsys.readouterr().err


def test_no_write_measures_and_writes_nothing(tmp_path, monkeypatch):
    calls = {}

    def fake_run(out_dir, *, quick, seed, write):
        calls.update(out_dir=out_dir, quick=quick, seed=seed, write=write)

    monkeypatch.setattr(E, "run", fake_run)
    assert E.main(["precision", "--quick", "--no-write", "--seed", "3"]) == 0
    assert calls["write"] is False and calls["quick"] and calls["seed"] == 3
