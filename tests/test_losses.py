"""Losses against PyTorch: forward value and input gradient, every option and reduction."""

from __future__ import annotations

import numpy as np
import pytest

import linearkit as lk
from linearkit.errors import DTypeError, ShapeError

torch = pytest.importorskip("torch")
from torch.testing import assert_close

DTYPES = [np.float32, np.float64]
REDUCTIONS = ["mean", "sum", "none"]


def _t(a):
    return None if a is None else torch.from_numpy(np.array(a))


def _ours(loss_fn, pred, target, dy):
    """Our (loss, dpred); checks forward() agrees with vjp() and that pred is left untouched."""
    before = pred.copy()
    value = loss_fn(pred, target)
    loss, backward = loss_fn.vjp(pred, target)
    np.testing.assert_array_equal(value, loss)
    grad = backward() if dy is None else backward(dy)
    np.testing.assert_array_equal(pred, before)
    assert isinstance(loss, np.ndarray) and loss.dtype == pred.dtype
    assert grad.dtype == pred.dtype and grad.shape == pred.shape
    return loss, grad


def _torch(module, pred, target, dy):
    x = torch.from_numpy(pred.copy()).requires_grad_(True)
    loss = module(x, _t(target))
    loss.backward(None if dy is None else _t(dy))
    return loss.detach(), x.grad


def _compare(ours_fn, torch_fn, pred, target, *, dy_seed=0):
    dy = None
    if ours_fn.reduction == "none":
        shape = torch_fn(torch.from_numpy(pred), _t(target)).shape
        dy = np.random.default_rng(dy_seed).standard_normal(tuple(shape)).astype(pred.dtype)
    loss, grad = _ours(ours_fn, pred, target, dy)
    t_loss, t_grad = _torch(torch_fn, pred, target, dy)
    assert loss.shape == tuple(t_loss.shape)
    assert_close(torch.from_numpy(np.asarray(loss)), t_loss)
    assert_close(torch.from_numpy(grad), t_grad)


# ------------------------------------------------------------------------ CrossEntropyLoss
CE_SHAPES = [(7, 5), (4, 5, 3), (3, 5, 2, 2), (5,)]
CE_OPTIONS = {
    "plain": {},
    "weight": {"weight": True},
    "ignore": {"ignore": -100},
    "ignore_in_range": {"ignore": 2},
    "smoothing": {"label_smoothing": 0.2},
    "weight+smoothing": {"weight": True, "label_smoothing": 0.3},
    "all": {"weight": True, "ignore": -100, "label_smoothing": 0.15},
}


def _ce_pair(option: dict, dtype, c: int):
    rng = np.random.default_rng(1)
    kwargs = {}
    weight = rng.uniform(0.2, 2.0, c) if option.get("weight") else None
    if option.get("label_smoothing"):
        kwargs["label_smoothing"] = option["label_smoothing"]
    if "ignore" in option:
        kwargs["ignore_index"] = option["ignore"]
    ours = lk.CrossEntropyLoss(weight=weight, **kwargs)  # float64 weight: cast to pred's dtype
    theirs_weight = None if weight is None else torch.tensor(weight, dtype=_torch_dtype(dtype))
    return ours, kwargs, theirs_weight


def _torch_dtype(dtype):
    return torch.float32 if np.dtype(dtype) == np.float32 else torch.float64


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("option", list(CE_OPTIONS))
@pytest.mark.parametrize("shape", CE_SHAPES, ids=str)
def test_cross_entropy_class_indices(shape, option, dtype):
    option = CE_OPTIONS[option]
    c = shape[1] if len(shape) > 1 else shape[0]
    rng = np.random.default_rng(len(shape))
    pred = (rng.standard_normal(shape) * 3).astype(dtype)
    index_shape = shape[:1] + shape[2:] if len(shape) > 1 else ()
    target = rng.integers(0, c, index_shape)
    if "ignore" in option and target.ndim:
        flat = target.reshape(-1)
        flat[::3] = option["ignore"]          # several ignored entries, never all of them
        flat[1] = 0 if option["ignore"] != 0 else 1
    elif "ignore" in option and target == option["ignore"]:
        target = (target + 1) % c
    _compare_reductions(option, dtype, c, pred, target)


def _compare_reductions(option, dtype, c, pred, target):
    for reduction in REDUCTIONS:
        ours, kwargs, weight = _ce_pair(option, dtype, c)
        ours.reduction = reduction
        theirs = torch.nn.CrossEntropyLoss(weight=weight, reduction=reduction, **kwargs)
        _compare(ours, theirs, pred, target)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("option", ["plain", "weight", "smoothing", "weight+smoothing"])
@pytest.mark.parametrize("shape", CE_SHAPES, ids=str)
def test_cross_entropy_probabilities(shape, option, dtype):
    option = CE_OPTIONS[option]
    c = shape[1] if len(shape) > 1 else shape[0]
    rng = np.random.default_rng(7)
    pred = (rng.standard_normal(shape) * 2).astype(dtype)
    axis = 1 if len(shape) > 1 else 0
    raw = rng.uniform(0, 1, shape)
    target = (raw / raw.sum(axis=axis, keepdims=True)).astype(dtype)
    _compare_reductions(option, dtype, c, pred, target)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["indices", "probabilities", "smoothing"])
def test_cross_entropy_large_logits_stay_finite(kind, dtype):
    rng = np.random.default_rng(3)
    pred = (rng.standard_normal((6, 4)) * 1e4).astype(dtype)
    pred[0] = [1e4, -1e4, 0.0, 1e4]
    if kind == "probabilities":
        target = rng.dirichlet(np.ones(4), 6).astype(dtype)
    else:
        target = rng.integers(0, 4, 6)
    smoothing = 0.1 if kind == "smoothing" else 0.0
    for reduction in REDUCTIONS:
        ours = lk.CrossEntropyLoss(reduction=reduction, label_smoothing=smoothing)
        theirs = torch.nn.CrossEntropyLoss(reduction=reduction, label_smoothing=smoothing)
        _compare(ours, theirs, pred, target)
        loss, grad = _ours(ours, pred, target,
                           np.ones(6, dtype) if reduction == "none" else None)
        assert np.isfinite(loss).all() and np.isfinite(grad).all()


def test_cross_entropy_upstream_gradient_scales():
    rng = np.random.default_rng(0)
    pred = rng.standard_normal((5, 3)).astype(np.float32)
    target = rng.integers(0, 3, 5)
    fn = lk.CrossEntropyLoss()
    g1 = fn.vjp(pred, target)[1]()
    g2 = fn.vjp(pred, target)[1](np.float32(2.5))
    np.testing.assert_allclose(g2, 2.5 * g1, rtol=1e-6)
    assert g2.dtype == np.float32


def test_cross_entropy_accepts_any_integer_dtype_and_lists():
    pred = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    ref = lk.CrossEntropyLoss()(pred, np.array([0, 2, 1, 1]))
    for target in (np.array([0, 2, 1, 1], np.int32), np.array([0, 2, 1, 1], np.uint8),
                   [0, 2, 1, 1]):
        np.testing.assert_array_equal(lk.CrossEntropyLoss()(pred, target), ref)


# ------------------------------------------------------------------------ MSE and L1
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["MSELoss", "L1Loss"])
@pytest.mark.parametrize("shape", [(6,), (4, 3), (2, 3, 4), ()], ids=str)
def test_regression_losses(shape, name, dtype):
    rng = np.random.default_rng(2)
    pred = rng.standard_normal(shape).astype(dtype)
    target = rng.standard_normal(shape).astype(dtype)
    if pred.ndim:
        target.reshape(-1)[0] = pred.reshape(-1)[0]   # L1's gradient at a zero difference is 0
    for reduction in REDUCTIONS:
        ours = getattr(lk, name)(reduction=reduction)
        theirs = getattr(torch.nn, name)(reduction=reduction)
        _compare(ours, theirs, pred, target)


def test_regression_target_is_cast_to_pred_dtype():
    pred = np.array([1.0, 2.0, 3.0], np.float32)
    for target in (np.array([0.0, 2.0, 5.0]), np.array([0, 2, 5]), [0, 2, 5]):
        loss, back = lk.MSELoss().vjp(pred, target)
        assert loss.dtype == np.float32 and back().dtype == np.float32
        np.testing.assert_allclose(loss, 5.0 / 3.0, rtol=1e-6)


def test_regression_losses_large_values():
    pred = np.array([1e4, -1e4, 3.0], np.float32)
    target = np.array([-1e4, 1e4, 3.0], np.float32)
    for name in ("MSELoss", "L1Loss"):
        _compare(getattr(lk, name)(), getattr(torch.nn, name)(), pred, target)


# ------------------------------------------------------------------------ BCEWithLogitsLoss
BCE_OPTIONS = {
    "plain": {},
    "weight_C": {"weight": (4,)},
    "weight_N1": {"weight": (5, 1)},
    "pos_weight": {"pos_weight": (4,)},
    "both": {"weight": (4,), "pos_weight": (4,)},
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("option", list(BCE_OPTIONS))
def test_bce_with_logits(option, dtype):
    rng = np.random.default_rng(4)
    pred = (rng.standard_normal((5, 4)) * 3).astype(dtype)
    target = rng.uniform(0, 1, (5, 4)).astype(dtype)
    target[0] = [0, 1, 0, 1]
    arrays = {k: rng.uniform(0.2, 3.0, shape) for k, shape in BCE_OPTIONS[option].items()}
    for reduction in REDUCTIONS:
        ours = lk.BCEWithLogitsLoss(reduction=reduction, **arrays)
        theirs = torch.nn.BCEWithLogitsLoss(
            reduction=reduction, **{k: torch.tensor(v, dtype=_torch_dtype(dtype))
                                    for k, v in arrays.items()})
        _compare(ours, theirs, pred, target)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pos_weight", [False, True])
def test_bce_with_logits_large_logits(pos_weight, dtype):
    pred = np.array([[1e4, -1e4, 1e4, -1e4, 50.0, -50.0]], dtype)
    target = np.array([[1, 0, 0, 1, 0.5, 0.5]], dtype)
    pw = np.linspace(0.5, 3, 6) if pos_weight else None
    for reduction in REDUCTIONS:
        ours = lk.BCEWithLogitsLoss(reduction=reduction, pos_weight=pw)
        theirs = torch.nn.BCEWithLogitsLoss(
            reduction=reduction,
            pos_weight=None if pw is None else torch.tensor(pw, dtype=_torch_dtype(dtype)))
        _compare(ours, theirs, pred, target)


def test_bce_accepts_boolean_and_integer_labels():
    pred = np.array([0.3, -1.2, 2.0], np.float32)
    ref = lk.BCEWithLogitsLoss()(pred, np.array([1.0, 0.0, 1.0], np.float32))
    for target in (np.array([True, False, True]), np.array([1, 0, 1])):
        np.testing.assert_array_equal(lk.BCEWithLogitsLoss()(pred, target), ref)


# ------------------------------------------------------------------------ empty batches
def test_empty_batch_mean_raises_and_sum_none_are_empty():
    pred = np.zeros((0, 3), np.float32)
    cases = [(lk.CrossEntropyLoss, np.zeros(0, np.int64)),
             (lk.MSELoss, np.zeros((0, 3), np.float32)),
             (lk.L1Loss, np.zeros((0, 3), np.float32)),
             (lk.BCEWithLogitsLoss, np.zeros((0, 3), np.float32))]
    for cls, target in cases:
        with pytest.raises(ValueError, match=r"empty batch.*\n.*hint: skip empty batches"):
            cls()(pred, target)
        with pytest.raises(ValueError, match="empty batch"):
            cls().vjp(pred, target)
        loss, back = cls(reduction="sum").vjp(pred, target)
        assert loss.shape == () and loss == 0 and loss.dtype == np.float32
        grad = back()
        assert grad.shape == (0, 3) and grad.dtype == np.float32
        loss, back = cls(reduction="none").vjp(pred, target)
        assert loss.size == 0
        assert back(np.zeros(loss.shape, np.float32)).shape == (0, 3)


def test_all_targets_ignored_raises_for_mean():
    pred = np.zeros((3, 4), np.float32)
    with pytest.raises(ValueError, match="total weight is 0.*ignore_index"):
        lk.CrossEntropyLoss()(pred, np.full(3, -100))
    with pytest.raises(ValueError, match="total weight is 0"):
        lk.CrossEntropyLoss(weight=np.array([0.0, 0, 1, 1]))(pred, np.array([0, 1, 0]))
    loss, back = lk.CrossEntropyLoss(reduction="sum").vjp(pred, np.full(3, -100))
    assert loss == 0 and not back().any()


# ------------------------------------------------------------------------ errors
def test_cross_entropy_float_indices_error():
    pred = np.zeros((4, 3), np.float32)
    with pytest.raises(DTypeError, match=r"CrossEntropyLoss.*class indices.*\n.*astype\(np.int64"):
        lk.CrossEntropyLoss()(pred, np.array([0.0, 1.0, 2.0, 1.0]))


def test_cross_entropy_one_hot_integer_error():
    pred = np.zeros((4, 3), np.float32)
    with pytest.raises(DTypeError, match=r"one-hot.*argmax\(axis=1\)"):
        lk.CrossEntropyLoss()(pred, np.eye(3, dtype=np.int64)[[0, 1, 2, 1]])


@pytest.mark.parametrize("target, match", [
    (np.zeros((4, 1), np.int64), r"shape \(4, 1\)[\s\S]*target.reshape\(-1\)"),
    (np.zeros(3, np.int64), r"expected class indices \(integer, shape \(4,\)\)"),
    (np.zeros((4, 3, 2), np.float32), r"class probabilities \(float, shape \(4, 3\)"),
])
def test_cross_entropy_target_shape_errors(target, match):
    with pytest.raises(ShapeError, match=match):
        lk.CrossEntropyLoss()(np.zeros((4, 3), np.float32), target)


def test_cross_entropy_channels_last_hint():
    with pytest.raises(ShapeError, match=r"class dimension must be dim 1.*moveaxis"):
        lk.CrossEntropyLoss()(np.zeros((2, 7, 5), np.float32), np.zeros((2, 7), np.int64))


def test_cross_entropy_one_logit_per_sample_hint():
    with pytest.raises(ShapeError, match="BCEWithLogitsLoss"):
        lk.CrossEntropyLoss()(np.zeros(4, np.float32), np.zeros(4, np.int64))


def test_cross_entropy_out_of_range_errors():
    pred = np.zeros((3, 4), np.float32)
    with pytest.raises(ValueError, match=r"CrossEntropyLoss\(\): target holds class index 7, "
                                         r"but pred has C=4 classes.*\n.*out_features=8"):
        lk.CrossEntropyLoss()(pred, np.array([0, 7, 1]))
    with pytest.raises(ValueError, match=r"class index 4.*\n.*1-based: pass target - 1"):
        lk.CrossEntropyLoss()(pred, np.array([1, 4, 2]))
    with pytest.raises(ValueError, match=r"class index -1.*\n.*ignore_index=-1"):
        lk.CrossEntropyLoss()(pred, np.array([0, -1, 2]))
    # ignore_index outside [0, C) is fine, and so is any ignored value
    lk.CrossEntropyLoss(ignore_index=-1)(pred, np.array([0, -1, 2]))
    lk.CrossEntropyLoss(ignore_index=9)(pred, np.array([0, 9, 2]))


def test_cross_entropy_weight_and_argument_errors():
    pred = np.zeros((3, 4), np.float32)
    with pytest.raises(ShapeError, match=r"weight has shape \(3,\) but pred has C=4"):
        lk.CrossEntropyLoss(weight=np.ones(3))(pred, np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="label_smoothing must be in"):
        lk.CrossEntropyLoss(label_smoothing=1.5)
    with pytest.raises(ValueError, match="reduction must be"):
        lk.CrossEntropyLoss(reduction="avg")
    with pytest.raises(DTypeError, match="pred must be a floating-point"):
        lk.CrossEntropyLoss()(np.zeros((3, 4), np.int64), np.array([0, 1, 2]))


def test_regression_shape_mismatch_error_names_the_fix():
    with pytest.raises(ShapeError, match=r"MSELoss\(\): target shape \(5,\) must equal pred "
                                         r"shape \(5, 1\)[\s\S]*target.reshape\(pred.shape\)"):
        lk.MSELoss()(np.zeros((5, 1), np.float32), np.zeros(5, np.float32))
    with pytest.raises(ShapeError, match="BCEWithLogitsLoss"):
        lk.BCEWithLogitsLoss()(np.zeros((5, 2), np.float32), np.zeros(5, np.float32))
    with pytest.raises(ShapeError, match=r"pos_weight of shape \(3,\) does not broadcast"):
        lk.BCEWithLogitsLoss(pos_weight=np.ones(3))(np.zeros((5, 2)), np.zeros((5, 2)))


def test_none_reduction_needs_dy_and_backward_runs_once():
    pred = np.zeros((2, 3), np.float32)
    _, back = lk.CrossEntropyLoss(reduction="none").vjp(pred, np.array([0, 1]))
    with pytest.raises(ValueError, match="needs dy for reduction='none'"):
        back()
    _, back = lk.MSELoss().vjp(pred, pred)
    back()
    with pytest.raises(lk.BackwardError):
        back()
    _, back = lk.CrossEntropyLoss().vjp(pred, np.array([0, 1]))
    with pytest.raises(ShapeError, match="dy must have the output's shape"):
        back(np.ones(2, np.float32))


def test_state_dict_and_repr_follow_pytorch():
    w = np.array([1.0, 2.0, 3.0], np.float32)
    assert list(lk.CrossEntropyLoss(weight=w).state_dict()) == ["weight"]
    assert list(lk.BCEWithLogitsLoss(pos_weight=w).state_dict()) == ["pos_weight"]
    assert repr(lk.CrossEntropyLoss()) == "CrossEntropyLoss()"
    assert repr(lk.MSELoss(reduction="sum")) == "MSELoss(reduction='sum')"
