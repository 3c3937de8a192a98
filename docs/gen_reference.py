"""Write the API reference (reference/*.md) from the package's ``__all__`` lists.

mkdocs runs this on every build (the gen-files plugin in mkdocs.yml), so a name added to an
``__all__`` is in the reference without editing a page. tests/test_docs_site.py calls
``namespaces`` and ``pages`` to check that every public name has its entry.

A namespace is ``linearkit``, every module named in a namespace's ``__all__`` (``linearkit.optim``,
``linearkit.hooks``, ...), and the rooms in ``EXTRA`` that the root loads lazily but does not
list. Each gets one page: its docstring, a link to each sub-namespace, and one mkdocstrings
entry per other name. Classes and functions are rendered from the file that defines them
(``linearkit.layers.linear.Linear`` for ``linearkit.Linear``): several namespaces load their
names on first use, which a static reader of the source cannot follow.
"""

from __future__ import annotations

import importlib
import re
import types

ROOT = "linearkit"
# Public namespaces that no __all__ names, by the dotted name users type: rooms the root loads
# on first use (`lk.runtime`, `lk.rules`), the compiled kernels' switches (`lk.fast`), the
# modules whose names the root re-exports (`lk.losses`, `lk.errors`: their own page lists them
# all, including any the root does not re-export), and the schedulers file that `linearkit.optim`
# loads by name (`lk.optim.lr_scheduler.OneCycleLR`), as torch.optim does; and the train recipe
# (`lk.train.train`, the function behind `linearkit train`).
EXTRA = ("linearkit.runtime", "linearkit.rules", "linearkit.fast", "linearkit.losses",
         "linearkit.errors", "linearkit.optim.lr_scheduler", "linearkit.train")
# Rooms with an __all__ that are deliberately not namespaces of their own, and why.
NOT_NAMESPACES = {
    "linearkit.layers": "every layer is re-exported by the root (linearkit.Linear, ...)",
    "linearkit.cli": "the command line, documented by `linearkit --help` and the README",
}
FOLDER = "reference"


def public_names(module: types.ModuleType) -> list[str]:
    """The module's ``__all__``; for a module without one (``linearkit.errors``), the public
    classes and functions it defines."""
    names = getattr(module, "__all__", None)
    if names is not None:
        return list(names)
    return [name for name, value in vars(module).items()
            if not name.startswith("_") and getattr(value, "__module__", None) == module.__name__
            and isinstance(value, (type, types.FunctionType))]


def namespaces() -> dict[str, types.ModuleType]:
    """Public dotted name -> module, ``linearkit`` first; a module reached twice keeps its
    first name."""
    found: dict[str, types.ModuleType] = {}
    todo = [ROOT, *EXTRA]
    while todo:
        name = todo.pop(0)
        module = importlib.import_module(ROOT) if name == ROOT else resolve(name)
        if name in found or any(module is seen for seen in found.values()):
            continue
        found[name] = module
        todo += [f"{name}.{attr}" for attr in public_names(module)
                 if isinstance(getattr(module, attr), types.ModuleType)]
    return found


def resolve(dotted: str):
    """``linearkit.a.b`` by attribute access from the package (lazy names load here)."""
    parent, _, attr = dotted.rpartition(".")
    return getattr(importlib.import_module(parent) if parent == ROOT else resolve(parent), attr)


def source_path(namespace: str, name: str, value: object) -> str:
    """Where mkdocstrings reads ``namespace.name`` from: the defining file's path for a class
    or function, the namespace's own name for anything else (a constant)."""
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if (isinstance(value, type) or callable(value)) and module and qualname \
            and "<" not in qualname and module.startswith(ROOT):
        return f"{module}.{qualname}"
    return f"{namespace}.{name}"


def page_name(namespace: str) -> str:
    return f"{namespace}.md"


def page(namespace: str, found: dict[str, types.ModuleType], rendered: set[str]) -> str:
    """One namespace's page (``found[namespace]``): its docstring, links to the pages of the
    modules it names, one entry per other name.

    An object already rendered on an earlier page (``linearkit.io.save`` is ``linearkit.save``)
    gets a link to that entry instead of a second copy; ``rendered`` collects the entries."""
    module, page_of = found[namespace], {id(m): name for name, m in found.items()}
    lines = [f"# `{namespace}`", "", f"::: {module.__name__}",
             "    options:", "      show_root_heading: false", "      show_root_toc_entry: false",
             "      members: false", ""]
    names = public_names(module)
    subs = [n for n in names if isinstance(getattr(module, n), types.ModuleType)]
    if subs:
        lines += ["Namespaces:", ""]
        for name in subs:
            target = page_of[id(getattr(module, name))]      # its first name, where it differs
            lines.append(f"- [`{namespace}.{name}`]({page_name(target)})")
        lines.append("")
    links = []
    for name in sorted(set(names) - set(subs), key=str.lower):
        path = source_path(namespace, name, getattr(module, name))
        if path in rendered:
            links.append(f"- [`{name}`][{path}]")
            continue
        rendered.add(path)
        lines += [f"::: {path}", "    options:",
                  f"      heading: \"{name}\"", f"      toc_label: \"{name}\"", ""]
    if links:
        lines += ["Documented on another page:", "", *links, ""]
    return "\n".join(lines)


def pages() -> dict[str, str]:
    """File name (inside reference/) -> Markdown, plus SUMMARY.md, the section's nav."""
    found, rendered = namespaces(), set()
    order = [ROOT, *sorted(set(found) - {ROOT})]       # the root first: users type lk.Linear
    written = {page_name(name): page(name, found, rendered) for name in order}
    summary = [f"- [{name}]({page_name(name)})" for name in order]
    written["SUMMARY.md"] = "\n".join(summary) + "\n"
    return written


def rendered_entries(markdown: str) -> set[str]:
    """The objects a page renders: the path after each ``:::`` directive (its module's too)."""
    return {line[4:].strip() for line in markdown.splitlines() if line.startswith("::: ")}


def linked_entries(markdown: str) -> set[str]:
    """The objects a page links to on another page: ``[`name`][path]``."""
    return set(re.findall(r"^- \[`[^`]+`\]\[([\w.]+)\]$", markdown, re.MULTILINE))


if __name__ == "<run_path>":          # run by the gen-files plugin (runpy.run_path)
    import mkdocs_gen_files

    for file_name, text in pages().items():
        with mkdocs_gen_files.open(f"{FOLDER}/{file_name}", "w") as out:
            out.write(text)
