"""``python -m linearkit ...``: the same command as ``linearkit ...`` (for a venv without its scripts
on PATH, or to pick the interpreter explicitly)."""

import sys

from .cli.commands import main

if __name__ == "__main__":  # importing it (tools that walk every module) runs nothing
    sys.exit(main())
