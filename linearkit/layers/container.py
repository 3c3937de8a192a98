"""Containers: Sequential (a chain) and Residual (``x + f(x)``)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ..core.module import Module
from ..errors import ShapeError

__all__ = ["Residual", "Sequential", "install_runner"]

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
