"""Building or loading a layer allocates what it holds, and little beside it.

Peaks are measured with tracemalloc (NumPy reports its array allocations to it), as the most
memory allocated above what was allocated when the call began, and compared with the bytes of
the parameters the call creates: at most 1.1 times those. The 100M-parameter cases (400 MB of
float32) are the loads a user of a real model does: ``load_model`` of a model file and
``from_torch`` of a torch module.
"""

from __future__ import annotations

import gc
import json
import struct
import tracemalloc
from collections import OrderedDict

import numpy as np
import pytest

import linearkit as lk
from linearkit.core.random import default_generator
from linearkit.io.architecture import architecture_metadata
from linearkit.layers.linear import uninitialized

LIMIT = 1.1


def peak_bytes(fn):
    """``(result, most bytes allocated above the start while fn() ran)``."""
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        result = fn()
        peak = tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()
    return result, peak


def param_bytes(model) -> int:
    return sum(np.asarray(a).nbytes for a in model.state_dict().values())


def assert_peak_within(fn, limit=LIMIT):
    model, peak = peak_bytes(fn)
    held = param_bytes(model)
    assert peak <= limit * held, (
        f"peak {peak / 2**20:.1f} MiB above the start for {held / 2**20:.1f} MiB of parameters "
        f"({peak / held:.2f}x, limit {limit}x)")
    return model


def test_linear_8000_float32_peaks_at_its_parameters():
    layer = assert_peak_within(lambda: lk.Linear(8000, 8000, rng=np.random.default_rng(0)))
    assert param_bytes(layer) == 4 * (8000 * 8000 + 8000)
    w = layer.weight.data
    assert np.abs(w).max() <= np.float32(1 / np.sqrt(8000)) and w.std() > 0  # initialized


@pytest.mark.parametrize("dtype", [np.float64, np.float16, "bfloat16"])
def test_linear_of_every_storage_dtype_peaks_at_its_parameters(dtype):
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
        lk.Linear(2, 2, dtype=dtype)  # ml_dtypes' own import is not the layer's memory
    assert_peak_within(lambda: lk.Linear(3000, 3000, dtype=dtype))


def test_lazy_linear_materializing_peaks_at_its_parameters():
    lazy = lk.LazyLinear(3000)

    def materialize():
        lazy.materialize(3000)
        return lazy

    assert_peak_within(materialize)


def _sparse_file(path, model):
    """A model file for ``model`` (built only for its architecture) whose tensors are zeros: the
    data section is a hole in the file, so writing 400 MB costs nothing."""
    entries, offset = {}, 0
    for key, array in model.state_dict().items():
        entries[key] = {"dtype": "F32", "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    entries["__metadata__"] = {"format": "np", **architecture_metadata(model)}
    header = json.dumps(entries).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + offset)
    return path


def test_load_model_of_100m_parameters_peaks_at_its_parameters(tmp_path):
    with uninitialized():  # the architecture only; its arrays are never touched
        spec_model = lk.Sequential(lk.Linear(10_000, 10_000))
    path = _sparse_file(tmp_path / "big.safetensors", spec_model)
    del spec_model
    model = assert_peak_within(lambda: lk.load_model(path))
    assert param_bytes(model) == 4 * (10_000 * 10_000 + 10_000)
    assert not model[0].weight.data[::997, ::991].any() and not model[0].bias.data.any()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, "bfloat16"])
def test_load_model_reads_every_dtype_into_the_layers_exactly(tmp_path, dtype):
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    model = lk.Sequential(OrderedDict(
        body=lk.Sequential(lk.Linear(2000, 1000, dtype=dtype), lk.ReLU()),
        norm=lk.LayerNorm(1000, dtype=dtype), head=lk.Linear(1000, 500, dtype=dtype)))
    for p in model.parameters():
        p.data[...] = np.random.default_rng(p.size).standard_normal(p.shape)
    path = tmp_path / "m.safetensors"
    lk.save(model, path)
    again = assert_peak_within(lambda: lk.load_model(path))
    for key, value in model.state_dict().items():
        got = again.state_dict()[key]
        assert got.dtype == value.dtype
        np.testing.assert_array_equal(got.view(np.uint8), value.view(np.uint8))


def test_a_tensor_stored_in_another_dtype_is_still_cast_on_load(tmp_path):
    from safetensors.numpy import save_file

    model = lk.Sequential(lk.Linear(5, 4), lk.Tanh())
    state = {k: np.asarray(v, np.float64) for k, v in model.state_dict().items()}
    state["0.weight"] = state["0.weight"] + 1e-12  # not a float32 value: it is rounded
    path = str(tmp_path / "f64.safetensors")
    save_file(state, path, metadata={"format": "np", **architecture_metadata(model)})
    again = lk.load_model(path)
    assert again[0].weight.dtype == np.float32
    np.testing.assert_array_equal(again[0].weight.data, state["0.weight"].astype(np.float32))
    np.testing.assert_array_equal(again[0].bias.data, model[0].bias.data)


def test_load_model_still_refuses_non_finite_values(tmp_path):
    model = lk.Sequential(lk.Linear(3, 2))
    model[0].weight.data[1, 2] = np.nan
    path = tmp_path / "nan.safetensors"
    lk.save(model, path)
    with pytest.warns(UserWarning, match=r"non-finite values \(NaN or Inf\) in tensor\(s\) "
                                         r"'0.weight'"):
        lk.load_model(path)
    with pytest.raises(lk.FormatError, match="'0.weight'"):
        lk.load_model(path, strict_finite=True)


def test_from_torch_of_100m_parameters_peaks_at_its_parameters():
    torch = pytest.importorskip("torch")
    nn = torch.nn
    module = nn.Sequential(nn.utils.skip_init(nn.Linear, 10_000, 10_000), nn.ReLU())
    with torch.no_grad():
        module[0].weight[:, :2] = 0.5  # some known values (the rest is whatever torch.empty gave)
        module[0].bias.fill_(-1.0)
    model = assert_peak_within(lambda: lk.io.from_torch(module))
    assert param_bytes(model) == 4 * (10_000 * 10_000 + 10_000)
    assert (model[0].weight.data[:, :2] == 0.5).all() and (model[0].bias.data == -1).all()
    assert not np.shares_memory(model[0].weight.data, module[0].weight.detach().numpy())


def test_from_torch_copies_every_value_and_leaves_the_random_stream_alone():
    torch = pytest.importorskip("torch")
    nn = torch.nn
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(7, 5), nn.LayerNorm(5), nn.Linear(5, 3))
    expected = lk.manual_seed(4).random(3)
    lk.manual_seed(4)
    model = lk.io.from_torch(module)
    np.testing.assert_array_equal(default_generator().random(3), expected)
    for key, value in module.state_dict().items():
        np.testing.assert_array_equal(model.state_dict()[key], value.numpy())
