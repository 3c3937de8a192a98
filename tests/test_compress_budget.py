"""Compressing to a budget (``--max-drop`` with ``--data``) and the refusal of a ruinous step
without data: on the README's MNIST-1D model, trained once for the module."""

import numpy as np
import pytest

import linearkit as lk
from linearkit.cli.commands import main
from linearkit.transforms.budget import MAX_REL_ERROR, CostlyTransformError
from linearkit.transforms.pipeline import compress
from linearkit.transforms.transform_report import state_size


@pytest.fixture(scope="module")
def trained():
    """``(model, x_test (1000, 40), y_test (1000,))``: the README's recipe, fewer steps."""
    model, _ = lk.train.train("mlp", steps=1500, eval_every=0)
    data = lk.data.mnist1d()
    return model, data.x_test, data.y_test


@pytest.fixture
def model_file(trained, tmp_path):
    path = tmp_path / "mlp.safetensors"
    lk.save(trained[0], path)
    return path


def _accuracy(model, x, y):
    return 100.0 * lk.training.loop.evaluate(model, x, y)["accuracy"]


def test_cli_max_drop_keeps_the_smallest_model_within_the_budget(trained, model_file, tmp_path,
                                                                  capsys):
    model, x, y = trained
    out = tmp_path / "small.safetensors"
    assert main(["compress", str(model_file), "-o", str(out), "--max-drop", "1.0",
                 "--data", "mnist1d"]) == 0
    text = capsys.readouterr().out
    for column in ("params", "bytes", "accuracy", "batch 1", "batch 100"):
        assert column in text, text
    assert "--energy 0.5" in text and "--prune 0.9" in text and "over budget" in text
    assert "chose " in text and f"wrote {out}" in text
    small = lk.load_model(out)
    assert _accuracy(small, x, y) >= _accuracy(model, x, y) - 1.0
    assert out.stat().st_size < model_file.stat().st_size
    assert state_size(small)[1] < state_size(model)[1]


def test_python_max_drop_returns_a_smaller_model_and_the_table(trained):
    model, x, y = trained
    before = {k: np.array(v) for k, v in model.state_dict().items()}
    small, report = lk.transforms.compress(model, data=(x, y), max_drop=1.0)
    assert _accuracy(small, x, y) >= _accuracy(model, x, y) - 1.0
    assert report.chosen.bytes < report.original.bytes == state_size(model)[1]
    assert report.chosen.model is small and len(report.candidates) > 20
    assert all(c.within == (c.drop <= 1.0 + 1e-9) for c in report.candidates)
    assert not any(c.within and c.bytes < report.chosen.bytes for c in report.candidates)
    assert "*" in report.table() and report.choice().startswith("chose ")
    for key, value in model.state_dict().items():  # the input model is untouched
        np.testing.assert_array_equal(np.array(value), before[key])


def test_max_drop_searches_only_what_the_user_allows(trained):
    model, x, y = trained
    _, report = compress(model, data=(x, y), max_drop=5.0, rank=[8, 32])
    assert [c.options for c in report.candidates[1:]] == [{"rank": 8}, {"rank": 32}]


def test_a_regression_budget_is_a_percent_of_the_mse():
    rng = np.random.default_rng(0)
    lk.manual_seed(0)
    model = lk.Sequential(lk.Linear(20, 20), lk.ReLU(), lk.Linear(20, 3))
    x = rng.standard_normal((200, 20)).astype(np.float32)
    y = (model(x) + 0.1 * rng.standard_normal((200, 3))).astype(np.float32)
    _, report = compress(model, data=(x, y), max_drop=2.0, int8=True)
    assert report.task == "loss" and "MSE" in report.table()
    assert report.chosen.score <= report.original.score * 1.02


def test_cli_without_data_refuses_a_ruinous_rank_and_says_what_it_costs(model_file, tmp_path,
                                                                        capsys):
    out = tmp_path / "r8.safetensors"
    assert main(["compress", str(model_file), "-o", str(out), "--rank", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "--rank 8 changes the outputs by" in err and "on random probes" in err
    assert "give --data to measure accuracy, or --force to write it anyway" in err
    assert not out.exists()


def test_cli_force_writes_it_anyway(model_file, tmp_path, capsys):
    out = tmp_path / "r8.safetensors"
    assert main(["compress", str(model_file), "-o", str(out), "--rank", "8", "--force"]) == 0
    assert "factorize:" in capsys.readouterr().out
    assert out.exists() and lk.load_model(out) is not None


def test_cli_data_from_npy_files(trained, model_file, tmp_path, capsys):
    _, x, y = trained
    np.save(tmp_path / "x.npy", x[:300])
    np.save(tmp_path / "y.npy", y[:300])
    out = tmp_path / "q.safetensors"
    assert main(["compress", str(model_file), "-o", str(out), "--int8", "--max-drop", "2",
                 "--data", str(tmp_path / "x.npy"), str(tmp_path / "y.npy")]) == 0
    assert "--int8" in capsys.readouterr().out and out.exists()


def test_python_without_data_raises_a_clear_error_unless_forced(trained):
    model = trained[0]
    with pytest.raises(CostlyTransformError, match=r"rank=8 changes the outputs by \d+%") as info:
        compress(model, rank=8)
    assert isinstance(info.value, ValueError) and info.value.max_rel_error > MAX_REL_ERROR
    assert "data=(x, y)" in str(info.value) and "force=True" in str(info.value)
    forced, (report,) = compress(model, rank=8, force=True)
    assert report.max_rel_error > MAX_REL_ERROR and forced is not model
    compress(model, int8=True)  # a step within the limit needs no data and no force


@pytest.mark.parametrize("args, phrase", [
    (["--max-drop", "1"], "needs held-out data"),
    (["--max-drop", "-1", "--data", "mnist1d"], "expected a number >= 0"),
    (["--data", "a", "b", "c", "--int8"], "expected 'mnist1d' or two .npy files"),
])
def test_budget_misuse_is_one_line_and_exit_2(args, phrase, model_file, tmp_path, capsys):
    assert main(["compress", str(model_file), "-o", str(tmp_path / "o.safetensors"), *args]) == 2
    err = capsys.readouterr().err
    assert phrase in err and len(err.strip().splitlines()) == 1, err
