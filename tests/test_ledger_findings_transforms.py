"""The ledger <-> transforms link: a finding's transform, applied, removes the finding and keeps
the function (the ledger names the transform; the transform's report confirms the saving)."""

import numpy as np

import linearkit as lk
from linearkit.analysis import ledger
from linearkit.transforms import factorize, fold_norm, merge_linear


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
