"""linearkit.io.verify, and load_state_dict(layout=...): a wrong layout that every shape check
passes is caught by a forward pass on a known input."""

import copy

import numpy as np
import pytest
import torch

import linearkit as lk
from linearkit.io import VerifyReport, verify


def _linear(n_in, n_out, seed=0):
    lk.manual_seed(seed)
    return lk.Linear(n_in, n_out)


# --------------------------------------------------------------- the case verify was written for
def test_a_square_layer_in_the_wrong_layout_passes_every_shape_check_and_verify_catches_it():
    original = torch.nn.Linear(8, 8).double().eval()
    kernel = original.weight.detach().numpy().T.copy()  # stored (in, out), as Keras/Flax do
    state = {"weight": kernel, "bias": original.bias.detach().numpy()}

    wrong = lk.Linear(8, 8, dtype=np.float64)
    wrong.load_state_dict(state)  # no error: (8, 8) fits (8, 8)
    assert wrong.weight.shape == kernel.shape == tuple(original.weight.shape)
    report = verify(wrong, original, input_shape=(16, 8))
    assert not report.ok and not report
    assert report.max_abs_error > 0.1 and report.mismatched > 0
    assert "NOT ok" in str(report) and "worst at index" in str(report)

    right = lk.Linear(8, 8, dtype=np.float64)
    right.load_state_dict(state, layout="in_out")
    report = verify(right, original, input_shape=(16, 8))
    assert report.ok, str(report)
    assert report.max_abs_error < 1e-12
    assert str(report).startswith("verify: ok")


# ----------------------------------------------------------------------------- layouts
def _model():
    lk.manual_seed(1)
    return lk.Sequential(lk.Linear(3, 4), lk.LayerNorm((3, 4)), lk.Flatten(),
                         lk.Sequential(lk.Linear(12, 5, bias=False)))


def _randomized_state(model):
    rng = np.random.default_rng(0)
    return {k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in model.state_dict().items()}


def test_in_out_transposes_exactly_the_linear_weights():
    state = _randomized_state(_model())
    kernels = dict(state)
    kernels["0.weight"] = state["0.weight"].T
    kernels["3.0.weight"] = state["3.0.weight"].T
    a, b = _model(), _model()
    a.load_state_dict(state)
    b.load_state_dict(kernels, layout="in_out")
    for key, value in a.state_dict().items():
        np.testing.assert_array_equal(b.state_dict()[key], value, err_msg=key)
    # The LayerNorm((3, 4)) weight is 2-D but not a Linear weight: loaded as given.
    np.testing.assert_array_equal(b[1].weight.data, state["1.weight"])
    assert b[1].weight.shape == (3, 4)
    assert verify(b, a, input_shape=(2, 3, 3)).ok


def test_the_default_layout_is_pytorchs():
    state = _randomized_state(_model())
    a, b = _model(), _model()
    a.load_state_dict(state)
    b.load_state_dict(state, layout="out_in")
    np.testing.assert_array_equal(a[0].weight.data, b[0].weight.data)


def test_an_unknown_layout_is_a_value_error_and_changes_nothing():
    model = _model()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match="layout must be 'out_in'.*or 'in_out'.*got 'io'"):
        model.load_state_dict(_randomized_state(model), layout="io")
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(value, before[key])


def test_in_out_shape_errors_name_the_key_and_the_load_stays_transactional():
    model = _model()
    before = copy.deepcopy(model.state_dict())
    state = _randomized_state(model)  # out_in weights given as in_out: (4, 3) becomes (3, 4)
    with pytest.raises(RuntimeError) as err:
        model.load_state_dict(state, layout="in_out")
    text = str(err.value)
    assert "size mismatch for 0.weight" in text and "size mismatch for 3.0.weight" in text
    assert "1.weight" not in text and "layout='in_out'" in text
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(value, before[key])


def test_in_out_materializes_a_lazy_linear_with_the_right_in_features():
    layer = lk.LazyLinear(5)
    layer.load_state_dict({"weight": np.ones((7, 5), np.float32), "bias": np.zeros(5)},
                          layout="in_out")
    assert layer.in_features == 7 and layer.weight.shape == (5, 7)


def test_in_out_covers_a_linear_shared_under_two_names():
    shared = _linear(3, 3)
    model = lk.Sequential(shared, lk.Tanh(), shared)
    w = np.arange(9, dtype=np.float32).reshape(3, 3)
    model.load_state_dict({"0.weight": w, "0.bias": np.zeros(3), "2.weight": w,
                           "2.bias": np.zeros(3)}, layout="in_out")
    np.testing.assert_array_equal(shared.weight.data, w.T)


def test_in_out_accepts_torch_tensors():
    layer = _linear(2, 3)
    w = torch.arange(6.0).reshape(2, 3)
    layer.load_state_dict({"weight": w, "bias": torch.zeros(3)}, layout="in_out")
    np.testing.assert_array_equal(layer.weight.data, w.numpy().T)


# ----------------------------------------------------------------------------- verify's API
def test_probe_reference_callable_and_default_tolerances():
    layer = _linear(4, 2)
    w, b = layer.weight.data, layer.bias.data
    probe = np.random.default_rng(3).standard_normal((5, 4)).astype(np.float32)
    report = verify(layer, lambda x: x @ w.T + b, probe)
    assert isinstance(report, VerifyReport) and report.ok
    assert (report.rtol, report.atol) == (1.3e-6, 1e-5)
    assert report.probe_shape == (5, 4) and report.output_shape == (5, 2)
    assert report.total == 10 and report.mismatched == 0
    layer64 = lk.Linear(4, 2, dtype=np.float64)
    report = verify(layer64, lambda x: x @ layer64.weight.data.T + layer64.bias.data,
                    input_shape=(3, 4))
    assert (report.rtol, report.atol) == (1e-7, 1e-7) and report.dtype == np.float64


def test_tolerances_decide_the_verdict():
    layer = _linear(4, 2)
    shifted = lambda x: layer(x) + 1e-3
    assert not verify(layer, shifted, input_shape=(3, 4)).ok
    report = verify(layer, shifted, input_shape=(3, 4), atol=2e-3)
    assert report.ok and report.max_abs_error == pytest.approx(1e-3, rel=1e-3)


def test_the_random_probe_is_seeded():
    layer = _linear(4, 2)
    seen = []
    verify(layer, lambda x: seen.append(x.copy()) or layer(x), input_shape=(3, 4), seed=7)
    verify(layer, lambda x: seen.append(x.copy()) or layer(x), input_shape=(3, 4), seed=7)
    np.testing.assert_array_equal(seen[0], seen[1])
    assert seen[0].dtype == np.float32


def test_a_torch_module_or_a_tensor_returning_function_is_accepted():
    tm = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.GELU())
    model = lk.io.from_torch(tm)
    assert verify(model, tm, input_shape=(6, 4)).ok
    assert verify(model, lambda x: tm(torch.from_numpy(x)), input_shape=(6, 4)).ok  # grad on


def test_shape_disagreement_and_nan_are_reports_not_exceptions():
    layer = _linear(4, 2)
    report = verify(layer, lambda x: np.zeros((3, 3), np.float32), input_shape=(3, 4))
    assert not report.ok and report.max_abs_error == np.inf
    assert "shapes differ: model (3, 2), reference (3, 3)" in str(report)
    report = verify(layer, lambda x: np.full((3, 2), np.nan, np.float32), input_shape=(3, 4))
    assert not report.ok and report.mismatched == 6


def test_bad_arguments_are_clear():
    layer = _linear(4, 2)
    assert verify(layer, layer).probe_shape == (16, 4)     # a probe of the model's input width
    with pytest.raises(ValueError, match="cannot tell the input width of function"):
        verify(lambda x: x, lambda x: x)
    with pytest.raises(ValueError, match="either probe or input_shape"):
        verify(layer, layer, np.zeros((1, 4), np.float32), input_shape=(1, 4))
    with pytest.raises(TypeError, match="reference_fn must be callable"):
        verify(layer, 3, input_shape=(1, 4))
