"""How deep a JSON text nests, measured without parsing it: the bound a reader checks before
``json.loads``, whose recursion a hostile file could otherwise drive past Python's limit."""

from __future__ import annotations

import itertools
import re

__all__ = ["json_depth"]

_NOT_BRACKETS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[^\[\]{}"]+')
_DELTA = {"[": 1, "{": 1, "]": -1, "}": -1}


def json_depth(text: str) -> int:
    """The deepest nesting of ``[`` / ``{`` in ``text``, brackets inside strings not counted:
    an upper bound on the recursion ``json.loads`` needs for it (exact for valid JSON).

    One C-speed regex pass drops the strings and everything but brackets; the running sum
    (+1 per opener, -1 per closer) is then taken by ``itertools.accumulate`` and ``max``, in C,
    in constant memory. No recursion, whatever the depth.

    >>> json_depth('{"a": [1, {"b": "[[["}]}')
    3
    """
    brackets = _NOT_BRACKETS.sub("", text).replace('"', "")  # an unclosed quote: invalid anyway
    return max(itertools.accumulate(map(_DELTA.__getitem__, brackets)), default=0)
