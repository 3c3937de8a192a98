"""The train recipe: architecture, BLAS threads, determinism."""

import numpy as np
import pytest

import linearkit as lk
from linearkit.recipes.train_mnist1d import Dataset, build_model, train


def test_threads_n_trains_on_n_blas_threads_and_restores_the_policy():
    seen = []

    def progress(step, loss, acc):
        seen.append((lk.get_num_threads(), lk.threads.get_policy()))

    x = np.random.default_rng(0).standard_normal((40, 6)).astype(np.float32)
    y = np.arange(40) % 3
    train("linear", steps=3, batch_size=10, eval_every=0, dataset=Dataset(x, y, x, y),
          threads=2, progress=progress)
    assert seen == [(2, "fixed")] * 3
    assert lk.threads.get_policy() == "adaptive"  # the default policy again
    for bad in (0, "abc", 1.5, True):
        with pytest.raises(ValueError, match="threads must be 'auto', None or an int >= 1"):
            train("linear", steps=1, dataset=Dataset(x, y, x, y), batch_size=10, threads=bad)


def test_flush_denormal_flushes_while_training_and_restores_the_mode():
    seen = []
    tiny = np.float32(1e-39)

    def progress(step, loss, acc):
        seen.append(float(tiny * np.float32(1)))

    x = np.random.default_rng(0).standard_normal((40, 6)).astype(np.float32)
    y = np.arange(40) % 3
    data = Dataset(x, y, x, y)
    flushed, _ = train("linear", steps=3, batch_size=10, eval_every=0, dataset=data,
                       flush_denormal=True, progress=progress)
    assert float(tiny * np.float32(1)) > 0           # exact again afterwards
    if lk.set_flush_denormal(False):                 # a platform with the switch
        assert seen == [0.0] * 3
    exact, _ = train("linear", steps=3, batch_size=10, eval_every=0, dataset=data)
    for a, b in zip(flushed.parameters(), exact.parameters()):   # no subnormal in this run
        assert a.data.tobytes() == b.data.tobytes()


def test_same_seed_same_run_and_dtype_survives():
    _, first = train("mlp", hidden=16, steps=30, eval_every=0)
    model, second = train("mlp", hidden=16, steps=30, eval_every=0)
    assert first.final_loss == second.final_loss and first.test_accuracy == second.test_accuracy
    assert all(p.dtype == np.float32 for p in model.parameters())


def test_no_per_step_memory_growth_over_100_steps():
    import tracemalloc

    lk.manual_seed(0)
    model = build_model("mlp", 32)
    opt = lk.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = lk.CrossEntropyLoss()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 40)).astype(np.float32)
    y = rng.integers(0, 10, 64)

    def step():
        pred, back = model.vjp(x, input_grad=False)
        loss, loss_back = loss_fn.vjp(pred, y)
        back(loss_back())
        opt.step()
        opt.zero_grad(set_to_none=False)

    tracemalloc.start()     # warm up traced too: under tracemalloc Sequential keeps the thin
    try:                    # path (runtime/compiled_chain.py), whose first steps fill its caches
        for _ in range(5):
            step()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(100):
            step()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 4096, f"{grown} bytes retained after 100 steps"
    assert all(p.dtype == np.float32 and p.grad.dtype == np.float32 for p in model.parameters())
    assert all(s["exp_avg"].dtype == np.float32 for s in opt.state.values())


def test_full_recipe_lands_in_the_paper_band():
    """The README's main job, end to end: 6,000 steps each (a few seconds)."""
    _, mlp = train("mlp")
    _, logistic = train("linear")
    assert 0.60 <= mlp.test_accuracy <= 0.68, mlp.test_accuracy      # paper: 68%; torch here 63.3%
    assert 0.30 <= logistic.test_accuracy <= 0.34, logistic.test_accuracy  # paper: 32%


# ------------------------------------------------------------------ bad arguments, up front
def _in_subprocess(code: str, timeout: float = 120):
    """Run ``code`` in a fresh interpreter, so a regression that hangs fails instead of hanging."""
    import subprocess
    import sys

    try:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"hung for {timeout} s: {code}") from None


def test_batch_size_above_the_training_rows_raises_instead_of_hanging():
    proc = _in_subprocess(
        "from linearkit.recipes.train_mnist1d import train\n"
        "try:\n"
        "    train('linear', steps=5, batch_size=5000, eval_every=0)\n"
        "except ValueError as e:\n"
        "    print('ValueError:', e)\n", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "ValueError:" in proc.stdout
    assert "batch_size=5000" in proc.stdout and "4,000 training rows" in proc.stdout


@pytest.mark.parametrize("kwargs, error, match", [
    ({"batch_size": 4001}, ValueError, r"batch_size=4001 must be between 1 and the 4,000"),
    ({"batch_size": 0}, ValueError, "batch_size=0"),
    ({"batch_size": -3}, ValueError, "batch_size=-3"),
    ({"batch_size": 10.0}, TypeError, "batch_size must be an int"),
    ({"steps": 0}, ValueError, "steps must be >= 1"),
    ({"eval_every": -1}, ValueError, "eval_every must be >= 0"),
    ({"lr": -1.0}, ValueError, "lr must be finite and > 0"),
    ({"lr": 0}, ValueError, "lr must be finite and > 0"),
    ({"lr": float("nan")}, ValueError, "lr must be finite and > 0"),
    ({"lr": float("inf")}, ValueError, "lr must be finite and > 0"),
    ({"lr": "fast"}, TypeError, "lr must be a number"),
    ({"dataset": (1, 2, 3)}, ValueError, r"\(x_train, y_train, x_test, y_test\)"),
    ({"dataset": object()}, TypeError, "x_train"),
    ({"dataset": (np.zeros((4, 3)), np.zeros(4, int), np.zeros((0, 3)), np.zeros(0, int))},
     ValueError, "the test split"),
])
def test_bad_arguments_raise_before_any_step(kwargs, error, match):
    calls = []
    with pytest.raises(error, match=match):
        train("linear", steps=kwargs.pop("steps", 3), eval_every=kwargs.pop("eval_every", 0),
              progress=lambda *a: calls.append(a), **kwargs)
    assert calls == []


def test_callers_model_optimizer_and_dataset():
    data = lk.data.mnist1d()
    # The defaults are the recipe: the same run when built by hand and passed in.
    model = build_model("mlp", 100, rng=np.random.default_rng(42))
    opt = lk.optim.Adam(model.parameters(), lr=1e-2)
    got_model, got = train(model=model, optimizer=opt, steps=40, eval_every=20,
                           dataset=(data.x_train, data.y_train, data.x_test, data.y_test))
    ref_model, ref = train("mlp", steps=40, eval_every=20)
    assert got_model is model and got.model == "custom"
    assert (got.final_loss, got.test_accuracy, got.history) == (
        ref.final_loss, ref.test_accuracy, ref.history)
    for (k, v), (_, u) in zip(model.state_dict().items(), ref_model.state_dict().items()):
        np.testing.assert_array_equal(v, u, err_msg=k)

    # Any model, optimizer and loss: a Dropout/BatchNorm MLP with SGD on a small dataset.
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 5)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    net = lk.Sequential(lk.Linear(5, 16, rng=rng), lk.BatchNorm1d(16), lk.ReLU(),
                        lk.Dropout(0.1), lk.Linear(16, 2, rng=rng))
    sgd = lk.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    net, result = train("probe", model=net, optimizer=sgd, steps=200, batch_size=16,
                        eval_every=0, dataset=Dataset(x, y, x, y), threads=None)
    assert result.model == "probe" and result.steps == 200 and not net.training
    assert result.train_accuracy > 0.9


def test_callers_objects_are_checked():
    model = build_model("linear")
    other = build_model("linear")
    with pytest.raises(ValueError, match="not the model's"):
        train(model=model, optimizer=lk.optim.Adam(other.parameters()), steps=1)
    with pytest.raises(ValueError, match="needs model="):
        train(optimizer=lk.optim.Adam(other.parameters()), steps=1)
    with pytest.raises(ValueError, match="drop hidden="):
        train(model=model, hidden=10, steps=1)
    with pytest.raises(ValueError, match="drop lr="):
        train(model=model, optimizer=lk.optim.Adam(model.parameters()), lr=1e-3, steps=1)
    with pytest.raises(TypeError, match="linearkit optimizer"):
        train(model=model, optimizer=object(), steps=1)
    with pytest.raises(TypeError, match="linearkit Module"):
        train(model=lambda x: x, steps=1)
