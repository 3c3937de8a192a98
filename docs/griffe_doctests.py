"""A griffe extension for the API reference: a doctest outside an ``Examples`` section renders
as code.

numpydoc and reST read ``>>>`` lines anywhere in a docstring as a doctest block; Markdown reads
them as nested quotes (and ``[...]`` output as a link). Each such block — its ``>>>``/``...``
lines and the output under them, up to a blank line — is wrapped in a ``pycon`` fence. Blocks
in an ``Examples`` section are left as they are: griffe's numpy parser renders those itself.
mkdocs.yml loads this file (mkdocstrings' ``extensions`` option).
"""

from __future__ import annotations

import re

import griffe

RULE = re.compile(r"^\s*-{3,}\s*$")      # the dashes under a numpydoc section title


def fence_doctests(text: str) -> str:
    """``text`` with each doctest block outside an ``Examples`` section fenced as ``pycon``."""
    lines, out, section, i = text.splitlines(), [], None, 0
    while i < len(lines):
        line = lines[i]
        if line.strip() and i + 1 < len(lines) and RULE.match(lines[i + 1]):
            section = line.strip()
        if line.lstrip().startswith(">>>") and section != "Examples":
            indent = line[:len(line) - len(line.lstrip())]
            out.append(indent + "```pycon")
            while i < len(lines) and lines[i].strip():
                out.append(lines[i])
                i += 1
            out.append(indent + "```")
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


class DoctestBlocks(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = fence_doctests(obj.docstring.value)
