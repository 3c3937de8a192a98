"""Containers: Sequential (a chain), Residual (``x + f(x)``), and ModuleList / ModuleDict (held
children a custom module calls itself)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping

from operator import index as operator_index

import numpy as np

from ..core.module import Module
from ..errors import ShapeError

__all__ = ["ModuleDict", "ModuleList", "Residual", "Sequential", "install_runner"]

# How a Sequential runs its children is the runtime's choice: linearkit.runtime installs its
# runner here when linearkit is imported (``runner.forward(seq, x)``, ``runner.vjp(seq, x,
# input_grad)``). Without one, every child runs through its own guarded call.
_runner = None


def install_runner(runner) -> None:
    """Make ``runner`` decide how every Sequential runs (None: each child through its guard)."""
    global _runner
    _runner = runner


def trains(module: Module) -> bool:
    """True when ``module`` has a parameter that wants a gradient (Sequential's input_grad rule;
    the ledger uses the same function to mirror it)."""
    return any(p.requires_grad for p in module.parameters())


class Sequential(Module):
    """Modules applied in order: ``Sequential(a, b, c)(x) == c(b(a(x)))``.

    Accepts modules positionally (named ``0``, ``1``, …) or one ``OrderedDict`` of named modules.
    Supports indexing (``seq[-1]``), slicing (a new Sequential sharing the modules), ``len``,
    iteration, ``append``, ``extend``, ``insert``, ``del seq[i]`` / ``del seq[i:j]`` and
    ``pop``; as in PyTorch, deleting renumbers the steps left ``0..n`` (names given in an
    ``OrderedDict`` are not kept).

    Shape: whatever the chain maps — input of the first module -> output of the last.
    """

    def __init__(self, *modules):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], OrderedDict):
            for name, module in modules[0].items():
                self.add_module(name, module)
        else:
            for index, module in enumerate(modules):
                self.add_module(str(index), module)

    def _index(self, index: int) -> str:
        n = len(self._modules)
        if not -n <= index < n:
            raise IndexError(f"index {index} is out of range for a Sequential of length {n}")
        return list(self._modules)[index % n]

    def __getitem__(self, index):
        if isinstance(index, slice):
            return Sequential(OrderedDict(list(self._modules.items())[index]))
        return self._modules[self._index(index)]

    def __setitem__(self, index: int, module: Module) -> None:
        self.add_module(self._index(index), module)

    def __delitem__(self, index) -> None:
        names = list(self._modules)[index] if isinstance(index, slice) else [self._index(index)]
        self._renumber([m for name, m in self._modules.items() if name not in names])

    def pop(self, index: int = -1) -> Module:
        """Remove the step at ``index`` and return it; the steps left are renumbered."""
        module = self[index]
        del self[index]
        return module

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def steps(self) -> list[Module]:
        """The modules in call order (a module used twice listed twice)."""
        return list(self._modules.values())

    def named_steps(self) -> list[tuple[str, Module]]:
        """``(name, module)`` of each step in call order, a module used twice listed twice
        (``named_children`` lists it once); what tools walk to mirror ``forward``."""
        return [(name, m) for name, m in self._modules.items() if m is not None]

    def append(self, module: Module) -> Sequential:
        """Add ``module`` at the end, named by its position."""
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules) -> Sequential:
        for module in modules:
            self.append(module)
        return self

    def insert(self, index: int, module: Module) -> Sequential:
        """Insert ``module`` before position ``index``; names are renumbered ``0..n``."""
        items = list(self._modules.values())
        items.insert(index, module)
        self._renumber(items)
        return self

    def _renumber(self, items: list) -> None:
        """Make ``items`` the steps, named ``0..n`` in order."""
        for name in list(self._modules):
            delattr(self, name)
        for position, item in enumerate(items):
            self.add_module(str(position), item)

    def forward(self, x):
        """Each child on the output of the one before: ``forward_each``'s values, by the route
        the runtime picks (``linearkit.runtime.explain`` says which and why: while nothing
        observes the children one by one, they run without a guard each, ``Linear -> ReLU`` as
        one step, or the whole chain as one compiled call; the same bits). An error still names
        the child, located by this Sequential's own call."""
        runner = _runner
        if runner is not None:
            return runner.forward(self, x)
        return self.forward_each(x)

    def forward_each(self, x):
        """Each child through its own call (``module(x)``, hooks and checks included)."""
        for module in self._modules.values():
            x = module(x)
        return x

    def vjp(self, x, input_grad: bool = True):
        """Chain the children's closures; backward runs them in reverse (``vjp_each``'s values,
        by the route the runtime picks, as ``forward``).

        A child gets ``input_grad=False`` when neither the caller nor any earlier child needs a
        gradient through it (a first layer, or a frozen prefix): its dX GEMM is skipped and the
        frozen prefix is not visited in backward at all.
        """
        runner = _runner
        if runner is not None:
            return runner.vjp(self, x, input_grad)
        return self.vjp_each(x, input_grad)

    def vjp_each(self, x, input_grad: bool = True):
        """``vjp`` with each child through its own guarded ``vjp``."""
        backwards = []
        need = input_grad
        for module in self._modules.values():
            x, backward = module.vjp(x, input_grad=need)
            backwards.append(backward)
            need = need or trains(module)

        def backward(dy):
            for step in reversed(backwards):
                dy = step(dy)
                if dy is None:
                    return None
            return dy

        return x, backward


class Residual(Module):
    """``y = x + module(x)``: a skip connection around ``module``.

    Shape: x ``(*, d)`` -> y ``(*, d)``; ``module`` must keep the shape.
    """

    def __init__(self, module: Module):
        super().__init__()
        self.module = module

    def check_shapes(self, x_shape: tuple, fx_shape: tuple) -> None:
        """Raise the forward's ShapeError unless the wrapped module kept the shape."""
        if tuple(fx_shape) != tuple(x_shape):
            raise ShapeError(
                f"the wrapped module maps shape {tuple(x_shape)} to {tuple(fx_shape)}; a residual "
                "connection needs them equal",
                module=self,
                hint="make the inner block end with as many features as it starts with, or add "
                     "a projection (Linear) on the skip path",
            )

    def forward(self, x):
        """``x + module(x)``.

        Parameters
        ----------
        x : ndarray, shape ``(*, d)``

        Returns
        -------
        y : ndarray, shape ``(*, d)``
            A new array. A ShapeError if ``module(x)`` does not have ``x``'s shape.
        """
        fx = self.module(x)
        self.check_shapes(np.shape(x), np.shape(fx))
        return x + fx

    def vjp(self, x, input_grad: bool = True):
        """The forward plus its closure ``backward(dy) -> dx``.

        Parameters
        ----------
        x : ndarray, shape ``(*, d)``
        input_grad : bool
            False when the caller needs no ``dx``: the wrapped module is asked for none either,
            and ``backward`` returns None (it still runs the module's backward for its
            parameters' gradients).

        Returns
        -------
        y : ndarray, shape ``(*, d)``
            ``x + module(x)``, as ``forward``.
        backward : callable
            ``backward(dy (*, d)) -> dx (*, d)``: ``dy + module's dx`` (the skip path plus the
            block's), after the module's backward has added its parameters' gradients.
        """
        fx, inner = self.module.vjp(x, input_grad=input_grad)
        self.check_shapes(np.shape(x), np.shape(fx))

        def backward(dy):
            dx = inner(dy)
            return dy + dx if input_grad else None

        return x + fx, backward


def _indented(text: str) -> str:
    """``text`` with every line after the first indented two spaces (a nested repr)."""
    return text.replace("\n", "\n  ")


def _not_callable(module: Module) -> NotImplementedError:
    """The error of calling a ModuleList/ModuleDict: PyTorch's NotImplementedError, saying why."""
    kind = type(module).__name__
    return NotImplementedError(
        f"Module [{kind}] is missing the required \"forward\" function: a {kind} only holds "
        f"modules; call them from your own module's forward/vjp (for layer in self.layers: "
        f"x = layer(x)), or use lk.Sequential for a chain")


class ModuleList(Module):
    """A list of modules, registered as children ``'0'``, ``'1'``, … (PyTorch's ``ModuleList``).

    Holds modules for a custom module to call in its own ``forward``/``vjp``; it is not callable
    itself (NotImplementedError, as PyTorch). Their parameters are this module's: found by
    ``parameters()``, saved as ``0.weight``, ``1.bias``, … Supports indexing (negative too),
    slicing (a new ModuleList sharing the modules), ``len``, iteration, ``append``, ``extend``,
    ``insert``, ``pop``, ``+`` / ``+=``, ``lst[i] = m`` and ``del lst[i]`` / ``del lst[i:j]``
    (the modules left are renumbered ``0..n``, as PyTorch).

    Shape: none of its own (it has no forward).
    """

    def __init__(self, modules: Iterable[Module] | None = None):
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def _name(self, index) -> str:
        """The child name at position ``index`` (negative counts from the end), as PyTorch:
        TypeError for a non-integer, IndexError when out of range."""
        index = operator_index(index)
        n = len(self._modules)
        if not -n <= index < n:
            raise IndexError(f"index {index} is out of range")
        return str(index % n)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return type(self)(list(self._modules.values())[index])
        return self._modules[self._name(index)]

    def __setitem__(self, index, module: Module) -> None:
        self.add_module(self._name(index), module)

    def __delitem__(self, index) -> None:
        if isinstance(index, slice):
            names = list(self._modules)[index]
        else:
            names = [self._name(index)]
        self._renumber([m for name, m in self._modules.items() if name not in names])

    def _renumber(self, items: list) -> None:
        """Make ``items`` the children, named ``0..n`` in order."""
        for name in list(self._modules):
            delattr(self, name)
        for position, item in enumerate(items):
            self.add_module(str(position), item)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __iadd__(self, modules: Iterable[Module]) -> ModuleList:
        return self.extend(modules)

    def __add__(self, other: Iterable[Module]) -> ModuleList:
        """A new ModuleList of this one's modules then ``other``'s (shared, not copied)."""
        return ModuleList([*self, *other])

    def __dir__(self):
        return [key for key in super().__dir__() if not key.isdigit()]

    def append(self, module: Module) -> ModuleList:
        """Add ``module`` at the end, named by its position; returns self."""
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        """Append each module of ``modules`` in order; returns self."""
        if not isinstance(modules, Iterable):
            raise TypeError("ModuleList.extend should be called with an iterable, but got "
                            + type(modules).__name__)
        for module in list(modules):   # a list: ``lst.extend(lst)`` doubles it, as PyTorch
            self.append(module)
        return self

    def insert(self, index: int, module: Module) -> None:
        """Insert ``module`` before position ``index`` (list semantics); renumbers ``0..n``."""
        items = list(self._modules.values())
        items.insert(operator_index(index), module)
        self._renumber(items)

    def pop(self, index: int = -1) -> Module:
        """Remove the module at ``index`` and return it; the ones left are renumbered."""
        module = self[index]
        del self[index]
        return module

    def forward(self, *args, **kwargs):
        raise _not_callable(self)

    def vjp(self, *args, **kwargs):
        raise _not_callable(self)

    def __repr__(self) -> str:
        """PyTorch's: consecutive children with the same repr collapse into one line,
        ``(0-2): 3 x Linear(...)``."""
        children = list(self._modules.items())
        if not children:
            return "ModuleList()"
        lines, start = [], 0
        texts = [repr(child) for _, child in children]
        while start < len(children):
            end = start
            while end + 1 < len(children) and texts[end + 1] == texts[start]:
                end += 1
            text = _indented(texts[start])
            if end == start:
                lines.append(f"({children[start][0]}): {text}")
            else:
                lines.append(f"({children[start][0]}-{children[end][0]}): "
                             f"{end - start + 1} x {text}")
            start = end + 1
        return "ModuleList(\n  " + "\n  ".join(lines) + "\n)"


class ModuleDict(Module):
    """An ordered dict of modules, registered as children under their keys (PyTorch's
    ``ModuleDict``).

    Holds modules for a custom module to call in its own ``forward``/``vjp``; not callable
    itself (NotImplementedError, as PyTorch). Keys are child names (str, no '.', not an
    attribute of the module): state-dict keys ``name.weight``. Supports ``d[key]``,
    ``d[key] = m``, ``del d[key]``, ``len``, iteration (the keys), ``in``, ``keys``,
    ``values``, ``items``, ``update``, ``pop`` and ``clear``; insertion order is kept.

    Shape: none of its own (it has no forward).
    """

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, module)

    def __delitem__(self, key: str) -> None:
        if key not in self._modules:
            raise KeyError(key)
        delattr(self, key)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def __contains__(self, key) -> bool:
        return key in self._modules

    def clear(self) -> None:
        """Remove every child."""
        for key in list(self._modules):
            delattr(self, key)

    def pop(self, key: str) -> Module:
        """Remove the child ``key`` and return it (KeyError when absent)."""
        module = self[key]
        del self[key]
        return module

    def keys(self):
        return self._modules.keys()

    def items(self):
        return self._modules.items()

    def values(self):
        return self._modules.values()

    def update(self, modules) -> None:
        """Add or replace children from a mapping (its order) or an iterable of
        ``(key, module)`` pairs; errors as PyTorch's."""
        if not isinstance(modules, Iterable):
            raise TypeError("ModuleDict.update should be called with an iterable of key/value "
                            "pairs, but got " + type(modules).__name__)
        if isinstance(modules, (Mapping, ModuleDict)):
            for key, module in modules.items():
                self[key] = module
            return
        for j, pair in enumerate(modules):
            if not isinstance(pair, Iterable):
                raise TypeError(f"ModuleDict update sequence element #{j} should be Iterable; "
                                f"is {type(pair).__name__}")
            if len(pair) != 2:
                raise ValueError(f"ModuleDict update sequence element #{j} has length "
                                 f"{len(pair)}; 2 is required")
            self[pair[0]] = pair[1]

    def forward(self, *args, **kwargs):
        raise _not_callable(self)

    def vjp(self, *args, **kwargs):
        raise _not_callable(self)
