"""The surgery experiment (docs/surgery.md) in quick mode: every section measured and on the
page, the page's numbers are the run's, and --write-docs refuses a quick run."""

import pytest

from experiments import surgery as E


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("surgery")
    result = E.run(out, quick=True, log=lambda *a: None)
    return result, (out / "surgery_quick.md").read_text(encoding="utf-8")


def test_quick_run_measures_every_section_and_writes_the_page(quick):
    result, page = quick
    assert set(result.sections) == {"factorization", "big_layer", "int8", "fold_merge", "qkv",
                                    "sparse_init", "sparse_speed", "pruning", "lora", "quarter"}
    for claim in ("**The claim**: rank 64 takes a 100 MB layer",
                  "**The claim**: a quarter of the parameters",
                  "**The claim**: folding a norm into the Linear",
                  "**The usual layout** fuses the three projections",
                  "**The claim**: `nn.init.sparse_(w, sparsity=0.99)`"):
        assert claim in page, claim
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
