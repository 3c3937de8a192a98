"""What the module-level transforms share: copying, choosing target layers, replacing a layer
by its path, building a Linear from arrays, and writing the report.

Which layers a transform may edit is the layer rules' answer (``LayerRule.transforms``, asked
through ``linearkit.rules.transforms_for``), never a class check here: a Linear's rule lists
'factorize', 'quantize', ...; a subclass of Linear has none of them unless its own rule says so.
"""

from __future__ import annotations

import copy
import fnmatch

import numpy as np

from ..core.module import Module
from ..layers import Linear
from ..layers.linear import linear_from
from ..rules import is_lazy, rule_for, transforms_for
from .transform_report import TransformReport, compare_models, probe_inputs, state_size

__all__ = ["Ties", "copy_model", "finish", "linear_from", "lists", "named", "paths_text",
           "replace_everywhere", "select_linears", "set_submodule", "uses"]


def copy_model(model, transform: str) -> Module:
    """A deep copy of ``model`` for ``transform`` to edit (the caller's model is never touched)."""
    if not isinstance(model, Module):
        raise TypeError(f"{transform}() takes a linearkit Module, got {type(model).__name__}; "
                        "convert a PyTorch model first with linearkit.io.from_torch")
    new = copy.deepcopy(model)
    for p in new.parameters():
        p.grad = None  # a new model starts without gradients (the original keeps its own)
    return new


def named(path: str, module: Module) -> str:
    """How a report and an error name a layer: ``'0' (Linear(3, 4))``, or ``the model (...)``."""
    rule = rule_for(module)
    text = rule.describe_module(module) if rule is not None else type(module).__name__
    return f"'{path}' ({text})" if path else f"the model ({text})"


def lists(module, transform: str) -> bool:
    """Whether ``module``'s layer rule lists ``transform`` (a transform touches nothing else;
    ``rules.transforms_for``: a subclass without a rule of its own is not listed unless its
    base's rule says ``transforms_inherited``); ``transform`` may carry a call's text
    ('quantize(int8)'). False for anything that is not a module with a rule."""
    name = transform.split("(")[0].strip()
    return name in transforms_for(module)


def _matches(path: str, target: str) -> bool:
    return path == target or path.endswith("." + target) or fnmatch.fnmatchcase(path, target)


def _owner(model: Module, path: str) -> str | None:
    """The path of the layer that the module at ``path`` is a part of — an ancestor with a rule
    of its own that is not a container (a LoRALinear, for its base and adapters) — or None when
    it is a step of containers and of users' modules only."""
    parts = path.split(".") if path else []
    modules = dict(model.named_modules())
    for i in range(len(parts)):
        ancestor = modules.get(".".join(parts[:i]))
        rule = rule_for(ancestor) if ancestor is not None else None
        if rule is not None and rule.kind not in ("sequential", "residual"):
            return ".".join(parts[:i])
    return None


def uses(model: Module) -> dict[int, list[str]]:
    """Every path at which each module object of ``model`` is found, by identity (``id`` ->
    paths, in order). A module shared under several names — a tied layer, as
    ``Sequential(a, ReLU(), a)`` — has several; a transform that replaces it puts one new
    module at each of them (``replace_everywhere``), so the tie survives."""
    where: dict[int, list[str]] = {}
    for path, m in model.named_modules(remove_duplicate=False):
        where.setdefault(id(m), []).append(path)
    return where


class Ties:
    """Which modules of ``model`` are tied, read once before a transform edits it.

    ``slots(m)``: how many slots (a parent and a child name) hold ``m``. More than one: ``m`` is
    tied — one object used at several places, so an edit of it at one place is an edit at all
    of them (or, replaced at one place only, unties it). A module at several paths only because
    a container above it is shared (``s = Sequential(a); Sequential(s, s)``) is held by one
    slot: editing it once, inside ``s``, is the same edit at every path. ``where(m)``: every
    path of ``m``. A module the model did not hold (one a transform made) has 0 slots.

    The modules are held here, so that no id is reused by a new module while the transform
    runs (the tables are keyed by identity).
    """

    def __init__(self, model: Module):
        at = dict(model.named_modules(remove_duplicate=False))
        self._held = list(at.values())
        self._paths: dict[int, list[str]] = {}
        held: dict[int, set] = {}
        for path, m in at.items():
            self._paths.setdefault(id(m), []).append(path)
            if path:
                parent, _, name = path.rpartition(".")
                held.setdefault(id(m), set()).add((id(at[parent]), name))
        self._slots = {key: len(h) for key, h in held.items()}

    def slots(self, module: Module) -> int:
        return self._slots.get(id(module), 0)

    def where(self, module: Module) -> list[str]:
        return list(self._paths.get(id(module), []))

    def tied_text(self, path: str, module: Module) -> str:
        """``"'0' (Linear(4, 4)) is one layer used at '0', '2' (tied)"``."""
        return f"{named(path, module)} is one layer used at {paths_text(self.where(module))} (tied)"


def paths_text(paths) -> str:
    """``'0', '2'``: paths as a report line lists them."""
    return ", ".join(repr(p) for p in paths)


def replace_everywhere(root: Module, paths, module: Module) -> Module:
    """Put ``module`` at each of ``paths`` (all the places one old module was used: ``uses``)
    and return the new root, so a tied layer's replacement is one object tied the same way."""
    for path in paths:
        root = set_submodule(root, path, module)
    return root


def select_linears(model: Module, targets, transform: str) -> list[tuple[str, Linear]]:
    """``(path, layer)`` of every plain ``Linear`` in ``model`` that ``targets`` names, for
    ``transform`` (its name, as listed in the layer rule's ``transforms``: the layers whose own
    rule lists it, which for the shipped layers is exactly ``Linear``).

    ``targets``: None (all of them), or a path / list of paths, each matching a layer's path
    exactly, its last components (``'fc1'`` matches ``'encoder.fc1'``, as peft's
    ``target_modules``), or as a glob (``'blocks.*.proj'``). A target that names no Linear is a
    ValueError listing the layers there are. The Linears inside another layer (a LoRALinear's
    base and adapters) are parts of that layer, never targets.

    A layer used at several paths (tied) is listed once, at its first path, and a target naming
    any of its paths selects it: it is one layer, which the transform replaces at every path.
    """
    # Only where the layer's own rule lists the transform: a subclass may compute something
    # else, and a user's rule can take a layer type out of it.
    found = [(path, m) for path, m in model.named_modules() if lists(m, transform)]
    linears = [(path, m) for path, m in found if _owner(model, path) is None]
    if targets is None:
        return linears
    targets = [targets] if isinstance(targets, str) else list(targets)
    where = uses(model)
    chosen, seen = [], set()
    for target in targets:
        hits = [(p, m) for p, m in linears
                if any(_matches(q, target) for q in where.get(id(m), [p]))]
        if not hits:
            inner = [p for p, _ in found if _matches(p, target)]
            if inner:
                owner = _owner(model, inner[0])
                raise ValueError(f"{transform}(): target {target!r} names '{inner[0]}', which is "
                                 f"inside {named(owner, dict(model.named_modules())[owner])}: "
                                 "a part of that layer, not a layer of its own")
            there = ", ".join(repr(p) for p, _ in linears) or "none"
            raise ValueError(f"{transform}(): target {target!r} names no Linear layer in the "
                             f"model; its Linear layers are: {there}")
        for p, m in hits:
            if p not in seen:
                seen.add(p)
                chosen.append((p, m))
    return chosen


def set_submodule(root: Module, path: str, module: Module) -> Module:
    """Put ``module`` at ``path`` in ``root`` (``'encoder.0'``) and return the new root (which is
    ``module`` itself when ``path`` is '')."""
    if not path:
        return module
    parent_path, _, name = path.rpartition(".")
    root.get_submodule(parent_path).add_module(name, module)
    return root


def finish(transform: str, old: Module, new: Module, probe, changed: list, left: list,
           layers: list | None = None) -> TransformReport:
    """The report of ``transform``: ``new`` checked against ``old`` on the probe inputs, and
    both models' sizes.

    Running a model materializes its lazy layers (with fresh random weights), so where ``old``
    has an unmaterialized ``LazyLinear`` the probes run on copies whose lazy layers (left alone
    by the transforms, at the same paths in both) are seeded alike: the caller's model is never
    touched, and both sides compute with the same weights.
    """
    params_before, bytes_before = state_size(old)
    params_after, bytes_after = state_size(new)
    lazy = [path for path, m in old.named_modules() if is_lazy(m)]
    if lazy:
        old, new = copy.deepcopy(old), copy.deepcopy(new)
        for seed, path in enumerate(lazy):
            for twin in (old, new):
                layer = dict(twin.named_modules()).get(path)
                if layer is not None and is_lazy(layer):
                    layer.reset_parameters(np.random.default_rng(seed))
    max_abs, max_rel = compare_models(old, new, probe_inputs(old, probe))
    return TransformReport(transform, max_abs, max_rel, params_before, params_after,
                           bytes_before, bytes_after, list(changed), list(left),
                           list(layers or []))
