"""The optimizer base: parameter groups, per-parameter state, zero_grad, state dicts.

A subclass says how to step a group (``_update``), which hyperparameters are valid
(``_validate``) and what a parameter's state holds (``_state_keys``); loading a state dict is
checked against the last of these before anything is assigned (see ``loading.py``).

Mixed precision: a float16/bfloat16 parameter is stepped through a float32 master copy,
``state[p]['master_param']`` (made from ``p.data`` on its first step), with float32 states; the
update is applied to the master and ``p.data`` receives it rounded to nearest even. A gradient
in the storage dtype is upcast for the step. The master is the truth between steps: if
``p.data`` is replaced by another array (``model.to(...)``, ``p.data = ...``) the master is made
again from it; a change written *into* ``p.data`` in place is not seen (load the optimizer's
state with the model's, or call ``sync_masters()``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np

from .. import precision
from ..core.module import Parameter
from . import loading

if TYPE_CHECKING:
    from .flat import FlatState

#: a state key's kind: "step" (a count, kept as an int), "array" (shaped and typed like the
#: parameter), "array-or-none" (the same, or None for "not started yet"); "any" (a number,
#: None, or such an array) is what an optimizer without ``_state_keys`` gets
StateKeys = dict  # {name: (kind, required)}

#: the state key of a 16-bit parameter's float32 master copy
MASTER = "master_param"


class Optimizer:
    """Base class: parameter groups, per-parameter state, zero_grad, state_dict.

    Parameters
    ----------
    params : iterable of Parameter, or of dicts ``{'params': [...], **hyperparameters}``
        Groups override ``defaults`` for their parameters (e.g. a smaller ``lr`` for a backbone).
    defaults : dict
        Hyperparameters used by every group that does not set them.

    Notes
    -----
    Subclasses implement ``_validate(group)`` (raise ValueError for a bad hyperparameter),
    ``_update(group)`` (one step for the group's parameters) and ``_state_keys(group)`` (what
    ``state[p]`` holds for a parameter of ``group``: ``{name: (kind, required)}``).
    """

    #: every key this optimizer's per-parameter state may hold (so that a load can name the
    #: optimizer whose state it was given by mistake)
    _state_names: frozenset[str] = frozenset()

    @staticmethod
    def _known() -> list[type[Optimizer]]:
        """Every subclass of Optimizer defined so far, base classes first."""
        found, todo = [], [Optimizer]
        while todo:
            cls = todo.pop(0)
            for sub in cls.__subclasses__():
                if sub not in found:
                    found.append(sub)
                    todo.append(sub)
        return found

    def __init__(self, params, defaults: dict):
        self.defaults = dict(defaults)
        self._validate(self.defaults)
        self.state: dict[Parameter, dict] = {}
        self.param_groups: list[dict] = []
        self._flat: dict[int, FlatState] = {}
        # the p.data array each 16-bit parameter's master was made from or written into
        self._synced: dict[Parameter, np.ndarray] = {}
        if isinstance(params, Parameter):
            raise TypeError("params must be an iterable of Parameters (e.g. model.parameters() "
                            "or [p]), got a single Parameter")
        if isinstance(params, (set, frozenset)):
            raise TypeError("optimizer parameters must be an ordered collection (a list), not a "
                            "set: the order of a set changes between runs")
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list; did the model build its "
                             "parameters yet? (a LazyLinear has none before its first call)")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    # ------------------------------------------------------------------ groups
    def add_param_group(self, param_group: dict) -> None:
        """Add a group (``{'params': [...], **overrides}``); missing options take the defaults."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, got {type(param_group).__name__}")
        if "params" not in param_group:
            raise ValueError("param_group needs a 'params' entry (a list of Parameters)")
        params = param_group["params"]
        if isinstance(params, Parameter):
            params = [params]
        elif isinstance(params, (set, frozenset)):
            raise TypeError("a param group's 'params' must be an ordered collection (a list), "
                            "not a set")
        params = list(params)
        for p in params:
            if not isinstance(p, Parameter):
                hint = (" wrap arrays: Parameter(array)" if isinstance(p, np.ndarray)
                        else " pass model.parameters()")
                raise TypeError(f"an optimizer can only optimize Parameters, got "
                                f"{type(p).__name__};{hint}")
        ids = [id(p) for p in params]
        if len(set(ids)) != len(ids):
            raise ValueError("a parameter group holds the same Parameter twice; it would be "
                             "updated twice per step")
        taken = {id(p) for g in self.param_groups for p in g["params"]}
        if taken.intersection(ids):
            raise ValueError("some parameters appear in more than one parameter group")
        group = {key: value for key, value in param_group.items() if key != "params"}
        for key, value in self.defaults.items():
            group.setdefault(key, value)
        self._validate(group)
        group = {"params": params, **group}
        self.param_groups.append(group)

    def _validate(self, group: dict) -> None:
        pass

    def _state_keys(self, group: dict) -> StateKeys | None:
        """What ``state[p]`` holds for a parameter of ``group``: ``{name: (kind, required)}``.

        None (the default, for a subclass that does not say) checks only what is there: a
        ``'step'`` is a count, numbers and None are kept, anything else must be an array of the
        parameter's shape.
        """
        return None

    def _state_context(self, group: dict) -> str:
        """Which hyperparameters ``_state_keys`` depends on, for messages (e.g. 'amsgrad=True')."""
        return ""

    def _check_loaded_group(self, index: int, saved: dict) -> list[str]:
        """Problems with a loaded group's hyperparameters beyond ``_validate`` (one per line)."""
        return []

    # ------------------------------------------------------------------ stepping
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset every parameter's ``.grad``: to None (default), or fill it with zeros in place.

        In place (``set_to_none=False``), the next backward overwrites the zeroed buffers
        instead of allocating new ones; a group whose gradients live in one flat buffer (see
        ``flat.py``) is zeroed with a single call.
        """
        for group in self.param_groups:
            self._zero_group(group, set_to_none)

    def flat_state(self, group: dict):
        """The ``FlatState`` holding ``group``'s state and gradients in one buffer per array
        (``flat.py``), or None while the group has none (before its first flat step)."""
        return self._flat.get(id(group))

    def _zero_group(self, group: dict, set_to_none: bool) -> None:
        flat = self._flat.get(id(group))
        if not set_to_none and flat is not None and flat.owns_grads(group["params"]):
            flat.buffers["grad"].fill(0)
            for p in group["params"]:
                p.mark_zeroed()
            return
        for p in group["params"]:
            p.zero_grad(set_to_none)

    def step(self, closure: Callable[[], object] | None = None):
        """One update of every parameter that has a gradient; returns ``closure()`` if given."""
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            self._update(group)
        return loss

    def step_and_zero_grad(self, set_to_none: bool = True) -> None:
        """``step()`` then ``zero_grad(set_to_none)``, the same result, in one call.

        An optimizer whose compiled step can zero the gradients it has just read does so in the
        same pass (Adam/AdamW, ``set_to_none=False``, after the first step: one pass less over
        the gradients; docs/fast.md, "One pass for Adam's step and the zeroing of the
        gradients", has the timing);
        ``linearkit.training.loop.step`` calls this. Groups are disjoint, so each is stepped and zeroed
        in turn.
        """
        if set_to_none or not self._zeroes_while_stepping or type(self).step is not Optimizer.step:
            self.step()
            self.zero_grad(set_to_none)
            return
        for group in self.param_groups:
            if not self._update(group, zero_grads=True):
                self._zero_group(group, set_to_none)

    #: whether ``_update(group, zero_grads=True)`` may zero the gradients (returning True)
    _zeroes_while_stepping = False

    def _update(self, group: dict) -> None:  # pragma: no cover - abstract
        """Step ``group``. A subclass with ``_zeroes_while_stepping`` also takes
        ``zero_grads``: zero (in place, marked zeroed) the gradients it read, return whether
        it did (False: the caller zeroes them)."""
        raise NotImplementedError

    @staticmethod
    def _trainable(group: dict) -> Iterator[tuple[Parameter, np.ndarray]]:
        """``(p, grad)`` for each parameter of ``group`` that takes a step."""
        for p in group["params"]:
            grad = p.grad
            if grad is None or not p.requires_grad:
                continue
            if grad.shape != p.data.shape:
                raise ValueError(f"a gradient of shape {grad.shape} does not match its "
                                 f"parameter's shape {p.data.shape}")
            yield p, grad

    def _master(self, p: Parameter, state: dict) -> np.ndarray:
        """The float32 master copy of a 16-bit parameter (``state['master_param']``), made from
        ``p.data`` when there is none or ``p.data`` is no longer the array it was synced with."""
        master = state.get(MASTER)
        if master is None or self._synced.get(p) is not p.data:
            master = state[MASTER] = p.data.astype(precision.compute_dtype(p.data.dtype))
            self._synced[p] = p.data
        return master

    @staticmethod
    def _write_back(p: Parameter, master: np.ndarray) -> None:
        """``p.data`` <- ``master`` rounded to nearest even (into the same array)."""
        p.data[...] = master

    def sync_masters(self) -> None:
        """Make every 16-bit parameter's master copy again from ``p.data`` (after writing into
        ``p.data`` in place outside the optimizer, e.g. ``model.load_state_dict``)."""
        for state in self.state.values():
            state.pop(MASTER, None)
        self._synced.clear()

    def _incomplete_state(self, p: Parameter, missing: list[str]) -> ValueError:
        """The error for a ``state[p]`` that lacks keys its group now needs."""
        index = self._indexed()[id(p)]
        group_index, group = next((i, g) for i, g in enumerate(self.param_groups)
                                  if any(q is p for q in g["params"]))
        context = self._state_context(group)
        return ValueError(
            f"{type(self).__name__} state of parameter {index} (group {group_index}) lacks "
            f"{loading.names(missing)}, which a group{' with ' + context if context else ''} "
            f"needs; was that set after the parameter's first step, or the state edited? Start "
            f"a new optimizer, or load a state dict saved with these hyperparameters")

    # ------------------------------------------------------------------ state dict
    def _indexed(self) -> dict[int, int]:
        index: dict[int, int] = {}
        for group in self.param_groups:
            for p in group["params"]:
                index.setdefault(id(p), len(index))
        return index

    def state_dict(self) -> dict:
        """``{'state': {i: {...}}, 'param_groups': [{..., 'params': [i, ...]}]}`` (deep copies)."""
        index = self._indexed()
        groups = []
        for group in self.param_groups:
            packed = {k: copy.deepcopy(v) for k, v in group.items() if k != "params"}
            packed["params"] = [index[id(p)] for p in group["params"]]
            groups.append(packed)
        state = {index[id(p)]: copy.deepcopy(s) for p, s in self.state.items() if id(p) in index}
        return {"state": dict(sorted(state.items())), "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore hyperparameters and state saved by ``state_dict()`` (this or PyTorch's layout).

        Everything is checked before anything is assigned: the groups must match in number and
        size; each loaded group must hold this optimizer's hyperparameters, with valid values;
        each parameter's state must hold exactly the keys this optimizer keeps for its group
        (no more, no fewer: another optimizer's state is refused), with arrays of the
        parameter's shape. A problem raises ValueError naming the parameter's index in the
        state dict, its group, the key and what was expected, and leaves the optimizer as it
        was. Arrays are copied and cast to each parameter's dtype (float32 for a 16-bit
        parameter, whose state may also hold its ``'master_param'``); an empty entry means no
        state yet.
        """
        state, hyperparameters = loading.check(self, state_dict)
        for group, values in zip(self.param_groups, hyperparameters):
            group.update(values)
        self.state = state
        # a loaded master copy is the truth for its parameter; one without gets a new one
        self._synced = {p: p.data for p, entry in state.items() if MASTER in entry}

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            for key in sorted(group):
                if key != "params":
                    lines.append(f"    {key}: {group[key]}")
        lines.append(")")
        return "\n".join(lines)
