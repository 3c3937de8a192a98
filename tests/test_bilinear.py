"""Bilinear against torch.nn.Bilinear: init, forward and every gradient, shapes, errors, the
two-input vjp protocol (hooks, freezing, accumulation) and 16-bit storage."""

import math

import numpy as np
import pytest
import torch

import linearkit as lk
from linearkit import functional as F
from linearkit.analysis.gradcheck import gradcheck
from linearkit.errors import DTypeError, ShapeError
from linearkit.layers.linear import uninitialized

TORCH = {np.float32: torch.float32, np.float64: torch.float64}


def pair(dtype, *args, seed=0, **kwargs):
    """A linearkit Bilinear and torch's, holding the same (random) weights."""
    ours = lk.Bilinear(*args, **kwargs, dtype=dtype, rng=np.random.default_rng(seed))
    theirs = torch.nn.Bilinear(*args, **kwargs, dtype=TORCH[dtype])
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in ours.state_dict().items()})
    return ours, theirs


def draw(shape, dtype, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def run_both(ours, theirs, x1, x2, dy, **tol):
    """vjp on ours, autograd on theirs; compares y, dx1, dx2 and every parameter's gradient."""
    t1, t2 = (torch.from_numpy(x.copy()).requires_grad_() for x in (x1, x2))
    y_t = theirs(t1, t2)
    y_t.backward(torch.from_numpy(dy))
    y, backward = ours.vjp(x1, x2)
    dx1, dx2 = backward(dy)
    for got, want in ((y, y_t.detach()), (dx1, t1.grad), (dx2, t2.grad)):
        torch.testing.assert_close(torch.from_numpy(np.asarray(got)), want, **tol)
    for name, p in theirs.named_parameters():
        torch.testing.assert_close(torch.from_numpy(getattr(ours, name).grad), p.grad,
                                   msg=name, **tol)
    return y, dx1, dx2


# ----------------------------------------------------------------------------- forward, grads
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("lead", [(6,), (), (2, 3), (0,), (2, 0, 3)])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_torch(dtype, lead, bias):
    ours, theirs = pair(dtype, 3, 4, 5, bias=bias)
    x1, x2 = draw(lead + (3,), dtype, 1), draw(lead + (4,), dtype, 2)
    dy = draw(lead + (5,), dtype, 3)
    tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == np.float64 else {}
    y, dx1, dx2 = run_both(ours, theirs, x1, x2, dy, **tol)
    assert (y.shape, dx1.shape, dx2.shape) == (lead + (5,), x1.shape, x2.shape)
    assert y.dtype == dx1.dtype == dx2.dtype == dtype
    np.testing.assert_array_equal(ours(x1, x2), y)


def test_the_formula_by_einsum_and_the_functional_tier():
    rng = np.random.default_rng(4)
    x1, x2 = rng.standard_normal((7, 3)), rng.standard_normal((7, 2))
    w, b = rng.standard_normal((4, 3, 2)), rng.standard_normal(4)
    np.testing.assert_allclose(F.bilinear(x1, x2, w, b),
                               np.einsum("bi,oij,bj->bo", x1, w, x2) + b, rtol=1e-13, atol=1e-13)
    dy = rng.standard_normal((7, 4))
    dx1, dx2, dw, db = F.bilinear_backward(dy, x1, x2, w)
    np.testing.assert_allclose(dx1, np.einsum("bo,oij,bj->bi", dy, w, x2), rtol=1e-13)
    np.testing.assert_allclose(dx2, np.einsum("bo,oij,bi->bj", dy, w, x1), rtol=1e-13)
    np.testing.assert_allclose(dw, np.einsum("bo,bi,bj->oij", dy, x1, x2), rtol=1e-13)
    np.testing.assert_allclose(db, dy.sum(0), rtol=1e-13)
    assert F.bilinear_backward(dy, None, None, w, need_dx=False, need_dw=False)[:3] == (None,) * 3


def test_gradcheck_float64_on_3d_inputs():
    layer = lk.Bilinear(3, 2, 4, dtype=np.float64, rng=np.random.default_rng(5))
    result = gradcheck(layer, draw((2, 3, 3), np.float64, 6), draw((2, 3, 2), np.float64, 7))
    assert result.ok and set(result.tensors) == {"input[0]", "input[1]", "weight", "bias"}


def test_zero_out_and_zero_in2_features():
    """out_features=0 gives an empty output; in2_features=0 makes y the bias alone (torch cannot
    reshape its empty input there; the sum over no terms is 0)."""
    ours, theirs = pair(np.float64, 3, 4, 0)
    x1, x2 = draw((5, 3), np.float64, 1), draw((5, 4), np.float64, 2)
    y, dx1, dx2 = run_both(ours, theirs, x1, x2, np.zeros((5, 0)))
    assert y.shape == (5, 0) and not dx1.any() and not dx2.any()
    layer = lk.Bilinear(3, 0, 2, dtype=np.float64)
    y, backward = layer.vjp(x1, np.zeros((5, 0)))
    np.testing.assert_array_equal(y, np.broadcast_to(layer.bias.data, (5, 2)))
    dx1, dx2 = backward(np.ones((5, 2)))
    assert not dx1.any() and dx2.shape == (5, 0) and layer.weight.grad.shape == (2, 3, 0)


# ----------------------------------------------------------------------------- init, repr
def test_init_is_torchs_distribution_bound_from_in1_features():
    """U(-1/sqrt(in1), 1/sqrt(in1)) for weight and bias (torch's reset_parameters reads
    weight.size(1)); in2 does not enter. Drawn in float64 and rounded once, weight then bias."""
    layer = lk.Bilinear(4, 100, 50, dtype=np.float64, rng=np.random.default_rng(8))
    torch.manual_seed(0)
    theirs = torch.nn.Bilinear(4, 100, 50, dtype=torch.float64)
    bound = 1 / math.sqrt(4)
    for ours, t in ((layer.weight.data, theirs.weight), (layer.bias.data, theirs.bias)):
        t = t.detach().numpy()
        assert np.abs(ours).max() <= bound and np.abs(t).max() <= bound
        assert np.abs(ours).max() > 0.95 * bound and np.abs(t).max() > 0.95 * bound
    for values in (layer.weight.data, theirs.weight.detach().numpy()):  # uniform: mean, var
        assert abs(values.mean()) < 0.01 and abs(values.var() - bound ** 2 / 3) < 0.002
    rng = np.random.default_rng(8)
    np.testing.assert_array_equal(layer.weight.data, rng.uniform(-bound, bound, (50, 4, 100)))
    np.testing.assert_array_equal(layer.bias.data, rng.uniform(-bound, bound, 50))


def test_repr_state_dict_and_the_library_generator():
    layer = lk.Bilinear(2, 3, 4, bias=False)
    assert repr(layer) == repr(torch.nn.Bilinear(2, 3, 4, bias=False))
    assert list(lk.Bilinear(2, 3, 4).state_dict()) == ["weight", "bias"]
    assert list(layer.state_dict()) == ["weight"] and layer.weight.shape == (4, 2, 3)
    lk.manual_seed(3)
    a = lk.Bilinear(2, 3, 4).weight.data.copy()
    lk.manual_seed(3)
    np.testing.assert_array_equal(lk.Bilinear(2, 3, 4).weight.data, a)


def test_uninitialized_draws_nothing():
    lk.manual_seed(1)
    state = lk.random.default_generator().bit_generator.state
    with uninitialized():
        lk.Bilinear(5, 6, 7)
    assert lk.random.default_generator().bit_generator.state == state


# ----------------------------------------------------------------------------- errors
def test_in1_features_zero_is_refused_as_torch_does():
    with pytest.raises(ValueError, match=r"in1_features must be > 0"):
        lk.Bilinear(0, 3, 2)
    with pytest.raises(ValueError, match=r"in1_features must be > 0"):
        torch.nn.Bilinear(0, 3, 2)
    with pytest.raises(TypeError, match="in2_features must be a non-negative int"):
        lk.Bilinear(3, 2.5, 2)
    with pytest.raises(ValueError, match="out_features must be a non-negative int"):
        lk.Bilinear(3, 2, -1)


@pytest.mark.parametrize("s1, s2, phrase", [
    ((5, 4), (5, 4), r"expected input1 of shape \(\*, 3\), got \(5, 4\)"),
    ((5, 3), (5, 5), r"expected input2 of shape \(\*, 4\), got \(5, 5\)"),
    ((5, 3), (1, 4), r"same leading dimensions, got input1 \(5, 3\) and input2 \(1, 4\)"),
    ((2, 5, 3), (5, 4), r"same leading dimensions"),
    ((5, 4), (5, 3), r"inputs look swapped"),
    ((), (4,), r"expected input1 of shape \(\*, 3\), got \(\)"),
])
def test_a_shape_torch_refuses_is_a_shape_error_naming_the_layer(s1, s2, phrase):
    layer = lk.Bilinear(3, 4, 2)
    x1, x2 = np.zeros(s1, np.float32), np.zeros(s2, np.float32)
    with pytest.raises(RuntimeError):  # torch refuses each of these too
        torch.nn.Bilinear(3, 4, 2)(torch.from_numpy(x1), torch.from_numpy(x2))
    for call in (lambda: layer(x1, x2), lambda: layer.vjp(x1, x2)):
        with pytest.raises(ShapeError, match=phrase) as err:
            call()
        assert str(err.value).startswith("Bilinear(in1_features=3, in2_features=4")


def test_the_dtype_error_names_the_input():
    layer = lk.Bilinear(3, 4, 2)
    with pytest.raises(DTypeError, match=r"input2: expected a float32 input.*got float64"):
        layer(np.zeros((2, 3), np.float32), np.zeros((2, 4), np.float64))
    with pytest.raises(DTypeError, match=r"input1: expected a floating-point float32 input, "
                                         r"got int64"):
        layer(np.zeros((2, 3), np.int64), np.zeros((2, 4), np.float32))


def test_the_ledger_checks_the_first_input_as_the_forward():
    from linearkit.analysis import ledger

    with pytest.raises(ShapeError, match=r"expected input1 of shape \(\*, 3\), got \(5, 4\)"):
        ledger(lk.Bilinear(3, 4, 2), (5, 4))


# ----------------------------------------------------------------------------- the vjp protocol
def test_frozen_weight_input_grad_false_and_accumulation():
    ours, theirs = pair(np.float64, 3, 4, 2)
    x1, x2 = draw((5, 3), np.float64, 1), draw((5, 4), np.float64, 2)
    dy = draw((5, 2), np.float64, 3)
    ours.weight.requires_grad = False
    _, backward = ours.vjp(x1, x2, input_grad=False)
    assert backward(dy) is None and ours.weight.grad is None
    np.testing.assert_allclose(ours.bias.grad, dy.sum(0))
    ours.weight.requires_grad = True
    ours.zero_grad()
    for _ in range(2):  # two backwards add up
        _, backward = ours.vjp(x1, x2)
        backward(dy)
    t1, t2 = torch.from_numpy(x1), torch.from_numpy(x2)
    theirs(t1, t2).backward(torch.from_numpy(dy))
    np.testing.assert_allclose(ours.weight.grad, 2 * theirs.weight.grad.numpy(), rtol=1e-12)
    with pytest.raises(lk.BackwardError, match="already called"):
        backward(dy)
    with pytest.raises(ShapeError, match="backward got dy of shape"):
        ours.vjp(x1, x2)[1](np.zeros((5, 3)))


def test_hooks_see_both_inputs_and_both_input_gradients():
    layer = lk.Bilinear(3, 4, 2, dtype=np.float64)
    x1, x2 = draw((5, 3), np.float64, 1), draw((5, 4), np.float64, 2)
    seen = []
    layer.register_forward_hook(lambda m, args, y: seen.append([a.shape for a in args]))
    layer.register_full_backward_hook(
        lambda m, grad_in, grad_out: seen.append([g.shape for g in grad_in]))
    y, backward = layer.vjp(x1, x2)
    backward(np.ones_like(y))
    layer(x1, x2)
    assert seen == [[(5, 3), (5, 4)], [(5, 3), (5, 4)], [(5, 3), (5, 4)]]


@pytest.mark.parametrize("storage", ["float16", "bfloat16"])
def test_16bit_storage_computes_in_float32(storage):
    ours = lk.Bilinear(3, 4, 2, rng=np.random.default_rng(0)).to(
        lk.precision.storage_dtype(storage))
    theirs = torch.nn.Bilinear(3, 4, 2)
    theirs.load_state_dict({k: torch.from_numpy(v.astype(np.float32))
                            for k, v in ours.state_dict().items()})
    x1, x2 = draw((5, 3), np.float32, 1), draw((5, 4), np.float32, 2)
    dy = draw((5, 2), np.float32, 3)
    y, dx1, dx2 = run_both(ours, theirs, x1, x2, dy, rtol=1e-5, atol=1e-5)
    assert y.dtype == dx1.dtype == dx2.dtype == ours.weight.grad.dtype == np.float32
