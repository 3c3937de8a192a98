"""A model's architecture as JSON: the module tree, its registered types and constructor arguments.

``model_spec(model)`` describes a model; ``build_model(spec)`` makes an equal, freshly initialized
model from it (load the weights afterwards). A spec holds no code and is never unpickled: each
node names a layer type that has a rule with ``rebuild`` (every shipped layer; a user's type
registers one, see ``linearkit.rules.Rebuild``) and gives plain JSON constructor arguments::

    {"format": "linearkit.spec/1",
     "root": {"type": "Sequential", "args": {}, "training": true,
              "children": [["0", {"type": "Linear", "args": {"in_features": 40, ...}}], ...]}}

A type is named by its class name for linearkit's own layers, else ``module.QualName``.

A spec read from a file is untrusted, and bounded before anything is built:

* ``spec_from_json`` refuses more than :data:`MAX_SPEC_CHARS` characters, more than
  :data:`MAX_BRACKETS` JSON objects and arrays, nesting deeper than :data:`MAX_DEPTH` levels (all
  three counted on the text, before ``json.loads`` runs, so no recursion limit is ever reached)
  and duplicate keys (while parsing);
* ``check_spec`` then walks the tree, without building: at most :data:`MAX_NODES` modules; type
  and child names of at most :data:`MAX_NAME` printable characters; child names as
  ``Module.add_module`` takes them (not empty, no '.', not an attribute of the class such as
  ``forward`` or ``training``), each once per parent. Given the file's header entries it also
  checks, for every shipped layer, each tensor its arguments declare (``in_features``,
  ``normalized_shape``, ``nnz``...) against the tensor the header lists — present, same shape,
  a float or an integer dtype as the layer holds — and that the header lists no tensor no
  module holds. A disagreement is a FormatError naming the file, the module path, what the
  architecture expects and what the file has, before one array is allocated.
* ``build_model(spec, entries=...)`` then builds the layers without their random init
  (``layers.linear.uninitialized``): the weights are loaded next. A user's layer type (one not
  shipped with linearkit) is checked against the header right after it is built, since only its
  own code knows what it allocates.

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

import contextlib
import inspect
import json
import numbers
from dataclasses import dataclass, field

from ..core.module import Module
from ..errors import AllocationError, FormatError
from ..storage.json_depth import json_depth

__all__ = ["FORMAT", "MAX_BRACKETS", "MAX_DEPTH", "MAX_NAME", "MAX_NODES", "MAX_SPEC_CHARS",
           "SpecNode", "build_model", "check_spec", "describe_spec", "model_spec",
           "spec_from_json", "tensor_roles", "type_name"]

#: The ``format`` field of every spec this version writes and reads.
FORMAT = "linearkit.spec/1"
#: Deepest nesting of modules a spec may describe (a module inside 64 containers).
MAX_DEPTH = 64
#: Most modules (nodes) a spec may describe.
MAX_NODES = 10_000
#: Longest type name or child name, in characters.
MAX_NAME = 256
#: Longest spec JSON text, in characters (10,000 small modules fit; so does any real model).
MAX_SPEC_CHARS = 1 << 20
#: Most '{' and '[' a spec's text may hold (about four per module, with room to spare).
MAX_BRACKETS = 8 * MAX_NODES
_MAX_DEPTH = MAX_DEPTH  # the name this module used before
# A module level is three JSON levels (node object, children list, [name, node] pair); the
# document, the root node and a node's args (an object holding a list) add a few more.
_JSON_DEPTH = 3 * MAX_DEPTH + 8

_REWRITE = ("the file's 'linearkit.spec' metadata was edited, damaged or written by a hostile "
            "tool; load its weights with linearkit.load(path, model) into a model you build")
_RESAVE = ("the architecture and the tensors do not belong together (edited or mixed files); "
           "save the model again with linearkit.save(model, path)")

# A JSON string (escapes included; the unrolled form cannot backtrack badly), or a run of
# characters that are neither brackets nor quotes: what the nesting scan removes.
# Attributes every Module instance has before a child is added (Module.__init__ sets them).
_INSTANCE_SLOTS = frozenset({"_parameters", "_buffers", "_non_persistent", "_modules",
                             "training", "_hooks"})
_FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2"})
_INT_DTYPES = frozenset({"I8", "U8", "I16", "U16", "I32", "U32", "I64", "U64"})


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


# ---------------------------------------------------------------------------- bounded parsing
def _refuse(problem: str, source, hint: str = _REWRITE):
    raise FormatError(problem, path=source, hint=hint)


def _no_duplicate_keys(source):
    def hook(pairs):
        out = dict(pairs)
        if len(out) != len(pairs):  # a repeated key: find the first to name it
            seen = set()
            for key, _ in pairs:
                if key in seen:
                    _refuse(f"the model architecture names the key {str(key)[:80]!r} twice in "
                            "one object (a JSON reader would silently keep the last one)",
                            source)
                seen.add(key)
        return out
    return hook


def spec_from_json(text: str, source: str = "<spec>") -> dict:
    """Parse a spec's JSON text, bounded; a FormatError naming ``source`` when it is too long,
    holds too many objects and arrays, nests too deep, repeats a key or is not valid JSON.

    The bounds are checked on the text before ``json.loads`` runs (so the parser's recursion
    stays under ``3 * MAX_DEPTH + 8`` levels), duplicate keys while it runs. The result is
    parsed JSON, not yet a checked spec: ``check_spec`` / ``build_model`` check the tree.
    """
    if not isinstance(text, str):
        _refuse(f"the model architecture must be JSON text, got {type(text).__name__}", source)
    if len(text) > MAX_SPEC_CHARS:
        _refuse(f"the model architecture is {len(text):,} characters of JSON, more than the "
                f"{MAX_SPEC_CHARS:,} a model file may hold", source)
    openers = text.count("{") + text.count("[")  # brackets inside strings count too: an upper bound
    if openers > MAX_BRACKETS:
        _refuse(f"the model architecture holds {openers:,} JSON objects and arrays, more than "
                f"the {MAX_BRACKETS:,} that {MAX_NODES:,} modules (the most a model file may "
                "describe) need", source)
    depth = json_depth(text)
    if depth > _JSON_DEPTH:
        _refuse(f"the model architecture nests deeper than {MAX_DEPTH} modules (its JSON is "
                f"{depth:,} levels deep, more than the {_JSON_DEPTH} that {MAX_DEPTH} modules "
                "need)", source)
    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_keys(source))
    except FormatError:
        raise
    except (TypeError, ValueError, RecursionError) as err:
        raise FormatError(f"the model architecture is not valid JSON ({err})", path=source,
                          hint=_REWRITE) from None


# ---------------------------------------------------------------------------- the checked tree
@dataclass(frozen=True, slots=True)
class _Want:
    """A tensor a layer's arguments declare: its shape, 'float' or 'int', and whether it is a
    parameter (and trainable once built) or a buffer."""

    shape: tuple
    kind: str
    role: str  # 'param', 'frozen' (a parameter its parent freezes) or 'buffer'


@dataclass(slots=True)  # a spec may hold 10,000 of them
class SpecNode:
    """One checked module of a spec: ``path`` ('' for the root, else dotted, as
    ``named_modules``), ``kind`` (the spec's type name), ``cls``, ``args``, ``training``,
    ``children`` (``[(name, SpecNode)]`` in order), ``state`` (``{name: _Want}`` of the
    tensors it holds, None for a user's type whose tensors are known only once built) and
    ``lazy`` (an unmaterialized LazyLinear: it holds no tensor yet)."""

    path: str
    kind: str
    cls: type
    args: dict
    training: bool
    children: list = field(default_factory=list)
    state: dict | None = None
    lazy: bool = False

    def where(self) -> str:
        """How errors name this module: "module 'a.b' (Linear)" or "the root module (Linear)"."""
        if self.path:
            return f"module '{self.path}' ({self.kind})"
        return f"the root module ({self.kind})"

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def walk(self):
        """This node and every descendant, depth first (the order of ``named_modules``)."""
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(child for _, child in reversed(node.children))


class _Mismatch(Exception):
    """A state rule's finding that the header disagrees with the arguments (not a bad
    argument); ``{weight}`` in the message becomes the tensor's key."""


def _count(args: dict, name: str) -> int:
    """``args[name]`` as a non-negative int (the layers' ``feature_count`` rule), else a
    TypeError/ValueError saying so."""
    value = args.get(name)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a non-negative int, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value}")
    return int(value)


def _bound(cls: type, args: dict) -> dict:
    """``args`` with the constructor's defaults filled in; TypeError for an argument it does not
    take or a required one missing (what ``cls(**args)`` would raise, without calling it)."""
    bound = inspect.signature(cls).bind(**args)
    bound.apply_defaults()
    return dict(bound.arguments)


def _linear_state(cls, args, own, children):
    a = _bound(cls, args)
    n_in, n_out = _count(a, "in_features"), _count(a, "out_features")
    state = {"weight": _Want((n_out, n_in), "float", "param")}
    if a["bias"]:
        state["bias"] = _Want((n_out,), "float", "param")
    return state


def _lazy_state(cls, args, own, children):
    # An unmaterialized LazyLinear holds nothing; a file that holds its weight materializes it
    # with in_features = the weight's dim 1 (as load_state_dict does), so only that is free.
    a = _bound(cls, args)
    n_out = _count(a, "out_features")
    if "weight" not in own:
        return None  # lazy: nothing held, nothing to load
    shape = tuple(own["weight"][1])
    if len(shape) != 2:
        raise _Mismatch(f"materializes from a 2-D weight ({n_out}, in_features), but the "
                        f"file's '{{weight}}' has shape {shape}")
    state = {"weight": _Want((n_out, shape[1]), "float", "param")}
    if a["bias"]:
        state["bias"] = _Want((n_out,), "float", "param")
    return state


def _layer_norm_state(cls, args, own, children):
    a = _bound(cls, args)
    shape = a["normalized_shape"]
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        shape = [shape]
    if not isinstance(shape, list):
        raise TypeError(f"normalized_shape must be an int or a list of ints, got {shape!r}")
    shape = tuple(_count({"normalized_shape": d}, "normalized_shape") for d in shape)
    state = {}
    if a["elementwise_affine"]:
        state["weight"] = _Want(shape, "float", "param")
        if a.get("bias", False):  # LayerNorm's; an RMSNorm has none
            state["bias"] = _Want(shape, "float", "param")
    return state


def _bilinear_state(cls, args, own, children):
    a = _bound(cls, args)
    n1, n2 = _count(a, "in1_features"), _count(a, "in2_features")
    n_out = _count(a, "out_features")
    state = {"weight": _Want((n_out, n1, n2), "float", "param")}
    if a["bias"]:
        state["bias"] = _Want((n_out,), "float", "param")
    return state


def _batch_norm_state(cls, args, own, children):
    a = _bound(cls, args)
    c = _count(a, "num_features")
    state = {}
    if a["affine"]:
        state["weight"] = _Want((c,), "float", "param")
        if a["bias"]:
            state["bias"] = _Want((c,), "float", "param")
    if a["track_running_stats"]:
        state["running_mean"] = _Want((c,), "float", "buffer")
        state["running_var"] = _Want((c,), "float", "buffer")
        state["num_batches_tracked"] = _Want((), "int", "buffer")
    return state


def _sparse_state(cls, args, own, children):
    a = _bound(cls, args)
    n_in, n_out, nnz = _count(a, "in_features"), _count(a, "out_features"), _count(a, "nnz")
    if nnz > n_in * n_out:
        raise ValueError(f"nnz={nnz} is more than the {n_in * n_out} entries of a "
                         f"({n_out}, {n_in}) weight")
    state = {"weight_values": _Want((nnz,), "float", "param"),
             "weight_indices": _Want((nnz,), "int", "buffer"),
             "weight_indptr": _Want((n_out + 1,), "int", "buffer")}
    if a["bias"]:
        state["bias"] = _Want((n_out,), "float", "param")
    return state


def _quantized_state(cls, args, own, children):
    a = _bound(cls, args)
    n_in, n_out = _count(a, "in_features"), _count(a, "out_features")
    state = {"weight": _Want((n_out, n_in), "int", "buffer"),
             "weight_scale": _Want((n_out,), "float", "buffer")}
    if a["bias"]:
        state["bias"] = _Want((n_out,), "float", "buffer")
    return state


def _lora_state(cls, args, own, children):
    # LoRALinear(base, rank) allocates lora_A (rank, in) and lora_B (out, rank) before the
    # rebuilt children replace them: rank must be the rank of the lora_A the file holds.
    rank = args.get("rank", 8)
    if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or rank < 1:
        raise ValueError(f"rank must be a positive int, got {rank!r}")
    a, b = children.get("lora_A"), children.get("lora_B")
    shapes = [getattr(n, "state", None) or {} for n in (a, b)]
    want_a, want_b = shapes[0].get("weight"), shapes[1].get("weight")
    if want_a is None or want_b is None or want_a.shape[0] != rank or want_b.shape[1] != rank:
        raise ValueError(f"rank={rank} must be the rank of its Linear children lora_A "
                         f"(rank, in_features) and lora_B (out_features, rank); got lora_A "
                         f"{want_a.shape if want_a else None}, lora_B "
                         f"{want_b.shape if want_b else None}")
    return {}


def _stateless(cls, args, own, children):
    return {}


def _state_rules() -> dict:
    """The shipped layer types whose tensors ``check_spec`` derives from their arguments:
    ``{cls: rule(cls, args, own_entries, child_nodes) -> {name: _Want} or None (lazy)}``."""
    from ..layers import (
        GELU,
        BatchNorm1d,
        Bilinear,
        Dropout,
        Flatten,
        Identity,
        LayerNorm,
        LazyLinear,
        LeakyReLU,
        Linear,
        LogSoftmax,
        LoRALinear,
        QuantizedLinear,
        ReLU,
        Residual,
        RMSNorm,
        Sequential,
        Sigmoid,
        SiLU,
        Softmax,
        SparseLinear,
        Tanh,
    )
    from ..training.checkpointing import Checkpoint

    rules = {Linear: _linear_state, LazyLinear: _lazy_state, LayerNorm: _layer_norm_state,
             BatchNorm1d: _batch_norm_state, SparseLinear: _sparse_state,
             QuantizedLinear: _quantized_state, LoRALinear: _lora_state,
             RMSNorm: _layer_norm_state, Bilinear: _bilinear_state}
    for cls in (Identity, ReLU, LeakyReLU, GELU, Tanh, Sigmoid, SiLU, Softmax, LogSoftmax,
                Dropout, Flatten, Sequential, Residual, Checkpoint):
        rules[cls] = _stateless
    return rules


def _child_name_problem(cls: type, name, seen: set) -> str | None:
    """Why ``name`` cannot name a child of a ``cls`` module (``Module.add_module``'s rule, plus
    a length cap and printable characters for a name read from a file), or None."""
    if not isinstance(name, str):
        return f"a child name must be a string, got {type(name).__name__} {str(name)[:40]!r}"
    if name == "":
        return "a child name is empty"
    if "." in name:
        return f"child name {name[:80]!r} contains '.' (paths and state-dict keys are dotted)"
    if len(name) > MAX_NAME:
        return f"a child name is {len(name):,} characters long, more than {MAX_NAME}"
    if not name.isprintable():
        return f"child name {name!r} holds control characters"
    if name in _INSTANCE_SLOTS or hasattr(cls, name):
        return (f"child name {name!r} would shadow the attribute {cls.__name__}.{name} "
                "(attribute already exists)")
    if name in seen:
        return f"child name {name!r} appears twice"
    return None


def _tensor_problem(want: _Want, key: str, entry) -> str | None:
    """What is wrong with the header's ``entry`` ((dtype, shape, ...) or None) for ``want``."""
    if entry is None:
        return f"expects tensor '{key}' of shape {want.shape}, but the file has no such tensor"
    dtype, shape = entry[0], tuple(entry[1])
    if shape != want.shape:
        return (f"expects tensor '{key}' of shape {want.shape}, but the file's has shape "
                f"{shape}")
    floating = want.kind == "float"
    if dtype not in (_FLOAT_DTYPES if floating else _INT_DTYPES):
        what = "a floating-point" if floating else "an integer"
        return f"expects tensor '{key}' to be {what} tensor, but the file's is {dtype}"
    return None


def check_spec(spec, source: str = "<spec>", entries: dict | None = None) -> SpecNode:
    """The checked tree of ``spec`` (parsed JSON); builds nothing, allocates no array.

    ``entries``: the file's header (``read_header(path)[0]``: name -> ``(dtype, shape, begin,
    end)``); when given, every tensor each shipped layer's arguments declare must be in it with
    that shape and a float/integer dtype as the layer holds, and every tensor in it must belong
    to a module. Every problem is a ``FormatError`` naming ``source``, the module path, what the
    architecture expects and what was found (see the module docstring for the bounds).
    """
    from ..rules import registered_types, rule_for

    if not isinstance(spec, dict) or spec.get("format") != FORMAT:
        got = spec.get("format") if isinstance(spec, dict) else type(spec).__name__
        raise FormatError(f"the model architecture has format {str(got)[:80]!r}, expected "
                          f"{FORMAT!r}", path=source,
                          hint="written by another program or a newer linearkit")
    known = {type_name(cls): cls for cls in registered_types()
             if getattr(rule_for(cls), "rebuild", None) is not None}
    state_rules = _state_rules()
    by_module: dict[str, dict] = {}  # module path -> {own tensor name: header entry}
    if entries is not None:
        for key, entry in entries.items():
            owner, _, name = key.rpartition(".")
            by_module.setdefault(owner, {})[name] = entry
    nodes = 0

    def check(node, path: str, depth: int) -> SpecNode:
        nonlocal nodes
        where = f"node '{path}'" if path else "the root node"
        if depth > MAX_DEPTH:
            _refuse(f"the architecture nests deeper than {MAX_DEPTH} modules (at {where})",
                    source)
        nodes += 1
        if nodes > MAX_NODES:
            _refuse(f"the architecture describes more than {MAX_NODES:,} modules", source)
        if not isinstance(node, dict) or not isinstance(node.get("type"), str) \
                or not isinstance(node.get("args", {}), dict):
            _refuse(f"{where} of the architecture must be an object with a 'type' string and "
                    f"an 'args' object, got {str(node)[:80]!r}", source)
        kind, args = node["type"], node.get("args", {})
        if len(kind) > MAX_NAME:
            _refuse(f"{where} has a type name of {len(kind):,} characters, more than "
                    f"{MAX_NAME}", source)
        cls = known.get(kind)
        if cls is None:
            raise FormatError(
                f"{where} has layer type {kind!r}, which is not registered for rebuilding",
                path=source, hint="a user's layer must be imported, with its rule registered "
                                  "(register_rule(..., LayerRule(rebuild=...))), before loading")
        training = node.get("training", True)
        out = SpecNode(path, kind, cls, args, True)
        where = out.where()  # the type is known now: "module 'a.b' (Linear)"
        if not isinstance(training, bool):
            _refuse(f"{where} has 'training' {str(training)[:40]!r}, expected a bool", source)
        out.training = training
        raw = node.get("children", [])
        if not isinstance(raw, list) or not all(
                isinstance(c, list) and len(c) == 2 for c in raw):
            _refuse(f"{where} has malformed 'children': expected a list of [name, node] "
                    "pairs", source)
        seen: set = set()
        for name, child in raw:
            problem = _child_name_problem(cls, name, seen)
            if problem is not None:
                _refuse(f"{where}: {problem}", source,
                        hint="a child name is a non-empty str without '.', each once, and not "
                             "an attribute of the module (forward, training, state_dict...); "
                             + _REWRITE)
            seen.add(name)
            out.children.append((name, check(child, f"{path}.{name}" if path else name,
                                             depth + 1)))
        rule = state_rules.get(cls)
        if rule is not None:
            own = by_module.get(path, {})
            try:
                state = rule(cls, args, own, dict(out.children))
            except _Mismatch as err:
                _refuse(f"{where} {str(err).format(weight=out.key('weight'))}", source,
                        hint=_RESAVE)
            except (TypeError, ValueError, KeyError) as err:
                _refuse(f"{where} cannot be built from arguments "
                        f"{str(args)[:200]}: {err}", source)
            out.lazy = state is None
            out.state = {} if state is None else state
        return out

    root = check(spec.get("root"), "", 0)
    if entries is not None:
        _against_header(root, entries, source)
    return root


def _against_header(root: SpecNode, entries: dict, source) -> None:
    """Every tensor a shipped layer declares is in ``entries`` with its shape and kind of dtype,
    and every entry belongs to a module (a user's type may hold any under its own path)."""
    claimed: set = set()
    open_paths: set = set()  # modules of a user's type: their own tensors are checked once built
    nodes = {}
    for node in root.walk():
        nodes[node.path] = node
        if node.state is None:
            open_paths.add(node.path)
            continue
        for name, want in node.state.items():
            key = node.key(name)
            claimed.add(key)
            problem = _tensor_problem(want, key, entries.get(key))
            if problem is not None:
                _refuse(f"{node.where()} {problem}{_from_args(node)}", source, hint=_RESAVE)
        if node.lazy:  # an unmaterialized LazyLinear: its weight and bias must be absent too
            for name in ("weight", "bias"):
                if node.key(name) in entries:
                    _refuse(f"{node.where()} holds tensor '{node.key(name)}' but no "
                            f"'{node.key('weight')}': its in_features comes from the "
                            "weight's shape", source, hint=_RESAVE)
    for key in entries:
        if key in claimed or key.rpartition(".")[0] in open_paths:
            continue
        owner = key.rpartition(".")[0]
        while owner not in nodes:  # the nearest module the key is under
            owner = owner.rpartition(".")[0]
        holder = nodes[owner]
        held = ", ".join(sorted(holder.state or {})) or "none"
        _refuse(f"tensor '{key}' in the file belongs to no module of the architecture (the "
                f"nearest, {holder.where()}, holds: {held})", source, hint=_RESAVE)


def _from_args(node: SpecNode) -> str:
    shown = {k: v for k, v in node.args.items() if k != "dtype"}
    return f" (from its arguments {str(shown)[:160]})" if shown else ""


def describe_spec(root: SpecNode) -> str:
    """A checked spec as text in the layout of a model's ``repr``: ``Type(arg=value, ...)``
    from the spec's arguments (the default ``dtype='float32'`` left out), children indented as
    ``(name): ...``. Built from the spec alone: nothing is constructed."""
    def text(node: SpecNode) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in node.args.items()
                         if not (k == "dtype" and v == "float32"))
        head = node.kind.rpartition(".")[2] if "." in node.kind else node.kind
        if node.lazy:
            args = "in_features=?, " + args if args else "in_features=?"
        if not node.children:
            return f"{head}({args})"
        lines = ([args] if args else []) + [
            f"({name}): " + text(child).replace("\n", "\n  ") for name, child in node.children]
        return f"{head}(\n  " + "\n  ".join(lines) + "\n)"

    return text(root)


def tensor_roles(root: SpecNode) -> dict[str, str]:
    """``{state-dict key: 'param' | 'frozen' | 'buffer'}`` for every tensor the shipped layers of
    a checked spec hold; a LoRALinear's base_layer is frozen (its constructor freezes it)."""
    from ..layers import LoRALinear

    roles = {}
    frozen: list[str] = []
    for node in root.walk():
        if node.cls is LoRALinear:
            frozen.append(node.key("base_layer") + ".")
        for name, want in (node.state or {}).items():
            key = node.key(name)
            roles[key] = "frozen" if want.role == "param" and any(
                key.startswith(p) for p in frozen) else want.role
    return roles


# ---------------------------------------------------------------------------- building
def build_model(spec: dict, source: str = "<spec>", *, entries: dict | None = None) -> Module:
    """A new model with the architecture ``spec`` describes (``check_spec`` runs first).

    Without ``entries`` the model is freshly initialized. With ``entries`` (the file's header,
    name -> ``(dtype, shape, begin, end)``) the spec is checked against them first, the layers
    are built without their random init (their weights are loaded next:
    ``model_file.model_from_metadata``), and a user's layer type is checked against them as soon
    as it is built. Every problem — a wrong format, an unknown type, arguments the type does not
    accept, a malformed node, a disagreement with the header — is a ``FormatError`` naming
    ``source`` (the file), the node's path and type; a layer that does not fit in memory is an
    ``AllocationError`` (a ``MemoryError``) naming its path, array, shape, dtype and bytes.
    """
    from ..layers.linear import uninitialized
    from ..rules import rule_for

    root = spec if isinstance(spec, SpecNode) else check_spec(spec, source, entries)

    def build(node: SpecNode) -> Module:
        children = {name: build(child) for name, child in node.children}
        try:
            module = rule_for(node.cls).rebuild.make(node.cls, dict(node.args), children)
        except AllocationError as err:  # a layer too large for this machine: named by its path
            raise err.at(node.path)
        except MemoryError as err:  # a user's layer, out of memory in its own code
            raise AllocationError(node.kind, module=None, detail=(
                f"ran out of memory while being built from arguments {str(node.args)[:200]}"
                f" ({str(err)[:300] or 'MemoryError'})")).at(node.path) from None
        except (TypeError, ValueError, KeyError, OverflowError) as err:
            raise FormatError(f"{node.where()} cannot be built from arguments "
                              f"{str(node.args)[:200]}: {str(err)[:300]}", path=source,
                              hint=_REWRITE) from None
        if node.state is None and entries is not None:
            _built_against_header(node, module, entries, source)
        module.training = node.training
        return module

    with uninitialized() if entries is not None else contextlib.nullcontext():
        return build(root)


def _built_against_header(node: SpecNode, module: Module, entries: dict, source) -> None:
    """A user's layer, just built: its own tensors must be the file's under its path."""
    own = {name: tuple(getattr(value, "data", value).shape)
           for name, value in module._local_state().items()}
    prefix = node.key("")
    in_file = {key[len(prefix):]: tuple(e[1]) for key, e in entries.items()
               if key.startswith(prefix) and "." not in key[len(prefix):]}
    for name in sorted(set(own) | set(in_file)):
        key = node.key(name)
        if name not in in_file:
            problem = f"holds tensor '{key}' of shape {own[name]}, but the file has no such tensor"
        elif name not in own:
            problem = f"holds no tensor '{name}', but the file has '{key}' {in_file[name]}"
        elif own[name] != in_file[name]:
            problem = (f"holds tensor '{key}' of shape {own[name]}, but the file's has shape "
                       f"{in_file[name]}")
        else:
            continue
        _refuse(f"{node.where()}, built from arguments {str(node.args)[:160]}, {problem}",
                source, hint=_RESAVE)
