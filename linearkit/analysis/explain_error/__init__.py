"""``explain(error_or_text, model=None, x=None, *, input_shape=None)``: the real cause of an
error met around linear layers, the layer at fault, and the one-line fix.

It reads PyTorch's messages (``mat1 and mat2 shapes cannot be multiplied``, a
``load_state_dict`` size mismatch, conv/pool ranks, ``view``, broadcasting, invalid gradients,
LayerNorm/BatchNorm widths, cross-entropy targets), NumPy's ``not aligned``, and linearkit's own
errors (which already name the module and a hint: they are restated with the same kinds). Given
the model (a linearkit Module, a torch ``nn.Module`` or a linearkit model file) and the input
(or its shape), it names the layer: from the exception's traceback, by a shape walk
(``model_view``), or by the message's numbers. A message of no known class gives
``recognized=False`` and says so; nothing is guessed.

The package, one job a file: ``explanation`` (the result), ``context`` (one message and what
was given with it), ``model_view`` (finding the layer), ``shape_classes`` and
``load_loss_classes`` (PyTorch's and NumPy's message classes), ``own_errors`` (linearkit's),
``cli`` (``run(args)`` for the command line). torch is imported only for a torch model.
"""

from __future__ import annotations

import re

from .context import Context
from .explanation import Explanation
from .load_loss_classes import CLASSES as _LOAD_LOSS
from .model_view import ModelView, as_model, shape_of
from .own_errors import CLASSES as _OWN
from .own_errors import file_error, parse_own, restate
from .shape_classes import CLASSES as _SHAPES

__all__ = ["CLASSES", "Explanation", "explain"]

#: ``[(compiled regex, handler)]`` tried in order on the message (a linearkit error's detail).
CLASSES = _OWN + _SHAPES + _LOAD_LOSS

_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception): ", re.MULTILINE)


def _clean(text: str) -> str:
    """The message alone: a pasted traceback's last exception line onwards, without its
    ``RuntimeError: `` prefix."""
    text = text.strip()
    if "Traceback (most recent call last)" in text:
        lines = list(_EXCEPTION_LINE.finditer(text))
        if lines:
            return text[lines[-1].end():].strip()
    found = _EXCEPTION_LINE.match(text)
    return text[found.end():] if found else text


def _as_shape(input_shape) -> tuple | None:
    if input_shape is None:
        return None
    if isinstance(input_shape, int):
        return (input_shape,)
    return tuple(int(d) for d in input_shape)


def explain(error_or_text, model=None, x=None, *, input_shape=None) -> Explanation:
    """Explain an error: its real cause, the layer at fault and the one-line fix.

    Parameters
    ----------
    error_or_text : BaseException or str
        The exception (its traceback then locates the layer exactly) or its message; a pasted
        traceback is read from its last exception line.
    model : linearkit Module, torch ``nn.Module`` or path of a linearkit model file, optional
        The model the error came from; without it the layer is None.
    x : array or tensor, optional
        The input that failed, shape ``(N, *)``; a torch model then runs on it.
    input_shape : tuple of ints, optional
        The input's shape with the batch, ``(16, 512)``, when ``x`` is not at hand: the shapes
        are walked through the model to the first layer they do not fit.

    Returns
    -------
    Explanation
        ``.recognized``, ``.kind``, ``.cause``, ``.layer``, ``.fix``; ``print()`` it.

    Examples
    --------
    >>> import linearkit as lk
    >>> model = lk.Sequential(lk.Linear(512, 256), lk.ReLU(), lk.Linear(128, 10))
    >>> e = explain("mat1 and mat2 shapes cannot be multiplied (16x256 and 128x10)", model,
    ...             input_shape=(16, 512))
    >>> e.kind, e.layer, e.fix
    ('linear_in_features', '2', "use Linear(256, 10) for '2' (the features it receives)")
    >>> explain("CUDA out of memory. Tried to allocate 2.00 GiB").recognized
    False
    """
    exc = error_or_text if isinstance(error_or_text, BaseException) else None
    text = _clean(str(error_or_text) if exc is None or str(exc) else type(exc).__name__)
    model = as_model(model)
    view = None if model is None else ModelView(model)
    shape = _as_shape(input_shape) if input_shape is not None else shape_of(x)
    own = parse_own(exc, text, view)
    if isinstance(own, tuple):
        return file_error(own, text)
    ctx = Context(text, exc, view, shape, x, own)
    for pattern, handler in CLASSES if own is not None else _SHAPES + _LOAD_LOSS:
        found = pattern.search(ctx.detail)
        if found:
            return handler(found, ctx)
    if own is not None:
        return restate(ctx)
    return Explanation(False, "unrecognized",
                       "this message is none of the error classes explain knows (the shapes, "
                       "dtypes, checkpoints and loss targets of layers; docs/explain.md lists "
                       "them), so no cause or fix is given", None, "", text)
