"""linearkit.analysis.gradcheck: passes on correct backwards, pinpoints wrong ones, loses nothing."""

import numpy as np
import pytest

import linearkit as lk
from linearkit.analysis.gradcheck import GradcheckError, GradcheckResult, gradcheck
from linearkit.core.random import default_generator


def _x(*shape, dtype=np.float64, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _mlp(dtype=np.float64):
    rng = np.random.default_rng(1)
    return lk.Sequential(lk.Linear(4, 6, dtype=dtype, rng=rng), lk.Tanh(),
                         lk.Linear(6, 3, dtype=dtype, rng=rng))


class WrongDx(lk.Module):
    """A Linear wrapper whose input gradient is off by 1 at dx[1, 2]."""

    def __init__(self):
        super().__init__()
        self.fc = lk.Linear(4, 3, dtype=np.float64, rng=np.random.default_rng(0))

    def forward(self, x):
        return self.fc(x)

    def vjp(self, x, input_grad=True):
        y, back = self.fc.vjp(x, input_grad=input_grad)

        def backward(dy):
            dx = back(dy)
            dx[1, 2] += 1.0
            return dx

        return y, backward


class WrongWeightGrad(lk.Linear):
    """A Linear whose weight gradient is off by 0.5 at weight[2, 1]."""

    def vjp(self, x, input_grad=True):
        y, back = super().vjp(x, input_grad=input_grad)

        def backward(dy):
            dx = back(dy)
            self.weight.grad[2, 1] += 0.5
            return dx

        return y, backward


class Multiply(lk.Module):
    """Two inputs, elementwise product; ``wrong`` makes the second gradient wrong."""

    def __init__(self, wrong=False):
        super().__init__()
        self.wrong = wrong

    def forward(self, a, b):
        return a * b

    def vjp(self, a, b, input_grad=True):
        def backward(dy):
            return dy * b, dy * (b if self.wrong else a)

        return a * b, backward


# ----------------------------------------------------------------------------- passing
def test_linear_passes_and_reports_every_tensor():
    layer = lk.Linear(4, 3, dtype=np.float64, rng=np.random.default_rng(0))
    result = gradcheck(layer, _x(5, 4))
    assert isinstance(result, GradcheckResult) and result.ok and result
    assert list(result.tensors) == ["input[0]", "weight", "bias"]
    assert result.max_abs_error < 1e-8
    assert (result.eps, result.atol, result.rtol) == (1e-6, 1e-5, 1e-3)
    assert result.dtype == np.float64


@pytest.mark.parametrize("shape", [(5, 4), (4,), (2, 3, 4)])
def test_mlp_passes(shape):
    result = gradcheck(_mlp(), _x(*shape), raise_on_failure=True)
    assert set(result.tensors) == {"input[0]", "0.weight", "0.bias", "2.weight", "2.bias"}


def test_float32_path():
    result = gradcheck(_mlp(np.float32), _x(5, 4, dtype=np.float32))
    assert result.ok, str(result)
    assert result.dtype == np.float32
    assert (result.eps, result.atol, result.rtol) == (1e-3, 1e-2, 1e-2)
    bad = gradcheck(WrongDx().to(np.float32), _x(3, 4, dtype=np.float32))
    assert not bad.ok and bad.worst.name == "input[0]" and bad.worst.index == (1, 2)


def test_float16_is_refused():
    with pytest.raises(TypeError, match="float32 and float64"):
        gradcheck(lk.Linear(2, 2, dtype=np.float16), _x(3, 2, dtype=np.float16))


# ----------------------------------------------------------------------------- catching bugs
def test_wrong_dx_is_caught_at_the_right_element():
    result = gradcheck(WrongDx(), _x(3, 4))
    assert not result.ok and not result
    assert result.worst.name == "input[0]" and result.worst.index == (1, 2)
    assert result.worst.analytic == pytest.approx(result.worst.numeric + 1.0)
    assert result.tensors["fc.weight"].ok and result.tensors["fc.bias"].ok
    assert not result.tensors["input[0]"].ok
    assert result.max_abs_error == pytest.approx(1.0)


def test_wrong_weight_grad_is_caught_at_the_right_element():
    layer = WrongWeightGrad(4, 3, dtype=np.float64, rng=np.random.default_rng(0))
    with pytest.raises(GradcheckError) as info:
        gradcheck(layer, _x(5, 4), raise_on_failure=True)
    assert isinstance(info.value, AssertionError)
    result = info.value.result
    assert result.worst.name == "weight" and result.worst.index == (2, 1)
    assert result.tensors["input[0]"].ok and result.tensors["bias"].ok
    text = str(info.value)
    assert "FAILED" in text and "weight[2, 1]" in text


def test_str_is_readable():
    text = str(gradcheck(lk.Linear(2, 3, dtype=np.float64), _x(4, 2)))
    assert text.startswith("gradcheck passed (float64")
    for name in ("input[0]", "weight", "bias", "max abs", "worst:"):
        assert name in text


def test_multi_input_module_and_plain_function():
    a, b = _x(3, 2, seed=1), _x(3, 2, seed=2)
    assert gradcheck(Multiply(), a, b).ok
    bad = gradcheck(Multiply(wrong=True), a, b)
    assert not bad.ok and bad.worst.name == "input[1]" and bad.tensors["input[0]"].ok

    def fn(x):
        return np.sin(x), (lambda dy: dy * np.cos(x))

    assert gradcheck(fn, _x(6)).ok
    assert not gradcheck(lambda x: (np.sin(x), lambda dy: dy * np.sin(x)), _x(6)).ok


def test_integer_inputs_are_held_fixed_and_params_mapping():
    layer = lk.Linear(3, 2, dtype=np.float64)
    labels = np.array([1, 0, 1])

    def pick(x, idx):  # y = layer(x)[i, idx[i]]: the integer input is not perturbed
        y, back = layer.vjp(x)
        out = y[np.arange(len(idx)), idx]

        def backward(dy):
            full = np.zeros_like(y)
            full[np.arange(len(idx)), idx] = dy
            return back(full), None

        return out, backward

    result = gradcheck(pick, _x(3, 3), labels, params=dict(layer.named_parameters()))
    assert result.ok and list(result.tensors) == ["input[0]", "weight", "bias"]
    assert layer.weight.grad is None


def test_params_false_and_frozen_parameters_are_skipped():
    layer = lk.Linear(3, 2, dtype=np.float64)
    assert list(gradcheck(layer, _x(4, 3), params=False).tensors) == ["input[0]"]
    layer.bias.requires_grad = False
    assert list(gradcheck(layer, _x(4, 3)).tensors) == ["input[0]", "weight"]
    assert layer.bias.grad is None and layer.weight.grad is None


# ----------------------------------------------------------------------------- nothing is lost
def test_parameters_grads_and_inputs_restored():
    model = _mlp()
    x = _x(5, 4)
    x_before = x.copy()
    data_before = {n: p.data.copy() for n, p in model.named_parameters()}
    arrays_before = {n: p.data for n, p in model.named_parameters()}
    grads = {n: np.full(p.shape, 7.0) for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        p.grad = grads[n]
    model[2].bias.grad = None
    gradcheck(model, x)
    np.testing.assert_array_equal(x, x_before)
    for n, p in model.named_parameters():
        assert p.data is arrays_before[n]
        np.testing.assert_array_equal(p.data, data_before[n])  # bit for bit
        if n == "2.bias":
            assert p.grad is None
        else:
            assert p.grad is grads[n] and np.all(p.grad == 7.0)


class Counter(lk.Module):
    """Identity that tracks a running mean and a call count in buffers (like BatchNorm)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("running_mean", np.zeros(2))
        self.register_buffer("calls", np.array(0))

    def forward(self, x):
        return self.vjp(x)[0]

    def vjp(self, x, input_grad=True):
        self.running_mean = 0.9 * self.running_mean + 0.1 * x.mean(0)  # rebinds
        self.calls += 1  # in place
        return x * 2.0, (lambda dy: 2.0 * dy)


def test_buffers_restored():
    counter = Counter()
    counter(_x(3, 2))
    mean, calls = counter.running_mean.copy(), counter.calls
    assert gradcheck(counter, _x(3, 2)).ok
    np.testing.assert_array_equal(counter.running_mean, mean)
    assert counter.calls is calls and counter.calls == 1
    assert counter.state_dict()["calls"] == 1


def test_batchnorm_training_mode_checked_and_running_stats_restored():
    bn = lk.BatchNorm1d(3, dtype=np.float64)
    bn(_x(6, 3, seed=3))
    before = {k: np.array(v, copy=True) for k, v in bn.state_dict().items()}
    assert bn.training
    assert gradcheck(bn, _x(6, 3)).ok
    after = bn.state_dict()
    assert list(after) == list(before)
    for key, value in before.items():
        np.testing.assert_array_equal(after[key], value)


def test_dropout_training_uses_one_fixed_mask_and_keeps_the_generators():
    model = lk.Sequential(lk.Linear(4, 5, dtype=np.float64), lk.Dropout(0.5), lk.Tanh())
    state = default_generator().bit_generator.state
    assert model.training and gradcheck(model, _x(6, 4), raise_on_failure=True)
    assert default_generator().bit_generator.state == state
    assert model[1].rng is None and model.training
    own = np.random.default_rng(5)
    model[1].rng = own
    assert gradcheck(model, _x(6, 4)).ok and model[1].rng is own


def test_nondeterministic_module_is_refused():
    class Noisy(lk.Module):
        def __init__(self):
            super().__init__()
            self.rng = np.random.default_rng(0)

        def vjp(self, x, input_grad=True):
            return x + self.rng.standard_normal(x.shape), (lambda dy: dy)

    with pytest.raises(ValueError, match="deterministic"):
        gradcheck(Noisy(), _x(3))


def test_lazy_linear_is_materialized_and_checked():
    result = gradcheck(lk.LazyLinear(2, dtype=np.float64), _x(3, 4))
    assert result.ok and result.tensors["weight"].shape == (2, 4)


def test_shape_bug_in_backward_raises():
    def fn(x):
        return x * 2, (lambda dy: (2 * dy)[:-1])

    with pytest.raises(GradcheckError, match="shape"):
        gradcheck(fn, _x(3))


def test_public_name_is_the_function():
    import importlib
    import types

    importlib.import_module("linearkit.analysis.gradcheck")  # the submodule must not shadow it
    from linearkit.analysis import gradcheck as public

    assert not isinstance(public, types.ModuleType) and public is lk.analysis.gradcheck
    assert not isinstance(lk.analysis.ledger, types.ModuleType)
    assert lk.analysis.gradcheck(lk.Linear(2, 2, dtype=np.float64), _x(2)).ok


def test_nothing_to_check_is_an_error():
    with pytest.raises(ValueError, match="nothing to check"):
        gradcheck(lambda i: (i * 1.0, lambda dy: None), np.arange(3))
