"""Every ```python block in README.md and docs/*.md runs here, and the output it shows is checked.

The runner is Sybil (its Markdown lexers and its skip directive). The conventions, stated for
writers in docs/architecture.md ("The docs: examples that run, ..."):

- The blocks of one page run in order in one namespace, as a reader pastes them into one
  session, in a fresh temporary folder; the library's generator starts unseeded, as in a new
  process, so a block whose shown output depends on random numbers seeds them itself.
- Output: a ```text block that follows a ```python block (nothing but blank lines between)
  is what the block prints, compared after stripping each line's trailing spaces; ``...`` in it
  matches anything (doctest's ELLIPSIS), for timings and other figures that change from run to
  run. A ```python block without one may print anything; one followed by an untagged ``` block
  fails (unchecked output, or a missing sentence between two blocks).
- A block that cannot run here (an MPI launch, minutes of training, a network) is preceded by
  ``<!-- skip: next "the reason" -->``; a skip without a reason fails.
- ``<!-- invisible-code-block: python ... -->`` runs setup a reader has done already (the
  file the README's first command wrote) without showing it.

A plain regex counts the python fences of every page; the runner must have run or skipped
(with a reason) exactly that many, so a block it would silently ignore (``py``, ``Python`` or
``python skip`` as the fence's tag) fails the page.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import doctest
import io
import re
from pathlib import Path
from unittest import SkipTest

import pytest
from sybil import Document, Region
from sybil.parsers.markdown import CodeBlockParser, SkipParser

import linearkit

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# The count the runner must agree with: every fence opening (any indentation, in a list or a
# quote) whose tag reads as Python, in any spelling a writer might use.
PYTHON_FENCE = re.compile(r"^[ \t>*+\-\d.)]*(?:`{3,}|~{3,})[ \t]*(?:python3?|py3?|pycon|ipython)\b",
                          re.MULTILINE | re.IGNORECASE)
# The ```text block right after a python block's closing fence: its printed output.
OUTPUT_BLOCK = re.compile(r"(?:[ \t]*\n)*(?P<indent>[ \t]*)```text[ \t]*\n(?P<text>.*?)"
                          r"^(?P=indent)```[ \t]*$", re.DOTALL | re.MULTILINE)
UNTAGGED_AFTER = re.compile(r"(?:[ \t]*\n)*[ \t]*```[ \t]*$", re.MULTILINE)
SKIP = re.compile(r"^[ \t]*<!--+\s*skip:", re.MULTILINE)
CHECKER, ELLIPSIS = doctest.OutputChecker(), doctest.ELLIPSIS


@dataclasses.dataclass
class Block:
    """One python block: its source, whether it is fenced (not an invisible setup block), and
    the output its following ```text block shows (None: not shown) with that block's line."""

    source: str
    fenced: bool
    want: str | None = None
    want_line: int = 0
    untagged_line: int = 0


@dataclasses.dataclass
class PageRun:
    """What the runner did with one page: the first lines of the blocks it ran, skipped (with
    the reason) and ran as invisible setup."""

    ran: list[int] = dataclasses.field(default_factory=list)
    skipped: list[tuple[int, str]] = dataclasses.field(default_factory=list)
    setup: list[int] = dataclasses.field(default_factory=list)


def _tidy(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()) + "\n"


class PythonBlocks(CodeBlockParser):
    """Sybil's Markdown code-block parser for ``python``, each region carrying a :class:`Block`
    (with the shown output, when a ```text block follows)."""

    def __init__(self, run: PageRun):
        super().__init__("python")
        self.page_run = run

    def __call__(self, document: Document):
        for region in super().__call__(document):
            fenced = not document.text[region.start:region.start + 80].lstrip().startswith("<!--")
            block = Block(str(region.parsed), fenced)
            shown = OUTPUT_BLOCK.match(document.text, region.end) if fenced else None
            untagged = UNTAGGED_AFTER.match(document.text, region.end) if fenced else None
            if untagged:   # output that nobody would check: tag it, or separate it by prose
                block.untagged_line = document.text.count("\n", 0, untagged.end()) + 1
            if shown:
                indent = shown["indent"]
                block.want = _tidy("\n".join(line.removeprefix(indent)
                                             for line in shown["text"].splitlines()))
                block.want_line = document.text.count("\n", 0, shown.start("text"))
            yield Region(region.start, region.end, block, self.evaluate)

    def evaluate(self, example) -> None:
        __tracebackhide__ = True
        block = example.parsed
        if block.untagged_line:
            raise AssertionError(
                f"{Path(example.path).name}, line {block.untagged_line}: an untagged ``` block "
                f"right after the python block at line {example.line}; tag it ```text if it is "
                "what the block prints (then it is checked), or put a sentence between them")
        # the padding makes a traceback's line numbers the page's
        code = compile("\n" * example.line + block.source, example.path, "exec")
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(code, example.namespace)
        example.namespace.pop("__builtins__", None)
        (self.page_run.ran if block.fenced else self.page_run.setup).append(example.line)
        if block.want is not None:
            got = _tidy(printed.getvalue())
            if not CHECKER.check_output(block.want, got, ELLIPSIS):
                diff = "\n".join(difflib.unified_diff(
                    block.want.splitlines(), got.splitlines(), "shown", "printed", lineterm=""))
                raise AssertionError(
                    f"{Path(example.path).name}, line {example.line}: the block prints other "
                    f"than the ```text block at line {block.want_line} shows:\n{diff}")


def run_page(path: Path) -> PageRun:
    """Run every example of ``path`` in order; raises on the first failure."""
    __tracebackhide__ = True
    run = PageRun()
    document = Document.parse(str(path), PythonBlocks(run), SkipParser())
    for example in document:
        done = len(run.ran) + len(run.setup)
        try:
            example.evaluate()
        except SkipTest as exc:
            run.skipped.append((example.line, str(exc)))
            continue
        if isinstance(example.parsed, Block) and len(run.ran) + len(run.setup) == done:
            raise AssertionError(f"{path.name}, line {example.line}: a block skipped without a "
                                 'reason; write <!-- skip: next "why it cannot run here" -->')
    return run


def python_fences(path: Path) -> list[int]:
    """The line of every python fence opening in ``path``, by the plain regex."""
    text = path.read_text(encoding="utf-8")
    return [text.count("\n", 0, m.start()) + 1 for m in PYTHON_FENCE.finditer(text)]


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_every_python_block_runs_and_prints_what_it_shows(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    linearkit.manual_seed(None)   # unseeded, as a reader's new process is
    run = run_page(page)
    fences = python_fences(page)
    handled = sorted(run.ran + [line for line, _ in run.skipped])
    assert handled == fences, (
        f"{page.name}: the python fences at lines {fences} and the blocks the runner ran or "
        f"skipped (at {handled}) differ: tag a block ```python, unindented or indented as "
        "its list item")
    for line, reason in run.skipped:
        assert reason.strip(), f"{page.name}, line {line}: a skip needs its reason"


def test_skips_are_few():
    skips = sum(len(SKIP.findall(page.read_text(encoding="utf-8"))) for page in PAGES)
    assert skips <= 3, "keep the docs' examples runnable: a skipped block goes stale"


def test_the_regex_sees_every_spelling_of_a_python_fence(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```python\nx = 1\n```\n\n```py\nx = 2\n```\n\n  ```Python\nx = 3\n  ```\n"
                    "\n- item\n\n  ```python\n  assert x == 1\n  ```\n\nprose\n```text\nnot python\n"
                    "```\n", encoding="utf-8")
    assert python_fences(page) == [1, 5, 9, 15]
    run = run_page(page)   # the runner takes the first and the indented one only
    assert run.ran == [1, 15]


def test_a_shown_output_is_checked_with_ellipsis(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```python\nprint('took', 0.25, 's')\nprint('done')  \n```\n\n```text\n"
                    "took ... s\ndone\n```\n", encoding="utf-8")
    assert run_page(page).ran == [1]
    page.write_text("```python\nprint('done')\n```\n```text\nfinished\n```\n", encoding="utf-8")
    with pytest.raises(AssertionError, match=r"-finished\n\+done"):
        run_page(page)


def test_a_skip_needs_a_reason(tmp_path):
    page = tmp_path / "page.md"
    page.write_text('<!-- skip: next "needs mpirun -n 2" -->\n```python\nraise SystemExit\n```\n',
                    encoding="utf-8")
    assert run_page(page).skipped == [(2, "needs mpirun -n 2")]
    page.write_text("<!-- skip: next -->\n```python\nraise SystemExit\n```\n", encoding="utf-8")
    with pytest.raises(AssertionError, match="skipped without a reason"):
        run_page(page)
