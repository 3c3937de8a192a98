"""Model architecture as JSON (linearkit.io.spec): every shipped layer rebuilds, bad specs name
the file and the node."""

import json

import numpy as np
import pytest

import linearkit as lk
from linearkit.analysis.cases import MODULE_CASES, build
from linearkit.io.spec import FORMAT, build_model, model_spec, spec_from_json
from linearkit.rules import LayerRule, Rebuild, register_rule

#: The cases whose top module is a layer (a user's module around a ModuleList has no rule).
LAYER_CASES = [c for c in MODULE_CASES if not c.user_module]


@pytest.mark.parametrize("case", LAYER_CASES, ids=[c.id for c in LAYER_CASES])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_every_case_rebuilds_from_its_json_spec(case, dtype):
    model, *xs = build(case, dtype)
    spec = json.loads(json.dumps(model_spec(model)))  # what a file holds
    rebuilt = build_model(spec)
    assert repr(rebuilt) == repr(model)
    assert [m.training for m in rebuilt.modules()] == [m.training for m in model.modules()]
    rebuilt.load_state_dict(model.state_dict())
    model.eval()
    rebuilt.eval()
    np.testing.assert_array_equal(rebuilt(*xs), model(*xs))
    assert all(p.dtype == dtype for p in rebuilt.parameters())


@pytest.mark.parametrize("case", [c for c in MODULE_CASES if c.user_module],
                         ids=[c.id for c in MODULE_CASES if c.user_module])
def test_a_users_module_has_no_spec_but_the_containers_it_holds_do(case):
    model, _ = build(case)
    with pytest.raises(TypeError, match=f"{type(model).__name__} cannot be described"):
        model_spec(model)
    for name, child in model.named_children():  # the ModuleList / ModuleDict itself rebuilds
        rebuilt = build_model(json.loads(json.dumps(model_spec(child))))
        assert type(rebuilt) is type(child) and repr(rebuilt) == repr(child), name


def test_an_unmaterialized_lazy_linear_stays_lazy():
    rebuilt = build_model(model_spec(lk.Sequential(lk.LazyLinear(3), lk.ReLU())))
    assert type(rebuilt[0]) is lk.LazyLinear and rebuilt[0].in_features is None


def _spec(**root):
    return {"format": FORMAT, "root": root}


@pytest.mark.parametrize("spec, phrase", [
    ({"format": "other/9", "root": {}}, "format 'other/9'"),
    ([1, 2], "format 'list'"),
    (_spec(type="Conv2d", args={}), "layer type 'Conv2d', which is not registered"),
    (_spec(type="Linear", args={"in_features": 3}), "cannot be built from arguments"),
    (_spec(type="Linear", args={"in_features": 3, "out_features": 2, "bogus": 1}),
     "cannot be built from arguments"),
    (_spec(type="Linear", args={"in_features": -3, "out_features": 2}),
     "cannot be built from arguments"),
    (_spec(type="Sequential", args={}, children=[["0"]]), "malformed 'children'"),
    (_spec(type="Sequential", args={}, children=[["0", {"type": 5}]]), "node '0'"),
    (_spec(type="Residual", args={}), "cannot be built"),
    (_spec(type="ReLU", args={}, training="yes"), "'training' 'yes'"),
    (_spec(type="Linear", args=[1]), "must be an object"),
])
def test_a_bad_spec_is_a_format_error_naming_the_file_and_node(spec, phrase):
    with pytest.raises(lk.FormatError) as err:
        build_model(spec, source="model.safetensors")
    assert str(err.value).startswith("model.safetensors: ") and phrase in str(err.value)


def test_deep_nesting_and_bad_json_are_refused():
    node = {"type": "ReLU", "args": {}}
    for _ in range(100):
        node = {"type": "Sequential", "args": {}, "children": [["0", node]]}
    with pytest.raises(lk.FormatError, match="nests deeper"):
        build_model({"format": FORMAT, "root": node}, source="f")
    with pytest.raises(lk.FormatError, match="not valid JSON"):
        spec_from_json("{not json", source="f")


class Scale(lk.Module):
    def __init__(self, d, init=1.0):
        super().__init__()
        self.d, self.init = d, init
        self.weight = lk.Parameter(np.full(d, init, np.float32))

    def forward(self, x):
        return x * self.weight.data


def test_a_users_type_rebuilds_once_registered_and_is_refused_before():
    model = lk.Sequential(lk.Linear(2, 3), Scale(3, 0.5))
    with pytest.raises(TypeError, match=r"module '1' \(Scale\).*rebuild="):
        model_spec(model)
    with register_rule(Scale, LayerRule(kind="scale",
                                        rebuild=Rebuild(lambda m: {"d": m.d, "init": m.init}))):
        spec = json.loads(json.dumps(model_spec(model)))
        assert spec["root"]["children"][1][1]["type"] == f"{__name__}.Scale"
        rebuilt = build_model(spec)
        assert isinstance(rebuilt[1], Scale) and rebuilt[1].init == 0.5
    with pytest.raises(lk.FormatError, match="not registered"):
        build_model(spec)


def test_tied_submodules_are_refused_clearly():
    shared = lk.Linear(3, 3)
    with pytest.raises(TypeError, match="tied modules"):
        model_spec(lk.Sequential(shared, lk.ReLU(), shared))
