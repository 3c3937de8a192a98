"""The seams between the package's parts: tools ask the layer rules, not the classes.

The source checks parse every module of ``linearkit`` (``ast``, not a text grep: a docstring's
``isinstance(m, linearkit.Linear)`` example is not code) and fail on

* a class-identity check on a layer class — ``isinstance(x, Linear)``, ``type(x) is Sequential``
  — outside ``linearkit/layers/`` and ``linearkit/rules/``: what such a check expressed is a
  rule's field (``transforms``, ``lazy``, ``transposable_keys``, the torch twin), asked through
  ``linearkit.rules``. The layer classes are every Module subclass ``linearkit.layers`` exports
  and every Module subclass defined in ``linearkit`` (torch's classes of the same names count
  too: their twins are the rules');
* a read (or write) of ``._parameters``, ``._modules``, ``._buffers``, ``._hooks`` or ``._rng``
  on anything but ``self``, outside the file of the class that defines the field: the public
  accessors are ``named_parameters(recurse=False)``, ``named_children()``,
  ``named_buffers(recurse=False)``, ``get_submodule``, ``has_hooks()``, ``Dropout.rng``;
* ``from <module> import _private`` across modules, and ``module._private`` reached through an
  imported linearkit module.

``linearkit/runtime/`` is exempt: it is the one place that decides how a model runs, and knows
the layers it routes. A violation anywhere else fails.

The last tests check the seams themselves: each built-in layer's torch twin round-trips through
``to_torch``/``from_torch`` against the real torch class, and the import graph has no layer
import in the base ``Module`` and no factorization <-> factorize_sweep cycle.
"""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest

import linearkit as lk
from linearkit.rules import (
    LayerRule,
    TorchTwin,
    is_lazy,
    register_rule,
    registered_types,
    rule_for,
    torch_twin_of,
    torch_twins,
    transforms_for,
    transposable_keys,
)

PACKAGE = pathlib.Path(lk.__file__).parent
ROOT = PACKAGE.parent

#: Not checked at all: the runtime, the one place that knows every layer it routes.
EXEMPT = ("linearkit/runtime/",)
#: Where class-identity checks on layer classes belong: the classes themselves and their rules
#: (a room's own layers' rules included: distributed registers its parallel layers' there).
CLASS_CHECKS_ALLOWED = ("linearkit/layers/", "linearkit/rules/", "linearkit/distributed/rules.py")
#: The private fields of other objects nobody outside the defining class's file touches.
PRIVATE_FIELDS = ("_parameters", "_modules", "_buffers", "_hooks", "_rng")

#: Known violations (none left): ``(path, rule, what)``.
PENDING: set = set()


# ------------------------------------------------------------------ reading the package
def _sources() -> dict[str, ast.Module]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if not rel.startswith(EXEMPT):
            found[rel] = ast.parse(path.read_text(encoding="utf-8"), rel)
    return found


SOURCES = _sources()


def _module_name(rel: str) -> list[str]:
    parts = rel[:-3].split("/")
    return parts[:-1] if parts[-1] == "__init__" else parts


def _is_module(parts: list[str]) -> bool:
    path = ROOT.joinpath(*parts)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imported_from(rel: str, node: ast.ImportFrom) -> list[str] | None:
    """The absolute dotted parts of the module ``node`` imports from; None outside linearkit."""
    if node.level == 0:
        parts = (node.module or "").split(".")
        return parts if parts[0] == "linearkit" else None
    package = _module_name(rel) if rel.endswith("__init__.py") else _module_name(rel)[:-1]
    base = package[:len(package) - (node.level - 1)]
    return base + (node.module.split(".") if node.module else [])


def _last_name(node) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _class_names(node) -> list[str]:
    """The class names a class-check's second argument or comparand holds."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [n for e in node.elts for n in _class_names(e)]
    if isinstance(node, ast.BinOp):  # isinstance(x, A | B)
        return _class_names(node.left) + _class_names(node.right)
    name = _last_name(node)
    return [] if name is None else [name]


def _layer_classes() -> set[str]:
    """Every Module subclass exported by linearkit.layers or defined in linearkit (by name)."""
    bases: dict[str, set] = {}
    for path in PACKAGE.rglob("*.py"):  # every file: a class defined in an exempt one counts
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases.setdefault(node.name, set()).update(
                    n for n in map(_last_name, node.bases) if n)
    modules, grown = {"Module"}, True
    while grown:
        new = {name for name, of in bases.items() if of & modules} - modules
        modules |= new
        grown = bool(new)
    exported = {name for name in lk.layers.__all__
                if isinstance(getattr(lk.layers, name), type)
                and issubclass(getattr(lk.layers, name), lk.Module)}
    return (modules | exported) - {"Module"}  # the base class is what every tool takes


LAYER_CLASSES = _layer_classes()


def _is_type_call(node) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "type" and len(node.args) == 1)


def _class_checks(rel: str, tree: ast.Module) -> list[tuple[str, str, str, int]]:
    found = []
    for node in ast.walk(tree):
        names = []
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("isinstance", "issubclass") and len(node.args) == 2):
            names = _class_names(node.args[1])
        elif isinstance(node, ast.Compare) and any(
                _is_type_call(side) for side in [node.left, *node.comparators]):
            names = [n for side in [node.left, *node.comparators] if not _is_type_call(side)
                     for n in _class_names(side)]
        found += [(rel, "class-check", n, node.lineno) for n in names if n in LAYER_CLASSES]
    return found


def _field_owners() -> dict[str, set]:
    """For each private field, the files whose classes define it (``self.<field> = ...`` or
    ``object.__setattr__(self, "<field>", ...)``)."""
    owners = {field: set() for field in PRIVATE_FIELDS}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name) and node.value.id == "self"
                    and node.attr in owners):
                owners[node.attr].add(rel)
            if (isinstance(node, ast.Call) and ast.unparse(node.func) == "object.__setattr__"
                    and len(node.args) >= 2 and isinstance(node.args[0], ast.Name)
                    and node.args[0].id == "self" and isinstance(node.args[1], ast.Constant)
                    and node.args[1].value in owners):
                owners[node.args[1].value].add(rel)
    return owners


FIELD_OWNERS = _field_owners()
# the call-hook machinery keeps each module's hook set for it (registering, running, suspending)
FIELD_OWNERS["_hooks"].add("linearkit/core/hooks.py")


def _private_fields(rel: str, tree: ast.Module) -> list[tuple[str, str, str, int]]:
    found = []
    for node in ast.walk(tree):
        field, target = None, None
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE_FIELDS:
            field, target = node.attr, node.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and node.args[1].value in PRIVATE_FIELDS):
            field, target = node.args[1].value, node.args[0]
        elif (isinstance(node, ast.Call) and ast.unparse(node.func) == "object.__setattr__"
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and node.args[1].value in PRIVATE_FIELDS):
            field, target = node.args[1].value, node.args[0]
        elif (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
              and node.value.attr == "__dict__" and isinstance(node.slice, ast.Constant)
              and node.slice.value in PRIVATE_FIELDS):
            field, target = node.slice.value, node.value.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "get" and isinstance(node.func.value, ast.Attribute)
              and node.func.value.attr == "__dict__" and node.args
              and isinstance(node.args[0], ast.Constant) and node.args[0].value in PRIVATE_FIELDS):
            field, target = node.args[0].value, node.func.value.value
        if field is None or (isinstance(target, ast.Name) and target.id == "self"):
            continue
        if rel not in FIELD_OWNERS[field]:
            found.append((rel, "private-field", f"{ast.unparse(target)}.{field}", node.lineno))
    return found


def _private_imports(rel: str, tree: ast.Module) -> list[tuple[str, str, str, int]]:
    found, modules = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = _imported_from(rel, node)
            if base is None:
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append((rel, "private-import", ".".join(base + [alias.name]),
                                  node.lineno))
                elif _is_module(base + [alias.name]):
                    modules[alias.asname or alias.name] = ".".join(base + [alias.name])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "linearkit" and alias.asname:
                    modules[alias.asname] = alias.name
    for node in ast.walk(tree):  # module._private, through an imported linearkit module
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in modules and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            found.append((rel, "private-import", f"{modules[node.value.id]}.{node.attr}",
                          node.lineno))
    return found


def _violations(sources: dict[str, ast.Module]) -> list[tuple[str, str, str, int]]:
    found = []
    for rel, tree in sources.items():
        if not rel.startswith(CLASS_CHECKS_ALLOWED):
            found += _class_checks(rel, tree)
        found += _private_fields(rel, tree)
        found += _private_imports(rel, tree)
    return found


def _new(found) -> list[str]:
    return [f"{rel}:{line}: {rule} {what}" for rel, rule, what, line in found
            if (rel, rule, what) not in PENDING]


# ------------------------------------------------------------------ the source checks
def test_the_scan_sees_the_package_and_the_layer_classes():
    assert len(SOURCES) >= 100 and "linearkit/transforms/walk.py" in SOURCES
    assert {"Linear", "LazyLinear", "Sequential", "LoRALinear", "ColumnParallelLinear",
            "Checkpoint", "CrossEntropyLoss"} <= LAYER_CLASSES
    assert "QuantizedTrainingError" not in LAYER_CLASSES  # an error type, not a layer
    assert "linearkit/core/module.py" in FIELD_OWNERS["_parameters"]
    assert "linearkit/layers/dropout.py" in FIELD_OWNERS["_rng"]


def test_no_class_identity_check_on_a_layer_class_outside_layers_and_rules():
    found = [v for v in _violations(SOURCES) if v[1] == "class-check"]
    assert not _new(found), ("ask linearkit.rules (transforms_for, is_lazy, transposable_keys, "
                             "torch_twin_of) instead of checking the class:\n"
                             + "\n".join(_new(found)))


def test_no_private_field_of_another_object_is_touched():
    found = [v for v in _violations(SOURCES) if v[1] == "private-field"]
    assert not _new(found), ("use the public accessors (named_parameters(recurse=False), "
                             "named_children(), named_buffers(recurse=False), get_submodule, "
                             "has_hooks(), Dropout.rng):\n" + "\n".join(_new(found)))


def test_no_private_name_is_imported_or_reached_across_modules():
    found = [v for v in _violations(SOURCES) if v[1] == "private-import"]
    assert not _new(found), ("make the helper public (drop the underscore) where another "
                             "module needs it:\n" + "\n".join(_new(found)))


@pytest.mark.parametrize("snippet, rule", [
    ("def f(m):\n    return type(m) is Linear\n", "class-check"),
    ("def f(m):\n    return isinstance(m, (nn.Sequential, int))\n", "class-check"),
    ("def f(m):\n    return isinstance(m, LazyLinear | Identity)\n", "class-check"),
    ("def f(m):\n    return [p for p in m._parameters.values()]\n", "private-field"),
    ("def f(m):\n    m._rng = None\n", "private-field"),
    ("def f(m):\n    return getattr(m, '_hooks')\n", "private-field"),
    ("def f(m):\n    object.__setattr__(m, '_hooks', None)\n", "private-field"),
    ("def f(m):\n    return m.__dict__['_hooks']\n", "private-field"),
    ("def f(m):\n    return m.__dict__.get('_parameters')\n", "private-field"),
    ("from .merge import _as_float64\n", "private-import"),
    ("from . import merge\n\ndef f():\n    return merge._plan\n", "private-import"),
])
def test_each_check_catches_its_violation(snippet, rule):
    """Each kind of violation, put into a transform's source, is found (and is not PENDING)."""
    tree = ast.parse(snippet)
    found = [v for v in _violations({"linearkit/transforms/walk.py": tree}) if v[1] == rule]
    assert _new(found), snippet


def test_what_is_allowed_is_not_flagged():
    ok = ("def f(self, m, model):\n"
          "    self._parameters, self._hooks = {}, None\n"   # its own fields
          "    assert isinstance(model, Module)\n"            # the base class: any model
          "    return type(m).__name__, type(m) is type(model)\n")
    assert not _violations({"linearkit/transforms/walk.py": ast.parse(ok)})


# ------------------------------------------------------------------ the rules answer instead
def test_transforms_apply_to_exactly_their_type_unless_the_rule_is_inherited():
    class Doubled(lk.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    class LoudDropout(lk.Dropout):
        pass

    assert "factorize" in transforms_for(lk.Linear(2, 2)) and transforms_for(Doubled(2, 2)) == ()
    assert "merge_linear" in transforms_for(LoudDropout())  # a pass-through stays one
    assert transforms_for(lk.LazyLinear(2)) == () and transforms_for(np.zeros(2)) == ()
    model = lk.Sequential(lk.Linear(3, 3), Doubled(3, 3))
    _, report = lk.transforms.factorize(model, rank=1, timing=False)
    assert [entry["path"] for entry in report.layers] == ["0"]  # the subclass is left alone


def test_facts_stay_with_the_type_when_a_users_rule_replaces_its_rule():
    builtin = rule_for(lk.Linear)
    cheaper = LayerRule(kind="linear", cost=lambda m, s, need: (0,) * 6)
    with register_rule(lk.Linear, cheaper):
        assert rule_for(lk.Linear) is cheaper
        assert torch_twins(lk.Linear) == builtin.torch  # torch=None keeps the twin ...
        assert transposable_keys(lk.Linear(2, 2)) == ("weight",)  # ... and the kernel keys
        assert transforms_for(lk.Linear(2, 2)) == ()  # transforms are the rule's own
    with register_rule(lk.Linear, LayerRule(kind="linear", torch=(), transposable_keys=())):
        assert torch_twins(lk.Linear) == () and transposable_keys(lk.Linear) == ()
    assert rule_for(lk.Linear) is builtin and torch_twins(lk.Linear) == builtin.torch
    assert is_lazy(lk.LazyLinear(3)) and not is_lazy(lk.Linear(2, 2))


def test_in_out_layout_transposes_the_keys_the_rules_name():
    class Named(lk.Linear):  # a subclass inherits Linear's rule, so its weight is a kernel too
        pass

    model = lk.Sequential(lk.Linear(2, 3), Named(3, 4), lk.LayerNorm((4, 4)))
    state = {k: np.asarray(v).T.copy() if k in ("0.weight", "1.weight") else np.asarray(v)
             for k, v in model.state_dict().items()}
    fresh = lk.Sequential(lk.Linear(2, 3), Named(3, 4), lk.LayerNorm((4, 4)))
    fresh.load_state_dict(state, layout="in_out")
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(fresh.state_dict()[key], value)


def test_the_public_accessors():
    model = lk.Sequential(lk.Linear(2, 3), lk.Sequential(lk.ReLU(), lk.Dropout(0.5, rng=0)))
    assert model.get_submodule("1.1") is model[1][1] and model.get_submodule("") is model
    with pytest.raises(AttributeError, match=r"get_submodule\('1.5'\): '1' \(Sequential\) has no "
                                             r"child module '5'; its children are: 0, 1"):
        model.get_submodule("1.5")
    drop = model[1][1]
    own = np.random.default_rng(1)
    drop.rng = own
    assert drop.rng is own
    with pytest.raises(TypeError, match="Dropout.rng takes a numpy.random.Generator"):
        drop.rng = 3
    assert not model.has_hooks()
    handle = model.register_forward_hook(lambda m, a, y: None)
    assert model.has_hooks() and not model[0].has_hooks()
    handle.remove()
    assert not model.has_hooks()


def test_a_torch_twin_is_a_class_path_checked_when_it_is_made():
    with pytest.raises(TypeError, match="import path"):
        TorchTwin("Linear")
    with pytest.raises(TypeError, match="ledger must be one of"):
        TorchTwin("torch.nn.Linear", ledger="sometimes")
    with pytest.raises(TypeError, match="at most one twin"):
        LayerRule(torch=("torch.nn.Linear", "torch.nn.Identity"))
    assert LayerRule(torch="torch.nn.ReLU").torch == (TorchTwin("torch.nn.ReLU"),)


# ------------------------------------------------------------------ torch twins round-trip
def _builtin_layers() -> list[type]:
    return [t for t in registered_types() if t.__module__.startswith("linearkit.layers")]


def _examples():
    """One linearkit instance per built-in layer type with a torch twin, and its input (a
    tuple of inputs for Bilinear)."""
    x2 = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    x3 = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
    return {
        lk.Linear: (lambda: lk.Linear(4, 3), x2),
        lk.ReLU: (lk.ReLU, x2), lk.Tanh: (lk.Tanh, x2), lk.Sigmoid: (lk.Sigmoid, x2),
        lk.SiLU: (lk.SiLU, x2), lk.Identity: (lk.Identity, x2),
        lk.LeakyReLU: (lambda: lk.LeakyReLU(0.2), x2),
        lk.GELU: (lambda: lk.GELU(approximate="tanh"), x2),
        lk.Softmax: (lambda: lk.Softmax(dim=1), x2), lk.LogSoftmax: (lambda: lk.LogSoftmax(1), x2),
        lk.Dropout: (lambda: lk.Dropout(0.3).eval(), x2),
        lk.Flatten: (lambda: lk.Flatten(0), x2),
        lk.LayerNorm: (lambda: lk.LayerNorm(4), x2),
        lk.RMSNorm: (lambda: lk.RMSNorm(4, eps=1e-4), x2),
        lk.Bilinear: (lambda: lk.Bilinear(4, 5, 2), (x2, x3)),
        lk.BatchNorm1d: (lambda: lk.BatchNorm1d(4).eval(), x2),
        lk.Sequential: (lambda: lk.Sequential(lk.Linear(4, 4), lk.ReLU()), x2),
        lk.Residual: (lambda: lk.Residual(lk.Linear(4, 4)), x2),
        # No input: they have no forward (NO_FORWARD), so the round trip checks what they hold.
        lk.ModuleList: (lambda: lk.ModuleList([lk.Linear(4, 3), lk.ReLU(), lk.Linear(3, 2)]),
                        None),
        lk.ModuleDict: (lambda: lk.ModuleDict({"b": lk.Linear(4, 3), "a": lk.ModuleList(
            [lk.Linear(3, 2)])}), None),
    }


#: The containers that have no forward on either side, as in torch: a custom module calls their
#: children. Their round trip cannot compare outputs; it checks that calling one raises
#: NotImplementedError on both sides (so this exemption cannot hide a forward that broke), that
#: the torch twin holds the same tree (its repr, its keys) and that the weights come back equal.
NO_FORWARD = {lk.ModuleList, lk.ModuleDict}


#: The torch class ``to_torch`` makes of each built-in layer (``TorchResidual``: by name).
TORCH_NAMES = {"Linear": "Linear", "LazyLinear": "Linear", "Residual": "TorchResidual"}


def test_every_builtin_twin_round_trips_through_torch():
    torch = pytest.importorskip("torch")
    from linearkit.io import from_torch, to_torch

    examples = _examples()
    with_twin = [t for t in _builtin_layers() if torch_twins(t)]
    assert set(with_twin) == set(examples) | {lk.LazyLinear}, "give each twin an example"
    for layer_type in with_twin:
        (to_twin,) = [tw for tw in torch_twins(layer_type) if tw.to_torch]
        cls = to_twin.resolve()
        want = TORCH_NAMES.get(layer_type.__name__, layer_type.__name__)
        assert cls.__name__ == want and (want == "TorchResidual" or cls is getattr(torch.nn, want))
        if layer_type is lk.LazyLinear:
            continue  # materialized, it is a Linear; unmaterialized, both sides refuse it
        make, x = examples[layer_type]
        model = make()
        tm = to_torch(model)
        assert type(tm) is cls, layer_type
        if layer_type in NO_FORWARD:
            probe = np.zeros((1, 4), np.float32)
            with pytest.raises(NotImplementedError, match="forward"):
                model(probe)
            with pytest.raises(NotImplementedError, match="forward"):
                tm(torch.from_numpy(probe))
            assert repr(tm) == repr(model) and list(tm.state_dict()) == list(model.state_dict())
        else:
            xs = x if isinstance(x, tuple) else (x,)
            with torch.no_grad():
                np.testing.assert_allclose(tm(*map(torch.from_numpy, xs)).numpy(), model(*xs),
                                           rtol=1e-6, atol=1e-6, err_msg=layer_type.__name__)
        back = from_torch(tm)
        assert type(back) is layer_type and back.training == model.training
        assert repr(back) == repr(model)
        assert list(back.state_dict()) == list(model.state_dict())
        for key, value in model.state_dict().items():
            np.testing.assert_array_equal(back.state_dict()[key], value)


def test_the_one_way_twins_and_the_ledgers_matches():
    torch = pytest.importorskip("torch")
    from linearkit.io import from_torch

    nn = torch.nn
    listed = from_torch(nn.ModuleList([nn.Linear(2, 3), nn.ReLU()]))  # both ways, not a chain
    assert type(listed) is lk.ModuleList and list(listed.state_dict()) == ["0.weight", "0.bias"]

    class Sub(nn.Linear):
        pass

    matches = {nn.Linear(2, 2): lk.Linear, Sub(2, 2): lk.Linear, nn.LazyLinear(2): lk.LazyLinear,
               nn.ReLU(): lk.ReLU, nn.Sequential(): lk.Sequential,
               nn.BatchNorm1d(2): lk.BatchNorm1d}
    for m, layer_type in matches.items():
        assert torch_twin_of(m)[0] is layer_type, type(m)

    class SubReLU(nn.ReLU):  # an activation twin matches its class exactly
        pass

    for m in (SubReLU(), nn.ModuleList(), nn.Conv1d(1, 1, 1)):
        assert torch_twin_of(m) is None, type(m)


class Clamp(lk.Module):
    """y = clip(x, min_val, max_val): a user's layer whose torch twin is ``nn.Hardtanh``."""

    def __init__(self, min_val=-1.0, max_val=1.0):
        super().__init__()
        self.min_val, self.max_val = min_val, max_val

    def forward(self, x):
        return np.clip(x, self.min_val, self.max_val)


def test_a_users_layer_converts_and_is_costed_once_its_rule_names_a_twin():
    torch = pytest.importorskip("torch")
    from linearkit.io import from_torch, to_torch

    twin = TorchTwin("torch.nn.Hardtanh", lambda m, dt: {"min_val": m.min_val,
                                                         "max_val": m.max_val})
    rule = LayerRule(kind="activation", torch=twin, saved=lambda m, s, need: [],
                     cost=lambda m, s, need: (0, 0, 0, 2 * int(np.prod(s)), 0, 0))
    with register_rule(Clamp, rule):
        tm = to_torch(lk.Sequential(lk.Linear(3, 2), Clamp(-0.5, 0.5)))
        assert type(tm[1]) is torch.nn.Hardtanh and tm[1].min_val == -0.5
        back = from_torch(tm)
        assert type(back[1]) is Clamp and back[1].max_val == 0.5
        assert lk.analysis.ledger(tm, (4, 3))["1"].flops == 2 * 8
    with pytest.raises(lk.FormatError, match=r"torch module '1' \(Hardtanh\) has no linearkit"):
        from_torch(tm)  # the rule is gone, and with it the twin


# ------------------------------------------------------------------ the import graph
def test_the_base_module_imports_no_layer_and_the_registry_nothing_of_the_package():
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("linearkit")
    core = graph.find_modules_directly_imported_by("linearkit.core.module")
    assert not {m for m in core if m.startswith("linearkit.layers")
                or m == "linearkit.rules.builtin"}, core
    assert graph.find_modules_directly_imported_by("linearkit.rules.registry") == {
        "linearkit.rules.torch_twin"}
    assert not graph.find_modules_directly_imported_by("linearkit.rules.torch_twin")
    assert not graph.chain_exists("linearkit.transforms.factorization",
                                  "linearkit.transforms.factorize_sweep")
    assert graph.chain_exists("linearkit.transforms.factorize_sweep",
                              "linearkit.transforms.factorization")  # one way only
