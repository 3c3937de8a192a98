"""The package's code and docstrings stand alone: they cite no document outside the repository
(planning notes, article sections, issue numbers) and quote no measured time — figures live in
docs/, which the code may name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "linearkit"
OUTSIDE = re.compile(r"DESIGN\.md|STYLE\.md|\.\./shared|§|\bissues? #?\d+|\barticles? \d{3}\b")
MEASURED = re.compile(r"\d(?:\.\d+)? ?(?:ms|µs|us|ns)\b|\d(?:\.\d+)?x (?:faster|slower)"
                      r"|\d+% (?:faster|slower)|fastest of \d+")
FILES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_outside_reference_and_no_measured_time(path):
    found = [f"{path.relative_to(PACKAGE.parent)}:{n}: {line.strip()}"
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if OUTSIDE.search(line) or MEASURED.search(line)]
    assert not found, "\n".join(found)


def test_the_patterns_catch_what_they_are_for():
    assert MEASURED.search("184.7 against 175.8 ms") and MEASURED.search("~0.4 us less")
    assert MEASURED.search("3-7x slower") and MEASURED.search("fastest of 15")
    assert OUTSIDE.search("see DESIGN.md") and OUTSIDE.search("(issue 11)")
    assert OUTSIDE.search("articles 004 §1.3")
    assert not MEASURED.search("1 << 20 elements") and not OUTSIDE.search("tissue 3")


REPO = PACKAGE.parent
OTHERS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"),
                 *(REPO / "tests").rglob("*.py"), *(REPO / "benchmarks").rglob("*.py"),
                 *(REPO / "experiments").rglob("*.py")])


@pytest.mark.parametrize("path", [p for p in OTHERS if p.name != Path(__file__).name],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_docs_tests_and_tooling_cite_nothing_outside_the_repository(path):
    found = [f"{path.relative_to(REPO)}:{n}: {line.strip()}"
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if OUTSIDE.search(line)]
    assert not found, "\n".join(found)
