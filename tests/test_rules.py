"""Per-layer rules: a new layer gets a correct ledger row from one rule; lookups walk the MRO;
the built-in rules agree with the layers' real forward; the ledger reads only rules."""

from __future__ import annotations

import ast
import math
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from closure_oracle import closure_bytes

import linearkit as lk
from linearkit.analysis.ledger import ledger
from linearkit.rules import LayerRule, register_rule, rule_for


class Scale(lk.Module):
    """y = x * weight, per feature: x (*, d) -> (*, d); weight (d,)."""

    def __init__(self, d, dtype=np.float32):
        super().__init__()
        self.d = d
        self.weight = lk.Parameter(np.linspace(0.5, 1.5, d).astype(dtype))

    def check_input_shape(self, shape):
        if len(shape) == 0 or shape[-1] != self.d:
            raise lk.ShapeError(f"expected input of shape (*, {self.d}), got {tuple(shape)}",
                                module=self)

    def forward(self, x):
        self.check_input_shape(np.shape(x))
        return x * self.weight.data

    def vjp(self, x, input_grad=True):
        self.check_input_shape(np.shape(x))
        w = self.weight
        need_dw = w.requires_grad
        saved_x = x if need_dw else None

        def backward(dy):
            if need_dw:
                w.add_grad(np.sum(dy * saved_x, axis=tuple(range(dy.ndim - 1))))
            return dy * w.data if input_grad else None

        return x * w.data, backward


def _scale_cost(m, shape, need_dx):
    n = math.prod(shape)
    trains = m.weight.requires_grad
    # forward: one multiply per element; backward: dx = dy*w (n), dw = sum(dy*x) (2n)
    return 0, 0, 0, n, 0, n * int(need_dx) + 2 * n * int(trains)


def _scale_out(m, shape):
    m.check_input_shape(shape)
    return shape


SCALE_RULE = LayerRule(
    kind="scale", describe=lambda m: f"Scale({m.d})", output_shape=_scale_out, cost=_scale_cost,
    saved=lambda m, shape, need_dx: [("input", math.prod(shape))] if m.weight.requires_grad
    else [])


@pytest.fixture
def scale_rule():
    with register_rule(Scale, SCALE_RULE) as handle:
        yield handle
    assert rule_for(Scale) is None


def _mlp_with_scale():
    return lk.Sequential(lk.Linear(5, 6), Scale(6), lk.Linear(6, 2))


# ------------------------------------------------------------------ a new layer, one rule
def test_one_rule_gives_a_new_layer_a_correct_row(scale_rule):
    model = _mlp_with_scale()
    L = ledger(model, (3, 5))
    row = L["1"]
    n = 3 * 6
    assert (row.type, row.kind) == ("Scale(6)", "scale")
    assert (row.input_shape, row.output_shape) == ((3, 6), (3, 6))
    assert row.params == row.trainable_params == 6
    assert (row.macs, row.flops) == (0, n)
    assert row.backward_flops == n + 2 * n  # dx (Linear 0 trains) and dw
    assert row.saved_bytes == n * 4 and row.output_bytes == n * 4  # it keeps its input
    assert row.note == ""
    # the model's totals: the Scale's share added to the Linears', nothing unaccounted
    assert L.totals["params"] == 36 + 6 + 14
    assert L.totals["elementwise_flops"] == n
    assert not any("no FLOP rule" in note for note in L.notes)
    _, backward = model.vjp(np.zeros((3, 5), np.float32), input_grad=False)
    assert L.memory["activations"] == closure_bytes(backward, model)  # what the closures hold


def test_the_rules_row_follows_freezing_and_input_grad(scale_rule):
    model = _mlp_with_scale()
    model[0].requires_grad_(False)
    model[1].requires_grad_(False)  # nothing before Linear 2 trains: no dx, no dw, no saved x
    L = ledger(model, (4, 5))
    assert L["1"].backward_flops == 0 and L["1"].saved_bytes == 0
    _, backward = model.vjp(np.zeros((4, 5), np.float32), input_grad=False)
    assert L.memory["activations"] == closure_bytes(backward, model)


def test_the_rules_shape_check_raises_the_layers_own_error_located(scale_rule):
    model = lk.Sequential(lk.Linear(5, 7), Scale(6))
    with pytest.raises(lk.ShapeError) as info:
        ledger(model, (3, 5))
    with pytest.raises(lk.ShapeError) as real:
        model(np.zeros((3, 5), np.float32))
    assert str(info.value) == str(real.value)
    assert "module '1'" in str(info.value) and "(*, 6)" in str(info.value)


def test_without_a_rule_the_layer_is_run_once_and_its_params_still_count():
    assert rule_for(Scale) is None
    model = _mlp_with_scale()
    L = ledger(model, (3, 5))
    row = L["1"]
    assert row.kind == "custom" and "run once on zeros" in row.note
    assert "no rule for Scale" in row.note
    assert row.params == row.trainable_params == 6 and L.totals["params"] == 56
    assert row.flops is None  # its own arithmetic is unknown, not zero ...
    assert any("no FLOP rule for 1" in note for note in L.notes)  # ... and said so
    assert row.output_shape == (3, 6)
    _, backward = model.vjp(np.zeros((3, 5), np.float32), input_grad=False)
    assert L.memory["activations"] == closure_bytes(backward, model)  # measured for real
    assert all(m._hooks is None for m in model.modules())  # the observing hooks are gone


def test_the_scale_layers_gradients_are_right():
    layer = Scale(4, dtype=np.float64)
    x = np.random.default_rng(0).standard_normal((3, 4))
    lk.analysis.gradcheck(layer, x, raise_on_failure=True)


# ------------------------------------------------------------------ lookup through the MRO
def test_a_subclass_inherits_its_bases_rule(scale_rule):
    class WideScale(Scale):
        pass

    class NamedLinear(lk.Linear):
        pass

    assert rule_for(WideScale) is SCALE_RULE and rule_for(WideScale(3)) is SCALE_RULE
    assert rule_for(NamedLinear) is rule_for(lk.Linear)
    L = ledger(lk.Sequential(NamedLinear(5, 6), WideScale(6)), (2, 5))
    plain = ledger(lk.Sequential(lk.Linear(5, 6), Scale(6)), (2, 5))
    for a, b in zip(L.rows, plain.rows):
        assert (a.type, a.kind, a.macs, a.flops, a.backward_flops, a.saved_bytes) == \
            (b.type, b.kind, b.macs, b.flops, b.backward_flops, b.saved_bytes)


def test_a_users_rule_wins_and_removing_it_restores_the_builtin():
    builtin = rule_for(lk.ReLU)
    doubled = LayerRule(kind="activation", cost=lambda m, s, need: (0, 0, 0, 2 * math.prod(s),
                                                                    0, 0), saved=lambda *a: [])
    model = lk.Sequential(lk.Linear(4, 3), lk.ReLU())
    with register_rule(lk.ReLU, doubled):
        assert rule_for(lk.ReLU()) is doubled
        assert ledger(model, (5, 4))["1"].flops == 2 * 15
    assert rule_for(lk.ReLU) is builtin
    assert ledger(model, (5, 4))["1"].flops == 15

    class Special(lk.Linear):
        pass

    with register_rule(Special, SCALE_RULE):  # a subclass's own rule beats its base's
        assert rule_for(Special) is SCALE_RULE and rule_for(lk.Linear) is not SCALE_RULE


def test_register_rule_refuses_what_is_not_a_layer_type_or_a_rule():
    with pytest.raises(TypeError, match="type\\(module\\)"):
        register_rule(lk.ReLU(), SCALE_RULE)
    with pytest.raises(TypeError, match="Module subclass"):
        register_rule(int, SCALE_RULE)
    with pytest.raises(TypeError, match="LayerRule"):
        register_rule(Scale, {"kind": "scale"})
    with pytest.raises(TypeError, match="cost must be callable"):
        LayerRule(kind="x", cost=3)
    with pytest.raises(TypeError, match="kind"):
        LayerRule(kind="")
    with pytest.raises(AttributeError):
        SCALE_RULE.kind = "other"  # frozen: change a rule by registering another


# ------------------------------------------------------------------ a user's container
class Twice(lk.Module):
    """y = block(block(x)): one block applied twice (its parameters shared)."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, x):
        return self.block(self.block(x))

    def vjp(self, x, input_grad=True):
        h, back1 = self.block.vjp(x, input_grad=input_grad)
        y, back2 = self.block.vjp(h, input_grad=True)
        return y, lambda dy: back1(back2(dy))


def _twice_compose(m, x, need_dx, visit):
    h = visit(m.block, "block", x, need_dx)
    return visit(m.block, "block", h, True)


def test_a_container_rule_walks_its_children():
    block = lk.Sequential(lk.Linear(4, 4), lk.Tanh())
    model = Twice(block)
    with register_rule(Twice, LayerRule(kind="twice", compose=_twice_compose,
                                        cost=lambda *a: (0,) * 6, saved=lambda *a: [])):
        L = ledger(model, (3, 4))
    once = ledger(block, (3, 4))
    assert L[""].kind == "twice" and L[""].output_shape == (3, 4)
    assert L.totals["params"] == once.totals["params"]  # the shared block counted once
    assert L.totals["macs"] == 2 * once.totals["macs"]
    assert L.totals["output_bytes"] == 2 * once.totals["output_bytes"]  # its own row is a sum
    _, backward = model.vjp(np.zeros((3, 4), np.float32), input_grad=False)
    assert L.memory["activations"] == closure_bytes(backward, model)


def test_a_container_rule_that_returns_nothing_is_named():
    broken = LayerRule(kind="twice", compose=lambda m, x, need, visit: None)
    with register_rule(Twice, broken), pytest.raises(TypeError, match="Twice.*compose"):
        ledger(Twice(lk.Linear(4, 4)), (3, 4))


# ------------------------------------------------------------------ the built-in rules
def test_every_shipped_layer_has_a_rule_in_its_rules_file():
    """The built-in layers' rules are in rules/builtin.py; the layers the transforms make have
    theirs in rules/<family>_rules.py (each with rebuild, so model files hold them)."""
    surgery = {"LoRALinear": "lora_rules", "QuantizedLinear": "quantized_rules",
               "SparseLinear": "sparse_rules"}
    for name in lk.layers.__all__:
        layer = getattr(lk.layers, name)
        if not (isinstance(layer, type) and issubclass(layer, lk.Module)):
            continue  # an error type exported beside its layer
        rule = rule_for(layer)
        assert rule is not None, name
        home = surgery.get(name, "builtin")
        assert rule.cost.__module__ == f"linearkit.rules.{home}", name
        assert rule.rebuild is not None, name


BAD_SHAPES = [
    (lambda: lk.Linear(3, 2), (4, 5)), (lambda: lk.Linear(3, 2), ()),
    (lambda: lk.Linear(784, 10), (8, 28, 28)), (lambda: lk.LazyLinear(2), ()),
    (lambda: lk.LayerNorm(4), (4, 3)), (lambda: lk.LayerNorm((3, 4)), (4,)),
    (lambda: lk.BatchNorm1d(4), (4,)), (lambda: lk.BatchNorm1d(4), (1, 4)),
    (lambda: lk.BatchNorm1d(4), (2, 5, 4)), (lambda: lk.Softmax(dim=3), (4, 3)),
    (lambda: lk.LogSoftmax(dim=-3), (2, 2)), (lambda: lk.Flatten(2), (4,)),
    (lambda: lk.Residual(lk.Linear(4, 5)), (2, 4)),
]


@pytest.mark.parametrize("make,shape", BAD_SHAPES)
def test_a_rules_shape_check_raises_what_the_forward_raises(make, shape):
    with pytest.raises(lk.ShapeError) as real:
        make()(np.zeros(shape, np.float32))
    with pytest.raises(lk.ShapeError) as shape_only:
        ledger(make(), shape)
    assert str(shape_only.value) == str(real.value)


GOOD_SHAPES = [
    (lambda: lk.Linear(3, 2), (4, 3)), (lambda: lk.Linear(3, 2), (3,)),
    (lambda: lk.LazyLinear(2), (2, 5, 7)), (lambda: lk.Identity(), (2, 3)),
    (lambda: lk.Flatten(), (2, 3, 4)), (lambda: lk.Flatten(0, 1), (2, 3, 4)),
    (lambda: lk.Dropout(0.5), (4, 3)), (lambda: lk.Dropout(0.5).eval(), (4, 3)),
    (lambda: lk.Dropout(0.0), (4, 3)), (lambda: lk.GELU(), (2, 3)),
    (lambda: lk.Softmax(dim=0), (2, 3)), (lambda: lk.LayerNorm((3, 4)), (2, 3, 4)),
    (lambda: lk.BatchNorm1d(3), (4, 3, 5)), (lambda: lk.BatchNorm1d(3).eval(), (1, 3)),
    (lambda: lk.Residual(lk.Linear(3, 3)), (2, 3)),
    (lambda: lk.Sequential(lk.Flatten(), lk.Linear(6, 2)), (4, 2, 3)),
]


@pytest.mark.parametrize("make,shape", GOOD_SHAPES)
def test_a_rules_output_shape_and_buffer_sharing_match_the_forward(make, shape):
    m = make()
    x = np.zeros(shape, np.float32)
    y = m(x)
    rule = rule_for(m)
    row = ledger(m, shape)[""]
    assert row.output_shape == y.shape
    if rule.compose is None:
        assert rule.shape_of_output(m, shape) == y.shape
        assert rule.output_shares_input(m) == np.shares_memory(x, y)


def test_the_torch_path_costs_with_the_same_rules():
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    before = ledger(model, (5, 4)).totals["elementwise_flops"]
    assert before == 15  # ReLU: 1 per element
    seven = LayerRule(kind="activation", cost=lambda m, s, need: (0, 0, 0, 7 * math.prod(s),
                                                                  0, 0), saved=lambda *a: [])
    with register_rule(lk.ReLU, seven):
        assert ledger(model, (5, 4)).totals["elementwise_flops"] == 7 * 15


# ------------------------------------------------------------------ the ledger reads rules only
LEDGER = pathlib.Path(lk.__file__).parent / "analysis" / "ledger"
PRIVATE = {"_has_bias", "_keeps", "_input", "_axis", "_target", "_check", "_modules",
           "_shape_error", "_rng", "_prepare", "_params"}


@pytest.mark.parametrize("name", ["linearkit_model.py", "linearkit_layers.py", "custom.py"])
def test_the_linearkit_pass_has_no_layer_isinstance_chain_or_private_reads(name):
    tree = ast.parse((LEDGER / name).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and "layers" in (node.module or "").split("."):
            classes = {a.name for a in node.names} & set(lk.layers.__all__)
            assert not classes, f"{name} imports layer classes {classes}"
        if isinstance(node, ast.Attribute):
            assert node.attr not in PRIVATE, f"{name}:{node.lineno} reads .{node.attr}"
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
            named = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            assert not named & set(lk.layers.__all__), f"{name}:{node.lineno} isinstance chain"


def test_import_linearkit_does_not_load_the_rules_and_hasattr_works():
    code = ("import sys, linearkit as lk; assert 'linearkit.rules' not in sys.modules; "
            "assert hasattr(lk, 'rules'); assert lk.rules.rule_for(lk.Linear).kind == 'linear'")
    subprocess.run([sys.executable, "-c", code], check=True)
