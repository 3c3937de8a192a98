"""The ``linearkit`` command."""

from .commands import main

__all__ = ["main"]
