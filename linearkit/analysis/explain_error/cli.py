"""``run(args)``: the ``linearkit explain`` command, given the parsed arguments.

``args.message`` is the error message (``-`` reads it from stdin, so a traceback can be piped
in), ``args.model`` the path of a linearkit model file or None, ``args.input_shape`` the input's
shape (a tuple of ints, batch included) or None. Prints the explanation; exit status 0 when the
message was recognized, 1 when not.
"""

from __future__ import annotations

import sys

from ..render import terminal_safe
from . import explain

__all__ = ["run"]


def run(args) -> int:
    """Explain ``args.message`` (with ``args.model`` and ``args.input_shape``); print it."""
    message = args.message
    if message == "-":
        message = sys.stdin.read()
    result = explain(message, getattr(args, "model", None),
                     input_shape=getattr(args, "input_shape", None))
    print(terminal_safe(result.text(), keep_newlines=True))
    return 0 if result.recognized else 1
