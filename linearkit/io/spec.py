"""A model's architecture as JSON: the module tree, its registered types and constructor arguments.

``model_spec(model)`` describes a model; ``build_model(spec)`` makes an equal, freshly initialized
model from it (load the weights afterwards). A spec holds no code and is never unpickled: each
node names a layer type that has a rule with ``rebuild`` (every shipped layer; a user's type
registers one, see ``linearkit.rules.Rebuild``) and gives plain JSON constructor arguments::

    {"format": "linearkit.spec/1",
     "root": {"type": "Sequential", "args": {}, "training": true,
              "children": [["0", {"type": "Linear", "args": {"in_features": 40, ...}}], ...]}}

A type is named by its class name for linearkit's own layers, else ``module.QualName``.

Examples
--------
>>> import linearkit as lk
>>> from linearkit.io.spec import build_model, model_spec
>>> model = lk.Sequential(lk.Linear(3, 4), lk.ReLU())
>>> spec = model_spec(model)
>>> spec["root"]["children"][0][1]["type"], spec["root"]["children"][0][1]["args"]["in_features"]
('Linear', 3)
>>> build_model(spec)
Sequential(
  (0): Linear(in_features=3, out_features=4, bias=True)
  (1): ReLU()
)
"""

from __future__ import annotations

import json

from ..errors import FormatError
from ..core.module import Module

__all__ = ["FORMAT", "build_model", "model_spec", "spec_from_json", "type_name"]

#: The ``format`` field of every spec this version writes and reads.
FORMAT = "linearkit.spec/1"
_MAX_DEPTH = 64


def type_name(cls: type) -> str:
    """The name a spec gives a layer type: ``Linear`` for linearkit's, else ``module.QualName``."""
    if cls.__module__.split(".")[0] == "linearkit":
        return cls.__name__
    return f"{cls.__module__}.{cls.__qualname__}"


def model_spec(model: Module) -> dict:
    """The architecture of ``model`` as a JSON-serializable dict (see the module docstring).

    Raises TypeError naming the module's path when a module's type has no rule with
    ``rebuild``, or when a submodule appears twice (tied modules are not stored yet).
    """
    from ..rules import rule_for

    def node(m: Module, path: str) -> dict:
        rule = rule_for(m)
        where = f"module '{path}' ({type(m).__name__})" if path else type(m).__name__
        if rule is None or rule.rebuild is None:
            raise TypeError(
                f"{where} cannot be described in a model file: its type has no rule with "
                "rebuild=. Register one: linearkit.rules.register_rule(YourType, "
                "LayerRule(..., rebuild=Rebuild(args=lambda m: {...})))")
        children = list(m.named_children())
        slots = [name for name, _ in m.named_modules(remove_duplicate=False)
                 if name and "." not in name]
        if len(slots) != len(children):
            raise TypeError(f"{where} holds one submodule under two names; model files do not "
                            "store tied modules yet")
        out = {"type": type_name(type(m)), "args": rule.rebuild.args(m),
               "training": bool(m.training)}
        if children:
            out["children"] = [[name, node(child, f"{path}.{name}" if path else name)]
                               for name, child in children]
        return out

    return {"format": FORMAT, "root": node(model, "")}


def spec_from_json(text: str, source: str = "<spec>") -> dict:
    """Parse a spec's JSON text; a FormatError naming ``source`` when it is not valid JSON."""
    try:
        return json.loads(text)
    except (TypeError, ValueError) as err:
        raise FormatError(f"the model architecture is not valid JSON ({err})", path=source,
                          hint="the file's 'linearkit.spec' metadata was edited or damaged; "
                               "load its weights with linearkit.load(path) instead") from None


def build_model(spec: dict, source: str = "<spec>") -> Module:
    """A new model (freshly initialized) with the architecture ``spec`` describes.

    Every problem — a wrong format, an unknown type, arguments the type does not accept, a
    malformed node — is a ``FormatError`` naming ``source`` (the file), the node's path and type.
    """
    from ..rules import registered_types, rule_for

    if not isinstance(spec, dict) or spec.get("format") != FORMAT:
        got = spec.get("format") if isinstance(spec, dict) else type(spec).__name__
        raise FormatError(f"the model architecture has format {got!r}, expected {FORMAT!r}",
                          path=source, hint="written by another program or a newer linearkit")
    known = {type_name(cls): cls for cls in registered_types()
             if getattr(rule_for(cls), "rebuild", None) is not None}

    def build(node, path: str, depth: int) -> Module:
        where = f"node '{path}'" if path else "the root node"
        if depth > _MAX_DEPTH:
            raise FormatError(f"the architecture nests deeper than {_MAX_DEPTH} modules",
                              path=source)
        if not isinstance(node, dict) or not isinstance(node.get("type"), str) \
                or not isinstance(node.get("args", {}), dict):
            raise FormatError(f"{where} of the architecture must be an object with a 'type' "
                              f"string and an 'args' object, got {str(node)[:80]!r}", path=source)
        kind, args = node["type"], node.get("args", {})
        cls = known.get(kind)
        if cls is None:
            raise FormatError(
                f"{where} has layer type {kind!r}, which is not registered for rebuilding",
                path=source, hint="a user's layer must be imported, with its rule registered "
                                  "(register_rule(..., LayerRule(rebuild=...))), before loading")
        raw_children = node.get("children", [])
        if not isinstance(raw_children, list) or not all(
                isinstance(c, list) and len(c) == 2 and isinstance(c[0], str) for c in raw_children):
            raise FormatError(f"{where} ({kind}) has malformed 'children': expected a list of "
                              "[name, node] pairs", path=source)
        children = {name: build(child, f"{path}.{name}" if path else name, depth + 1)
                    for name, child in raw_children}
        try:
            module = rule_for(cls).rebuild.make(cls, dict(args), children)
        except (TypeError, ValueError, KeyError) as err:
            raise FormatError(f"{where} ({kind}) cannot be built from arguments {args}: {err}",
                              path=source) from None
        training = node.get("training", True)
        if not isinstance(training, bool):
            raise FormatError(f"{where} ({kind}) has 'training' {training!r}, expected a bool",
                              path=source)
        module.training = training
        return module

    return build(spec.get("root"), "", 0)
