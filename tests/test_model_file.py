"""Self-describing model files: linearkit.save stores the architecture, load_model rebuilds."""

import json

import numpy as np
import pytest

import linearkit as lk
from linearkit.analysis.cases import MODULE_CASES, build
from linearkit.io.model_file import SPEC_KEY, read_spec


@pytest.mark.parametrize("case", MODULE_CASES, ids=[c.id for c in MODULE_CASES])
def test_save_then_load_model_gives_the_same_model(case, tmp_path):
    model, *xs = build(case, np.float32)
    path = tmp_path / "m.safetensors"
    if case.user_module:  # a user's module (around a ModuleList/ModuleDict) has no rule
        with pytest.warns(UserWarning, match="without the architecture"):
            lk.save(model, path)
        again = case.make(np.dtype(np.float32), np.random.default_rng(9))
        again.load_state_dict(lk.load(path))  # its weights load into the model built in code
    else:
        lk.save(model, path)
        again = lk.load_model(path)
    assert repr(again) == repr(model)
    model.eval()
    again.eval()
    np.testing.assert_array_equal(again(*xs), model(*xs))


def test_the_file_is_still_plain_safetensors(tmp_path):
    from safetensors.numpy import load_file
    from safetensors.torch import load_file as torch_load_file

    model = lk.Sequential(lk.Linear(3, 4), lk.ReLU(), lk.Linear(4, 2))
    path = tmp_path / "m.safetensors"
    lk.save(model, path)
    assert set(load_file(str(path))) == set(model.state_dict()) == set(torch_load_file(str(path)))
    assert json.loads(json.dumps(read_spec(path)))["root"]["type"] == "Sequential"


def test_a_file_without_architecture_says_so(tmp_path):
    path = tmp_path / "weights.safetensors"
    lk.save(lk.Linear(2, 2).state_dict(), path)  # a dict of arrays: no architecture
    with pytest.raises(lk.FormatError, match="no architecture") as err:
        lk.load_model(path)
    assert str(path) in str(err.value) and "linearkit.load(path, model)" in str(err.value)


def test_an_undescribable_model_saves_its_weights_with_a_warning(tmp_path):
    class Custom(lk.Module):
        def __init__(self):
            super().__init__()
            self.fc = lk.Linear(2, 2)

        def forward(self, x):
            return self.fc(x)

    path = tmp_path / "c.safetensors"
    with pytest.warns(UserWarning, match="without the architecture"):
        lk.save(Custom(), path)
    assert read_spec(path) is None and set(lk.load(path)) == {"fc.weight", "fc.bias"}


def test_a_damaged_spec_is_a_format_error_naming_the_file(tmp_path):
    path = tmp_path / "m.safetensors"
    lk.save(lk.Linear(2, 2).state_dict(), path, metadata={SPEC_KEY: "{broken"})
    with pytest.raises(lk.FormatError, match="not valid JSON") as err:
        lk.load_model(path)
    assert str(path) in str(err.value)


def test_the_ledger_of_a_saved_file_equals_the_ledger_of_its_model(tmp_path):
    from linearkit.recipes.train_mnist1d import build_model

    model = build_model("mlp", rng=np.random.default_rng(0))
    path = tmp_path / "mlp.safetensors"
    lk.save(model, path)
    ours = lk.analysis.ledger(model, (100, 40))
    from_file = lk.analysis.ledger(str(path), (100, 40))
    assert from_file.totals == ours.totals and ours.totals["flops"] == 3_051_000
    assert from_file.memory == ours.memory
