"""``TorchTwin``: the PyTorch class a layer type corresponds to — the ``torch`` part of its rule.

One twin says which torch class a linearkit layer converts to (``linearkit.io.to_torch``), which
torch class converts to it (``linearkit.io.from_torch``), how the constructor arguments are read
off a module of either side (linearkit's layers use PyTorch's argument and attribute names), and
whether the ledger's PyTorch path costs a torch module of that class with the layer's rule.

The class is named by its import path, a string (``"torch.nn.Linear"``), and resolved only when
a tool that already has torch in hand asks for it: nothing in ``linearkit.rules`` imports torch.
This module imports nothing from linearkit.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["LEDGER_MATCHES", "TorchTwin"]

#: How the ledger's PyTorch path matches a torch module to a twin: its class exactly, or any
#: subclass of it too (``nn.Linear``'s subclasses compute a Linear's GEMM, as PyTorch's own
#: ``NonDynamicallyQuantizableLinear``).
LEDGER_MATCHES = ("exact", "subclasses")


@dataclass(frozen=True)
class TorchTwin:
    """The torch class of a layer type, and how a module converts between the two sides.

    Attributes
    ----------
    path : str
        The torch class's import path: ``"torch.nn.Linear"`` (``module.attribute``; the module
        is imported on first use, so a class a module builds lazily, as
        ``linearkit.io.torch.TorchResidual``, resolves through its module's ``__getattr__``).
    args : ``args(m, dtype) -> dict``, optional
        The constructor's keyword arguments, read off a module ``m`` of either side (the
        attribute names agree); ``dtype`` is the module's dtype in the target side's terms (a
        NumPy dtype building a linearkit layer, a ``torch.dtype`` building a torch one).
        Default: no arguments.
    build : ``build(cls, children) -> module``, optional — containers only
        Makes the target from its converted children (``children``: an OrderedDict name ->
        module, in order; the names are kept, so the state-dict keys agree); ``cls`` is the
        target class (the linearkit layer's, or the resolved torch class). A twin with
        ``build`` is a container: its children are converted first and ``args`` is not used.
    to_torch, from_torch : bool
        Whether ``to_torch`` turns the layer into this class, and whether ``from_torch`` turns
        this class into the layer (default both). A materialized ``LazyLinear`` converts to
        ``nn.Linear``, but ``nn.Linear`` converts to ``Linear``, not back to a LazyLinear.
        A rule has at most one twin with ``to_torch``.
    ledger : 'exact', 'subclasses' or None
        How the ledger's PyTorch path matches a torch module to this twin, and then costs it
        with the layer's rule (its ``kind``, ``cost``): its class exactly (the default), any
        subclass too, or never (None: a torch module of this class is a row without a rule).
    describe : ``describe(torch_module) -> str``, optional
        The ledger's type text of a matched torch module ('Linear(784, 256)'). Default: the
        linearkit layer's class name.
    """

    path: str
    args: Callable[[Any, Any], dict] | None = None
    build: Callable[[type, Any], Any] | None = None
    to_torch: bool = True
    from_torch: bool = True
    ledger: str | None = "exact"
    describe: Callable[[Any], str] | None = None

    def __post_init__(self) -> None:
        module, _, name = self.path.rpartition(".") if isinstance(self.path, str) else ("", "", "")
        if not (module and name):
            raise TypeError(f"TorchTwin.path must be a class's import path such as "
                            f"'torch.nn.Linear', got {self.path!r}")
        for field in ("args", "build", "describe"):
            value = getattr(self, field)
            if value is not None and not callable(value):
                raise TypeError(f"TorchTwin.{field} must be callable or None, got "
                                f"{type(value).__name__} (twin {self.path!r})")
        if self.ledger is not None and self.ledger not in LEDGER_MATCHES:
            raise TypeError(f"TorchTwin.ledger must be one of {LEDGER_MATCHES} or None, got "
                            f"{self.ledger!r} (twin {self.path!r})")
        if not (isinstance(self.to_torch, bool) and isinstance(self.from_torch, bool)):
            raise TypeError(f"TorchTwin.to_torch and from_torch must be bools, got "
                            f"{self.to_torch!r}, {self.from_torch!r} (twin {self.path!r})")

    @property
    def is_container(self) -> bool:
        """Whether the twin is built from converted children (``build``), not from ``args``."""
        return self.build is not None

    def resolve(self) -> type:
        """The torch class ``path`` names (its module imported now, if it is not yet)."""
        module, _, name = self.path.rpartition(".")
        try:
            found = getattr(importlib.import_module(module), name, None)
        except ImportError as err:  # ModuleNotFoundError stays one
            raise type(err)(f"torch twin {self.path!r}: cannot import module {module!r} ({err}); "
                            "install it, or fix the path in the rule's torch=") from err
        if not isinstance(found, type):
            got = "nothing" if found is None else f"a {type(found).__name__}"
            raise TypeError(f"torch twin {self.path!r}: module {module!r} has {got} named "
                            f"{name!r}, expected a class; fix the path in the rule's torch=")
        return found

    def arguments(self, m, dtype) -> dict:
        """``args(m, dtype)``, or no arguments."""
        return {} if self.args is None else self.args(m, dtype)

    def text(self, torch_module, layer_type: type) -> str:
        """The ledger's type text of ``torch_module``: ``describe(torch_module)``, or the name of
        ``layer_type`` (the linearkit layer this twin belongs to)."""
        return self.describe(torch_module) if self.describe is not None else layer_type.__name__
