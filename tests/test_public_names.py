"""The public API: every name the README and the docs use resolves, every name in
``linearkit.__all__`` exists, and the root holds only the modules users import."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import linearkit as lk

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# lk.X.Y or linearkit.X.Y, not inside a file path (docs/x.py) or a longer dotted name
NAME = re.compile(r"(?<![\w/.])(?:lk|linearkit)\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")


def resolve(dotted: str):
    """``lk.<dotted>`` by attribute access, importing a submodule where an attribute is not
    there yet (``linearkit.io.onnx_import`` before anything imported it); stops at the first
    object that is neither a module nor a class (the rest are its attributes, e.g. methods)."""
    obj, parts = lk, dotted.split(".")
    for i, part in enumerate(parts):
        if not (isinstance(obj, type) or type(obj).__name__ == "module"):
            return obj
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module("linearkit." + ".".join(parts[:i + 1]))
    return obj


def documented_names() -> list[tuple[str, str]]:
    found = {}
    for page in PAGES:
        for match in NAME.finditer(page.read_text()):
            found.setdefault(match.group(1), page.name)
    return sorted(found.items())


@pytest.mark.parametrize("name,page", documented_names())
def test_every_documented_name_resolves(name, page):
    try:
        resolve(name)
    except (AttributeError, ImportError) as err:
        pytest.fail(f"{page} names linearkit.{name}, which does not resolve: {err}")


def test_the_documented_names_were_found():
    names = {name for name, _ in documented_names()}
    assert {"Linear", "loop.step", "amp.GradScaler", "hooks", "checkpoint"} <= names
    assert len(names) > 50


@pytest.mark.parametrize("name", lk.__all__)
def test_every_name_in_all_exists(name):
    assert getattr(lk, name) is not None


def test_names_that_moved_into_rooms_keep_working():
    from linearkit.backend import threads
    from linearkit.core import hooks
    from linearkit.recipes import train_mnist1d as mnist1d
    from linearkit.training import accumulation, amp, checkpointing, loop

    assert (lk.loop, lk.hooks, lk.amp, lk.accumulation, lk.threads) == (
        loop, hooks, amp, accumulation, threads)
    assert lk.train is mnist1d and lk.checkpointing is checkpointing
    assert lk.train.train is mnist1d.train and lk.checkpoint is checkpointing.checkpoint


def test_the_root_holds_only_the_modules_users_import():
    modules = sorted(p.stem for p in (ROOT / "linearkit").glob("*.py"))
    assert modules == ["__init__", "__main__", "errors", "functional", "init", "losses",
                       "precision"]
