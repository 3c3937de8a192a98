"""safetensors save/load: round trip, atomic write, PyTorch reads the file."""

import os

import numpy as np
import pytest
import torch

import linearkit as lk
from linearkit.recipes.train_mnist1d import build_model


def test_round_trip_and_torch_reads_it(tmp_path):
    model = build_model("mlp", 16, rng=np.random.default_rng(0))
    path = tmp_path / "m.safetensors"
    assert lk.save(model, path) == str(path)
    assert [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]  # no temp file left
    state = lk.load(path)
    assert set(state) == set(model.state_dict())
    fresh = lk.load(path, build_model("mlp", 16, rng=np.random.default_rng(1)))
    x = np.ones((2, 40), np.float32)
    np.testing.assert_array_equal(fresh(x), model(x))
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    torch.testing.assert_close(tensors["0.weight"], torch.from_numpy(model[0].weight.data))


def test_failed_save_keeps_the_old_file(tmp_path, monkeypatch):
    model = lk.Sequential(lk.Linear(2, 2))
    path = tmp_path / "w.safetensors"
    lk.save(model, path)
    before = path.read_bytes()
    import safetensors.numpy

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.numpy, "save", boom)  # linearkit writes save()'s bytes itself
    with pytest.raises(OSError, match="disk full"):
        lk.save(model, path)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["w.safetensors"]
