"""LayerNorm, RMSNorm and BatchNorm1d against torch.nn: forward, every gradient, running
statistics."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import linearkit as lk
from linearkit import functional as F
from linearkit.errors import DTypeError, ShapeError

DTYPES = [np.float32, np.float64]
TORCH = {np.float32: torch.float32, np.float64: torch.float64}


def close(ours, theirs, **tol):
    """assert_close with torch's default tolerances for the dtype (dtype must match too)."""
    torch.testing.assert_close(torch.from_numpy(np.array(ours)), theirs.detach(), **tol)


def pair(kind, dtype, rng, *args, **kwargs):
    """A linearkit module and its torch twin with the same (random, non-trivial) parameters."""
    ours = getattr(lk, kind)(*args, **kwargs, dtype=dtype)
    for p in ours.parameters():
        p.data[...] = rng.normal(1.0, 0.5, p.shape)
    theirs = getattr(torch.nn, kind)(*args, **kwargs, dtype=TORCH[dtype])
    theirs.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in ours.state_dict().items()})
    return ours, theirs


def run_both(ours, theirs, x, dy, **tol):
    """vjp on ours, autograd on theirs; returns (y, dx, x_t, y_t) after comparing y and dx."""
    x_t = torch.from_numpy(x.copy()).requires_grad_()
    y_t = theirs(x_t)
    y_t.backward(torch.from_numpy(dy))
    y, backward = ours.vjp(x)
    dx = backward(dy)
    close(y, y_t)
    close(dx, x_t.grad, **tol)
    for name, p in theirs.named_parameters():
        close(getattr(ours, name).grad, p.grad, **tol)
    return y, dx


def data(rng, shape, dtype, scale=3.0, shift=2.0):
    return (rng.normal(shift, scale, shape)).astype(dtype)


# ----------------------------------------------------------------------------- LayerNorm
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, normalized", [
    ((4, 8), 8), ((2, 3, 8), (8,)), ((2, 3, 4, 5), (4, 5)), ((6,), 6), ((3, 4, 5), (3, 4, 5)),
    ((0, 8), 8), ((5, 1), 1),
])
@pytest.mark.parametrize("affine", [{}, {"bias": False}, {"elementwise_affine": False}])
def test_layer_norm_matches_torch(dtype, shape, normalized, affine):
    rng = np.random.default_rng(0)
    ours, theirs = pair("LayerNorm", dtype, rng, normalized, **affine)
    x, dy = data(rng, shape, dtype), data(rng, shape, dtype, 1.0, 0.0)
    # One normalized element: the exact dx is 0 and ours is; torch's float32 rounding leaves
    # ~eps32 * rstd (rstd = 1/sqrt(eps) ~ 316) behind, so allow that much.
    tol = {"rtol": 0, "atol": 1e-4} if x.shape[-1] == 1 and dtype == np.float32 else {}
    y, dx = run_both(ours, theirs, x, dy, **tol)
    assert y.dtype == dx.dtype == dtype and y.shape == dx.shape == shape
    np.testing.assert_array_equal(ours(x), y)
    assert [k for k in ours.state_dict()] == list(theirs.state_dict())
    assert repr(ours) == repr(theirs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_eps_and_functional(dtype):
    rng = np.random.default_rng(1)
    x = data(rng, (3, 5), dtype, scale=1e-3, shift=0.0)  # variance ~ eps: eps matters
    w, b = data(rng, 5, dtype), data(rng, 5, dtype)
    t = [torch.from_numpy(a) for a in (x, w, b)]
    for eps in (1e-5, 1e-2):
        close(F.layer_norm(x, 5, w, b, eps), torch.nn.functional.layer_norm(t[0], (5,), *t[1:], eps))
    close(F.layer_norm(x, (5,)), torch.nn.functional.layer_norm(t[0], (5,)))


def _error_vs_float64(ours, theirs, x, axis):
    """Max error of our and torch's float32 output against float64 math on the same inputs."""
    x64 = x.astype(np.float64)
    ref = (x64 - x64.mean(axis, keepdims=True)) / np.sqrt(x64.var(axis, keepdims=True) + 1e-5)
    return (np.abs(ours(x) - ref).max(),
            np.abs(theirs(torch.from_numpy(x)).detach().numpy() - ref).max())


def test_layer_norm_large_offset_float32():
    """A large common offset (1e4 + N(0, 1)): float32 keeps ~1 ulp of the offset, at least as
    accurate as torch (which is off by up to ~1.5e-3 here, beyond its own default tolerance)."""
    x = data(np.random.default_rng(2), (4, 256), np.float32, scale=1.0, shift=1e4)
    ours, theirs = lk.LayerNorm(256), torch.nn.LayerNorm(256)
    err, err_torch = _error_vs_float64(ours, theirs, x, -1)
    assert err <= min(err_torch, 1e-3)  # an ulp of 1e4 in float32 is 9.8e-4


def test_layer_norm_errors_and_repr():
    ln = lk.LayerNorm(8)
    assert ln.normalized_shape == (8,) and lk.LayerNorm([2, 3]).normalized_shape == (2, 3)
    assert repr(ln) == "LayerNorm((8,), eps=1e-05, elementwise_affine=True, bias=True)"
    np.testing.assert_array_equal(ln.weight.data, np.ones(8, np.float32))
    np.testing.assert_array_equal(ln.bias.data, np.zeros(8, np.float32))
    with pytest.raises(ShapeError, match=r"expected input of shape \(\*, 8\), got \(8, 3\)") as e:
        ln(np.zeros((8, 3), np.float32))
    assert "np.moveaxis(x, 0, -1)" in str(e.value)
    with pytest.raises(ShapeError):
        ln.vjp(np.zeros((2, 7), np.float32))
    with pytest.raises(ShapeError):
        lk.LayerNorm((2, 3))(np.zeros(3, np.float32))
    with pytest.raises(DTypeError):
        ln(np.zeros((2, 8), np.float64))
    with pytest.raises(TypeError):
        lk.LayerNorm(2.5)
    with pytest.raises(ValueError):
        lk.LayerNorm((4, -1))


# ----------------------------------------------------------------------------- RMSNorm
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, normalized", [
    ((4, 8), 8), ((2, 3, 8), (8,)), ((2, 3, 4, 5), (4, 5)), ((6,), 6), ((3, 4, 5), (3, 4, 5)),
    ((0, 8), 8), ((5, 1), 1),
])
@pytest.mark.parametrize("kwargs", [{}, {"eps": 1e-3}, {"elementwise_affine": False}])
def test_rms_norm_matches_torch(dtype, shape, normalized, kwargs):
    rng = np.random.default_rng(0)
    ours, theirs = pair("RMSNorm", dtype, rng, normalized, **kwargs)
    x, dy = data(rng, shape, dtype), data(rng, shape, dtype, 1.0, 0.0)
    y, dx = run_both(ours, theirs, x, dy)
    assert y.dtype == dx.dtype == dtype and y.shape == dx.shape == shape
    np.testing.assert_array_equal(ours(x), y)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert repr(ours) == repr(theirs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_float64_within_1e_12_of_torch(dtype):
    rng = np.random.default_rng(3)
    ours, theirs = pair("RMSNorm", np.float64, rng, (3, 4))
    x, dy = data(rng, (5, 3, 4), np.float64), data(rng, (5, 3, 4), np.float64, 1.0, 0.0)
    run_both(ours, theirs, x, dy, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_eps_none_is_the_compute_dtypes_machine_epsilon(dtype):
    """eps=None is torch.finfo(float32).eps for float32, finfo(float64).eps for float64: on
    inputs whose mean square is near it the choice shows, and ours is torch's."""
    scale = 1e-4 if dtype == np.float32 else 1e-8
    x = data(np.random.default_rng(4), (3, 6), dtype, scale=scale, shift=0.0)
    ours, theirs = lk.RMSNorm(6, dtype=dtype), torch.nn.RMSNorm(6, dtype=TORCH[dtype])
    close(ours(x), theirs(torch.from_numpy(x)))
    eps = float(np.finfo(dtype).eps)
    other = float(np.finfo(np.float64 if dtype == np.float32 else np.float32).eps)
    np.testing.assert_array_equal(ours(x), F.rms_norm(x, (6,), ours.weight.data, eps))
    assert np.abs(F.rms_norm(x, (6,), None, other) - ours(x)).max() > 0.1  # it matters here


def test_rms_norm_functional_matches_torch():
    rng = np.random.default_rng(5)
    x, w = data(rng, (4, 2, 5), np.float64), data(rng, (2, 5), np.float64)
    t = torch.from_numpy(x)
    for eps in (None, 1e-6, 0.5):
        close(F.rms_norm(x, (2, 5), w, eps), torch.nn.functional.rms_norm(
            t, (2, 5), torch.from_numpy(w), eps), rtol=1e-12, atol=1e-12)
    close(F.rms_norm(x, (5,)), torch.nn.functional.rms_norm(t, (5,)), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype, scale", [(np.float32, 1e30), (np.float64, 1e200),
                                          (np.float64, 1e-200)])
def test_rms_norm_is_exact_where_the_mean_square_overflows_or_underflows(dtype, scale):
    """float32 squares overflow beyond ~1.8e19 (torch's float32 RMSNorm then returns zeros);
    float64 ones beyond ~1e154, and underflow near 1e-162. The result is the scaled input's,
    as the math says (eps 0: RMSNorm is scale-invariant), and so is dx, divided by the scale."""
    rng = np.random.default_rng(6)
    x, dy = data(rng, (4, 8), np.float64), data(rng, (4, 8), np.float64, 1.0, 0.0)
    ours = lk.RMSNorm(8, eps=0.0, dtype=dtype)
    y, backward = ours.vjp((x * scale).astype(dtype))
    dx = backward(dy.astype(dtype))
    x_t = torch.from_numpy(x).requires_grad_()
    y_t = torch.nn.functional.rms_norm(x_t, (8,), eps=0.0)
    y_t.backward(torch.from_numpy(dy))
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == np.float32 else {"rtol": 1e-12, "atol": 0}
    np.testing.assert_allclose(y, y_t.detach().numpy(), **tol)
    np.testing.assert_allclose(dx * scale, x_t.grad.numpy(), **tol)
    if dtype == np.float32:  # torch's own float32 answer is zeros: its squares overflow
        big = torch.from_numpy((x * scale).astype(np.float32))
        assert torch.nn.RMSNorm(8, eps=0.0)(big).abs().max() == 0


def test_rms_norm_errors_repr_and_init():
    rn = lk.RMSNorm(8)
    assert rn.normalized_shape == (8,) and lk.RMSNorm([2, 3]).normalized_shape == (2, 3)
    assert repr(rn) == "RMSNorm((8,), eps=None, elementwise_affine=True)"
    assert repr(lk.RMSNorm((2, 3), 1e-3, False)) == repr(torch.nn.RMSNorm((2, 3), 1e-3, False))
    np.testing.assert_array_equal(rn.weight.data, np.ones(8, np.float32))
    assert list(rn.state_dict()) == ["weight"] and lk.RMSNorm(8, elementwise_affine=False) \
        .state_dict() == {}
    with pytest.raises(ShapeError, match=r"RMSNorm.*expected input of shape \(\*, 8\), got "
                                         r"\(8, 3\)") as e:
        rn(np.zeros((8, 3), np.float32))
    assert "RMSNorm normalizes the last dimension" in str(e.value)
    assert "np.moveaxis(x, 0, -1)" in str(e.value)
    with pytest.raises(ShapeError):
        rn.vjp(np.zeros((2, 7), np.float32))
    with pytest.raises(ShapeError):
        lk.RMSNorm((2, 3))(np.zeros(3, np.float32))
    with pytest.raises(DTypeError):
        rn(np.zeros((2, 8), np.float64))
    with pytest.raises(TypeError, match="eps must be a float or None"):
        lk.RMSNorm(8, eps="1e-5")
    with pytest.raises(ValueError):
        lk.RMSNorm((4, -1))
    rn.weight.data[...] = 3.0
    rn.reset_parameters()
    np.testing.assert_array_equal(rn.weight.data, np.ones(8, np.float32))


@pytest.mark.parametrize("storage", ["float16", "bfloat16"])
def test_rms_norm_16bit_storage_computes_in_float32(storage):
    """16-bit storage: float32 inputs, float32 compute (eps=None is float32's) and output, as
    torch's float32 RMSNorm with the rounded weight; the weight's gradient is float32."""
    rng = np.random.default_rng(7)
    ours = lk.RMSNorm(6)
    ours.weight.data[...] = rng.uniform(0.5, 1.5, 6)
    ours.to(lk.precision.storage_dtype(storage))
    theirs = torch.nn.RMSNorm(6)
    with torch.no_grad():
        theirs.weight.copy_(torch.from_numpy(ours.weight.data.astype(np.float32)))
    x, dy = data(rng, (4, 6), np.float32), data(rng, (4, 6), np.float32, 1.0, 0.0)
    y, dx = run_both(ours, theirs, x, dy, rtol=1e-5, atol=1e-5)
    assert y.dtype == dx.dtype == ours.weight.grad.dtype == np.float32


# ----------------------------------------------------------------------------- BatchNorm1d
BN_CONFIGS = [{}, {"affine": False}, {"bias": False}, {"track_running_stats": False},
              {"momentum": None}]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(8, 4), (5, 4, 3), (1, 4, 2)])
@pytest.mark.parametrize("config", BN_CONFIGS)
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_matches_torch(dtype, shape, config, training):
    rng = np.random.default_rng(3)
    ours, theirs = pair("BatchNorm1d", dtype, rng, 4, **config)
    if ours.track_running_stats:  # non-trivial running statistics for eval mode
        ours.running_mean[...] = rng.normal(size=4)
        ours.running_var[...] = rng.uniform(0.5, 2.0, 4)
        theirs.running_mean.copy_(torch.from_numpy(ours.running_mean))
        theirs.running_var.copy_(torch.from_numpy(ours.running_var))
    ours.train(training), theirs.train(training)
    x, dy = data(rng, shape, dtype), data(rng, shape, dtype, 1.0, 0.0)
    y, dx = run_both(ours, theirs, x, dy)
    assert y.dtype == dx.dtype == dtype
    for name, buf in theirs.named_buffers():
        close(getattr(ours, name), buf)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert repr(ours) == repr(theirs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("momentum", [0.1, None, 0.7])
def test_running_stats_follow_torch(dtype, momentum):
    """Training steps (forward and vjp, (N, C) and (N, C, L) alike), an eval step in between,
    then eval: buffers and outputs equal torch's after every step."""
    rng = np.random.default_rng(4)
    ours, theirs = pair("BatchNorm1d", dtype, rng, 3, momentum=momentum)
    for step in range(7):
        training = step != 4
        ours.train(training), theirs.train(training)
        x = data(rng, (6, 3) if step % 3 else (4, 3, 5), dtype, scale=1.0 + step, shift=step)
        y_t = theirs(torch.from_numpy(x))
        y = ours(x) if step % 2 else ours.vjp(x)[0]
        close(y, y_t)
        close(ours.running_mean, theirs.running_mean)
        close(ours.running_var, theirs.running_var)
        close(ours.num_batches_tracked, theirs.num_batches_tracked)
    assert ours.num_batches_tracked.dtype == np.int64 and ours.num_batches_tracked.shape == ()
    assert int(ours.num_batches_tracked) == 6
    ours.eval(), theirs.eval()
    x = data(rng, (5, 3, 2), dtype)
    close(ours(x), theirs(torch.from_numpy(x)))


def test_running_var_is_unbiased_and_normalization_biased():
    bn = lk.BatchNorm1d(1, momentum=1.0, dtype=np.float64)
    x = np.array([[1.0], [2.0], [3.0], [6.0]])
    y = bn(x)
    np.testing.assert_allclose(bn.running_var, [x.var(ddof=1)])
    np.testing.assert_allclose(bn.running_mean, [3.0])
    np.testing.assert_allclose(y[:, 0], (x[:, 0] - 3.0) / np.sqrt(x.var() + 1e-5))


@pytest.mark.parametrize("shape", [(0, 3), (0, 3, 4), (2, 3, 0)])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_empty_batch(shape, training):
    rng = np.random.default_rng(5)
    ours, theirs = pair("BatchNorm1d", np.float32, rng, 3)
    warm = data(rng, (4, 3), np.float32)  # non-trivial running statistics first
    ours(warm), theirs(torch.from_numpy(warm))
    ours.train(training), theirs.train(training)
    x = np.zeros(shape, np.float32)
    run_both(ours, theirs, x, x.copy())
    for name, buf in theirs.named_buffers():
        close(getattr(ours, name), buf)


@pytest.mark.parametrize("shape", [(1, 3), (1, 3, 1)])
def test_one_value_per_channel(shape):
    bn = lk.BatchNorm1d(3)
    x = np.ones(shape, np.float32)
    with pytest.raises(ValueError):
        torch.nn.BatchNorm1d(3)(torch.from_numpy(x))
    for call in (bn, bn.vjp):
        with pytest.raises(ShapeError, match="Expected more than 1 value per channel when training"):
            call(x)
    assert int(bn.num_batches_tracked) == 0  # the failed call changed nothing
    np.testing.assert_array_equal(bn.running_mean, np.zeros(3, np.float32))
    assert bn.eval()(x).shape == shape  # eval uses the running statistics: fine
    with pytest.raises(ShapeError, match="more than 1 value"):  # no running stats: batch stats
        lk.BatchNorm1d(3, track_running_stats=False).eval()(x)
    with pytest.raises(ValueError, match="more than 1 value"):
        F.batch_norm(x, training=True)


def test_batch_norm_shape_and_dtype_errors():
    bn = lk.BatchNorm1d(4)
    with pytest.raises(ShapeError, match=r"x\[None\]"):
        bn(np.zeros(4, np.float32))
    with pytest.raises(ShapeError, match=r"transpose\(0, 2, 1\)"):
        bn(np.zeros((2, 5, 4), np.float32))
    with pytest.raises(ShapeError, match=r"\(N, 4\) or \(N, 4, L\)"):
        bn(np.zeros((2, 4, 3, 3), np.float32))
    with pytest.raises(ShapeError):
        bn.vjp(np.zeros((2, 3), np.float32))
    with pytest.raises(DTypeError):
        bn(np.zeros((2, 4), np.float64))
    with pytest.raises(DTypeError):
        bn(np.zeros((2, 4), np.int64))
    assert int(bn.num_batches_tracked) == 0
    with pytest.raises(ValueError, match="running_mean"):
        F.batch_norm(np.zeros((2, 4)), training=False)


def test_batch_norm_repr_defaults_and_state_dict():
    bn = lk.BatchNorm1d(10)
    assert repr(bn) == ("BatchNorm1d(10, eps=1e-05, momentum=0.1, affine=True, bias=True, "
                        "track_running_stats=True)")
    assert "momentum=None" in repr(lk.BatchNorm1d(2, momentum=None))
    sd = bn.state_dict()
    assert list(sd) == ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]
    np.testing.assert_array_equal(sd["running_var"], np.ones(10, np.float32))
    assert sd["running_mean"].dtype == np.float32 and sd["num_batches_tracked"].dtype == np.int64
    assert [n for n, _ in bn.named_buffers()] == ["running_mean", "running_var",
                                                  "num_batches_tracked"]
    theirs = torch.nn.BatchNorm1d(10)
    theirs.train()(torch.randn(8, 10))
    bn.load_state_dict(theirs.state_dict())
    close(bn.running_mean, theirs.running_mean)
    assert int(bn.num_batches_tracked) == 1
    bn.reset_parameters()
    assert int(bn.num_batches_tracked) == 0 and not bn.running_mean.any()


def test_state_dict_round_trip_and_to_float64():
    bn = lk.BatchNorm1d(3)
    bn(np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32))
    other = lk.BatchNorm1d(3)
    other.load_state_dict(bn.state_dict())
    np.testing.assert_array_equal(other.running_var, bn.running_var)
    bn.to(np.float64)
    assert bn.running_mean.dtype == np.float64 and bn.num_batches_tracked.dtype == np.int64
    bn(np.ones((2, 3)))
    assert int(bn.num_batches_tracked) == 2


@pytest.mark.parametrize("kind, arg, shape", [("LayerNorm", 4, (3, 4)),
                                              ("BatchNorm1d", 4, (3, 4, 2))])
def test_grad_protocol(kind, arg, shape):
    """input_grad=False, frozen parameters, accumulation, reuse, fresh grad arrays."""
    rng = np.random.default_rng(6)
    m, _ = pair(kind, np.float64, rng, arg)
    x, dy = data(rng, shape, np.float64), data(rng, shape, np.float64)
    dx_full = m.vjp(x)[1](dy)
    g_w, g_b = m.weight.grad.copy(), m.bias.grad.copy()
    assert not np.shares_memory(m.weight.grad, dy) and not np.shares_memory(m.bias.grad, dy)
    assert m.vjp(x, input_grad=False)[1](dy) is None
    np.testing.assert_allclose(m.weight.grad, 2 * g_w)
    m.zero_grad()
    m.weight.requires_grad = False
    np.testing.assert_allclose(m.vjp(x)[1](dy), dx_full)
    assert m.weight.grad is None
    np.testing.assert_allclose(m.bias.grad, g_b)
    m.zero_grad()
    m.weight.requires_grad = True
    (_, b1), (_, b2) = m.vjp(x), m.vjp(x)  # used twice in one forward: contributions sum
    b1(dy), b2(dy)
    np.testing.assert_allclose(m.weight.grad, 2 * g_w)


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_matches_finite_differences(training):
    """An independent check of the analytic backward (float64, central differences)."""
    rng = np.random.default_rng(7)
    bn, _ = pair("BatchNorm1d", np.float64, rng, 2)
    bn.train(training)
    x, dy = data(rng, (3, 2, 2), np.float64), data(rng, (3, 2, 2), np.float64)
    momentum, bn.momentum = bn.momentum, 0.0  # keep the running stats fixed while probing
    dx = bn.vjp(x)[1](dy)
    numeric = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = 1e-6
        numeric[i] = np.sum(dy * (bn(x + e) - bn(x - e))) / 2e-6
    np.testing.assert_allclose(dx, numeric, rtol=1e-6, atol=1e-8)
    bn.momentum = momentum


def test_functional_batch_norm_matches_torch():
    rng = np.random.default_rng(8)
    x = data(rng, (6, 3, 2), np.float64)
    w, b = data(rng, 3, np.float64), data(rng, 3, np.float64)
    rm, rv = np.zeros(3), np.ones(3)
    rm_t, rv_t = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    for training in (True, True, False):
        y_t = torch.nn.functional.batch_norm(torch.from_numpy(x), rm_t, rv_t, torch.from_numpy(w),
                                             torch.from_numpy(b), training, 0.2, 1e-3)
        close(F.batch_norm(x, rm, rv, w, b, training, 0.2, 1e-3), y_t)
        close(rm, rm_t), close(rv, rv_t)


def test_batch_norm_long_batch_float32():
    """Axis-0 statistics over many rows: float64 accumulation keeps float32 exact to rounding;
    a float32 running sum (torch: ~2e-4 off here) would not."""
    x = data(np.random.default_rng(9), (20000, 4), np.float32, scale=1.0, shift=100.0)
    err, err_torch = _error_vs_float64(lk.BatchNorm1d(4), torch.nn.BatchNorm1d(4), x, 0)
    assert err <= min(err_torch, 1e-5)


@settings(max_examples=30, deadline=None, database=None)
@given(st.sampled_from(DTYPES), st.lists(st.integers(0, 4), min_size=0, max_size=2),
       st.lists(st.integers(2, 5), min_size=1, max_size=2), st.booleans(), st.integers(0, 2**16))
def test_property_matches_torch(dtype, lead, norm, use_bn, seed):
    """Random shapes and dtypes: LayerNorm over trailing dims, BatchNorm1d on (N, C[, L]).

    Normalized sizes start at 2 (a single normalized element is covered above, with a tolerance).
    """
    rng = np.random.default_rng(seed)
    if use_bn:
        shape = (2 + len(lead), norm[0]) + tuple(n + 1 for n in lead[:1])
        ours, theirs = pair("BatchNorm1d", dtype, rng, norm[0])
    else:
        shape = tuple(lead) + tuple(norm)
        ours, theirs = pair("LayerNorm", dtype, rng, tuple(norm))
    run_both(ours, theirs, data(rng, shape, dtype), data(rng, shape, dtype, 1.0, 0.0))


# --------------------------------------------------------- numerics at the ends of the range
def _ln_reference(x, w, dy, axes, eps, param_axes=None):
    """Forward and (dx, dw, db) of ``(x - mean)/sqrt(var + eps) * w + b`` in 80-bit long double,
    whose range (1e±4932) holds every float64 square: an independent reference for huge and tiny
    rows. ``axes``: the statistics axes; dw/db are summed over ``param_axes`` (default: the
    others, as in LayerNorm)."""
    x, dy, w = (np.asarray(a, np.longdouble) for a in (x, dy, w))
    mean = x.mean(axes, keepdims=True)
    xhat = (x - mean) / np.sqrt(((x - mean) ** 2).mean(axes, keepdims=True) + eps)
    g = dy * w
    rstd = 1 / np.sqrt(((x - mean) ** 2).mean(axes, keepdims=True) + eps)
    dx = rstd * (g - g.mean(axes, keepdims=True) - xhat * (g * xhat).mean(axes, keepdims=True))
    if param_axes is None:
        param_axes = tuple(a for a in range(x.ndim) if a not in axes)
    return xhat * w, dx, (dy * xhat).sum(param_axes), dy.sum(param_axes)


def _extreme_rows(scale, dtype, rng, shape=(3, 8)):
    x = np.clip(rng.standard_normal(shape), -2.2, 2.2)  # 2.2 * 1.5e38 < float32's max 3.4e38
    if scale == "mixed":  # one huge element among ordinary ones, and a row of ordinary values
        x[0, 1], x[1, 1 % shape[1]] = 1e20, -3e38
    else:
        x *= scale
    return x.astype(dtype)


EXTREME = [(1e20, np.float32), (1e20, np.float64), (1.5e38, np.float32), (1.5e38, np.float64),
           ("mixed", np.float32), ("mixed", np.float64), (1e-30, np.float32),
           (1e-30, np.float64), (1e200, np.float64), (1e-300, np.float64)]


def _assert_matches(ours, ref, dtype):
    """Elementwise close to the reference, scaled to its magnitude; never NaN, never all-zero."""
    ref = np.asarray(ref, np.float64)
    assert np.isfinite(ours).all(), ours
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    atol = rtol * np.abs(ref).max() + np.finfo(dtype).smallest_subnormal * 4
    np.testing.assert_allclose(ours.astype(np.float64), ref, rtol=rtol, atol=atol)


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("scale, dtype, eps",
                         [(s, d, e) for s, d in EXTREME for e in (1e-5, 0.0)
                          if not (e == 0.0 and s == "mixed")],  # mixed rows: ordinary variance
                         ids=str)
def test_layer_norm_huge_and_tiny_rows_are_right(scale, dtype, eps):
    """Rows near float max or min: the right answer, no warning — not silent zeros (ours before)
    nor NaN (torch's float32)."""
    rng = np.random.default_rng(11)
    x = _extreme_rows(scale, dtype, rng)
    dy = rng.standard_normal(x.shape).astype(dtype)
    w = rng.normal(1.0, 0.5, 8).astype(dtype)
    y, xhat, rstd = F.layer_norm_forward(x, 8, w, None, eps)
    dx, dw, db = F.layer_norm_backward(dy, xhat, rstd, 8, w)
    ref = _ln_reference(x, w, dy, (1,), eps)
    for ours, theirs in zip((y, dx, dw, db), ref):
        assert ours.dtype == dtype
        _assert_matches(ours, theirs, dtype)
    np.testing.assert_array_equal(F.layer_norm(x, 8, w, None, eps), y)
    ln = lk.LayerNorm(8, bias=False, eps=eps, dtype=dtype)
    ln.weight.data[...] = w
    y_mod, back = ln.vjp(x)
    np.testing.assert_array_equal(y_mod, y), np.testing.assert_array_equal(back(dy), dx)


def test_layer_norm_reference_is_torch_float64_where_that_is_exact():
    """The long-double reference agrees with torch in float64 on float32's extremes."""
    rng = np.random.default_rng(12)
    for scale in (1e20, 1.5e38, 1e-30):
        x = _extreme_rows(scale, np.float32, rng).astype(np.float64)
        y_t = torch.nn.functional.layer_norm(torch.from_numpy(x), (8,))
        np.testing.assert_allclose(_ln_reference(x, np.ones(8), x, (1,), 1e-5)[0], y_t.numpy(),
                                   rtol=1e-12, atol=1e-300)


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_layer_norm_ordinary_rows_unchanged_beside_a_huge_one():
    """Ordinary rows in a batch with an overflowing row get exactly their usual result, and
    that result is torch's."""
    rng = np.random.default_rng(13)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    alone = F.layer_norm(x, 8)
    x_big = x.copy()
    x_big[2] *= 1e20
    y = F.layer_norm(x_big, 8)
    np.testing.assert_array_equal(y[[0, 1, 3]], alone[[0, 1, 3]])
    close(alone, torch.nn.functional.layer_norm(torch.from_numpy(x), (8,)))
    _assert_matches(y[2], _ln_reference(x_big[2:3], np.ones(8), x_big[2:3], (1,), 1e-5)[0][0],
                    np.float32)


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_layer_norm_nan_and_inf_inputs_stay_nan_like_torch():
    x = np.array([[1.0, np.nan, 2.0, 3.0], [1.0, np.inf, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0]],
                 np.float32)
    y = F.layer_norm(x, 4)
    y_t = torch.nn.functional.layer_norm(torch.from_numpy(x), (4,)).numpy()
    np.testing.assert_array_equal(np.isnan(y), np.isnan(y_t))
    assert np.isnan(y[:2]).all() and np.isfinite(y[2]).all()


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("scale, dtype", EXTREME, ids=str)
def test_batch_norm_huge_and_tiny_channels_are_right(scale, dtype):
    """BatchNorm1d's batch variance has the same overflow: forward, backward and the running
    variance against the long-double reference."""
    rng = np.random.default_rng(14)
    x = _extreme_rows(scale, dtype, rng, (8, 3))
    dy = rng.standard_normal(x.shape).astype(dtype)
    w = rng.normal(1.0, 0.5, 3).astype(dtype)
    rm, rv = np.zeros(3, dtype), np.ones(3, dtype)
    y, xhat, rstd = F.batch_norm_forward(x, rm, rv, w, None, True, 0.5, 1e-5)
    dx, dw, db = F.batch_norm_backward(dy, xhat, rstd, w, True)
    ref = _ln_reference(x, w, dy, (0,), 1e-5, (0,))
    for ours, theirs in zip((y, dx, dw, db), ref):
        assert ours.dtype == dtype
        _assert_matches(ours, theirs, dtype)
    x64 = np.asarray(x, np.longdouble)
    true_var = 0.5 + 0.5 * x64.var(0, ddof=1)
    with np.errstate(over="ignore"):
        expected = true_var.astype(dtype)  # inf where the variance itself exceeds the dtype
    np.testing.assert_allclose(rv, expected, rtol=1e-5 if dtype == np.float32 else 1e-12)
    np.testing.assert_allclose(rm, (0.5 * x64.mean(0)).astype(np.float64),
                               rtol=1e-5 if dtype == np.float32 else 1e-12)


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("scale", [1e200, 1e-200, 1.0])
def test_layer_norm_gradient_at_extreme_scales_matches_finite_differences(scale):
    """An independent check of dx where the variance overflows (1e200² in float64) or is tiny:
    central differences with a step relative to the row's scale."""
    rng = np.random.default_rng(15)
    x = rng.standard_normal((2, 5)) * scale
    dy = rng.standard_normal((2, 5))
    _, xhat, rstd = F.layer_norm_forward(x, 5, eps=0.0)
    dx = F.layer_norm_backward(dy, xhat, rstd, 5)[0]
    numeric = np.zeros_like(x)
    h = 1e-6 * scale
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = h
        diff = F.layer_norm(x + e, 5, eps=0.0) - F.layer_norm(x - e, 5, eps=0.0)
        numeric[i] = np.sum(dy * diff) / (2 * h)
    np.testing.assert_allclose(dx * scale, numeric * scale, rtol=1e-6, atol=1e-8)
