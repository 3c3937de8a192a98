"""Checking a state dict against an optimizer before ``load_state_dict`` assigns anything.

PyTorch checks the number and sizes of the groups at load time (we raise with its words, then
say what differs) and finds everything else at the next ``step``: a bare ``KeyError`` for a
missing key, a broadcast error for a wrong shape, and nothing at all for Adam's state loaded
into SGD with momentum (a fresh buffer starts beside it). Here every group, key, shape and value is checked
first, all problems are reported in one ValueError (one line each, naming the parameter's index
in the state dict, its group, the key and what was expected), and only a state dict that fits is
turned into the new state.
"""

from __future__ import annotations

import copy
import math
import operator
from collections.abc import Mapping, Sequence

import numpy as np

from .. import precision
from .state_names import BUILTIN

_SHOWN = 10  # problems listed in one message; the rest are counted


def names(keys) -> str:
    """``'a', 'b'``: keys quoted as they are in messages."""
    return ", ".join(f"'{k}'" for k in keys)


def check(opt, state_dict) -> tuple[dict, list[dict]]:
    """Validate ``state_dict`` for ``opt``; return the new state and each group's new values.

    Returns ``(state, values)``: ``state`` maps each Parameter to its loaded entries (arrays
    copied and cast to the parameter's compute dtype — its own, float32 for a 16-bit one —
    steps as ints); ``values[i]`` holds deep copies
    of loaded group ``i``'s hyperparameters. Raises ValueError (TypeError for a non-dict) and
    changes nothing.
    """
    saved_groups, saved_state = _layout(state_dict)
    groups = opt.param_groups
    if len(saved_groups) != len(groups):
        raise ValueError("loaded state dict has a different number of parameter groups: it has "
                         f"{_count(len(saved_groups), 'parameter group')}, this optimizer has "
                         f"{len(groups)}")
    for i, (group, saved) in enumerate(zip(groups, saved_groups)):
        if len(group["params"]) != len(saved["params"]):
            raise ValueError("loaded state dict contains a parameter group that doesn't match "
                             f"the size of optimizer's group: the loaded group {i} has "
                             f"{_count(len(saved['params']), 'parameter')}, this optimizer's "
                             f"has {len(group['params'])}")
    owner = _owners(groups, saved_groups)
    problems: list[str] = []
    values, merged = [], []
    for i, (group, saved) in enumerate(zip(groups, saved_groups)):
        loaded = {k: copy.deepcopy(v) for k, v in saved.items() if k != "params"}
        merged.append({**{k: v for k, v in group.items() if k != "params"}, **loaded})
        values.append(loaded)
        problems += _group_problems(opt, i, loaded, merged[-1])
    state = {}
    seen: dict[int, object] = {}
    for key, entry in saved_state.items():
        index = _index(key)
        if index not in owner:
            problems.append(f"loaded state dict has state for parameter {key!r}, which no "
                            "parameter group lists")
            continue
        if index in seen:
            problems.append(f"loaded state dict has state for parameter {index} twice (under "
                            f"{seen[index]!r} and {key!r})")
            continue
        seen[index] = key
        p, g = owner[index]
        if not isinstance(entry, Mapping):
            problems.append(f"state of parameter {index} (group {g}) is a "
                            f"{type(entry).__name__}, not a dict of its state")
        elif entry:                                     # an empty entry: no state yet
            loaded_entry = _entry(opt, index, g, p, entry, merged[g], problems)
            if loaded_entry is not None:
                state[p] = loaded_entry
    if problems:
        where = f"cannot load this state dict into {type(opt).__name__}"
        if len(problems) == 1:
            raise ValueError(f"{where}: {problems[0]}")
        shown = problems[:_SHOWN] + ([f"... and {len(problems) - _SHOWN} more"]
                                     if len(problems) > _SHOWN else [])
        raise ValueError(f"{where} ({len(problems)} problems):\n  " + "\n  ".join(shown))
    return state, values


def _layout(state_dict) -> tuple[Sequence, Mapping]:
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"load_state_dict() takes a dict as state_dict() returns, got "
                        f"{type(state_dict).__name__}")
    for key in ("state", "param_groups"):
        if key not in state_dict:
            raise ValueError(f"loaded state dict lacks '{key}'; expected {{'state': {{...}}, "
                             "'param_groups': [...]}, as state_dict() returns")
    saved_groups, saved_state = state_dict["param_groups"], state_dict["state"]
    if not isinstance(saved_groups, Sequence) or isinstance(saved_groups, str):
        raise TypeError(f"loaded 'param_groups' is a {type(saved_groups).__name__}, not a list")
    if not isinstance(saved_state, Mapping):
        raise TypeError(f"loaded 'state' is a {type(saved_state).__name__}, not a dict")
    for i, saved in enumerate(saved_groups):
        if not isinstance(saved, Mapping) or "params" not in saved:
            raise ValueError(f"loaded parameter group {i} lacks 'params' (the indices of its "
                             "parameters in 'state')")
    return saved_groups, saved_state


def _owners(groups, saved_groups) -> dict:
    """``{index in the state dict: (Parameter, group index)}``, pairing groups in order."""
    owner: dict = {}
    for g, (group, saved) in enumerate(zip(groups, saved_groups)):
        for key, p in zip(saved["params"], group["params"]):
            index = _index(key)
            if index is None:
                raise ValueError(f"loaded parameter group {g} lists {key!r}, which is not a "
                                 "parameter index")
            if index in owner:
                other = owner[index][1]
                raise ValueError(f"loaded parameter group {g} lists parameter {index} twice"
                                 if other == g else f"loaded parameter groups {other} and {g} "
                                 f"both list parameter {index}")
            owner[index] = (p, g)
    return owner


def _index(key) -> int | None:
    """A parameter index: an int, or a string of one (a JSON round trip makes keys strings)."""
    try:
        return int(key) if isinstance(key, str) else operator.index(key)
    except (TypeError, ValueError):
        return None


def _group_problems(opt, i: int, loaded: dict, merged: dict) -> list[str]:
    kind = type(opt).__name__
    missing = sorted(set(opt.defaults) - set(loaded))
    if missing:
        return [(f"loaded parameter group {i} lacks {names(missing)}, hyperparameters of "
                 f"{kind}; was this state dict saved by another optimizer?")]
    try:
        opt._validate(merged)
    except (TypeError, ValueError) as err:
        return [f"loaded parameter group {i}: {err}"]
    return opt._check_loaded_group(i, loaded)


def _entry(opt, index: int, g: int, p, entry: Mapping, group: dict, problems: list):
    """One parameter's loaded state, or None after appending what is wrong to ``problems``."""
    spec = opt._state_keys(group)
    if spec is None:                                    # an optimizer that does not say
        spec = {k: ("step" if k == "step" else "any", False) for k in entry}
    if precision.is_16bit(p.data.dtype):                # its float32 master copy, if saved
        spec = {**spec, "master_param": ("array", False)}
    missing = [k for k, (_, required) in spec.items() if required and k not in entry]
    unexpected = [k for k in entry if k not in spec]
    if missing or unexpected:
        parts = [f"lacks {names(missing)}"] if missing else []
        if unexpected:
            parts.append(f"holds {names(unexpected)}{_foreign(opt, unexpected)}")
        keeps = [k for k, (_, required) in spec.items() if required]
        context = opt._state_context(group)
        problems.append(
            f"parameter {index} (group {g}) {' and '.join(parts)}; {type(opt).__name__} keeps "
            f"{names(keeps) if keeps else 'no state'} per parameter"
            f"{f' (in a group with {context})' if context else ''}")
        return None
    before = len(problems)
    loaded = {name: _value(spec[name][0], value, p, name, index, g, problems)
              for name, value in entry.items()}
    return loaded if len(problems) == before else None


def _foreign(opt, keys: list) -> str:
    """`` (SGD's state: ...)`` when ``keys`` are what another optimizer keeps."""
    states = dict(BUILTIN)      # the built-in ones, imported or not, then any other subclass
    states.update({cls.__name__: cls._state_names for cls in opt._known() if cls._state_names})
    owners: dict[frozenset, list[str]] = {}
    for name, names in states.items():
        if names != type(opt)._state_names and set(keys) <= names:
            owners.setdefault(names, []).append(name)
    if not owners:
        return ""
    who = " or ".join("/".join(n) for n in owners.values())
    return f" ({who}'s state: was this state dict saved by {who}?)"


def _value(kind: str, value, p, name: str, index: int, g: int, problems: list):
    """``value`` as loaded state ``name`` of kind ``kind`` for ``p``, or None after a problem."""
    what = f"state '{name}' of parameter {index} (group {g})"
    if kind == "step":                          # a count: int, float, 0-d array or tensor
        array = _as_array(value)
        number = float(array.reshape(())) if array.size == 1 and array.dtype.kind in "iuf" \
            else math.nan
        if not (math.isfinite(number) and number >= 0 and number == int(number)):
            problems.append(f"{what} is {_show(value)}; expected a whole number of steps >= 0")
            return None
        return int(number)
    if kind == "any" and (value is None or isinstance(value, (bool, int, float))):
        return value
    if value is None:
        if kind != "array-or-none":
            problems.append(f"{what} is None; expected an array of shape {p.data.shape}")
        return None
    array = _as_array(value)
    if array.dtype.kind not in "iuf" and not precision.is_float(array.dtype):  # bfloat16 too
        problems.append(f"{what} is {_show(value)}, not an array of real numbers")
        return None
    if array.shape != p.data.shape:
        problems.append(f"state '{name}' of parameter {index} has shape {array.shape}, but "
                        f"parameter {index} (group {g}) has shape {p.data.shape}")
        return None
    return np.array(array, dtype=precision.compute_dtype(p.data.dtype))  # a copy: float32
    # for a 16-bit parameter (its master copy and states), p's own dtype otherwise


def _as_array(value) -> np.ndarray:
    """``np.asarray(value)``; an object array when it is not array-like (a ragged list)."""
    try:
        return np.asarray(value)
    except (TypeError, ValueError):
        return np.asarray(None, dtype=object)


def _show(value) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape} and dtype {value.dtype}"
    text = repr(value)
    return text if len(text) <= 40 else f"a {type(value).__name__}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
