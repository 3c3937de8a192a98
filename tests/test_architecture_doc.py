"""Every Python example in docs/architecture.md runs, each on its own.

The blocks are cut out of the page as tests/test_cli.py cuts the README's: the text between
a line "```python" and the next "```". Each block runs in a fresh namespace, so a block that
leans on names from an earlier one fails here.
"""

import pathlib

import pytest

PAGE = pathlib.Path(__file__).parents[1] / "docs" / "architecture.md"


def _python_blocks() -> list[str]:
    text = PAGE.read_text(encoding="utf-8")
    return [block.split("```", 1)[0] for block in text.split("```python\n")[1:]]


BLOCKS = _python_blocks()


def test_the_page_has_an_example_for_each_seam_with_code():
    # hooks, layer rules, the gradient-write API, the precision policy, a custom module
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_example_runs(index):
    exec(compile(BLOCKS[index], f"docs/architecture.md, python block {index + 1}", "exec"), {})
