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


class ClassIndexError(Located, IndexError, ValueError):
    """A class-index target outside ``0..C-1`` that is not the loss's ``ignore_index``
    (``CrossEntropyLoss``, ``NLLLoss``): an IndexError, as PyTorch raises ("Target 4 is out of
    bounds."), and a ValueError (a bad value). The message names the index, the valid range and
    the likely fix (1-based labels, the head's ``out_features``, padding for ``ignore_index``)."""


class DTypeError(Located, TypeError):
    """An input's dtype does not match the module's parameters (linearkit never promotes silently)."""


class BackwardError(Located, RuntimeError):
    """A backward closure was misused (called twice)."""


class AnomalyError(Located, FloatingPointError):
    """Raised inside ``linearkit.detect_anomaly()`` when a module first produces NaN or Inf."""


class AllocationError(Located, MemoryError):
    """A layer could not allocate one of its arrays: in its constructor, ``reset_parameters``
    or a load. A ``MemoryError`` (``except MemoryError`` still catches it) whose message is one
    line naming the layer — its path in the model where known (``classifier.2``) — the array,
    its shape and dtype, and the bytes asked for.

    ``array``, ``shape``, ``dtype`` and ``nbytes`` are kept as attributes (None where unknown:
    a user's layer that ran out of memory in its own code). A loader that knows where the layer
    goes names it with ``at(path)``; otherwise the path is resolved like any located error's.
    """

    def __init__(self, layer: str, array: str | None = None, shape: tuple | None = None,
                 dtype=None, nbytes: int | None = None, *, module=None,
                 purpose: str = "", detail: str | None = None):
        self.layer = layer
        self.array = array
        self.shape = None if shape is None else tuple(int(s) for s in shape)
        self.dtype = None if dtype is None else str(dtype)
        self.nbytes = None if nbytes is None else int(nbytes)
        self.given_path: str | None = None
        if detail is None:
            detail = (f"cannot allocate {_bytes_text(self.nbytes)}{purpose} for its {array} of "
                      f"shape {self.shape}, {self.dtype}: more memory than this machine can "
                      "give; use smaller sizes or a 16-bit dtype, or free memory")
        super().__init__(detail, module=module)

    def at(self, path: str):
        """Name the layer by ``path`` (its place in the model being built); returns itself."""
        self.given_path = path
        return self

    @property
    def path(self) -> str | None:
        return self.given_path if self.given_path is not None else super().path

    def __str__(self) -> str:
        path = self.path
        where = f"module '{path}' ({self.layer})" if path else self.layer
        return f"{where}: {self.detail}"


def _bytes_text(nbytes: int | None) -> str:
    """``'400,000,000 bytes (381.5 MiB)'``: exact, then in binary units."""
    if nbytes is None:
        return "memory"
    size, unit = float(nbytes), "bytes"
    for next_unit in ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if size < 1024:
            break
        size, unit = size / 1024, next_unit
    return f"{nbytes:,} bytes" + ("" if unit == "bytes" else f" ({size:.1f} {unit})")


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
