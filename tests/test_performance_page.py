"""The performance figures cannot go stale: docs/performance.md, docs/sweep.md, the busy block
of docs/threads.md and the README's performance paragraph are each exactly what
``python -m benchmarks --write-docs`` renders from the results it saved beside them
(docs/performance.json). A hand edit to a figure, or a page left from another run, fails here;
``python -m benchmarks --from-json docs/performance.json --write-docs`` rewrites them all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import readme_block, report
from benchmarks import run as bench_run
from benchmarks.sweep_report import render_markdown as sweep_markdown

ROOT = Path(__file__).parents[1]
RESULTS = ROOT / "docs" / "performance.json"
REWRITE = "python -m benchmarks --from-json docs/performance.json --write-docs"


@pytest.fixture(scope="module")
def results():
    return json.loads(RESULTS.read_text(encoding="utf-8"))


def _between(text: str, begin: str, end: str) -> str:
    assert text.count(begin) == 1 and text.count(end) == 1, (begin, end)
    return text[text.index(begin) + len(begin):text.index(end)].strip("\n")


def test_performance_md_is_rendered_from_the_saved_results(results):
    page = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    assert page == report.render_markdown(results), f"stale: rerun {REWRITE}"


def test_the_readme_paragraph_is_rendered_from_the_saved_results(results):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = _between(readme, readme_block.BEGIN, readme_block.END)
    assert block == readme_block.render(results), f"stale: rerun {REWRITE}"


def test_the_sweep_page_and_the_busy_block_are_rendered_from_the_saved_results(results):
    groups = set(results["meta"].get("groups") or results["runs"]["clean"])
    if "sweep" in groups:
        assert (ROOT / "docs" / "sweep.md").read_text(encoding="utf-8") == \
            sweep_markdown(results), f"stale: rerun {REWRITE}"
    if "busy" in groups:
        threads = (ROOT / "docs" / "threads.md").read_text(encoding="utf-8")
        block = _between(threads, bench_run.BUSY_BEGIN, bench_run.BUSY_END)
        assert block == report.render_busy_markdown(results).strip("\n"), \
            f"stale: rerun {REWRITE}"


def test_the_readme_paragraph_names_the_figures_a_user_meets_first(results):
    """The end-to-end seconds (warm, first run, PyTorch, JAX) and the provenance line."""
    block = readme_block.render(results)
    view = report.View(results)
    for fw, case in (("linearkit", "train"), ("linearkit", "train-cold"),
                     ("torch", "train-fused"), ("jax", "train")):
        seconds = (view.get("e2e", fw, case) or {}).get("median_s")
        assert f"**{report.num(seconds, 2)} s**" in block, (fw, case)
    assert f"at commit {results['meta']['commit']}" in block
