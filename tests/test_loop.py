"""linearkit.training.loop: step equals the hand-written four lines; evaluate equals a hand computation."""

import numpy as np
import pytest

import linearkit as lk
from linearkit.training.loop import evaluate, step


def readme_model():
    lk.manual_seed(0)
    return lk.Sequential(lk.Linear(40, 100), lk.ReLU(),
                         lk.Residual(lk.Sequential(lk.Linear(100, 100), lk.ReLU())),
                         lk.Linear(100, 10))


def batches(n=3, rows=100):
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((rows, 40)).astype(np.float32), rng.integers(0, 10, rows))
            for _ in range(n)]


@pytest.mark.parametrize("set_to_none", [False, True])
def test_step_equals_the_readme_step_bit_for_bit(set_to_none):
    a, b = readme_model(), readme_model()
    loss_fn = lk.CrossEntropyLoss()
    opt_a = lk.optim.Adam(a.parameters(), lr=1e-2)
    opt_b = lk.optim.Adam(b.parameters(), lr=1e-2)
    for x, target in batches():
        pred, backward = b.vjp(x, input_grad=False)
        loss, loss_backward = loss_fn.vjp(pred, target)
        backward(loss_backward())
        opt_b.step()
        opt_b.zero_grad(set_to_none=set_to_none)

        got = step(a, loss_fn, opt_a, x, target, set_to_none=set_to_none)
        assert type(got) is float and got == float(loss)
    for (k, v), (_, u) in zip(a.state_dict().items(), b.state_dict().items()):
        np.testing.assert_array_equal(v, u, err_msg=k)
    for p, q in zip(a.parameters(), b.parameters()):
        if set_to_none:
            assert p.grad is None and q.grad is None
        else:
            np.testing.assert_array_equal(p.grad, 0)
            np.testing.assert_array_equal(q.grad, 0)


def test_step_keeps_the_callers_mode():
    model = lk.Sequential(lk.Linear(4, 4), lk.Dropout(0.5))
    opt = lk.optim.SGD(model.parameters(), lr=0.1)
    x, y = np.ones((8, 4), np.float32), np.zeros((8, 4), np.float32)
    step(model, lk.MSELoss(), opt, x, y)
    assert model.training and model[1].training
    model.eval()
    step(model, lk.MSELoss(), opt, x, y)
    assert not model.training and not model[1].training


def test_evaluate_equals_the_hand_computation():
    model = readme_model()
    loss_fn = lk.CrossEntropyLoss()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((250, 40)).astype(np.float32)
    y = rng.integers(0, 10, 250)
    pred = model(x)
    got = evaluate(model, x, y, batch_size=64, loss_fn=loss_fn)
    batched = np.concatenate([model(x[i:i + 64]) for i in range(0, 250, 64)])
    assert got["accuracy"] == np.mean(batched.argmax(axis=1) == y)
    # batch means weighted by batch length: 64, 64, 64, 58 rows
    by_hand = sum(float(loss_fn(model(x[i:i + 64]), y[i:i + 64])) * len(y[i:i + 64])
                  for i in range(0, 250, 64)) / 250
    assert got["loss"] == by_hand
    assert got["loss"] == pytest.approx(float(loss_fn(pred, y)), rel=1e-6)
    one_batch = evaluate(model, x, y, loss_fn=loss_fn)
    assert one_batch["accuracy"] == got["accuracy"]
    assert one_batch["loss"] == float(loss_fn(pred, y))
    assert evaluate(model, x, y) == {"accuracy": got["accuracy"], "loss": None}


def test_evaluate_regression_target_has_no_accuracy():
    model = lk.Sequential(lk.Linear(3, 2, rng=np.random.default_rng(0)))
    x = np.ones((5, 3), np.float32)
    y = np.zeros((5, 2), np.float32)
    got = evaluate(model, x, y, loss_fn=lk.MSELoss(), batch_size=2)
    assert got["accuracy"] is None
    assert got["loss"] == pytest.approx(float(lk.MSELoss()(model(x), y)), rel=1e-6)


def test_evaluate_runs_in_eval_mode_and_restores_every_mode():
    rng = np.random.default_rng(0)
    model = lk.Sequential(lk.Linear(6, 8, rng=rng), lk.BatchNorm1d(8), lk.ReLU(),
                          lk.Dropout(0.5), lk.Linear(8, 3, rng=rng))
    x = rng.standard_normal((40, 6)).astype(np.float32)
    y = rng.integers(0, 3, 40)
    model.train()
    model(x)  # give BatchNorm running statistics that differ from a batch's
    model[3].eval()  # a mixed tree: restored as it was, not to all-train
    before = {k: np.copy(v) for k, v in model.state_dict().items()}
    modes = [m.training for m in model.modules()]

    got = evaluate(model, x, y, batch_size=7, loss_fn=lk.CrossEntropyLoss())

    assert [m.training for m in model.modules()] == modes
    for k, v in model.state_dict().items():  # running stats not updated by the pass
        np.testing.assert_array_equal(v, before[k], err_msg=k)
    model.eval()
    pred = model(x)  # Dropout off, BatchNorm on running stats: deterministic
    assert got["accuracy"] == np.mean(pred.argmax(axis=1) == y)
    assert got["loss"] == pytest.approx(float(lk.CrossEntropyLoss()(pred, y)), rel=1e-6)


def test_evaluate_restores_modes_when_the_pass_raises():
    model = lk.Sequential(lk.Linear(4, 3), lk.Dropout(0.1))
    model.train()
    with pytest.raises(lk.ShapeError):
        evaluate(model, np.ones((3, 5), np.float32), np.zeros(3, np.int64))
    assert model.training and model[1].training


@pytest.mark.parametrize("x, y, kwargs, match", [
    (np.zeros((0, 4), np.float32), np.zeros(0, np.int64), {}, "0 rows"),
    (np.zeros((3, 4), np.float32), np.zeros(2, np.int64), {}, "same number of rows"),
    (np.zeros((3, 4), np.float32), np.zeros(3, np.int64), {"batch_size": 0}, "batch_size"),
    (np.zeros((3, 4), np.float32), np.zeros(3, np.int64), {"batch_size": 2.0}, "batch_size"),
    (np.zeros((3, 4), np.float32), np.zeros(3, np.int64),
     {"loss_fn": lk.CrossEntropyLoss(reduction="sum")}, "reduction='mean'"),
    (np.zeros((3, 4), np.float32), np.zeros((3, 2), np.int64), {}, r"pred.shape=\(3, 3\)"),
])
def test_evaluate_rejects_bad_input_clearly(x, y, kwargs, match):
    model = lk.Sequential(lk.Linear(4, 3))
    with pytest.raises(ValueError, match=match):
        evaluate(model, x, y, **kwargs)


def test_loop_is_an_attribute_after_import():
    assert lk.loop.step is step and lk.loop.evaluate is evaluate
