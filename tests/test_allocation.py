"""A layer too large for memory is one AllocationError (a MemoryError) naming the layer, its
path where known, the array, its shape and dtype and the bytes asked for; a failed load leaves
the model as it was; the command line prints it as one line and exits 2.

The sizes asked for are exabytes, beyond any address space, so NumPy refuses them at once and
nothing is ever paged in.
"""

from __future__ import annotations

import json
from collections import OrderedDict

import numpy as np
import pytest

import linearkit as lk
from linearkit.cli.commands import main
from linearkit.io.spec import build_model, model_spec

HUGE = 10**9  # Linear(HUGE, HUGE) in float32: 4e18 bytes (3.5 EiB)


def one_line(text: str) -> str:
    assert "\n" not in text.strip() and "Traceback" not in text, text
    return text


def test_a_linear_too_large_is_an_allocation_error_naming_it():
    with pytest.raises(lk.AllocationError) as caught:
        lk.Linear(HUGE, HUGE)
    err = caught.value
    assert isinstance(err, MemoryError)
    assert (err.array, err.shape, err.dtype, err.nbytes) == (
        "weight", (HUGE, HUGE), "float32", 4 * HUGE * HUGE)
    assert one_line(str(err)) == (
        "Linear: cannot allocate 4,000,000,000,000,000,000 bytes (3.5 EiB) for its weight of "
        "shape (1000000000, 1000000000), float32: more memory than this machine can give; use "
        "smaller sizes or a 16-bit dtype, or free memory")


def test_a_size_past_numpy_s_limit_is_the_same_error_not_a_value_error():
    with pytest.raises(lk.AllocationError, match=r"for its weight of shape \(10000000000, "
                                                 r"10000000000\), float64"):
        lk.Linear(10**10, 10**10, dtype=np.float64)  # 8e20 bytes: more than an intp counts


@pytest.mark.parametrize("make, array", [
    (lambda: lk.Linear(10**18, 4), "weight"),
    (lambda: lk.LayerNorm(10**18), "weight"),
    (lambda: lk.BatchNorm1d(10**18, affine=False), "running_mean"),
    (lambda: lk.SparseLinear(HUGE, HUGE, nnz=10**18), "weight_values"),
    (lambda: lk.QuantizedLinear(HUGE, 10**10), "weight"),
])
def test_every_layer_names_the_array_it_could_not_allocate(make, array):
    with pytest.raises(lk.AllocationError) as caught:
        make()
    assert caught.value.array == array
    assert f"for its {array} of shape" in one_line(str(caught.value))


def test_a_lazy_linear_too_large_is_named_by_its_path_and_stays_lazy():
    model = lk.Sequential(lk.Linear(3, 4), lk.Sequential(lk.ReLU(), lk.LazyLinear(HUGE * HUGE)))
    with pytest.raises(lk.AllocationError) as caught:
        model(np.ones((2, 3), np.float32))
    assert str(caught.value).startswith("module '1.1' (LazyLinear(in_features=?, ")
    assert "for its weight of shape (1000000000000000000, 4), float32" in str(caught.value)
    assert model[1][1].in_features is None and type(model[1][1]) is lk.LazyLinear


def test_a_load_that_runs_out_of_memory_leaves_the_model_as_it_was():
    model = lk.Sequential(OrderedDict(
        body=lk.Linear(3, 4), classifier=lk.Sequential(lk.ReLU(), lk.LazyLinear(HUGE))))
    before = {k: np.array(v) for k, v in model.state_dict().items()}
    state = dict(model.state_dict())
    state["body.weight"] = np.full((4, 3), 7.0, np.float32)  # would load, if all of it could
    zero = np.zeros(1, np.float32)  # a weight of HUGE x HUGE that occupies 4 bytes
    state["classifier.1.weight"] = np.lib.stride_tricks.as_strided(zero, (HUGE, HUGE), (0, 0))
    state["classifier.1.bias"] = np.lib.stride_tricks.as_strided(zero, (HUGE,), (0,))
    with pytest.raises(lk.AllocationError) as caught:
        model.load_state_dict(state)
    assert str(caught.value).startswith("module 'classifier.1' (LazyLinear(")
    assert type(model.classifier[1]) is lk.LazyLinear
    after = model.state_dict()
    assert after.keys() == before.keys()
    for key, value in before.items():
        np.testing.assert_array_equal(after[key], value)


def test_a_spec_asking_for_too_large_a_layer_names_its_path():
    spec = model_spec(lk.Sequential(OrderedDict(
        features=lk.Linear(4, 8), classifier=lk.Sequential(lk.ReLU(), lk.Tanh(),
                                                           lk.Linear(8, 2)))))
    text = json.dumps(spec).replace('"in_features": 8, "out_features": 2',
                                    f'"in_features": {HUGE}, "out_features": {HUGE}')
    assert text != json.dumps(spec)
    with pytest.raises(lk.AllocationError) as caught:
        build_model(json.loads(text))
    assert one_line(str(caught.value)).startswith(
        "module 'classifier.2' (Linear): cannot allocate 4,000,000,000,000,000,000 bytes")


def test_from_torch_of_too_large_a_layer_names_its_path():
    torch = pytest.importorskip("torch")
    nn = torch.nn
    module = nn.Sequential(OrderedDict(
        features=nn.Linear(4, 8),
        classifier=nn.Sequential(nn.ReLU(), nn.Linear(HUGE, HUGE, device="meta"))))
    with pytest.raises(lk.AllocationError) as caught:
        lk.io.from_torch(module)
    assert str(caught.value).startswith("module 'classifier.1' (Linear): cannot allocate")
    assert caught.value.shape == (HUGE, HUGE)


def test_the_cli_prints_one_line_and_exits_2(tmp_path, capsys):
    out = tmp_path / "model.safetensors"
    code = main(["train", "--hidden", str(10**16), "--steps", "1", "--out", str(out)])
    assert code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err
    last = err.strip().splitlines()[-1].split("\r")[-1].strip()
    assert last.startswith("linearkit train: error: AllocationError: Linear: cannot allocate "
                           "1,600,000,000,000,000,000 bytes (1.4 EiB) for its weight of shape "
                           "(10000000000000000, 40), float32"), last
    assert last.endswith("no output file was replaced"), last
    assert not out.exists()
