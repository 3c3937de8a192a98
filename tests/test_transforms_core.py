"""The transform core: reports, probes, target selection and copying (linearkit.transforms)."""

import numpy as np
import pytest

import linearkit as lk
from linearkit.transforms.transform_report import (
    compare_models,
    evaluating,
    probe_inputs,
    state_size,
)
from linearkit.transforms.walk import copy_model, finish, linear_from, select_linears, set_submodule


def _mlp():
    return lk.Sequential(lk.Linear(3, 4), lk.ReLU(), lk.Sequential(lk.Linear(4, 4), lk.ReLU()),
                         lk.Linear(4, 2))


def test_state_size_counts_the_state_dict_but_not_the_step_counter():
    model = lk.Sequential(lk.Linear(3, 4), lk.BatchNorm1d(4))
    # weight 12 + bias 4 + gamma 4 + beta 4 + running mean 4 + running var 4
    assert state_size(model) == (32, 32 * 4)


def test_compare_models_measures_abs_and_normwise_rel_error():
    a = lk.Linear(3, 2)
    b = copy_model(a, "test")
    b.bias.data += np.float32(0.5)
    x = np.random.default_rng(1).standard_normal((10, 3)).astype(np.float32)
    err, rel = compare_models(a, b, [x])
    assert err == pytest.approx(0.5, abs=1e-6)
    assert rel == pytest.approx(0.5 / np.abs(a(x)).max(), rel=1e-5)
    b.bias.data[0] = np.nan
    assert compare_models(a, b, [x]) == (float("inf"), float("inf"))


def test_probes_run_in_eval_mode_and_restore_each_modules_mode():
    model = lk.Sequential(lk.Linear(3, 4), lk.Dropout(0.5))
    model[1].eval()
    with evaluating(model):
        assert not any(m.training for m in model.modules())
    assert model.training and not model[1].training
    # Dropout off: the model compared with itself is exact even though it is in training mode
    assert compare_models(model, model, probe_inputs(model)) == (0.0, 0.0)


def test_probe_inputs_read_the_input_width_or_ask_for_a_probe():
    (x,) = probe_inputs(_mlp())
    assert x.shape == (64, 3) and x.dtype == np.float32
    assert probe_inputs(lk.Sequential(lk.LayerNorm(5)))[0].shape == (64, 5)
    user = np.ones((2, 3), np.float32)
    assert probe_inputs(_mlp(), user)[1] is user
    with pytest.raises(ValueError, match="probe="):
        probe_inputs(lk.Sequential(lk.ReLU()))


def test_select_linears_by_path_suffix_and_glob():
    model = _mlp()
    assert [p for p, _ in select_linears(model, None, "factorize")] == ["0", "2.0", "3"]
    assert [p for p, _ in select_linears(model, "0", "factorize")] == ["0", "2.0"]  # '2.0' ends in '.0'
    assert [p for p, _ in select_linears(model, ["2.*", "3"], "factorize")] == ["2.0", "3"]
    with pytest.raises(ValueError, match=r"target 'fc9' names no Linear.*'0', '2.0', '3'"):
        select_linears(model, "fc9", "factorize")


def test_copy_and_set_submodule_leave_the_original_alone():
    model = _mlp()
    before = {k: v.copy() for k, v in model.state_dict().items()}
    new = set_submodule(copy_model(model, "t"), "2.0", lk.Identity())
    assert isinstance(new[2][0], lk.Identity) and isinstance(model[2][0], lk.Linear)
    assert all(np.array_equal(v, before[k]) for k, v in model.state_dict().items())
    with pytest.raises(TypeError, match="from_torch"):
        copy_model(object(), "t")


def test_linear_from_does_not_advance_the_library_random_stream():
    lk.manual_seed(3)
    expected = lk.Linear(2, 2).weight.data.copy()
    lk.manual_seed(3)
    layer = linear_from(np.eye(2), None, np.float64)
    assert layer.weight.dtype == np.float64 and layer.bias is None
    assert np.array_equal(lk.Linear(2, 2).weight.data, expected)


def test_finish_reports_sizes_errors_and_a_summary():
    model = _mlp()
    report = finish("noop", model, copy_model(model, "t"), None, ["x"], ["y: why"])
    assert report.max_abs_error == 0 and report.params_before == report.params_after == 46
    assert report.summary().startswith("noop: 1 change, 1 left; params 46 -> 46")
    assert "left    y: why" in str(report)


def test_every_public_transform_name_is_the_function_not_a_submodule():
    """No submodule may share a public name: importing it would bind the module over the
    function on the package (``transforms.quantize`` was once the module)."""
    import importlib

    import linearkit.transforms as T

    for name in T.__all__:
        value = getattr(T, name)
        assert not isinstance(value, type(T)), name
        importlib.import_module(f"linearkit.transforms.{T._WHERE.get(name, 'transform_report')}")
        assert getattr(T, name) is value, name  # still the function after the import
    from linearkit.transforms import factorize, prune, quantize

    assert callable(factorize) and callable(prune) and callable(quantize)
