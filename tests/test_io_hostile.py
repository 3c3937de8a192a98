"""Hostile and broken safetensors files: a FormatError naming the file, nothing half-loaded, no
code run; F16/BF16 read; NaN/Inf warned or refused; saves fsync'ed, mode-keeping, orphan-free."""

import os
import pickle
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from malformed_safetensors import CASES, good_state, pickle_payload, reference_model

import linearkit as lk


def _snapshot(model):
    return {k: np.array(v, copy=True) for k, v in model.state_dict().items()}


def test_the_matrix_is_large_enough():
    assert len(CASES) >= 30


@pytest.mark.parametrize("name", sorted(CASES))
def test_malformed_file_is_refused_and_the_model_is_unchanged(name, tmp_path):
    case = CASES[name](tmp_path)
    if not case.with_model:  # the file alone, then the file and a model
        with pytest.raises(lk.FormatError) as info:
            lk.load(case.path, **case.kwargs)
        assert case.path.name in str(info.value) and case.phrase in str(info.value)
    model = reference_model()
    before = _snapshot(model)
    with pytest.raises(lk.FormatError) as info:
        lk.load(case.path, model, **case.kwargs)
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert str(case.path) in message, message
    assert case.phrase in message, message
    assert "hint:" in message
    after = _snapshot(model)
    assert after.keys() == before.keys()
    for key in before:
        np.testing.assert_array_equal(after[key], before[key])
    assert not list(tmp_path.glob("PWNED*"))  # no case ran code


def test_model_misfit_chains_the_load_state_dict_error(tmp_path):
    case = CASES["missing_key_strict"](tmp_path)
    with pytest.raises(lk.FormatError) as info:
        lk.load(case.path, reference_model())
    assert isinstance(info.value.__cause__, RuntimeError)


def test_pickle_payload_is_live_but_load_never_runs_it(tmp_path):
    proof = tmp_path / "proof"
    pickle.loads(pickle_payload(tmp_path / "p.bin", proof).read_bytes()).close()
    assert proof.exists()  # the payload does create its file when unpickled...
    marker = tmp_path / "marker"
    path = pickle_payload(tmp_path / "weights.safetensors", marker)
    with pytest.raises(lk.FormatError, match="never unpickles"):
        lk.load(path)
    assert not marker.exists()  # ...and linearkit.load never unpickles it


@pytest.mark.parametrize("change", ["missing", "unexpected"])
def test_non_strict_loads_the_rest(change, tmp_path):
    state = good_state()
    if change == "missing":
        del state["2.bias"]
    else:
        state["9.weight"] = np.ones((2, 2), np.float32)
    path = lk.save(state, tmp_path / "w.safetensors")
    model = reference_model()
    before = _snapshot(model)
    with pytest.raises(lk.FormatError, match=f"{change.capitalize()} key"):
        lk.load(path, model)
    assert lk.load(path, model, strict=False) is model
    after = model.state_dict()
    for key in before:
        expected = state[key] if key in state else before[key]
        np.testing.assert_array_equal(after[key], expected)


def test_non_finite_warns_by_default_naming_the_tensors(tmp_path):
    state = good_state()
    state["0.bias"][1] = np.nan
    path = lk.save(state, tmp_path / "w.safetensors")
    with pytest.warns(UserWarning, match=r"w\.safetensors.*non-finite.*'0\.bias'") as record:
        loaded = lk.load(path)
    assert "2.weight" not in str(record[0].message)
    assert np.isnan(loaded["0.bias"][1])
    model = reference_model()
    with pytest.warns(UserWarning, match="'0.bias'"):
        lk.load(path, model)
    assert np.isnan(model[0].bias.data[1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lk.load(lk.save(good_state(), tmp_path / "fine.safetensors"))  # finite: silent


def test_our_file_is_read_by_both_reference_loaders(tmp_path):
    import safetensors.numpy
    import safetensors.torch

    state = {**good_state(), "h": np.arange(6, dtype=np.float16).reshape(2, 3),
             "n": np.array(7, np.int64), "z": np.zeros((0, 4), np.float32)}
    path = lk.save(state, tmp_path / "w.safetensors")
    by_numpy = safetensors.numpy.load_file(path)
    by_torch = safetensors.torch.load_file(path)
    ours = lk.load(path)
    assert set(by_numpy) == set(by_torch) == set(ours) == set(state)
    for key, value in state.items():
        np.testing.assert_array_equal(by_numpy[key], value)
        np.testing.assert_array_equal(by_torch[key].numpy(), value)
        assert ours[key].dtype == value.dtype and ours[key].shape == value.shape
        np.testing.assert_array_equal(ours[key], value)


def test_files_written_by_safetensors_numpy_load_equal(tmp_path):
    import safetensors.numpy

    rng = np.random.default_rng(0)
    state = {"f64": rng.standard_normal((3, 2)), "f16": rng.standard_normal(5).astype(np.float16),
             "i32": np.arange(-3, 3, dtype=np.int32), "u8": np.arange(4, dtype=np.uint8),
             "b": np.array([True, False]), "i8": np.array([-128, 127], np.int8),
             "scalar": np.array(2.5, np.float32), "empty": np.zeros((2, 0), np.float32)}
    path = tmp_path / "ref.safetensors"
    safetensors.numpy.save_file(state, path, metadata={"k": "v"})
    ours = lk.load(path)
    for key, value in state.items():
        assert ours[key].dtype == value.dtype, key
        np.testing.assert_array_equal(ours[key], value)
        assert ours[key].flags.writeable


def test_bf16_and_f16_from_torch_equal_torch_values(tmp_path):
    import ml_dtypes
    import safetensors.torch
    import torch

    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
    for dtype, name in [(torch.bfloat16, "bf16"), (torch.float16, "f16")]:
        tensors = {k: v.detach().to(dtype).contiguous() for k, v in ref.state_dict().items()}
        path = tmp_path / f"{name}.safetensors"
        safetensors.torch.save_file(tensors, path)
        ours = lk.load(path)
        expected_dtype = np.dtype(ml_dtypes.bfloat16) if name == "bf16" else np.float16
        for key, t in tensors.items():
            assert ours[key].dtype == expected_dtype
            np.testing.assert_array_equal(ours[key].astype(np.float32), t.float().numpy())
        model = lk.load(path, reference_model())  # a float32 model: cast on load
        for key, value in model.state_dict().items():
            assert value.dtype == np.float32
            np.testing.assert_array_equal(value, tensors[key].float().numpy())
        x = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
        ref32 = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
        ref32.load_state_dict({k: t.float() for k, t in tensors.items()})
        with torch.no_grad():
            np.testing.assert_allclose(model(x), ref32(torch.from_numpy(x)).numpy(),
                                       rtol=1e-6, atol=1e-6)


def test_bf16_without_ml_dtypes_names_the_extra(tmp_path, monkeypatch):
    import safetensors.torch
    import torch

    path = tmp_path / "bf.safetensors"
    safetensors.torch.save_file({"w": torch.ones(2, dtype=torch.bfloat16)}, path)
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # import ml_dtypes now fails
    with pytest.raises(lk.FormatError, match=r"bf\.safetensors.*'w' is BF16(?s:.*)linearkit\[cli\]"):
        lk.load(path)


def test_save_fsyncs_the_temp_file_before_the_rename(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", Path(a).name)),
                                                    real_replace(a, b))[1])
    lk.save(reference_model(), tmp_path / "w.safetensors")
    first_replace = next(i for i, e in enumerate(events) if isinstance(e, tuple))
    assert "fsync" in events[:first_replace]
    assert events[first_replace][1].startswith(".tmp-")


@pytest.mark.parametrize("failing", ["serialize", "rename"])
def test_no_orphaned_temp_file_after_an_exception(failing, tmp_path, monkeypatch):
    import safetensors.numpy

    path = tmp_path / "w.safetensors"
    lk.save(reference_model(), path)
    before = path.read_bytes()

    def boom(*args, **kwargs):
        raise OSError("disk full")

    if failing == "serialize":
        monkeypatch.setattr(safetensors.numpy, "save", boom)
    else:
        monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        lk.save(good_state(), path)
    assert os.listdir(tmp_path) == ["w.safetensors"] and path.read_bytes() == before


def test_mode_new_file_follows_umask_overwrite_keeps_old_mode(tmp_path):
    old_umask = os.umask(0o027)
    try:
        new = Path(lk.save(reference_model(), tmp_path / "new.safetensors"))
        assert new.stat().st_mode & 0o777 == 0o640
        kept = tmp_path / "kept.safetensors"
        lk.save(reference_model(), kept)
        os.chmod(kept, 0o604)
        lk.save(reference_model(), kept)
        assert kept.stat().st_mode & 0o777 == 0o604
    finally:
        os.umask(old_umask)


def test_a_missing_file_stays_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.safetensors"):
        lk.load(tmp_path / "nope.safetensors")


_SAVER = """
import sys, numpy as np, linearkit as lk
state = {"w": np.zeros((512, 1024), np.float32)}  # 2 MB a save
path = sys.argv[1]
lk.save(state, path)
print("ready", flush=True)
i = 0
while True:
    i += 1
    state["w"][...] = i
    lk.save(state, path)
"""


def test_sigkill_mid_save_leaves_the_target_whole_and_at_most_one_temp_file(tmp_path):
    import signal
    import subprocess
    import time

    path = tmp_path / "w.safetensors"
    for delay in (0.05, 0.13, 0.21, 0.3):
        saver = subprocess.Popen([sys.executable, "-c", _SAVER, str(path)],
                                 stdout=subprocess.PIPE, text=True)
        assert saver.stdout.readline().strip() == "ready"
        time.sleep(delay)
        os.kill(saver.pid, signal.SIGKILL)
        saver.wait()
        saver.stdout.close()
        w = lk.load(path)["w"]  # never truncated: always a whole file
        assert w.shape == (512, 1024) and (w == w.flat[0]).all()
        leftovers = [p.name for p in tmp_path.iterdir() if p.name != "w.safetensors"]
        assert len(leftovers) <= 1 and all(n.startswith(".tmp-") for n in leftovers), leftovers
        for name in leftovers:  # what a kill can leave, as documented; safe to delete
            (tmp_path / name).unlink()
