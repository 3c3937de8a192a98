"""load_state_dict is transactional: a failing load leaves the model exactly as it was."""

import copy

import numpy as np
import pytest
import torch

import linearkit as lk


def _model():
    lk.manual_seed(0)
    return lk.Sequential(lk.Linear(4, 5), lk.BatchNorm1d(5), lk.ReLU(), lk.LayerNorm(5),
                         lk.Linear(5, 3))


def _snapshot(model):
    """Every array (by identity and value) and every module type."""
    return ([type(m) for m in model.modules()],
            [(k, id(v), v.copy()) for k, v in model.state_dict().items()])


def _assert_unchanged(model, snapshot):
    types, arrays = snapshot
    assert [type(m) for m in model.modules()] == types
    now = model.state_dict()
    assert list(now) == [k for k, _, _ in arrays]
    for key, ident, value in arrays:
        assert id(now[key]) == ident, key
        np.testing.assert_array_equal(now[key], value, err_msg=key)


def _good_state():
    lk.manual_seed(1)
    source = _model()
    source(np.ones((3, 4), np.float32))  # running stats and num_batches_tracked move
    return {k: v.copy() for k, v in source.state_dict().items()}


KEYS = list(_model().state_dict())


@pytest.mark.parametrize("key", [KEYS[0], KEYS[len(KEYS) // 2], KEYS[-1]],
                         ids=["first", "middle", "last"])
def test_a_wrong_shape_anywhere_changes_nothing_and_names_the_key(key):
    model = _model()
    snap = _snapshot(model)
    state = _good_state()
    state[key] = np.zeros(state[key].shape + (2,), np.float32)
    with pytest.raises(RuntimeError, match=f"size mismatch for {key}:"):
        model.load_state_dict(state)
    _assert_unchanged(model, snap)


@pytest.mark.parametrize("change", ["missing", "unexpected", "uncastable", "complex", "object"])
def test_other_failures_change_nothing(change):
    model = _model()
    snap = _snapshot(model)
    state = _good_state()
    key = KEYS[-1]
    if change == "missing":
        del state[key]
    elif change == "unexpected":
        state["9.weight"] = np.zeros(3, np.float32)
    elif change == "uncastable":
        state[key] = np.array(["a"] * len(state[key]))
    elif change == "complex":
        state[key] = state[key] + 1j
    else:
        state[key] = np.array([object()] * len(state[key]))
    with pytest.raises(RuntimeError) as err:
        model.load_state_dict(state)
    assert (key if change != "unexpected" else "9.weight") in str(err.value)
    _assert_unchanged(model, snap)


def test_several_errors_are_all_named():
    model = _model()
    state = _good_state()
    state[KEYS[0]] = np.zeros(7, np.float32)
    state[KEYS[-1]] = np.array(["x", "y", "z"])
    with pytest.raises(RuntimeError) as err:
        model.load_state_dict(state)
    assert KEYS[0] in str(err.value) and KEYS[-1] in str(err.value)


def test_a_failing_load_leaves_a_lazy_linear_lazy():
    lazy = lk.Sequential(lk.LazyLinear(3), lk.Linear(3, 2))
    rng_state = lk.random.default_generator().bit_generator.state
    state = {"0.weight": np.zeros((3, 4), np.float32), "0.bias": np.zeros(3, np.float32),
             "1.weight": np.zeros((2, 9), np.float32), "1.bias": np.zeros(2, np.float32)}
    with pytest.raises(RuntimeError, match="size mismatch for 1.weight"):
        lazy.load_state_dict(state)
    assert type(lazy[0]) is lk.LazyLinear and lazy[0].in_features is None
    assert lk.random.default_generator().bit_generator.state == rng_state
    state["1.weight"] = np.ones((2, 3), np.float32)
    lazy.load_state_dict(state)
    assert type(lazy[0]) is lk.Linear and lazy[0].weight.shape == (3, 4)
    assert (lazy[1].weight.data == 1).all()


def test_lazy_linear_without_a_weight_reports_missing_keys_as_torch_does():
    ours = lk.LazyLinear(3).load_state_dict({}, strict=False)
    theirs = torch.nn.LazyLinear(3).load_state_dict({}, strict=False)
    assert (ours.missing_keys, ours.unexpected_keys) == (theirs.missing_keys,
                                                         theirs.unexpected_keys)
    with pytest.raises(RuntimeError, match="without weight"):
        lk.LazyLinear(3).load_state_dict({"bias": np.zeros(3)})
    with pytest.raises(RuntimeError, match="2-D weight"):
        lk.LazyLinear(3).load_state_dict({"weight": np.zeros(3), "bias": np.zeros(3)})


def test_a_one_element_array_loads_into_a_0d_buffer_as_in_torch():
    ours, theirs = lk.BatchNorm1d(2), torch.nn.BatchNorm1d(2)
    state = {k: v.copy() for k, v in ours.state_dict().items()}
    state["num_batches_tracked"] = np.array([7])
    ours.load_state_dict(state)
    theirs.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in state.items()})
    assert ours.num_batches_tracked.shape == () and int(ours.num_batches_tracked) == 7
    assert int(theirs.num_batches_tracked) == 7
    state["num_batches_tracked"] = np.array([7, 8])
    with pytest.raises(RuntimeError, match="size mismatch for num_batches_tracked"):
        ours.load_state_dict(state)


def test_a_non_mapping_is_refused_as_torch_does():
    with pytest.raises(TypeError, match="Expected state_dict to be dict-like"):
        lk.Linear(2, 2).load_state_dict([1, 2])


ALL_LAYERS = [
    lambda: lk.Linear(4, 4), lambda: lk.Linear(4, 4, bias=False), lambda: lk.Identity(),
    lambda: lk.ReLU(), lambda: lk.LeakyReLU(0.2), lambda: lk.GELU(), lambda: lk.Tanh(),
    lambda: lk.Sigmoid(), lambda: lk.SiLU(), lambda: lk.Softmax(dim=-1),
    lambda: lk.LogSoftmax(dim=-1), lambda: lk.Dropout(0.5), lambda: lk.LayerNorm(4),
    lambda: lk.LayerNorm(4, elementwise_affine=False), lambda: lk.BatchNorm1d(4),
    lambda: lk.BatchNorm1d(4, affine=False), lambda: lk.BatchNorm1d(4, momentum=None),
    lambda: lk.BatchNorm1d(4, track_running_stats=False), lambda: lk.Flatten(),
    lambda: lk.Sequential(lk.Linear(4, 4), lk.ReLU()),
    lambda: lk.Residual(lk.Linear(4, 4)),
]


@pytest.mark.parametrize("make", ALL_LAYERS, ids=[repr(f()).replace("\n", "") for f in ALL_LAYERS])
def test_every_layer_round_trips_through_its_own_file(make, tmp_path):
    lk.manual_seed(3)
    model = lk.Sequential(make(), lk.Linear(4, 2))
    model.train()
    model(np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32))
    path = tmp_path / "model.safetensors"
    lk.save(model, path)
    lk.manual_seed(4)
    fresh = copy.deepcopy(model)
    for p in fresh.parameters():
        p.data[...] = 0
    lk.load(path, fresh)
    for (k, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items()):
        assert a.shape == b.shape and a.dtype == b.dtype, k
        np.testing.assert_array_equal(a, b, err_msg=k)


def test_a_saved_file_gets_the_permissions_of_any_new_file(tmp_path):
    import os
    import stat

    umask = os.umask(0o022)
    try:
        path = tmp_path / "m.safetensors"
        lk.save(lk.Linear(2, 2), path)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o644  # not mkstemp's 0600
    finally:
        os.umask(umask)
