"""The documentation site (mkdocs.yml): every docs/*.md page is in the nav, the Getting started
page is the README itself, and the API reference that docs/gen_reference.py writes has an entry
for every public name, pointing at the object that name is.

`mkdocs build --strict` (which renders every entry and checks every link) runs in .ci/run, not
here: it takes longer than a unit test should."""

from __future__ import annotations

import importlib
import importlib.util
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def load(path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = load(DOCS / "gen_reference.py")


# ------------------------------------------------------------------------------------ the nav
def nav_pages(nav) -> list[str]:
    """Every page file a mkdocs ``nav`` names (a folder entry such as ``reference/`` included)."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    return [page for entry in nav for page in nav_pages(entry)]


def missing_from_nav(pages: list[str], nav) -> list[str]:
    listed = set(nav_pages(nav))
    return [page for page in pages if page not in listed]


def site_config() -> dict:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))


def docs_pages() -> list[str]:
    return sorted(path.name for path in DOCS.glob("*.md"))


def test_every_docs_page_is_in_the_nav():
    missing = missing_from_nav(docs_pages(), site_config()["nav"])
    assert not missing, f"mkdocs.yml's nav does not list {missing}: add each under a section"


def test_every_page_the_nav_names_exists():
    absent = [page for page in nav_pages(site_config()["nav"])
              if not (DOCS / page).exists() and page != f"{gen.FOLDER}/"]
    assert not absent, f"mkdocs.yml's nav names {absent}, which docs/ does not have"


def test_the_nav_check_catches_a_missing_page():
    nav = site_config()["nav"]
    pages = docs_pages()
    assert missing_from_nav(pages, nav) == []
    dropped = [{"Guides": [page for page in nav_pages(nav) if page != "dtypes.md"]}]
    assert missing_from_nav(pages, dropped) == ["dtypes.md"]


def test_the_getting_started_page_is_the_readme_included():
    assert site_config()["nav"][0] == {"Getting started": "index.md"}
    assert '{% include-markdown "../README.md" %}' in (DOCS / "index.md").read_text()


def test_the_reference_section_is_generated_and_the_build_is_offline():
    config = site_config()
    assert {"API reference": f"{gen.FOLDER}/"} in config["nav"]
    scripts = [plugin["gen-files"]["scripts"] for plugin in config["plugins"]
               if isinstance(plugin, dict) and "gen-files" in plugin]
    assert scripts == [["docs/gen_reference.py"]]
    assert config["theme"]["font"] is False          # no Google Fonts link in any page


# ---------------------------------------------------------------------------- the reference
def lookup(path: str):
    """The object at a dotted path: the longest importable module, then attributes."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(path)


def uncovered(written: dict[str, str], found: dict[str, types.ModuleType]) -> list[str]:
    """Public names without an entry on their namespace's page (rendered there, or linked to
    an entry rendered on another page), or whose entry is another object."""
    rendered = set().union(*(gen.rendered_entries(text) for text in written.values()))
    problems = []
    for namespace, module in found.items():
        text = written.get(gen.page_name(namespace), "")
        here = gen.rendered_entries(text) | gen.linked_entries(text)
        for name in gen.public_names(module):
            value = getattr(module, name)
            if isinstance(value, types.ModuleType):
                pages = [gen.page_name(n) for n, m in found.items() if m is value]
                if not pages or f"]({pages[0]})" not in text:
                    problems.append(f"{namespace}.{name}: no link to its page")
                continue
            path = gen.source_path(namespace, name, value)
            if path not in here or path not in rendered:
                problems.append(f"{namespace}.{name}: no entry ({path})")
            elif lookup(path) is not value:
                problems.append(f"{namespace}.{name}: its entry {path} is another object")
    return problems


@pytest.fixture(scope="module")
def reference():
    return gen.pages(), gen.namespaces()


def test_every_public_name_has_a_reference_entry(reference):
    written, found = reference
    problems = uncovered(written, found)
    assert not problems, "docs/gen_reference.py misses:\n" + "\n".join(problems)


def test_the_reference_covers_the_root_and_every_public_namespace(reference):
    import linearkit as lk

    written, found = reference
    assert {"linearkit", "linearkit.functional", "linearkit.init", "linearkit.optim",
            "linearkit.optim.lr_scheduler", "linearkit.losses", "linearkit.io",
            "linearkit.transforms", "linearkit.analysis", "linearkit.distributed",
            "linearkit.amp", "linearkit.runtime", "linearkit.hooks", "linearkit.precision",
            "linearkit.errors", "linearkit.data", "linearkit.rules", "linearkit.fast"} <= set(found)
    assert found["linearkit"] is lk and found["linearkit.hooks"] is lk.hooks
    summary = written["SUMMARY.md"]
    assert all(f"({gen.page_name(name)})" in summary for name in found)
    entries = gen.rendered_entries(written["linearkit.md"])
    assert "linearkit.layers.linear.Linear" in entries                  # where it is defined
    assert f"{lk.doctor.__module__}.doctor" in entries                 # a lazy root name


def test_every_room_with_an_all_is_a_namespace_or_left_out_on_purpose(reference):
    _, found = reference
    rooms = [f"linearkit.{p.stem}" for p in (ROOT / "linearkit").glob("*.py")
             if not p.stem.startswith("_")]
    rooms += [f"linearkit.{p.parent.name}" for p in (ROOT / "linearkit").glob("*/__init__.py")]
    public = {name for name in rooms if hasattr(importlib.import_module(name), "__all__")}
    modules = {module.__name__ for module in found.values()}
    unplaced = sorted(public - modules - set(gen.NOT_NAMESPACES))
    assert not unplaced, (f"{unplaced} have an __all__ but no reference page: add them to EXTRA "
                          "in docs/gen_reference.py, or to NOT_NAMESPACES with the reason")


def test_the_coverage_check_catches_a_name_left_out(reference):
    written, found = reference
    assert uncovered(written, found) == []
    broken = dict(written)
    broken["linearkit.md"] = written["linearkit.md"].replace(
        "::: linearkit.layers.linear.Linear\n", "")
    assert uncovered(broken, found) == [
        "linearkit.Linear: no entry (linearkit.layers.linear.Linear)"]
    broken = dict(written)
    broken["linearkit.io.md"] = written["linearkit.io.md"].replace(
        "- [`save`][linearkit.io.safetensors.save]\n", "")
    assert uncovered(broken, found) == ["linearkit.io.save: no entry (linearkit.io.safetensors.save)"]


def test_bare_doctests_render_as_code():
    pytest.importorskip("griffe")
    fence = load(DOCS / "griffe_doctests.py").fence_doctests
    text = "Yield it.\n\n>>> f()\n['a', 'b']\n\nMore.\n\nExamples\n--------\n>>> g()\n1"
    assert fence(text) == ("Yield it.\n\n```pycon\n>>> f()\n['a', 'b']\n```\n\nMore.\n\n"
                           "Examples\n--------\n>>> g()\n1")
