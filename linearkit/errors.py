"""Errors that say which module failed, what it expected, what it got, and the fix.

A module raises with ``module=self``; every enclosing container (and ``Module.__call__``/``vjp``)
records itself as the root as the error travels up, so by the time a user sees it the message
names the module's path in the model they called (``classifier.2``), not just its class.
"""

from __future__ import annotations


class Located(Exception):
    """Mixin: a message that names the module path, resolved against the outermost caller."""

    def __init__(self, message: str, *, module=None, hint: str | None = None):
        super().__init__(message)
        self.detail = message
        self.module = module
        self.hint = hint
        self.root = None

    def locate(self, root) -> None:
        """Record ``root`` as the model the user called; the outermost call wins."""
        self.root = root

    def with_root(self, root):
        """``locate(root)``, then the error itself (to re-raise it in one expression)."""
        self.locate(root)
        return self

    @property
    def path(self) -> str | None:
        """Dotted path of the failing module inside ``root`` ('' for the root itself)."""
        if self.module is None or self.root is None:
            return None
        for name, mod in self.root.named_modules():
            if mod is self.module:
                return name
        return None

    def __str__(self) -> str:
        where = ""
        if self.module is not None:
            path = self.path
            signature = self.module._signature()
            where = f"module '{path}' ({signature})" if path else signature
            where += ": "
        text = where + self.detail
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


class ShapeError(Located, ValueError):
    """An input, gradient or state-dict entry has a shape the module cannot take."""


class DimError(ShapeError, IndexError):
    """A ``dim`` argument out of range for the input: an IndexError too, as PyTorch raises
    (and as NumPy's AxisError is both)."""


class DTypeError(Located, TypeError):
    """An input's dtype does not match the module's parameters (linearkit never promotes silently)."""


class BackwardError(Located, RuntimeError):
    """A backward closure was misused (called twice)."""


class AnomalyError(Located, FloatingPointError):
    """Raised inside ``linearkit.detect_anomaly()`` when a module first produces NaN or Inf."""


class FormatError(ValueError):
    """A file linearkit was asked to read is malformed or does not fit: names the file, the
    problem and the likely fix. Nothing has been loaded when it is raised."""

    def __init__(self, problem: str, *, path=None, hint: str | None = None):
        super().__init__(problem)
        self.problem = problem
        self.path = None if path is None else str(path)
        self.hint = hint

    def __str__(self) -> str:
        text = f"{self.path}: {self.problem}" if self.path is not None else self.problem
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text
