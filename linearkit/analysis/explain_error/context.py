"""``Context``: one message being explained, with what was given to explain it (the exception
object, the model, the input) and the failing layer, found once on first need."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .explanation import Explanation
from .model_view import Failure, ModelView, passes

__all__ = ["Context", "OwnError", "ints"]


def ints(text: str | None) -> tuple:
    """Every integer in ``text``, in order: ``'[16, 512]'`` -> ``(16, 512)``."""
    return () if text is None else tuple(int(t) for t in re.findall(r"-?\d+", text))


@dataclass
class OwnError:
    """A linearkit error taken apart: the failing module's path (None when the message does not
    say), its signature (``Linear(in_features=128, out_features=10, bias=True)``), the detail,
    the hint, and the module object when the exception itself was given."""

    path: str | None
    signature: str
    detail: str
    hint: str | None
    module: object = None

    @property
    def type_name(self) -> str:
        return self.signature.split("(", 1)[0]


class Context:
    """What ``explain`` knows about one message: ``text`` (the whole message), ``detail`` (the
    part the message classes are matched on: a linearkit error's detail, else the text),
    ``own`` (an ``OwnError`` for linearkit's own errors), the ``ModelView`` (or None), the
    input's shape and the input itself."""

    def __init__(self, text: str, exc, view: ModelView | None, input_shape, x,
                 own: OwnError | None):
        self.text, self.exc, self.view = text, exc, view
        self.input_shape, self.x, self.own = input_shape, x, own
        self.detail = own.detail if own is not None else text
        self.notes: list[str] = []
        self._found: Failure | None = None
        self._looked = False

    def explanation(self, kind: str, cause: str, fix: str, layer: str | None = None) -> Explanation:
        return Explanation(True, kind, cause, layer, fix, self.text, tuple(self.notes))

    def failure(self, test=None) -> Failure | None:
        """The failing module: named by a linearkit error, else found from the traceback or by
        a shape walk; None when unknown or when ``test(module)`` does not hold for it (the walk
        found a layer of another kind than the message is about)."""
        if not self._looked:
            self._looked = True
            self._found = self._locate()
        found = self._found
        if found is None or test is None or (self.own is not None and self.own.path is not None):
            return found
        return found if found.module is not None and passes(test, found.module) else None

    def _locate(self) -> Failure | None:
        own, view = self.own, self.view
        if own is not None and own.path is not None:
            module = own.module if view is None else view.by_path.get(own.path, own.module)
            got = re.search(r"got \(([\d,\s]*)\)", own.detail)
            return Failure(own.path, module, ints(got.group(1)) if got else None)
        if view is None:
            return None
        if self.exc is not None:
            found = view.from_traceback(self.exc)
            if found is not None:
                return found
        if self.input_shape is None:
            return None
        try:
            return view.walk(self.input_shape, self.x)
        except Exception as err:  # noqa: BLE001 - the walk failed: say so, use the numbers
            self.notes.append(f"the shape walk could not run ({type(err).__name__}: {err})")
            return None

    def match(self, test, what: str) -> tuple:
        """``(path, module)`` of the first layer of the model for which ``test`` holds (by the
        message's numbers), noting when several do; ``(None, None)`` when none or no model."""
        if self.view is None:
            return None, None
        found = self.view.find(test)
        if not found:
            return None, None
        if len(found) > 1:
            others = ", ".join(repr(p) for p, _ in found[1:4])
            self.notes.append(f"{len(found)} layers are {what}; the first is named (also "
                              f"{others}): give the input shape to pick the one that fails")
        return found[0]

    def locate(self, test, numbers_test, what: str) -> tuple:
        """``(path, module, incoming shape)``: the failing module when it passes ``test``,
        else the first layer passing ``numbers_test`` (``(None, None, None)`` if none)."""
        found = self.failure(test)
        if found is not None:
            return found.path, found.module, found.incoming
        path, module = self.match(numbers_test, what)
        return path, module, None
