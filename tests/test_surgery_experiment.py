"""The surgery experiment (docs/surgery.md) in quick mode, and the ledger <-> transforms link:
a finding's transform, applied, removes the finding and keeps the function."""

import numpy as np
import pytest

import linearkit as lk
from linearkit.analysis import ledger
from linearkit.experiments import surgery as E
from linearkit.transforms import factorize, fold_norm, merge_linear


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("surgery")
    result = E.run(out, quick=True, log=lambda *a: None)
    return result, (out / "surgery_quick.md").read_text(encoding="utf-8")


def test_quick_run_measures_every_section_and_writes_the_page(quick):
    result, page = quick
    assert set(result.sections) == {"factorization", "big_layer", "int8", "fold_merge", "qkv",
                                    "sparse_init", "sparse_speed", "pruning", "lora", "quarter"}
    for claim in ("002 §4.3", "004 §5.3", "004 §6.3", "000 §3.3", "002 §4.2"):
        assert f"Article {claim}" in page, claim
    assert "**Quick run**" in page and "nan" not in page.lower()


def test_the_page_reports_what_the_run_measured(quick):
    result, page = quick
    s = result.sections
    fold = s["fold_merge"]
    assert fold["layers_after"] == ["Linear", "ReLU", "Linear"] and fold["max_rel_error"] < 1e-5
    assert fold["same_predictions"] == 1.0 and f"{fold['params_after']:,}" in page
    init = s["sparse_init"]
    assert init["bytes_before_init"] == init["bytes_after_init"] > 10 * init["csr_bytes"]
    assert s["lora"]["base_unchanged"] and s["lora"]["lora"]["trainable"] < s["lora"]["full"][
        "trainable"]
    for row in s["int8"]:
        assert row["bytes_after"] < row["bytes_before"] / 3
    assert s["big_layer"]["bytes_after"] < s["big_layer"]["bytes_before"] / 10


def test_write_docs_refuses_a_quick_run(capsys):
    with pytest.raises(SystemExit) as exit_:
        E.main(["--write-docs", "--quick"])
    assert exit_.value.code == 2 and "--write-docs" in capsys.readouterr().err


# ------------------------------------------------------------------ ledger findings -> transforms
def _kinds(model, shape):
    return {f.kind: f for f in ledger(model, shape).findings}


def test_the_merge_finding_names_the_transform_that_removes_it():
    model = lk.Sequential(lk.Linear(16, 12), lk.Identity(), lk.Linear(12, 4))
    finding = _kinds(model, (8, 16))["mergeable-linear"]
    assert "merge_linear" in finding.transform
    merged, report = merge_linear(model)
    assert report.params_before - report.params_after == finding.saving_params
    assert "mergeable-linear" not in _kinds(merged, (8, 16))


def test_the_fold_finding_names_the_transform_that_removes_it():
    model = lk.Sequential(lk.Linear(6, 5), lk.BatchNorm1d(5), lk.ReLU()).eval()
    found = _kinds(model, (4, 6))
    assert "fold_norm(model)" in found["fold-batchnorm"].transform
    assert "keep_batchnorm=True" in found["bias-before-batchnorm"].transform
    folded, _ = fold_norm(model)
    assert not {"fold-batchnorm", "bias-before-batchnorm"} & set(_kinds(folded, (4, 6)))
    kept, _ = fold_norm(model, keep_batchnorm=True)
    assert "bias-before-batchnorm" not in _kinds(kept, (4, 6))


def test_the_low_rank_finding_names_the_rank_that_reproduces_the_weight():
    rng = np.random.default_rng(0)
    layer = lk.Linear(48, 64)
    layer.weight.data[:] = rng.standard_normal((64, 3)) @ rng.standard_normal((3, 48))
    finding = _kinds(layer, (2, 48))["low-rank"]
    assert "rank=3" in finding.transform
    _, report = factorize(layer, rank=3, timing=False)
    assert report.params_before - report.params_after == finding.saving_params
    assert report.max_rel_error < 1e-5
