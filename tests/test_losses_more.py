"""NLLLoss, BCELoss, SmoothL1Loss, HuberLoss and KLDivLoss against PyTorch: forward value and
input gradient for every option and reduction, float32 and float64, plus the error cases."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from linearkit.errors import DTypeError, ShapeError
from linearkit.losses import BCELoss, HuberLoss, KLDivLoss, NLLLoss, SmoothL1Loss

torch = pytest.importorskip("torch")
from torch.testing import assert_close

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings
from hypothesis import strategies as st

DTYPES = [np.float32, np.float64]
REDUCTIONS = ["mean", "sum", "none"]


def _tol(dtype):
    """torch.testing's defaults for float32; float64 must agree to 1e-10."""
    return {} if dtype == np.float32 else {"rtol": 1e-10, "atol": 1e-10}


def _t(a):
    return None if a is None else torch.from_numpy(np.array(a))


def _compare(ours, theirs, pred, target, *, seed=0):
    """Our (loss, dpred) against torch's, with a random upstream gradient for 'none'."""
    pred, target = np.asarray(pred), np.asarray(target)   # 0-d arithmetic gives NumPy scalars
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                 # KLDivLoss 'mean' warns in torch
        x = torch.from_numpy(pred.copy()).requires_grad_(True)
        t_loss = theirs(x, _t(target))
    dy = None
    if ours.reduction == "none":
        dy = np.random.default_rng(seed).standard_normal(tuple(t_loss.shape)).astype(pred.dtype)
    t_loss.backward(None if dy is None else _t(dy))
    before = pred.copy()
    value = ours(pred, target)
    loss, backward = ours.vjp(pred, target)
    np.testing.assert_array_equal(value, loss)
    grad = backward() if dy is None else backward(dy)
    np.testing.assert_array_equal(pred, before)           # pred is left untouched
    assert isinstance(loss, np.ndarray) and loss.dtype == pred.dtype
    assert grad.dtype == pred.dtype and grad.shape == pred.shape
    assert loss.shape == tuple(t_loss.shape)
    tol = _tol(pred.dtype)
    assert_close(torch.from_numpy(np.asarray(loss)), t_loss.detach(), **tol)
    assert_close(torch.from_numpy(grad), x.grad, **tol)


def _log_softmax(a, axis):
    a = a - a.max(axis=axis, keepdims=True)
    return a - np.log(np.exp(a).sum(axis=axis, keepdims=True))


# ------------------------------------------------------------------------ NLLLoss
NLL_SHAPES = [(7, 5), (4, 5, 3), (3, 5, 2, 2), (5,)]
NLL_OPTIONS = {
    "plain": {},
    "weight": {"weight": True},
    "ignore": {"ignore_index": -100},
    "ignore_in_range": {"ignore_index": 2},
    "weight+ignore": {"weight": True, "ignore_index": 1},
}


def _nll_case(shape, dtype, option, seed=1):
    rng = np.random.default_rng(seed)
    c = shape[1] if len(shape) >= 2 else shape[0]
    pred = _log_softmax(rng.standard_normal(shape), 1 if len(shape) >= 2 else 0).astype(dtype)
    index_shape = shape[:1] + shape[2:] if len(shape) >= 2 else ()
    target = rng.integers(0, c, index_shape)
    kwargs = {}
    if "ignore_index" in option:
        kwargs["ignore_index"] = option["ignore_index"]
        if target.ndim:
            flat = target.reshape(-1)
            flat[::3] = option["ignore_index"]
            flat[1] = 0 if option["ignore_index"] != 0 else 1    # never all ignored
    weight = rng.uniform(0.2, 2.0, c) if option.get("weight") else None
    return pred, target, weight, kwargs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("option", NLL_OPTIONS.values(), ids=NLL_OPTIONS.keys())
@pytest.mark.parametrize("shape", NLL_SHAPES, ids=str)
def test_nll(shape, option, dtype):
    pred, target, weight, kwargs = _nll_case(shape, dtype, option)
    for reduction in REDUCTIONS:
        ours = NLLLoss(weight=weight, reduction=reduction, **kwargs)   # float64 weight: cast
        t_weight = None if weight is None else torch.from_numpy(weight.astype(dtype))
        theirs = torch.nn.NLLLoss(weight=t_weight, reduction=reduction, **kwargs)
        _compare(ours, theirs, pred, target)


def test_nll_weighted_mean_divides_by_target_weights():
    pred = np.log(np.array([[0.5, 0.25, 0.25], [0.1, 0.8, 0.1]]))
    target = np.array([0, 1])
    weight = np.array([2.0, 3.0, 1.0])
    expected = -(2.0 * np.log(0.5) + 3.0 * np.log(0.8)) / 5.0
    np.testing.assert_allclose(NLLLoss(weight=weight)(pred, target), expected, rtol=1e-12)
    np.testing.assert_allclose(NLLLoss(weight=weight).mean_weights(target[:, None]), [2.0, 3.0])


def test_nll_errors():
    pred = np.zeros((3, 4))
    with pytest.raises(ValueError, match=r"NLLLoss\(\): target holds class index 4"):
        NLLLoss()(pred, np.array([0, 1, 4]))
    with pytest.raises(ValueError, match=r"class index -1.*\n.*NLLLoss\(ignore_index=-1\)"):
        NLLLoss()(pred, np.array([0, -1, 2]))
    with pytest.raises(ShapeError, match=r"target shape \(3, 1\).*\n.*squeeze"):
        NLLLoss()(pred, np.zeros((3, 1), np.int64))
    with pytest.raises(ShapeError, match="target shape"):
        NLLLoss()(pred, np.zeros(4, np.int64))
    with pytest.raises(DTypeError, match=r"integer class indices.*\n.*astype\(np.int64\)"):
        NLLLoss()(pred, np.zeros(3))
    with pytest.raises(ShapeError, match=r"weight has shape \(3,\) but pred has C=4"):
        NLLLoss(weight=np.ones(3))(pred, np.zeros(3, np.int64))
    with pytest.raises(ValueError, match="total weight is 0"):
        NLLLoss(ignore_index=0)(pred, np.zeros(3, np.int64))
    with pytest.raises(ValueError, match="empty batch"):
        NLLLoss()(np.zeros((0, 4)), np.zeros(0, np.int64))
    with pytest.raises(DTypeError, match="floating-point"):
        NLLLoss()(np.zeros((3, 4), np.int64), np.zeros(3, np.int64))
    with pytest.raises(ShapeError, match="class dimension"):
        NLLLoss()(np.zeros(()), np.zeros((), np.int64))
    # An ignored entry may hold any value, even one outside [0, C).
    assert NLLLoss(reduction="sum")(pred, np.array([0, -100, 1])) == 0


# ------------------------------------------------------------------------ BCELoss
BCE_SHAPES = [(6,), (5, 4), (2, 3, 4), ()]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weight", [None, "last", "rows"])
@pytest.mark.parametrize("shape", BCE_SHAPES, ids=str)
def test_bce(shape, weight, dtype):
    rng = np.random.default_rng(3)
    pred = rng.uniform(0.02, 0.98, shape).astype(dtype)
    target = rng.uniform(0, 1, shape).astype(dtype)
    w = None
    if weight == "last" and len(shape):
        w = rng.uniform(0.5, 2.0, shape[-1:])
    elif weight == "rows" and len(shape) >= 2:
        w = rng.uniform(0.5, 2.0, shape[:1] + (1,) * (len(shape) - 1))
    for reduction in REDUCTIONS:
        ours = BCELoss(weight=w, reduction=reduction)
        theirs = torch.nn.BCELoss(weight=_t(None if w is None else w.astype(dtype)),
                                  reduction=reduction)
        _compare(ours, theirs, pred, target)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bce_saturated_probabilities_are_clamped(dtype):
    # log clamps at -100 and the gradient's denominator at 1e-12, exactly as torch.
    pred = np.array([0.0, 1.0, 0.0, 1.0, 1e-30, 1 - 1e-7], dtype)
    target = np.array([0.0, 1.0, 1.0, 0.0, 1.0, 0.0], dtype)
    for reduction in REDUCTIONS:
        _compare(BCELoss(reduction=reduction), torch.nn.BCELoss(reduction=reduction),
                 pred, target)


def test_bce_errors():
    with pytest.raises(ValueError, match=r"BCELoss\(\): all elements of pred must be "
                                         r"probabilities.*\n.*BCEWithLogitsLoss"):
        BCELoss()(np.array([0.5, 1.2]), np.array([0.0, 1.0]))
    with pytest.raises(ShapeError, match=r"target shape \(3,\) must equal pred shape \(3, 1\)"):
        BCELoss()(np.full((3, 1), 0.5), np.zeros(3))
    with pytest.raises(ShapeError, match="weight of shape"):
        BCELoss(weight=np.ones(4))(np.full((2, 3), 0.5), np.zeros((2, 3)))
    # Boolean and integer labels are cast to pred's dtype.
    loss = BCELoss()(np.full(2, 0.5, np.float32), np.array([True, False]))
    assert loss.dtype == np.float32


# ------------------------------------------------------------------------ SmoothL1 and Huber
REG_SHAPES = [(6,), (4, 3), (2, 3, 4), ()]


def _regression_case(shape, dtype, seed=4):
    rng = np.random.default_rng(seed)
    pred = (2 * rng.standard_normal(shape)).astype(dtype)
    target = (2 * rng.standard_normal(shape)).astype(dtype)
    if pred.ndim:
        target.reshape(-1)[0] = pred.reshape(-1)[0]       # a zero difference (L1's slope 0)
    return pred, target


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("beta", [1.0, 0.5, 3.0, 0.0])
@pytest.mark.parametrize("shape", REG_SHAPES, ids=str)
def test_smooth_l1(shape, beta, dtype):
    pred, target = _regression_case(shape, dtype)
    for reduction in REDUCTIONS:
        _compare(SmoothL1Loss(reduction=reduction, beta=beta),
                 torch.nn.SmoothL1Loss(reduction=reduction, beta=beta), pred, target)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("delta", [1.0, 0.5, 3.0])
@pytest.mark.parametrize("shape", REG_SHAPES, ids=str)
def test_huber(shape, delta, dtype):
    pred, target = _regression_case(shape, dtype)
    for reduction in REDUCTIONS:
        _compare(HuberLoss(reduction=reduction, delta=delta),
                 torch.nn.HuberLoss(reduction=reduction, delta=delta), pred, target)


@pytest.mark.parametrize("dtype", DTYPES)
def test_smooth_l1_and_huber_at_the_threshold(dtype):
    # |d| exactly beta/delta: the quadratic and linear pieces meet; the slope is ±1 (±delta).
    pred = np.array([1.0, -1.0, 2.0, -2.0, 0.0], dtype)
    target = np.zeros(5, dtype)
    for k in (1.0, 2.0):
        _compare(SmoothL1Loss(beta=k, reduction="sum"),
                 torch.nn.SmoothL1Loss(beta=k, reduction="sum"), pred, target)
        _compare(HuberLoss(delta=k, reduction="sum"),
                 torch.nn.HuberLoss(delta=k, reduction="sum"), pred, target)


def test_smooth_l1_and_huber_errors():
    with pytest.raises(ValueError, match="beta must be >= 0"):
        SmoothL1Loss(beta=-1.0)
    with pytest.raises(ValueError, match="delta must be > 0"):
        HuberLoss(delta=0.0)
    for loss in (SmoothL1Loss(), HuberLoss()):
        with pytest.raises(ShapeError, match=r"target shape \(5,\) must equal pred shape"):
            loss(np.zeros((5, 1)), np.zeros(5))
        with pytest.raises(DTypeError, match="floating-point"):
            loss(np.zeros(3, np.int64), np.zeros(3))
        with pytest.raises(ValueError, match="empty batch"):
            loss(np.zeros(0), np.zeros(0))


# ------------------------------------------------------------------------ KLDivLoss
KL_SHAPES = [(5, 4), (3, 4, 2), (6,), ()]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("log_target", [False, True])
@pytest.mark.parametrize("shape", KL_SHAPES, ids=str)
def test_kl_div(shape, log_target, dtype):
    rng = np.random.default_rng(5)
    axis = 1 if len(shape) >= 2 else 0
    if len(shape):
        pred = _log_softmax(rng.standard_normal(shape), axis).astype(dtype)
        logq = _log_softmax(rng.standard_normal(shape), axis)
    else:
        pred, logq = np.asarray(-0.7, dtype), np.asarray(-0.3)
    target = logq if log_target else np.exp(logq)
    if not log_target and target.ndim:
        target.reshape(-1)[0] = 0.0                       # 0 log 0 = 0
    target = target.astype(dtype)
    for reduction in REDUCTIONS + ["batchmean"]:
        _compare(KLDivLoss(reduction=reduction, log_target=log_target),
                 torch.nn.KLDivLoss(reduction=reduction, log_target=log_target), pred, target)


def test_kl_div_batchmean_is_the_per_sample_divergence():
    p = np.array([[0.5, 0.5], [0.9, 0.1]])
    q = np.array([[0.25, 0.75], [0.5, 0.5]])
    expected = (p * np.log(p / q)).sum() / 2
    np.testing.assert_allclose(KLDivLoss("batchmean")(np.log(q), p), expected, rtol=1e-12)
    assert repr(KLDivLoss("batchmean", log_target=True)) == \
        "KLDivLoss(reduction='batchmean', log_target=True)"


def test_kl_div_errors():
    with pytest.raises(ValueError, match="'batchmean'"):
        KLDivLoss(reduction="avg")
    with pytest.raises(ShapeError, match=r"target shape \(4,\) must equal pred shape \(2, 4\)"):
        KLDivLoss()(np.zeros((2, 4)), np.full(4, 0.25))
    with pytest.raises(ValueError, match="empty batch"):
        KLDivLoss("batchmean")(np.zeros((0, 3)), np.zeros((0, 3)))
    with pytest.raises(ValueError, match="empty batch"):
        KLDivLoss()(np.zeros((0, 3)), np.zeros((0, 3)))


# ------------------------------------------------------------------------ property test
@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple),
       seed=st.integers(0, 2**16), name=st.sampled_from(["smooth_l1", "huber", "bce", "kl",
                                                          "nll"]),
       reduction=st.sampled_from(REDUCTIONS))
def test_property_matches_torch_float64(shape, seed, name, reduction):
    rng = np.random.default_rng(seed)
    if name == "nll":
        if len(shape) == 1:
            shape = (shape[0], 3)
        pred, target, weight, _ = _nll_case(shape, np.float64, {"weight": True}, seed)
        ours = NLLLoss(weight=weight, reduction=reduction)
        theirs = torch.nn.NLLLoss(weight=torch.from_numpy(weight), reduction=reduction)
        _compare(ours, theirs, pred, target, seed=seed)
        return
    pred = rng.standard_normal(shape)
    target = rng.standard_normal(shape)
    if name == "smooth_l1":
        beta = float(rng.uniform(0, 2))
        ours, theirs = SmoothL1Loss(reduction, beta), torch.nn.SmoothL1Loss(reduction=reduction,
                                                                            beta=beta)
    elif name == "huber":
        delta = float(rng.uniform(0.1, 2))
        ours, theirs = HuberLoss(reduction, delta), torch.nn.HuberLoss(reduction=reduction,
                                                                       delta=delta)
    elif name == "bce":
        pred, target = 1 / (1 + np.exp(-pred)), rng.uniform(0, 1, shape)
        ours, theirs = BCELoss(reduction=reduction), torch.nn.BCELoss(reduction=reduction)
    else:
        target = np.abs(target)
        ours, theirs = KLDivLoss(reduction), torch.nn.KLDivLoss(reduction=reduction)
    _compare(ours, theirs, pred, target, seed=seed)


@pytest.mark.parametrize("name", ["CrossEntropyLoss", "NLLLoss"])
@pytest.mark.parametrize("target, bad", [([0, 1, 4], 4), ([0, -1, 2], -1), ([7, 9, 8], 7),
                                         ([[0, 1], [4, 1], [0, 0]], 4)])
def test_an_out_of_range_class_index_is_a_public_index_error_as_in_torch(name, target, bad):
    import linearkit as lk

    target = np.array(target)
    pred = np.zeros((3, 4) if target.ndim == 1 else (3, 4, 2))
    with pytest.raises(IndexError, match=f"Target {bad} is out of bounds"):  # torch's type
        getattr(torch.nn, name)()(torch.from_numpy(pred), torch.from_numpy(target))
    with pytest.raises(lk.ClassIndexError) as err:
        getattr(lk, name)()(pred, target)
    assert isinstance(err.value, IndexError) and isinstance(err.value, ValueError)
    assert f"class index {bad}" in str(err.value) and "valid: 0..3" in str(err.value)
    assert str(err.value).startswith(f"{name}(): ")
    assert lk.ClassIndexError.__module__ == "linearkit.errors"
    getattr(lk, name)(ignore_index=bad)(pred, np.where(target == bad, bad, 0))  # ignored: fine
