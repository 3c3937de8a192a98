"""``Explanation``: what ``explain`` concluded about one error message."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Explanation", "where"]


def where(path: str | None) -> str:
    """How a layer path reads in a sentence: ``'classifier.2'``, the model itself for the root
    (path ``''``), or "the layer" when the path is unknown (None)."""
    if path is None:
        return "the layer"
    return f"'{path}'" if path else "the model itself"


@dataclass(frozen=True)
class Explanation:
    """The diagnosis of one error message.

    Attributes
    ----------
    recognized : bool
        False when the message is none of the classes ``explain`` knows; then ``cause`` says so
        and nothing else is claimed.
    kind : str
        A short id of the message class (``'linear_in_features'``, ``'missing_flatten'``,
        ``'state_dict_transposed'``, ... or ``'unrecognized'``); docs/explain.md lists them.
    cause : str
        The real cause, in words, with the numbers read from the message.
    layer : str or None
        The dotted path of the layer at fault inside the model (``'classifier.2'``; ``''`` is
        the model itself), or None when no model was given or no layer is at fault (a target's
        dtype, a file).
    fix : str
        One line: what to change.
    message : str
        The message that was explained, as given.
    notes : tuple of str
        Anything uncertain: several layers that fit, a possibility the numbers leave open.
    """

    recognized: bool
    kind: str
    cause: str
    layer: str | None = None
    fix: str = ""
    message: str = ""
    notes: tuple = ()

    def text(self) -> str:
        """A few lines: the kind and layer, the cause, the fix, then any notes."""
        if not self.recognized:
            return f"not recognized: {self.cause}"
        head = self.kind if self.layer is None else f"{self.kind} at {where(self.layer)}"
        lines = [head, f"  cause: {self.cause}"]
        if self.fix:
            lines.append(f"  fix: {self.fix}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()
