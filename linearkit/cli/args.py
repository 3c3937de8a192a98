"""Command-line argument checks shared by ``linearkit`` (cli.py) and the experiments' ``main``.

Every check runs before any work and reports a user error as ONE line on stderr with exit
status 2 (argparse's convention), naming what was expected, what was given and the fix:

- :class:`Parser` — an ``ArgumentParser`` whose ``--help`` shows every default and whose errors
  are one line;
- ``type=`` functions (:func:`int_at_least`, :func:`positive_float`, :func:`threads`,
  :func:`storage_dtype`, :func:`shape`) that reject bad values at parse time;
- :func:`check_writable_file` / :func:`check_writable_dir` — prove an output path can be written
  by creating and removing a temporary file there, before hours of work are spent;
- :class:`UsageError` — a user error found after parsing (the caller prints it as one line).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import textwrap

__all__ = ["ParagraphHelp", "Parser", "UsageError", "check_writable_dir", "check_writable_file",
           "int_at_least", "positive_float", "shape", "storage_dtype", "threads"]


class UsageError(Exception):
    """A mistake in the command line found after parsing; shown as one line, exit status 2."""


class _DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` to every option's help, unless the help already says it."""

    def _get_help_string(self, action):
        text = action.help or ""
        said = "(default" in text or "default:" in text
        return text if said else super()._get_help_string(action)


class ParagraphHelp(_DefaultsHelp):
    """``_DefaultsHelp`` that keeps a description's or epilog's paragraphs (split at blank
    lines) and never breaks a word at its hyphen (``init-depth`` stays whole)."""

    def _fill_text(self, text, width, indent):
        return "\n\n".join(textwrap.fill(" ".join(part.split()), width, initial_indent=indent,
                                         subsequent_indent=indent, break_on_hyphens=False)
                           for part in text.split("\n\n"))


class Parser(argparse.ArgumentParser):
    """``ArgumentParser`` with defaults in ``--help`` and one-line errors (exit status 2)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _DefaultsHelp)
        # an abbreviation (--step for --steps) would be taken silently, and a later option
        # sharing the prefix would change what an old command line means: spell options out
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        """As argparse, except that an unknown option after a subcommand is reported by that
        subcommand's parser: its usage, then one error line with ``did you mean --X?`` when an
        option of that subcommand is close (``--stpes`` -> ``--steps``); exit status 2."""
        namespace, extras = super().parse_known_args(args, namespace)
        unknown = [a for a in extras if a.startswith("-")]
        sub = self._chosen_subparser(namespace) if unknown else None
        if sub is not None:
            import difflib

            options = [o for action in sub._actions for o in action.option_strings
                       if o.startswith("--")]
            hints = []
            for arg in unknown:
                close = difflib.get_close_matches(arg.split("=", 1)[0], options, n=1)
                if close:
                    hints.append(f"did you mean {close[0]}?")
            sub.print_usage(sys.stderr)
            sub.error(f"unrecognized arguments: {' '.join(extras)}"
                      + (f"; {' '.join(hints)}" if hints else ""))
        return namespace, extras

    def _chosen_subparser(self, namespace):
        """The subcommand parser this command line chose, or None (no subcommands)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                name = getattr(namespace, action.dest, None) if action.dest else None
                return action.choices.get(name)
        return None

    def error(self, message: str):
        """Print ``PROG: error: MESSAGE (see PROG --help)`` as one line and exit with 2."""
        message = " ".join(str(message).split())
        if message.endswith("expected one argument"):
            message += " (a value that starts with '-' needs the = form: --option=-VALUE)"
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def int_at_least(minimum: int):
    """A ``type=`` for integers ``>= minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    parse.__name__ = f"int >= {minimum}"
    return parse


def positive_float(text: str) -> float:
    """A ``type=`` for finite numbers ``> 0`` (a learning rate)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number like 1e-2, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be finite and > 0 (e.g. 1e-2), got {text!r}")
    return value


def fraction(low_open: bool, high_open: bool):
    """An argparse type: a float in (0, 1], [0, 1) ... as ``low_open``/``high_open`` say."""
    interval = f"{'(' if low_open else '['}0, 1{')' if high_open else ']'}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (0.0 < value if low_open else 0.0 <= value) or not (
                value < 1.0 if high_open else value <= 1.0):
            raise argparse.ArgumentTypeError(f"expected a number in {interval}, got {text!r}")
        return value

    return parse


def threads(text: str) -> int | str | None:
    """``--threads``: ``auto`` -> ``"auto"``, ``default`` -> None (BLAS as it is), or ``N >= 1``."""
    if text in ("auto", "default"):
        return "auto" if text == "auto" else None
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(
            f"expected auto, default or a number of threads >= 1, got {text!r}")
    return value


def storage_dtype(text: str):
    """``--dtype``: a numeric NumPy dtype name (float16, float32, float64, int8, ...; bfloat16
    when ``ml_dtypes`` is installed), as a ``numpy.dtype``."""
    import numpy as np

    if text == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise argparse.ArgumentTypeError(
                "bfloat16 needs the ml_dtypes package: pip install ml_dtypes") from None
        return np.dtype(ml_dtypes.bfloat16)
    try:
        dtype = np.dtype(text)
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in "fiu":
        raise argparse.ArgumentTypeError(
            f"expected a numeric dtype such as float16, bfloat16, float32 or float64, "
            f"got {text!r}")
    return dtype


def shape(text: str) -> tuple[int, ...]:
    """``--input-shape``: comma-separated integers >= 1, batch first (``64,784``)."""
    pieces = text.split(",")
    bad = [p for p in pieces if not p.strip().isdigit() or int(p) < 1]
    if bad:
        reason = ("a piece is empty" if any(not p.strip() for p in bad)
                  else f"{bad[0].strip()!r} is not an integer >= 1")
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers >= 1 with the batch first, like 64,784; "
            f"got {text!r}: {reason}")
    return tuple(int(p) for p in pieces)


def _probe(folder: str, what: str) -> None:
    """Create and remove a temporary file in ``folder`` (or its nearest existing ancestor)."""
    probe = os.path.abspath(folder or ".")
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        raise UsageError(f"cannot write {what}: {probe} is a file, not a folder")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".linearkit-write-check-", dir=probe)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise UsageError(f"cannot write {what}: {probe} is not writable ({exc.strerror}); "
                         f"choose another location") from None


def check_writable_file(path: str, flag: str = "--out") -> str:
    """``path`` can be created or replaced: its folder takes a temporary file. Returns path."""
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path} is a folder; name a file, e.g. "
                         f"{os.path.join(path, 'model.safetensors')}")
    _probe(os.path.dirname(path), f"{flag} {path}")
    return path


def check_writable_dir(path: str, flag: str = "--out-dir") -> str:
    """``path`` is (or can become) a folder that takes files. Returns path."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"{flag} {path} is a file; name a folder")
    _probe(path, f"{flag} {path}")
    return path
