"""Which input a model takes, read from its layers without running it: what a random probe
(the transforms' reports, ``io.verify``) is shaped by."""

from __future__ import annotations

from .registry import is_lazy

__all__ = ["first_input"]


def first_input(model) -> tuple[str, object | None, tuple | None]:
    """``(path, layer, width)``: the first module, in registration order, that says what input
    it takes, and that feature shape — a Linear's ``(in_features,)``, a norm's normalized
    shape or channel count. An unmaterialized lazy layer met first ends the search with width
    None (the input's width is what it has yet to learn; a later layer's would be a guess);
    ``('', None, None)`` when no module tells.
    """
    for path, m in model.named_modules():
        if is_lazy(m):
            return path, m, None
        n_in = getattr(m, "in_features", None)
        if isinstance(n_in, int):
            return path, m, (n_in,)
        shape = getattr(m, "normalized_shape", None)
        if shape is not None:
            return path, m, tuple(shape)
        c = getattr(m, "num_features", None)
        if isinstance(c, int):
            return path, m, (c,)
    return "", None, None
