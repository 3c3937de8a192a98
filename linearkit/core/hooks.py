"""Call hooks: the supported way to observe (or adjust) module calls without patching a module.

PyTorch's shape, so a PyTorch user knows it:

* ``module.register_forward_pre_hook(hook)`` — ``hook(module, args) -> None | new args``
  (``with_kwargs=True``: ``hook(module, args, kwargs) -> None | (new args, new kwargs)``);
* ``module.register_forward_hook(hook)`` — ``hook(module, args, output) -> None | new output``
  (``with_kwargs=True``: ``hook(module, args, kwargs, output)``);
* ``module.register_full_backward_pre_hook(hook)`` — ``hook(module, grad_output) -> None | new
  grad_output``, before the module's backward runs;
* ``module.register_full_backward_hook(hook)`` — ``hook(module, grad_input, grad_output) ->
  None | new grad_input``, after it ran. ``grad_output`` is ``(dy,)``, ``grad_input`` is
  ``(dx,)`` (``(None,)`` for ``vjp(x, input_grad=False)``, as PyTorch passes None for an input
  that needs no gradient).

Each returns a handle whose ``.remove()`` unregisters the hook (also usable as a context
manager). Forward hooks fire for ``module(x)`` and for ``module.vjp(x)`` alike; under ``vjp`` the
keyword arguments hold ``input_grad``. Backward hooks fire when the closure ``vjp`` returned is
called. A forward hook may replace the output of ``module(x)`` but not of ``vjp`` (linearkit does
not differentiate through a hook; that raises). Hooks registered with the module-level
functions below (``register_module_forward_hook``, ...) fire for every module, before the
module's own. ``observe(model, ...)`` registers hooks on every submodule for the duration of a
``with`` block, which is what tools (``analysis.stats``, the ledger) use.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator

from . import structure as _structure

__all__ = ["KINDS", "RemovableHandle", "observe", "register_module_forward_hook",
           "register_module_forward_pre_hook", "register_module_full_backward_hook",
           "register_module_full_backward_pre_hook", "suspended"]

#: The four kinds of hook, in the order they fire.
KINDS = ("forward_pre", "forward", "backward_pre", "backward")

_ids = itertools.count()


class RemovableHandle:
    """Returned by every ``register_*`` call; ``remove()`` unregisters the hook (idempotent)."""

    __slots__ = ("_hooks", "id", "kind")

    def __init__(self, hook_set: HookSet, kind: str):
        self.id = next(_ids)
        self.kind = kind
        self._hooks = weakref.ref(hook_set)

    def remove(self) -> None:
        hook_set = self._hooks()
        if hook_set is not None:
            hook_set.discard(self)

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


class HookSet:
    """The hooks of one module (or the global ones): one ordered registry per kind.

    A module's set is dropped (``module._hooks`` back to None) when its last hook is removed,
    so a model whose hooks were all removed is exactly as it was.
    """

    __slots__ = KINDS + ("__weakref__", "_owner")

    def __init__(self, owner=None) -> None:
        for kind in KINDS:
            setattr(self, kind, OrderedDict())
        self._owner = None if owner is None else weakref.ref(owner)

    def add(self, kind: str, hook: Callable, with_kwargs: bool = False) -> RemovableHandle:
        if not callable(hook):
            raise TypeError(f"a {kind.replace('_', ' ')} hook must be callable, "
                            f"got {type(hook).__name__}")
        handle = RemovableHandle(self, kind)
        getattr(self, kind)[handle.id] = (hook, with_kwargs)
        _refresh()
        return handle

    def discard(self, handle: RemovableHandle) -> None:
        getattr(self, handle.kind).pop(handle.id, None)
        owner = None if self._owner is None else self._owner()
        if owner is not None and not self and owner.__dict__.get("_hooks") is self:
            object.__setattr__(owner, "_hooks", None)
        _refresh()

    def __bool__(self) -> bool:
        return any(getattr(self, kind) for kind in KINDS)

    def __deepcopy__(self, memo) -> HookSet:
        # A deep copy keeps its hooks, as in PyTorch (the callables are shared); the handles
        # returned before the copy remove them from the original only, as in PyTorch.
        copied = HookSet()
        for kind in KINDS:
            getattr(copied, kind).update(getattr(self, kind))
        return copied


#: Hooks that fire for every module's calls.
GLOBAL = HookSet()
#: True while any module-level hook is registered: the one check a hook-free call pays.
active = False


def _refresh() -> None:
    """After any hook was added or removed: the global flag, and every structure plan redone."""
    global active
    active = bool(GLOBAL)
    _structure.changed()


def _chain(module, kind: str) -> list:
    """The hooks of ``kind`` that fire for ``module``: the global ones first, then its own."""
    hooks = list(getattr(GLOBAL, kind).values())
    own = module.__dict__.get("_hooks")
    if own is not None:
        hooks += getattr(own, kind).values()
    return hooks


def run_forward_pre(module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Call the forward pre-hooks; returns the (possibly replaced) ``args`` and ``kwargs``."""
    for hook, with_kwargs in _chain(module, "forward_pre"):
        if with_kwargs:
            result = hook(module, args, kwargs)
            if result is not None:
                if not (isinstance(result, tuple) and len(result) == 2):
                    raise TypeError("a forward pre-hook registered with with_kwargs=True must "
                                    f"return None or (args, kwargs), got {type(result).__name__}")
                args, kwargs = result
        else:
            result = hook(module, args)
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
    return args, kwargs


def run_forward(module, args: tuple, kwargs: dict, output, replace_ok: bool):
    """Call the forward hooks; returns the (possibly replaced) output."""
    for hook, with_kwargs in _chain(module, "forward"):
        result = hook(module, args, kwargs, output) if with_kwargs else hook(module, args, output)
        if result is not None:
            if not replace_ok:
                raise TypeError(
                    f"a forward hook of {type(module).__name__} returned a new output during "
                    "vjp(); linearkit cannot differentiate through a hook. Observe in the hook "
                    "and return None, or wrap the change in a module of its own")
            output = result
    return output


def run_backward_pre(module, grad_output: tuple) -> tuple:
    """Call the backward pre-hooks; returns the (possibly replaced) ``grad_output``."""
    for hook, _ in _chain(module, "backward_pre"):
        result = hook(module, grad_output)
        if result is not None:
            grad_output = result if isinstance(result, tuple) else (result,)
    return grad_output


def run_backward(module, grad_input: tuple, grad_output: tuple) -> tuple:
    """Call the backward hooks; returns the (possibly replaced) ``grad_input``."""
    for hook, _ in _chain(module, "backward"):
        result = hook(module, grad_input, grad_output)
        if result is not None:
            grad_input = result if isinstance(result, tuple) else (result,)
    return grad_input


@contextlib.contextmanager
def suspended(*models):
    """Set aside the call hooks of every module of ``models`` (their own, not the global ones)
    for the block, so that a tool's own runs on models it owns (a transform's probes, timing,
    recorded inputs) fire none of them; each module gets exactly its own hook set back
    afterwards, even on an error. Hooks registered inside the block are gone when it ends."""
    saved = [(m, m.__dict__["_hooks"]) for model in models for m in model.modules()
             if m.has_hooks()]
    for m, _ in saved:
        object.__setattr__(m, "_hooks", None)  # as Module keeps it when no hook is registered
    if saved:
        _structure.changed()  # a plan made with the hooks must not run without them, and back
    try:
        yield
    finally:
        for m, hook_set in saved:
            object.__setattr__(m, "_hooks", hook_set)
        if saved:
            _structure.changed()


def register_module_forward_pre_hook(hook: Callable) -> RemovableHandle:
    """A forward pre-hook for every module's calls (``hook(module, args)``)."""
    return GLOBAL.add("forward_pre", hook)


def register_module_forward_hook(hook: Callable) -> RemovableHandle:
    """A forward hook for every module's calls (``hook(module, args, output)``)."""
    return GLOBAL.add("forward", hook)


def register_module_full_backward_pre_hook(hook: Callable) -> RemovableHandle:
    """A backward pre-hook for every module (``hook(module, grad_output)``)."""
    return GLOBAL.add("backward_pre", hook)


def register_module_full_backward_hook(hook: Callable) -> RemovableHandle:
    """A backward hook for every module (``hook(module, grad_input, grad_output)``)."""
    return GLOBAL.add("backward", hook)


@contextlib.contextmanager
def observe(model=None, *, forward_pre: Callable | None = None, forward: Callable | None = None,
            backward_pre: Callable | None = None, backward: Callable | None = None,
            with_kwargs: bool = False) -> Iterator[list[RemovableHandle]]:
    """Register the given hooks on every module of ``model`` (or, with no model, globally) for
    the duration of a ``with`` block; they are removed on exit, even on an error.

    ``with_kwargs`` applies to the forward hooks (under ``vjp`` the kwargs hold ``input_grad``).

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> model = lk.Sequential(lk.Linear(3, 4), lk.ReLU())
    >>> seen = []
    >>> with lk.hooks.observe(model, forward=lambda m, args, y: seen.append(y.shape)):
    ...     _ = model(np.ones((2, 3), np.float32))
    >>> seen  # children first, as they finish; the container last
    [(2, 4), (2, 4), (2, 4)]
    """
    given = {"forward_pre": forward_pre, "forward": forward, "backward_pre": backward_pre,
             "backward": backward}
    handles: list[RemovableHandle] = []
    try:
        for kind, hook in given.items():
            if hook is None:
                continue
            kw = with_kwargs and kind.startswith("forward")
            if model is None:
                handles.append(GLOBAL.add(kind, hook, kw))
            else:
                for module in model.modules():
                    handles.append(module._hook_set().add(kind, hook, kw))
        yield handles
    finally:
        for handle in handles:
            handle.remove()
