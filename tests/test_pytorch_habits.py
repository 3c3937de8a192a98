"""Habits carried over from PyTorch: dtype shortcuts, ``weight.T``, and CLI typos."""

import numpy as np
import pytest

import linearkit as lk
from linearkit.cli.commands import main

torch = pytest.importorskip("torch")


def _pair():
    """A linearkit Linear(3, 2) and a torch one holding the same float32 weights."""
    layer = lk.Linear(3, 2)
    ref = torch.nn.Linear(3, 2)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(layer.weight.data.copy()))
        ref.bias.copy_(torch.from_numpy(layer.bias.data.copy()))
    return layer, ref


@pytest.mark.parametrize("method, storage, torch_dtype", [
    ("double", np.float64, torch.float64), ("float", np.float32, torch.float32),
    ("half", np.float16, torch.float16), ("bfloat16", "bfloat16", torch.bfloat16)])
def test_dtype_shortcuts_return_self_and_convert_like_torch(method, storage, torch_dtype):
    layer, ref = _pair()
    assert getattr(layer, method)() is layer and getattr(ref, method)() is ref
    assert layer.weight.dtype == lk.precision.storage_dtype(storage)
    assert ref.weight.dtype == torch_dtype
    # same rounding of the same values
    np.testing.assert_array_equal(layer.weight.data.astype(np.float32),
                                  ref.weight.detach().float().numpy())


def test_half_stores_float16_and_computes_in_float32():
    layer = lk.Linear(3, 2).half()
    assert layer.weight.dtype == np.float16 and layer.bias.dtype == np.float16
    assert lk.precision.compute_dtype(layer.weight.dtype) == np.float32
    assert layer.double().weight.dtype == np.float64   # and back, through Module.to


def test_to_none_raises_instead_of_becoming_float64():
    # torch's Module.to(None) is a no-op; linearkit's to() takes only a dtype, so it refuses
    ref = torch.nn.Linear(3, 2)
    assert ref.to(None) is ref and ref.weight.dtype == torch.float32
    layer = lk.Linear(3, 2)
    with pytest.raises(TypeError, match="None"):
        layer.to(None)
    assert layer.weight.dtype == np.float32


def test_weight_T_matches_torch_and_the_layer():
    layer, ref = _pair()
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    assert layer.weight.T.shape == (3, 2) and layer.weight.T.base is layer.weight.data
    ours = x @ layer.weight.T
    np.testing.assert_allclose(ours, layer(x) - layer.bias.data, rtol=1e-6, atol=1e-6)
    theirs = (torch.from_numpy(x) @ ref.weight.T).detach().numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)


def test_parameter_array_protocol_and_attributes():
    p = lk.Linear(3, 2).weight
    assert (p.shape, p.dtype, p.ndim, p.size) == ((2, 3), np.float32, 2, 6)
    assert np.asarray(p) is p.data
    assert np.asarray(p, dtype=np.float32) is p.data
    copied = np.array(p, copy=True)
    assert copied is not p.data and np.array_equal(copied, p.data)
    assert np.asarray(p, dtype=np.float64).dtype == np.float64
    with pytest.raises(ValueError, match="copy"):
        np.asarray(p, dtype=np.float64, copy=False)


def test_sweep_help_shows_a_single_percent_sign(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["sweep", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "90%" in out and "%%" not in out


def test_compress_help_shows_a_single_percent_sign(capsys):
    with pytest.raises(SystemExit):
        main(["compress", "--help"])
    out = capsys.readouterr().out
    assert "10%" in out and "%%" not in out


@pytest.mark.parametrize("argv", [["train", "--step", "10"], ["--vers"]])
def test_abbreviations_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2


def test_option_typo_shows_usage_and_a_suggestion(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--stpes", "10"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: linearkit train")
    last = err.strip().splitlines()[-1]
    assert "unrecognized arguments: --stpes 10" in last and "did you mean --steps?" in last


def test_hidden_with_linear_model_is_said_ignored_and_still_trains(tmp_path, capsys):
    out = tmp_path / "l.safetensors"
    assert main(["train", "--model", "linear", "--hidden", "50", "--steps", "2",
                 "--eval-every", "0", "--json", "--out", str(out)]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "--hidden" in line]
    assert err == ["linearkit train: --hidden is ignored for --model linear (logistic "
                   "regression has no hidden layer)"]
    assert out.exists()


def test_hidden_default_is_silent_and_still_100(tmp_path, capsys):
    out = tmp_path / "m.safetensors"
    assert main(["train", "--steps", "2", "--eval-every", "0", "--json",
                 "--out", str(out)]) == 0
    assert "--hidden" not in capsys.readouterr().err
    from linearkit.recipes.train_mnist1d import build_model

    lk.load(out, build_model("mlp", 100))   # loads: the MLP was built 100 wide
