"""linearkit.recipes.train_mnist1d with precision='bf16' | 'fp16': 16-bit storage, float32 compute and master
weights (fp16 with the loss scaler), in the paper's accuracy band like float32."""

import numpy as np
import pytest

import linearkit as lk
from linearkit.cli.commands import main
from linearkit.recipes.train_mnist1d import train

pytest.importorskip("ml_dtypes")


@pytest.mark.parametrize("precision, dtype", [("bf16", "bfloat16"), ("fp16", "float16")])
def test_the_recipe_in_16_bit_lands_in_the_paper_band(precision, dtype):
    model, result = train(precision=precision, eval_every=0)
    assert result.precision == precision and result.steps == 6000
    assert {p.dtype.name for p in model.parameters()} == {dtype}
    assert 0.60 <= result.test_accuracy <= 0.68, result.test_accuracy  # float32: 64.6%
    if precision == "fp16":
        assert result.skipped_steps < 10  # the scaler backs off only on a non-finite gradient


def test_16_bit_training_keeps_float32_master_weights_and_rounds_into_storage():
    model, _ = train(precision="bf16", steps=20, eval_every=0)
    w = model[0].weight
    assert w.dtype.name == "bfloat16"
    x = lk.data.mnist1d().x_test[:4]
    assert model(x).dtype == np.float32  # float32 compute, float32 outputs


def test_precision_misuse_is_a_clear_error():
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16, fp16"):
        train(precision="int8", steps=1)
    model = lk.Sequential(lk.Linear(40, 10))
    with pytest.raises(ValueError, match=r"convert it first: model.to\('bfloat16'\)"):
        train(model=model, precision="bf16", steps=1)


def test_cli_train_precision_prints_what_it_stored(tmp_path, capsys):
    out = tmp_path / "m.safetensors"
    assert main(["train", "--precision", "fp16", "--steps", "30", "--eval-every", "0",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "precision: fp16 (weights stored as float16" in text and "skipped" in text
    assert {str(v.dtype) for v in lk.load(out).values()} == {"float16"}
