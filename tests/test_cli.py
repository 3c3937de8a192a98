"""The `linearkit` command: train (--json), ledger, gradcheck."""

import json

import numpy as np
import pytest

import linearkit as lk
from linearkit.cli import main


def test_train_json_saves_weights_that_reload(tmp_path, capsys):
    out = tmp_path / "w.safetensors"
    assert main(["train", "--steps", "60", "--json", "--out", str(out), "--eval-every", "30"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert set(record) >= {"test_accuracy", "train_accuracy", "steps", "seconds", "params"}
    assert record["steps"] == 60 and record["params"] == 15210
    assert 0.1 < record["test_accuracy"] <= 1.0
    from linearkit.train import build_model

    model = lk.load(out, build_model("mlp"))
    data = lk.data.mnist1d()
    from linearkit.train import accuracy

    assert accuracy(model, data.x_test, data.y_test) == pytest.approx(record["test_accuracy"])


def test_train_linear_prints_paper_table(tmp_path, capsys):
    assert main(["train", "--model", "linear", "--steps", "20", "--out", str(tmp_path / "l.safetensors")]) == 0
    text = capsys.readouterr().out
    assert "logistic regression 32%" in text and "MLP 68%" in text and "parameters: 410" in text


def test_ledger_preset_and_bad_shape(capsys):
    assert main(["ledger", "linear-512-256", "--input-shape", "64,512"]) == 0
    text = capsys.readouterr().out
    assert "131,328" in text and "2,101,248" in text
    assert main(["ledger", "mlp-mnist", "--input-shape", "64,3,16"]) == 2
    err = capsys.readouterr().err
    assert "ShapeError" in err and "module '0'" in err and "Traceback" not in err


def test_gradcheck_command(capsys):
    assert main(["gradcheck"]) == 0
    assert "15 passed, 0 failed" in capsys.readouterr().out


def test_build_model_matches_the_paper_architecture():
    from linearkit.train import build_model

    model = build_model("mlp", 100, rng=np.random.default_rng(0))
    assert sum(p.size for p in model.parameters()) == 40 * 100 + 100 + 100 * 100 + 100 + 100 * 10 + 10
