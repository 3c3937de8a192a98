"""Gradient accumulation: k micro-batches give the full batch's gradient (float64, 1e-12).

Also: uneven splits, CrossEntropyLoss weights and ignore_index, sum reductions, the scaler
(unscaled once per window) and clipping, torch's documented accumulation recipe as an oracle,
the forgotten division (k times the gradient), and what BatchNorm's batch statistics change.
"""

from __future__ import annotations

import numpy as np
import pytest

import linearkit as lk
from linearkit.optim import clip_grad_norm_
from linearkit.training.accumulation import accumulate, accumulated_step, micro_batch_slices
from linearkit.training.amp import GradScaler
from linearkit.training.loop import step

TOL = {"rtol": 1e-12, "atol": 1e-12}
N = 20


def _mlp(dtype=np.float64, out=3, seed=0):
    rng = np.random.default_rng(seed)
    return lk.Sequential(lk.Linear(5, 8, dtype=dtype, rng=rng), lk.Tanh(),
                         lk.Linear(8, out, dtype=dtype, rng=rng))


def _data(dtype=np.float64, seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((N, 5)).astype(dtype), rng.integers(0, 3, N)


def _full_grads(model, loss_fn, x, y):
    pred, back = model.vjp(x, input_grad=False)
    loss, loss_back = loss_fn.vjp(pred, y)
    back(loss_back())
    return float(loss), [p.grad.copy() for p in model.parameters()]


def _accumulated_grads(model, loss_fn, x, y, k, **kwargs):
    loss = accumulate(model, loss_fn, x, y, micro_batches=k, **kwargs)
    return loss, [p.grad.copy() for p in model.parameters()]


WEIGHTED = lk.CrossEntropyLoss(weight=np.array([0.2, 1.0, 3.0]), ignore_index=1)
LOSSES = {
    "ce": (lk.CrossEntropyLoss, lambda y: y),
    "ce_weight_ignore_smoothing": (lambda: lk.CrossEntropyLoss(
        weight=np.array([0.2, 1.0, 3.0]), ignore_index=1, label_smoothing=0.1), lambda y: y),
    "ce_probabilities": (lk.CrossEntropyLoss, lambda y: np.eye(3)[y] * 0.8 + 0.2 / 3),
    "mse": (lk.MSELoss, lambda y: np.eye(3)[y]),
    "bce": (lk.BCEWithLogitsLoss, lambda y: np.eye(3)[y]),
    "l1_sum": (lambda: lk.L1Loss(reduction="sum"), lambda y: np.eye(3)[y]),
    "ce_sum": (lambda: lk.CrossEntropyLoss(reduction="sum"), lambda y: y),
}


@pytest.mark.parametrize("k", [1, 2, 3, 7, N])
@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_gradients_equal_the_full_batch_in_float64(loss, k):
    make, target = LOSSES[loss]
    x, labels = _data()
    y = target(labels)
    full_loss, full = _full_grads(_mlp(), make(), x, y)
    acc_loss, acc = _accumulated_grads(_mlp(), make(), x, y, k)
    assert acc_loss == pytest.approx(full_loss, rel=1e-12, abs=1e-12)
    for a, b in zip(acc, full):
        np.testing.assert_allclose(a, b, **TOL)


def test_uneven_splits_are_weighted_by_their_rows():
    assert [s.stop - s.start for s in micro_batch_slices(20, 7)] == [3, 3, 3, 3, 3, 3, 2]
    assert [s.stop - s.start for s in micro_batch_slices(5, 5)] == [1] * 5
    # the naive mean of micro-batch means (equal weights) is not the full batch's gradient
    x, y = _data()
    _, full = _full_grads(_mlp(), lk.CrossEntropyLoss(), x, y)
    naive = _mlp()
    for rows in micro_batch_slices(N, 3):                       # 7, 7, 6 rows
        pred, back = naive.vjp(x[rows], input_grad=False)
        back(lk.CrossEntropyLoss().vjp(pred, y[rows])[1](1 / 3))
    assert not np.allclose(naive[0].weight.grad, full[0], **TOL)


def test_a_micro_batch_whose_targets_are_all_ignored_adds_nothing():
    x, y = _data()
    y = y.copy()
    y[:4] = 1                                   # ignore_index: micro-batch 0 has no target
    loss_fn = lk.CrossEntropyLoss(ignore_index=1)
    with pytest.raises(ValueError, match="undefined"):          # its own mean is undefined
        loss_fn(_mlp()(x[:4]), y[:4])
    full_loss, full = _full_grads(_mlp(), loss_fn, x, y)
    acc_loss, acc = _accumulated_grads(_mlp(), loss_fn, x, y, 5)
    assert acc_loss == pytest.approx(full_loss, rel=1e-12)
    for a, b in zip(acc, full):
        np.testing.assert_allclose(a, b, **TOL)
    with pytest.raises(ValueError, match="zero total weight"):
        accumulate(_mlp(), loss_fn, x, np.ones(N, int), micro_batches=2)


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_weights_after_steps_equal_the_full_batch(optimizer):
    def run(k):
        model = _mlp()
        opt = (lk.optim.Adam(model.parameters(), lr=0.01) if optimizer == "adam"
               else lk.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
        losses = []
        for seed in range(3):
            x, y = _data(seed=seed)
            if k == 0:
                losses.append(step(model, lk.CrossEntropyLoss(), opt, x, y))
            else:
                losses.append(accumulated_step(model, lk.CrossEntropyLoss(), opt, x, y,
                                               micro_batches=k))
        return model, losses

    big, big_losses = run(0)
    for k in (3, 4):
        small, losses = run(k)
        np.testing.assert_allclose(losses, big_losses, **TOL)
        for a, b in zip(small.parameters(), big.parameters()):
            np.testing.assert_allclose(a.data, b.data, **TOL)


def test_one_micro_batch_is_loop_step_bit_for_bit():
    x, y = _data(np.float32)
    a, b = _mlp(np.float32), _mlp(np.float32)
    oa, ob = lk.optim.Adam(a.parameters(), lr=0.01), lk.optim.Adam(b.parameters(), lr=0.01)
    for _ in range(2):
        assert step(a, lk.CrossEntropyLoss(), oa, x, y) == \
            accumulated_step(b, lk.CrossEntropyLoss(), ob, x, y)
    for p, q in zip(a.parameters(), b.parameters()):
        np.testing.assert_array_equal(p.data, q.data)


def test_clipping_clips_the_full_batch_gradient():
    x, y = _data()
    big = _mlp()
    opt = lk.optim.SGD(big.parameters(), lr=0.5)
    pred, back = big.vjp(x, input_grad=False)
    back(lk.CrossEntropyLoss().vjp(pred, y)[1]())
    norm = clip_grad_norm_(big.parameters(), 0.05)
    assert norm > 0.05                                          # it did clip
    opt.step()
    for scaler in (None, GradScaler(init_scale=2.0**20)):
        small = _mlp()
        accumulated_step(small, lk.CrossEntropyLoss(), lk.optim.SGD(small.parameters(), lr=0.5),
                         x, y, micro_batches=3, clip=0.05, scaler=scaler)
        for a, b in zip(small.parameters(), big.parameters()):
            np.testing.assert_allclose(a.data, b.data, **TOL)


def test_the_scaler_is_unscaled_once_per_window_and_skips_on_overflow():
    x, y = _data()
    model = _mlp()
    opt = lk.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler(init_scale=2.0**16, growth_interval=1)
    calls = []
    original = scaler.unscale_
    scaler.unscale_ = lambda o: (calls.append(1), original(o))[1]
    _, clean = _full_grads(_mlp(), lk.CrossEntropyLoss(), x, y)
    loss = accumulate(model, lk.CrossEntropyLoss(), x, y, micro_batches=4, scaler=scaler)
    for p, g in zip(model.parameters(), clean):                  # scaled by exactly 2^16
        np.testing.assert_allclose(p.grad, g * 2.0**16, **TOL)
    opt.zero_grad()
    accumulated_step(model, lk.CrossEntropyLoss(), opt, x, y, micro_batches=4, scaler=scaler)
    assert calls == [1] and scaler.get_scale() == 2.0**17        # one unscale_, then growth
    before = [p.data.copy() for p in model.parameters()]
    bad = x.copy()
    bad[-1, 0] = np.inf                                          # poisons the last micro-batch
    with np.errstate(invalid="ignore", over="ignore"):
        returned = accumulated_step(model, lk.CrossEntropyLoss(), opt, bad, y, micro_batches=4,
                                    scaler=scaler, clip=1.0)
    assert np.isfinite(returned)           # tanh saturates: the loss is finite, dW1 is not
    assert scaler.get_scale() == 2.0**16                         # skipped, backed off
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.data, b)
    assert loss == pytest.approx(_full_grads(_mlp(), lk.CrossEntropyLoss(), x, y)[0], rel=1e-12)


def test_float32_with_the_scaler_matches_torchs_accumulation_recipe():
    """torch's recipe: scaler.scale(loss / k).backward() per micro-batch, then unscale_, clip,
    step, update. Equal splits (the recipe's division by k is only right for those)."""
    torch = pytest.importorskip("torch")
    k, steps = 4, 5
    ours = _mlp(np.float32)
    theirs = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    theirs.load_state_dict({n: torch.from_numpy(v.copy()) for n, v in ours.state_dict().items()})
    opt = lk.optim.Adam(ours.parameters(), lr=0.01)
    topt = torch.optim.Adam(theirs.parameters(), lr=0.01)
    scaler = GradScaler(init_scale=2.0**8, growth_interval=2)
    tscaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
    for seed in range(steps):
        x, y = _data(np.float32, seed=seed)
        if seed == 2:
            x[-1, 0] = np.inf                                    # a skipped window
        with np.errstate(invalid="ignore", over="ignore"):
            accumulated_step(ours, lk.CrossEntropyLoss(), opt, x, y, micro_batches=k,
                             scaler=scaler, clip=1.0)
        for rows in micro_batch_slices(N, k):
            out = theirs(torch.from_numpy(x[rows]))
            loss = torch.nn.functional.cross_entropy(out, torch.from_numpy(y[rows]))
            tscaler.scale(loss / k).backward()
        tscaler.unscale_(topt)
        torch.nn.utils.clip_grad_norm_(theirs.parameters(), 1.0)
        tscaler.step(topt)
        tscaler.update()
        topt.zero_grad()
        assert scaler.get_scale() == tscaler.get_scale()
    assert scaler.get_scale() == 2.0**9              # grew (0, 1), backed off (2), grew (3, 4)
    for name, value in ours.state_dict().items():
        np.testing.assert_allclose(value, theirs.state_dict()[name].numpy(), rtol=1e-5,
                                   atol=1e-6)


def test_forgetting_to_divide_gives_k_times_the_gradient():
    """The common pitfall: k mean losses, each backward from 1."""
    k = 4
    x, y = _data()
    _, full = _full_grads(_mlp(), lk.CrossEntropyLoss(), x, y)
    naive = _mlp()
    for rows in micro_batch_slices(N, k):                        # 5 rows each
        pred, back = naive.vjp(x[rows], input_grad=False)
        back(lk.CrossEntropyLoss().vjp(pred, y[rows])[1]())
    for p, g in zip(naive.parameters(), full):
        np.testing.assert_allclose(p.grad, k * g, **TOL)
    # so one SGD step moves the weights k times as far: the learning rate is multiplied by k
    start = [p.data.copy() for p in naive.parameters()]
    lk.optim.SGD(naive.parameters(), lr=0.1).step()
    helped = _mlp()
    accumulated_step(helped, lk.CrossEntropyLoss(), lk.optim.SGD(helped.parameters(), lr=0.1),
                     x, y, micro_batches=k)
    for p, q, s in zip(naive.parameters(), helped.parameters(), start):
        np.testing.assert_allclose(p.data - s, k * (q.data - s), **TOL)


def _bn_model():
    rng = np.random.default_rng(0)
    return lk.Sequential(lk.Linear(5, 6, dtype=np.float64, rng=rng),
                         lk.BatchNorm1d(6, dtype=np.float64), lk.ReLU(),
                         lk.Linear(6, 3, dtype=np.float64, rng=rng))


def test_batchnorm_in_training_mode_sees_micro_batch_statistics():
    """What changes: the loss, the gradients and the running statistics (updated k times)."""
    k = 4
    x, y = _data()
    x = x + np.arange(N)[:, None] / 5.0          # rows differ in mean: micro-batches do too
    big, small = _bn_model(), _bn_model()
    full_loss, full = _full_grads(big, lk.CrossEntropyLoss(), x, y)
    acc_loss, acc = _accumulated_grads(small, lk.CrossEntropyLoss(), x, y, k)
    assert abs(acc_loss - full_loss) > 1e-3
    relative = np.linalg.norm(acc[0] - full[0]) / np.linalg.norm(full[0])
    assert relative > 0.05                       # not rounding: a different gradient
    bn_big, bn_small = big[1], small[1]
    assert int(bn_big.num_batches_tracked) == 1 and int(bn_small.num_batches_tracked) == k
    # the running mean is k momentum updates from micro-batch means, not one from the full mean
    h = x @ big[0].weight.data.T + big[0].bias.data
    np.testing.assert_allclose(bn_big.running_mean, 0.1 * h.mean(0), **TOL)
    expected = np.zeros(6)
    for rows in micro_batch_slices(N, k):
        expected = 0.9 * expected + 0.1 * h[rows].mean(0)
    np.testing.assert_allclose(bn_small.running_mean, expected, **TOL)
    assert not np.allclose(bn_small.running_mean, bn_big.running_mean, rtol=0.01)


def test_batchnorm_in_eval_mode_accumulates_exactly():
    """With fixed (running) statistics the rows are independent again: equality returns."""
    x, y = _data()
    big, small = _bn_model().eval(), _bn_model().eval()
    _, full = _full_grads(big, lk.CrossEntropyLoss(), x, y)
    _, acc = _accumulated_grads(small, lk.CrossEntropyLoss(), x, y, 3)
    for a, b in zip(acc, full):
        np.testing.assert_allclose(a, b, **TOL)


@pytest.mark.parametrize("kwargs, match", [
    ({"micro_batches": 21}, r"micro_batches=21 is more than the batch's 20 rows"),
    ({"micro_batches": 0}, "micro_batches must be an int >= 1"),
    ({"micro_batches": True}, "micro_batches must be an int >= 1"),
    ({"micro_batches": 2.0}, "micro_batches must be an int >= 1"),
    ({"micro_batches": 2, "y": np.zeros(19, int)}, "same number of rows"),
    ({"micro_batches": 1, "x": np.zeros((0, 5)), "y": np.zeros(0, int)}, "0 rows"),
    ({"micro_batches": 2, "loss_fn": lk.CrossEntropyLoss(reduction="none")},
     "reduction='mean' or 'sum'"),
    ({"micro_batches": 2, "loss_fn": lk.ReLU()}, "reduction='mean' or 'sum'"),
])
def test_misuse_is_refused_clearly(kwargs, match):
    x, y = _data()
    args = {"x": x, "y": y, "loss_fn": lk.CrossEntropyLoss(), **kwargs}
    with pytest.raises(ValueError, match=match):
        accumulate(_mlp(), args["loss_fn"], args["x"], args["y"],
                   micro_batches=args["micro_batches"])


@pytest.mark.parametrize("clip", [0.0, -1.0, float("nan"), float("inf"), True, "1"])
def test_bad_clip_is_refused_before_any_work(clip):
    x, y = _data()
    model = _mlp()
    with pytest.raises(ValueError, match="clip is clip_grad_norm_'s max_norm"):
        accumulated_step(model, lk.CrossEntropyLoss(), lk.optim.SGD(model.parameters(), lr=0.1),
                         x, y, micro_batches=2, clip=clip)
    assert all(p.grad is None for p in model.parameters())
