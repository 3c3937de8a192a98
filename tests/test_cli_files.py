"""`linearkit inspect` and `linearkit convert`: model files on the command line."""

import json
import subprocess
import sys

import numpy as np
import pytest

import linearkit as lk
from linearkit.cli.commands import main


def _model():
    lk.manual_seed(0)
    return lk.Sequential(lk.Linear(4, 8), lk.ReLU(), lk.Linear(8, 3))


def test_inspect_lists_tensors_architecture_and_ledger(tmp_path, capsys):
    path = tmp_path / "m.safetensors"
    lk.save(_model(), path)
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "0.weight" in out and "(8, 4)" in out and "F32" in out
    assert "Linear(in_features=8, out_features=3, bias=True)" in out and "67 parameters" in out
    assert main(["inspect", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["parameters"] == 67 and info["ledger"]["params"] == 67
    assert {t["name"] for t in info["tensors"]} == set(_model().state_dict())


def test_inspect_says_when_there_is_no_architecture(tmp_path, capsys):
    path = tmp_path / "w.safetensors"
    lk.save(_model().state_dict(), path)
    assert main(["inspect", str(path)]) == 0
    assert "architecture: none stored" in capsys.readouterr().out


def test_convert_round_trip_through_a_torch_state_dict(tmp_path):
    pytest.importorskip("torch")
    model = _model()
    src, pt, back = (tmp_path / n for n in ("m.safetensors", "m.pt", "b.safetensors"))
    lk.save(model, src)
    assert main(["convert", str(src), str(pt)]) == 0
    assert main(["convert", str(pt), str(back)]) == 0
    fresh = _model()
    for p in fresh.parameters():
        p.data[...] = 0
    lk.load(back, fresh)
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_array_equal(fresh(x), model(x))


@pytest.mark.parametrize("args, phrase", [
    (["inspect", "NOPE.safetensors"], "no such file"),
    (["inspect", "README.md"], "README.md"),
    (["convert", "README.md", "out.txt"], "unknown file type"),
    (["convert", "NOPE.safetensors", "x.pt"], "no such file"),
])
def test_misuse_is_one_line_and_exit_2(args, phrase, tmp_path):
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "linearkit.cli", *args], cwd=root,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and phrase in lines[0] and "Traceback" not in done.stderr


def test_convert_refuses_to_overwrite_its_input(tmp_path, capsys):
    path = tmp_path / "m.safetensors"
    lk.save(_model(), path)
    assert main(["convert", str(path), str(path)]) == 2
    assert "the output is the input file" in capsys.readouterr().err


def test_convert_to_onnx_and_back_keeps_the_outputs(tmp_path):
    pytest.importorskip("onnx")
    model = _model()
    src, onnx_file, back = (tmp_path / n for n in ("m.safetensors", "m.onnx", "b.safetensors"))
    lk.save(model, src)
    assert main(["convert", str(src), str(onnx_file), "--input-shape", "1,4"]) == 0
    assert main(["convert", str(onnx_file), str(back)]) == 0
    again = lk.load_model(back)
    x = np.random.default_rng(0).standard_normal((9, 4)).astype(np.float32)
    np.testing.assert_allclose(again(x), model(x), rtol=1.3e-6, atol=1e-5)


def test_convert_to_onnx_needs_an_input_shape(tmp_path, capsys):
    """A model file gives its first layer's width (tests/test_hostile_cli_messages.py); a file
    of weights alone has none, and the export says what it needs."""
    path = tmp_path / "m.safetensors"
    lk.save(_model().state_dict(), path)
    assert main(["convert", str(path), str(tmp_path / "m.onnx")]) == 2
    assert "needs the input shape" in capsys.readouterr().err
