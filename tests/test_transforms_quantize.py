"""int8 quantization: quantize_weight, QuantizedLinear, quantize(model, "int8")."""

import warnings

import numpy as np
import pytest

import linearkit as lk
from linearkit.layers.quantized import QuantizedLinear, QuantizedTrainingError
from linearkit.recipes.train_mnist1d import accuracy, train
from linearkit.rules import rule_for
from linearkit.storage.safetensors_header import read_header
from linearkit.training.loop import step
from linearkit.transforms import quantize, quantize_weight

torch = pytest.importorskip("torch")


def _rng(seed=0):
    return np.random.default_rng(seed)


def _mlp(seed=0):
    rng = _rng(seed)
    return lk.Sequential(lk.Linear(20, 32, rng=rng), lk.ReLU(), lk.Linear(32, 8, rng=rng))


def _quantize_torch(w, scale):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # quantized tensors are deprecated
        return torch.quantize_per_channel(
            torch.from_numpy(w), torch.from_numpy(scale.astype(np.float64)),
            torch.zeros(len(scale), dtype=torch.int64), 0, torch.qint8).int_repr().numpy()


# ---------------------------------------------------------------- quantize_weight
def test_quantize_weight_by_hand():
    w = np.array([[127.0, 0.5, 1.5, 2.5, -2.5],  # scale 1: ties round to even
                  [0.0, 0.0, 0.0, 0.0, 0.0],  # all zero: scale 1, q 0
                  [-2.0, 1.0, 0.5, 0.25, 0.0]], np.float32)  # scale 2/127
    q, scale = quantize_weight(w)
    assert q.dtype == np.int8 and scale.dtype == np.float32
    np.testing.assert_array_equal(scale, np.float32([1.0, 1.0, np.float32(2.0) / 127]))
    np.testing.assert_array_equal(q, [[127, 0, 2, 2, -2], [0, 0, 0, 0, 0],
                                      [-127, 64, 32, 16, 0]])  # 63.5 -> 64, 31.75 -> 32


def test_quantize_weight_matches_torch_quantize_per_channel():
    rng = _rng(1)
    w = rng.standard_normal((64, 300)).astype(np.float32)
    w[3] = (rng.integers(-127, 127, 300) + 0.5) / 64  # exact ties k + 1/2 at scale 1/64
    w[3, 0] = 127 / 64
    w[5] = 0.0
    q, scale = quantize_weight(w)
    assert scale[3] == 1 / 64 and scale[5] == 1.0
    np.testing.assert_array_equal(q, _quantize_torch(w, scale))
    expected = np.abs(w).max(1) / np.float32(127)
    expected[expected == 0] = 1
    np.testing.assert_array_equal(scale, expected)


def test_torch_ao_observer_differs_as_documented():
    from torch.ao.quantization.observer import PerChannelMinMaxObserver

    w = _rng(2).standard_normal((8, 50)).astype(np.float32) / 4
    w[0, 7] = -127.5 / 128  # the observer's scale is then exactly 1/128: w / scale = -127.5
    w[1, 9] = +127.5 / 128
    obs = PerChannelMinMaxObserver(ch_axis=0, dtype=torch.qint8,
                                   qscheme=torch.per_channel_symmetric)
    obs(torch.from_numpy(w))
    scales, zero_points = obs.calculate_qparams()
    amax = np.abs(w).max(1)
    np.testing.assert_allclose(scales.numpy(), amax / 127.5, rtol=1e-6)
    assert (obs.quant_min, obs.quant_max) == (-128, 127) and not zero_points.any()
    theirs = _quantize_torch(w, scales.numpy().astype(np.float32))
    ours, scale = quantize_weight(w)
    np.testing.assert_allclose(scale, amax / 127, rtol=1e-6)
    assert scales[0] == scales[1] == 1 / 128
    assert theirs[0, 7] == -128 and ours[0, 7] == -127  # [-128, 127] against [-127, 127]
    assert theirs[1, 9] == 127 and ours[1, 9] == 127  # 127.5 -> 128, clamped
    assert np.abs(ours).max() == 127


def test_quantize_weight_error_is_at_most_half_a_step():
    w = _rng(3).standard_normal((40, 70)).astype(np.float32) * np.logspace(-3, 1, 40)[:, None]
    q, scale = quantize_weight(w)
    deq = q.astype(np.float64) * scale[:, None]
    assert (np.abs(w - deq) <= scale[:, None] / 2 * (1 + 1e-6)).all()


def test_quantize_weight_refuses_bad_input():
    with pytest.raises(ValueError, match="NaN or Inf"):
        quantize_weight(np.array([[1.0, np.nan]], np.float32))
    with pytest.raises(ValueError, match=r"shape \(out, in\)"):
        quantize_weight(np.ones(3, np.float32))


# ---------------------------------------------------------------- QuantizedLinear
def _layer(activations=None, n_in=30, n_out=12, bias=True, seed=4):
    linear = lk.Linear(n_in, n_out, bias=bias, rng=_rng(seed))
    return linear, QuantizedLinear.from_linear(linear, activations)


def test_buffers_dtypes_and_no_parameters():
    linear, ql = _layer()
    assert ql.weight.dtype == np.int8 and ql.weight.shape == (12, 30)
    assert ql.weight_scale.dtype == np.float32 and ql.weight_scale.shape == (12,)
    assert ql.bias.dtype == np.float32 and ql.bias.shape == (12,)
    assert list(ql.parameters()) == []
    assert sorted(ql.state_dict()) == ["bias", "weight", "weight_scale"]
    np.testing.assert_array_equal(ql.bias, linear.bias.data)
    assert QuantizedLinear.from_linear(lk.Linear(3, 2, bias=False)).bias is None
    with pytest.raises(ValueError, match="'dynamic'"):
        QuantizedLinear(3, 2, activations="static")


@pytest.mark.parametrize("shape", [(7, 30), (30,), (2, 3, 30), (0, 30)])
def test_forward_matches_the_dequantized_weight(shape):
    _, ql = _layer()
    x = _rng(5).standard_normal(shape).astype(np.float32)
    deq = ql.weight.astype(np.float64) * ql.weight_scale[:, None]
    y = ql(x)
    assert y.dtype == np.float32 and y.shape == shape[:-1] + (12,)
    np.testing.assert_allclose(y, x @ deq.T + ql.bias, rtol=1.3e-6, atol=1e-5)
    np.testing.assert_allclose(ql.dequantize()(x), y, rtol=1.3e-6, atol=1e-5)


def test_forward_error_against_the_float_layer_is_bounded():
    # |w - q*s| <= s/2 per weight, so |dy| <= sum_i |x_i| * s_o / 2 for output o.
    linear, ql = _layer(n_in=200, n_out=50)
    x = _rng(6).standard_normal((64, 200)).astype(np.float32)
    y = ql(x).astype(np.float64)
    ref = x.astype(np.float64) @ linear.weight.data.T.astype(np.float64) + linear.bias.data
    bound = np.abs(x).astype(np.float64).sum(1)[:, None] * ql.weight_scale[None, :] / 2
    err = np.abs(y - ref)
    assert (err <= bound + 1e-5 + 1e-6 * np.abs(ref)).all()
    assert err.max() > 0.01 * bound.max()  # the bound is not vacuous: it is the right scale


def test_dynamic_mode_matches_its_formula():
    linear, ql = _layer("dynamic")
    x = _rng(7).standard_normal((9, 30)).astype(np.float32)
    x[4] = 0.0  # an all-zero row: scale 1, output = bias
    sx = np.abs(x).max(1) / np.float32(127)
    sx[sx == 0] = 1
    xq = np.clip(np.rint(x / sx[:, None]), -127, 127)
    ref = (xq @ ql.weight.T.astype(np.float64)) * sx[:, None] * ql.weight_scale + ql.bias
    np.testing.assert_allclose(ql(x), ref, rtol=1.3e-6, atol=1e-5)
    np.testing.assert_array_equal(ql(x)[4], ql.bias)
    assert np.abs(ql(x) - linear(x)).max() < 0.05 * np.abs(linear(x)).max()


def test_dynamic_accumulation_is_exact_up_to_1040_inputs():
    # in_features * 127**2 < 2**24: every partial sum of the int products is exact in float32.
    n_in, rng = 1040, _rng(8)
    ql = QuantizedLinear(n_in, 6, bias=False, activations="dynamic")
    ql.weight[...] = rng.integers(-127, 128, (6, n_in))
    ql.weight[:, 0] = 127
    x = rng.integers(-127, 128, (5, n_in)).astype(np.float32)
    x[:, 0] = 127  # row scale exactly 1, so x_q == x
    x[0] = 127  # the worst case: 1040 * 127**2 = 16,774,160
    exact = x.astype(np.int64) @ ql.weight.T.astype(np.int64)
    np.testing.assert_array_equal(ql(x).astype(np.int64), exact)


def test_vjp_refuses_to_train_and_names_the_layer():
    model, _ = quantize(_mlp(), "int8")
    x = np.ones((2, 20), np.float32)
    with pytest.raises(QuantizedTrainingError, match="(?s)module .0.*training a quantized model is "
                       "not supported.*int8.*train the float model and quantize after"):
        model.vjp(x)
    with pytest.raises(QuantizedTrainingError):
        step(model, lk.CrossEntropyLoss(), None, x, np.array([0, 1]))


def test_no_optimizer_silently_trains_a_quantized_model():
    model, _ = quantize(_mlp(), "int8")
    with pytest.raises(ValueError, match="empty parameter list"):
        lk.optim.Adam(model.parameters())  # nothing to step: no Parameters at all
    with pytest.raises(ValueError, match="empty parameter list"):
        train(model=model, steps=1, eval_every=0)
    # A float layer beside the int8 ones trains nothing either: the step raises before updating.
    rng = _rng(9)
    mixed, _ = quantize(lk.Sequential(lk.Linear(20, 8, rng=rng), lk.LayerNorm(8)), "int8")
    before = {k: v.copy() for k, v in mixed.state_dict().items()}
    opt = lk.optim.SGD(mixed.parameters(), lr=1.0)
    with pytest.raises(QuantizedTrainingError):
        step(mixed, lk.MSELoss(), opt, np.ones((2, 20), np.float32), np.ones((2, 8), np.float32))
    assert all(np.array_equal(before[k], v) for k, v in mixed.state_dict().items())


def test_load_state_dict_takes_int8_and_refuses_floats_into_the_int8_weight():
    _, ql = _layer()
    fresh = QuantizedLinear(30, 12)
    fresh.load_state_dict(ql.state_dict())
    np.testing.assert_array_equal(fresh.weight, ql.weight)
    float_state = dict(lk.Linear(30, 12).state_dict(), weight_scale=np.ones(12, np.float32))
    with pytest.raises(RuntimeError, match='"weight", whose dtype in the model is int8.*whole '
                       r"numbers in \[-128, 127\].*quantize the float model"):
        fresh.load_state_dict(float_state)
    np.testing.assert_array_equal(fresh.weight, ql.weight)  # nothing was loaded
    with pytest.raises(RuntimeError, match="int8"):
        fresh.load_state_dict(dict(ql.state_dict(), weight=ql.weight.astype(np.int64) * 3))


@pytest.mark.parametrize("activations", [None, "dynamic"])
def test_save_and_load_model_round_trip_keeps_int8(tmp_path, activations):
    model, _ = quantize(_mlp(), "int8", activations=activations)
    path = tmp_path / "q.safetensors"
    lk.save(model, path)
    entries = read_header(path)[0]
    assert entries["0.weight"][0] == "I8" and entries["2.weight"][0] == "I8"
    assert entries["0.weight_scale"][0] == "F32" and entries["0.bias"][0] == "F32"
    again = lk.load_model(path)
    assert type(again[0]) is QuantizedLinear and again[0].activations == activations
    x = _rng(10).standard_normal((16, 20)).astype(np.float32)
    np.testing.assert_array_equal(again(x), model(x))


def test_rule_kind_description_shape_check_and_cost():
    _, ql = _layer("dynamic")
    rule = rule_for(ql)
    assert rule.kind == "quantized-linear"
    assert rule.describe_module(ql) == "QuantizedLinear(30, 12, int8, dynamic)"
    assert rule.describe_module(QuantizedLinear(784, 256)) == "QuantizedLinear(784, 256, int8)"
    assert rule.shape_of_output(ql, (4, 5, 30)) == (4, 5, 12)
    with pytest.raises(lk.ShapeError, match=r"expected input of shape \(\*, 30\)"):
        rule.shape_of_output(ql, (4, 31))
    macs, gemm, bias, elementwise, bwd_macs, bwd = rule.cost(ql, (4, 30), True)
    assert (macs, gemm, bias, bwd_macs, bwd) == (4 * 30 * 12, 2 * 4 * 30 * 12, 4 * 12, 0, 0)
    assert elementwise == 30 * 12 + 4 * 12 + 4 * 4 * 30 + 4 * 12
    row = lk.analysis.ledger(lk.Sequential(ql), (4, 30))["0"]
    assert row.kind == "quantized-linear" and row.macs == macs


# ---------------------------------------------------------------- quantize(model)
def test_quantize_report_sizes_errors_and_lines():
    rng = _rng(11)
    model = lk.Sequential(lk.Linear(20, 32, rng=rng), lk.LayerNorm(32), lk.ReLU(),
                          lk.Linear(32, 8, rng=rng), lk.ReLU(), lk.Linear(8, 4, rng=rng))
    probe = _rng(12).standard_normal((10, 20)).astype(np.float32)
    new, report = quantize(model, "int8", targets=["0", "3"], probe=probe)
    assert [type(m).__name__ for m in new] == ["QuantizedLinear", "LayerNorm", "ReLU",
                                               "QuantizedLinear", "ReLU", "Linear"]
    sizes = {"0": (20, 32), "3": (32, 8)}
    for f in report.layers:
        n_in, n_out = sizes[f["path"]]
        assert f["bytes_before"] == 4 * (n_in * n_out + n_out)
        assert f["bytes_after"] == n_in * n_out + 4 * n_out + 4 * n_out  # int8 + scale + bias
        w = model[int(f["path"])].weight.data
        assert 0 < f["max_abs_weight_error"] <= np.abs(w).max(1).max() / 127 / 2 * (1 + 1e-6)
        assert 0 < f["output_rel_error"] < 0.02
    assert report.bytes_before - report.bytes_after == sum(
        f["bytes_before"] - f["bytes_after"] for f in report.layers)
    assert 0 < report.max_rel_error < 0.02
    assert any(line.startswith("'1' (LayerNorm((32,))): stays float (only plain Linear")
               for line in report.left)
    assert any(line.startswith("'5' (Linear(8, 4)): stays float (not among targets)")
               for line in report.left)
    assert report.changed[0].startswith("'0' (Linear(20, 32)) -> QuantizedLinear(20, 32, int8)")


def test_quantize_weights_are_four_times_smaller():
    model = lk.Sequential(lk.Linear(256, 256, rng=_rng(13)), lk.ReLU(),
                          lk.Linear(256, 128, rng=_rng(14)))
    _, report = quantize(model, "int8")
    weights = 256 * 256 + 256 * 128
    assert report.bytes_before == 4 * (weights + 256 + 128)
    assert report.bytes_after == weights + 2 * 4 * (256 + 128)
    assert report.bytes_before / report.bytes_after > 3.85  # 3.89: scales and biases stay float


def test_quantize_refuses_unknown_schemes_and_modes():
    with pytest.raises(ValueError, match="unknown scheme 'int4'.*'int8'"):
        quantize(_mlp(), "int4")
    with pytest.raises(ValueError, match="activations must be None"):
        quantize(_mlp(), "int8", activations="static")
    with pytest.raises(ValueError, match="target 'fc9' names no Linear"):
        quantize(_mlp(), "int8", targets="fc9")


def test_quantize_leaves_the_input_model_untouched():
    model = _mlp()
    model.train()
    before = {k: v.copy() for k, v in model.state_dict().items()}
    new, _ = quantize(model, "int8")
    assert all(type(m) is lk.Linear for m in (model[0], model[2]))
    assert model.training and all(m.training for m in model.modules())
    assert before.keys() == model.state_dict().keys()
    assert all(np.array_equal(before[k], v) and v.dtype == np.float32
               for k, v in model.state_dict().items())
    assert new is not model and new.training  # the copy keeps the mode


def test_quantized_mnist1d_model_keeps_its_accuracy():
    data = lk.data.mnist1d()
    model, result = train("mlp", steps=500, eval_every=0, threads=1)
    for activations in (None, "dynamic"):
        small, report = quantize(model, "int8", activations=activations, probe=data.x_test[:200])
        acc = accuracy(small, data.x_test, data.y_test)
        assert abs(acc - result.test_accuracy) <= 0.01, (activations, acc, result.test_accuracy)
        assert report.bytes_before / report.bytes_after > 3.5
