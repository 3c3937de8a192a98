"""``python -m linearkit ...``: the same command as ``linearkit ...`` (for a venv without its scripts
on PATH, or to pick the interpreter explicitly)."""

import sys

from .cli import main

sys.exit(main())
