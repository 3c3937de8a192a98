"""Optimizer state dicts: layout and exact resume against PyTorch; load_state_dict validation.

A state dict that does not fit the optimizer (a missing key, another optimizer's state, a wrong
shape, other group sizes) raises ValueError at ``load_state_dict`` naming the parameter's index,
its group and the key, and leaves the optimizer exactly as it was. PyTorch checks only the group
count and sizes at load time (our messages start with its wording) and fails later, at ``step``,
with a bare KeyError or a broadcast error; the tests below show both.
"""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest
from optim_cases import GROUPS, grad_fn, groups, initial, run_ours, run_torch

import linearkit as lk
from linearkit import optim

torch = pytest.importorskip("torch")


# ------------------------------------------------------------------------ round trips
@pytest.mark.parametrize("cls, kwargs", [
    (optim.SGD, {"momentum": 0.9, "nesterov": True}),
    (optim.Adam, {"amsgrad": True}),
    (optim.AdamW, {"weight_decay": 0.1}),
], ids=["SGD", "Adam", "AdamW"])
def test_state_dict_resume_is_exact(cls, kwargs):
    def grads(params, step):
        for i, p in enumerate(params):
            p.grad = grad_fn(p.data, step, i)

    params = [lk.Parameter(a) for a in initial()]
    opt = cls(groups(params, GROUPS), **kwargs)
    for step in range(5):
        grads(params, step)
        opt.step()
    saved = opt.state_dict()
    snapshot = [p.data.copy() for p in params]
    frozen_copy = copy.deepcopy(saved)
    for step in range(5, 10):
        grads(params, step)
        opt.step()
    # the saved dict is a deep copy: training on did not change it
    for index, entries in frozen_copy["state"].items():
        for key, value in entries.items():
            np.testing.assert_array_equal(saved["state"][index][key], value)

    fresh = [lk.Parameter(a) for a in snapshot]
    opt2 = cls(groups(fresh, ({"lr": 0.5}, {"lr": 0.5})), **kwargs)
    opt2.load_state_dict(saved)
    assert [g["lr"] for g in opt2.param_groups] == [0.05, 0.01]
    for step in range(5, 10):
        grads(fresh, step)
        opt2.step()
    for p, q in zip(params, fresh):
        np.testing.assert_array_equal(p.data, q.data)
    # loading copies too: stepping opt2 did not touch `saved`
    for index, entries in frozen_copy["state"].items():
        for key, value in entries.items():
            np.testing.assert_array_equal(saved["state"][index][key], value)


def test_state_dict_layout_matches_torch():
    _, opt = run_ours(optim.Adam, {"amsgrad": True}, GROUPS, steps=2)
    _, topt = run_torch(torch.optim.Adam, {"amsgrad": True}, GROUPS, steps=2)
    sd, tsd = opt.state_dict(), topt.state_dict()
    assert sd["state"].keys() == tsd["state"].keys()
    for index in sd["state"]:
        assert sd["state"][index].keys() == tsd["state"][index].keys()
    assert [g["params"] for g in sd["param_groups"]] == [g["params"] for g in tsd["param_groups"]]
    for group, tgroup in zip(sd["param_groups"], tsd["param_groups"]):
        for key, value in group.items():
            assert tgroup[key] == value, key


def _numpy_state_dict(topt) -> dict:
    """A PyTorch optimizer's state dict with every tensor turned into an ndarray."""
    tsd = topt.state_dict()
    return {
        "state": {i: {k: v.numpy().copy() if isinstance(v, torch.Tensor) else v
                      for k, v in s.items()} for i, s in tsd["state"].items()},
        "param_groups": copy.deepcopy(tsd["param_groups"]),
    }


@pytest.mark.parametrize("name, kwargs", [
    ("Adam", {"weight_decay": 0.1}), ("AdamW", {"amsgrad": True}),
    ("SGD", {"momentum": 0.9, "lr": 0.1}),
])
def test_load_torch_state_dict_and_continue(name, kwargs):
    """A PyTorch state dict (tensors as arrays) resumes to PyTorch's trajectory."""
    theirs, topt = run_torch(getattr(torch.optim, name), kwargs, GROUPS, steps=4)
    params = [lk.Parameter(q.detach().numpy().copy()) for q in theirs]
    opt = getattr(optim, name)(groups(params, GROUPS), **kwargs)
    opt.load_state_dict(_numpy_state_dict(topt))
    if name != "SGD":
        assert opt.state[params[0]]["step"] == 4
    for step in range(4, 8):
        for i, (p, q) in enumerate(zip(params, theirs)):
            p.grad = grad_fn(p.data, step, i)
            q.grad = torch.from_numpy(grad_fn(q.detach().numpy(), step, i))
        opt.step()
        topt.step()
    for p, q in zip(params, theirs):
        np.testing.assert_allclose(p.data, q.detach().numpy(), rtol=0, atol=1e-10)


def test_sgd_momentum_buffer_none_loads_as_a_fresh_buffer_as_in_torch():
    """Old PyTorch versions saved ``momentum_buffer: None``; both start a fresh buffer (the
    gradient itself, not zeros: with dampening the two differ)."""
    params, tparams = [lk.Parameter(np.ones(3))], [torch.nn.Parameter(torch.ones(3).double())]
    opt = optim.SGD(params, lr=0.1, momentum=0.9, dampening=0.5)
    topt = torch.optim.SGD(tparams, lr=0.1, momentum=0.9, dampening=0.5)
    saved = {"state": {0: {"momentum_buffer": None}}, "param_groups": opt.state_dict()["param_groups"]}
    opt.load_state_dict(saved)
    topt.load_state_dict({"state": {0: {"momentum_buffer": None}},
                          "param_groups": topt.state_dict()["param_groups"]})
    for step in range(3):
        params[0].grad = np.full(3, step + 1.0)
        tparams[0].grad = torch.full((3,), step + 1.0, dtype=torch.float64)
        opt.step()
        topt.step()
    np.testing.assert_allclose(params[0].data, tparams[0].detach().numpy(), rtol=0, atol=1e-12)


def test_state_indices_may_be_strings_as_after_a_json_round_trip():
    _, opt = run_ours(optim.Adam, {}, GROUPS, steps=2)
    sd = opt.state_dict()
    sd["state"] = {str(k): v for k, v in sd["state"].items()}
    params = [lk.Parameter(a) for a in initial()]
    twin = optim.Adam(groups(params, GROUPS))
    twin.load_state_dict(sd)
    assert twin.state[params[0]]["step"] == 2


# ------------------------------------------------------------------------ validation
def _trained(cls, kwargs, sizes=(2, 2), steps=2):
    """An optimizer over len(sizes) groups of parameters (sizes[i] in group i), after ``steps``."""
    rng = np.random.default_rng(7)
    params = [[lk.Parameter(rng.standard_normal((j + 2,))) for j in range(n)] for n in sizes]
    opt = cls([{"params": ps} for ps in params], lr=0.05, **kwargs)
    flat = [p for ps in params for p in ps]
    for step in range(steps):
        for i, p in enumerate(flat):
            p.grad = grad_fn(p.data, step, i)
        opt.step()
    return opt, flat


def _snapshot(opt):
    """Everything a load could change: the state (objects and values) and the groups."""
    return (opt.state, {p: dict(s) for p, s in opt.state.items()}, copy.deepcopy(opt.state_dict()),
            [(g, dict(g)) for g in opt.param_groups])


def _assert_unchanged(opt, snap):
    state, entries, sd, groups_ = snap
    assert opt.state is state
    assert {p: dict(s) for p, s in opt.state.items()}.keys() == entries.keys()
    for p, entry in entries.items():
        assert opt.state[p].keys() == entry.keys()
        for key, value in entry.items():
            assert opt.state[p][key] is value, key                 # the same arrays (flat views)
    now = opt.state_dict()
    assert now["param_groups"] == sd["param_groups"]
    for index, entry in sd["state"].items():
        for key, value in entry.items():
            np.testing.assert_array_equal(now["state"][index][key], value)
    assert [(g, dict(g)) for g in opt.param_groups] == groups_


def _load_fails(opt, sd, match):
    """``load_state_dict(sd)`` raises ValueError matching ``match`` and changes nothing."""
    snap = _snapshot(opt)
    with pytest.raises(ValueError, match=match) as info:
        opt.load_state_dict(sd)
    _assert_unchanged(opt, snap)
    return str(info.value)


@pytest.mark.parametrize("size", [1, 2, 3], ids=["one-param-group", "flat-2", "flat-3"])
@pytest.mark.parametrize("key", ["exp_avg_sq", "exp_avg", "step"])
def test_adam_state_missing_a_key_raises_at_load_not_zero_filled(key, size):
    """The old defect: a group of two or more silently zero-filled a missing exp_avg_sq."""
    opt, _ = _trained(optim.Adam, {}, sizes=(size,))
    sd = opt.state_dict()
    del sd["state"][size - 1][key]
    target, _ = _trained(optim.Adam, {}, sizes=(size,), steps=1)
    message = _load_fails(target, sd, rf"parameter {size - 1} \(group 0\).*'{key}'")
    assert "'step', 'exp_avg', 'exp_avg_sq'" in message             # what was expected


def test_adam_amsgrad_state_missing_max_exp_avg_sq_raises_at_load():
    opt, _ = _trained(optim.Adam, {"amsgrad": True}, sizes=(1, 2))
    sd = opt.state_dict()
    del sd["state"][2]["max_exp_avg_sq"]
    target, _ = _trained(optim.Adam, {"amsgrad": True}, sizes=(1, 2))
    _load_fails(target, sd, r"parameter 2 \(group 1\).*'max_exp_avg_sq'.*amsgrad")


def test_torch_fails_only_later_on_the_same_missing_key():
    """What PyTorch does with the defect's input: loads, then a bare KeyError at step()."""
    tparams = [torch.nn.Parameter(torch.ones(3)) for _ in range(2)]
    topt = torch.optim.Adam(tparams)
    for p in tparams:
        p.grad = torch.ones(3)
    topt.step()
    tsd = topt.state_dict()
    del tsd["state"][1]["exp_avg_sq"]
    topt.load_state_dict(tsd)
    with pytest.raises(KeyError, match="exp_avg_sq"):
        topt.step()
    # ours refuses the same dict at load time
    ours, _ = _trained(optim.Adam, {}, sizes=(2,))
    sd = ours.state_dict()
    del sd["state"][1]["exp_avg_sq"]
    with pytest.raises(ValueError, match=r"parameter 1 \(group 0\).*'exp_avg_sq'"):
        _trained(optim.Adam, {}, sizes=(2,))[0].load_state_dict(sd)


@pytest.mark.parametrize("size", [1, 2])
@pytest.mark.parametrize("adam", ["Adam", "AdamW"])
def test_sgd_state_loaded_into_adam_raises_naming_sgd(adam, size):
    sgd, _ = _trained(optim.SGD, {"momentum": 0.9}, sizes=(size,))
    sd = sgd.state_dict()
    sd["param_groups"] = _trained(getattr(optim, adam), {}, sizes=(size,))[0] \
        .state_dict()["param_groups"]                               # only the state is foreign
    target, _ = _trained(getattr(optim, adam), {}, sizes=(size,))
    message = _load_fails(target, sd, r"parameter 0 \(group 0\).*'momentum_buffer'")
    assert "SGD" in message and "'step'" in message


def test_adam_state_loaded_into_sgd_with_momentum_raises():
    adam, _ = _trained(optim.Adam, {}, sizes=(2,))
    sd = adam.state_dict()
    sgd, _ = _trained(optim.SGD, {"momentum": 0.9}, sizes=(2,))
    sd["param_groups"] = sgd.state_dict()["param_groups"]
    message = _load_fails(sgd, sd, r"parameter 0 \(group 0\).*'momentum_buffer'")
    assert "'exp_avg'" in message and "Adam" in message


def test_a_whole_sgd_state_dict_into_adam_raises_even_without_state():
    """Plain SGD keeps no state, but its groups lack Adam's hyperparameters."""
    sgd, _ = _trained(optim.SGD, {}, sizes=(2,))
    assert sgd.state == {}
    target, _ = _trained(optim.Adam, {}, sizes=(2,))
    _load_fails(target, sgd.state_dict(), r"parameter group 0 lacks 'amsgrad', 'betas', 'eps'")


def test_torch_adamw_groups_into_adam_raise_on_decoupled_weight_decay():
    """PyTorch 2.13 marks AdamW's groups ``decoupled_weight_decay=True``: not Adam's rule."""
    theirs, topt = run_torch(torch.optim.AdamW, {}, GROUPS, steps=2)
    params = [lk.Parameter(q.detach().numpy().copy()) for q in theirs]
    target = optim.Adam(groups(params, GROUPS))
    _load_fails(target, _numpy_state_dict(topt), r"group 0 has decoupled_weight_decay=True.*AdamW")
    optim.AdamW(groups(params, GROUPS)).load_state_dict(_numpy_state_dict(topt))   # fits
    with pytest.raises(ValueError, match="decoupled_weight_decay=False"):
        optim.AdamW(groups(params, GROUPS)).load_state_dict(
            _numpy_state_dict(run_torch(torch.optim.Adam, {}, GROUPS, steps=2)[1]))


@pytest.mark.parametrize("where", [0, 2, 3], ids=["first", "middle", "last"])
def test_wrong_shape_raises_naming_parameter_group_key_and_shapes(where):
    opt, _ = _trained(optim.Adam, {"amsgrad": True}, sizes=(2, 2))
    sd = opt.state_dict()
    sd["state"][where]["max_exp_avg_sq"] = np.zeros(7)
    target, _ = _trained(optim.Adam, {"amsgrad": True}, sizes=(2, 2))
    group = 0 if where < 2 else 1
    shape = (where % 2 + 2,)
    _load_fails(target, sd, rf"'max_exp_avg_sq' of parameter {where} has shape \(7,\).*"
                            rf"group {group}.*{re.escape(str(shape))}")


@pytest.mark.parametrize("bad, match", [
    (lambda s: s.__setitem__("exp_avg", "zeros"), r"'exp_avg' of parameter 1 .*numbers"),
    (lambda s: s.__setitem__("exp_avg", None), r"'exp_avg' of parameter 1 .*None"),
    (lambda s: s.__setitem__("step", -1), r"'step' of parameter 1 .*-1"),
    (lambda s: s.__setitem__("step", 2.5), r"'step' of parameter 1 .*2.5"),
    (lambda s: s.__setitem__("step", np.array([1.0, 2.0])), r"'step' of parameter 1"),
    (lambda s: s.__setitem__("step", "two"), r"'step' of parameter 1 .*'two'"),
    (lambda s: s.__setitem__("exp_avg_sq", np.zeros(3, complex)), r"'exp_avg_sq' of parameter 1"),
], ids=["string", "None", "negative-step", "fractional-step", "array-step", "string-step",
        "complex"])
def test_values_that_are_not_state_raise(bad, match):
    opt, _ = _trained(optim.Adam, {}, sizes=(2,))
    sd = opt.state_dict()
    bad(sd["state"][1])
    _load_fails(_trained(optim.Adam, {}, sizes=(2,))[0], sd, match)


def test_group_count_and_size_mismatches_use_torch_wording():
    """Our messages start with PyTorch's, then say what differs."""
    def torch_message(loaded_sizes, target_sizes):
        def make(sizes):
            return torch.optim.Adam([{"params": [torch.nn.Parameter(torch.ones(2))
                                                 for _ in range(n)]} for n in sizes])
        with pytest.raises(ValueError) as info:
            make(target_sizes).load_state_dict(make(loaded_sizes).state_dict())
        return str(info.value)

    sd = _trained(optim.Adam, {}, sizes=(2,))[0].state_dict()
    message = _load_fails(_trained(optim.Adam, {}, sizes=(1, 1))[0], sd,
                          "has 1 parameter group, this optimizer has 2")
    assert message.startswith(torch_message((2,), (1, 1)))
    message = _load_fails(_trained(optim.Adam, {}, sizes=(3,))[0], sd,
                          "group 0 has 2 parameters, this optimizer's has 3")
    assert message.startswith(torch_message((2,), (3,)))


def test_load_state_dict_errors():
    a, b = lk.Parameter(np.ones(3)), lk.Parameter(np.ones(2))
    opt = optim.Adam([a, b])
    a.grad, b.grad = np.ones(3), np.ones(2)
    opt.step()
    sd = opt.state_dict()
    with pytest.raises(ValueError, match="group 0 has 2 parameters, this optimizer's has 1"):
        optim.Adam([lk.Parameter(np.ones(3))]).load_state_dict(sd)
    with pytest.raises(ValueError, match="parameter group"):
        optim.Adam([{"params": [a]}, {"params": [b]}]).load_state_dict(sd)
    with pytest.raises(ValueError, match=r"'exp_avg' of parameter 0 has shape \(3,\)"):
        optim.Adam([lk.Parameter(np.ones(4)), lk.Parameter(np.ones(2))]).load_state_dict(sd)


@pytest.mark.parametrize("edit, match", [
    (lambda sd: sd["state"].__setitem__(9, sd["state"][0]), "state for parameter 9, which no"),
    (lambda sd: sd["param_groups"][0].__setitem__("params", [0, 0]), "lists parameter 0 twice"),
    (lambda sd: sd["param_groups"][0].__setitem__("lr", -1.0),
     "loaded parameter group 0: Invalid learning rate"),
    (lambda sd: sd["param_groups"][0].__setitem__("betas", (0.9,)),
     "loaded parameter group 0: betas must be a pair"),
    (lambda sd: sd.pop("state"), "lacks 'state'"),
    (lambda sd: sd["param_groups"][0].pop("params"), "group 0 lacks 'params'"),
], ids=["unknown-index", "duplicate-index", "bad-lr", "bad-betas", "no-state", "no-params"])
def test_malformed_state_dicts_raise_and_change_nothing(edit, match):
    sd = _trained(optim.Adam, {}, sizes=(2,))[0].state_dict()
    edit(sd)
    _load_fails(_trained(optim.Adam, {}, sizes=(2,))[0], sd, match)


def test_every_problem_is_named_in_one_message():
    sd = _trained(optim.Adam, {}, sizes=(2, 1))[0].state_dict()
    del sd["state"][0]["exp_avg"]
    sd["state"][2]["exp_avg_sq"] = np.zeros(9)
    message = _load_fails(_trained(optim.Adam, {}, sizes=(2, 1))[0], sd, "parameter 0")
    assert "parameter 2 has shape (9,)" in message.replace("'exp_avg_sq' of ", "")


def test_a_failed_load_leaves_training_exactly_as_before():
    """After a refused load the optimizer steps as an untouched twin does, bit for bit."""
    def fresh():
        return _trained(optim.Adam, {"amsgrad": True}, sizes=(3, 1), steps=3)

    (opt, params), (twin, twin_params) = fresh(), fresh()
    bad = opt.state_dict()
    del bad["state"][3]["exp_avg_sq"]
    bad["param_groups"][0]["lr"] = 1.0
    with pytest.raises(ValueError):
        opt.load_state_dict(bad)
    for step in range(3, 6):
        for i, (p, q) in enumerate(zip(params, twin_params)):
            p.grad = grad_fn(p.data, step, i)
            q.grad = grad_fn(q.data, step, i)
        opt.step()
        twin.step()
    assert opt.param_groups[0]["lr"] == 0.05
    for p, q in zip(params, twin_params):
        np.testing.assert_array_equal(p.data, q.data)


def test_empty_entries_and_untrained_parameters_load_as_no_state():
    """``{}`` for a parameter means no state yet (PyTorch then starts it fresh, as we do)."""
    opt, _ = _trained(optim.Adam, {}, sizes=(2,))
    sd = opt.state_dict()
    sd["state"][1] = {}
    target, target_params = _trained(optim.Adam, {}, sizes=(2,), steps=0)
    target.load_state_dict(sd)
    assert list(target.state) == [target_params[0]]


def test_a_long_list_of_problems_is_cut_short():
    """Another optimizer's state for a 12-parameter model: ten lines, then a count."""
    sgd, _ = _trained(optim.SGD, {"momentum": 0.9}, sizes=(12,))
    target, _ = _trained(optim.Adam, {}, sizes=(12,))
    sd = sgd.state_dict()
    sd["param_groups"] = target.state_dict()["param_groups"]
    message = _load_fails(target, sd, r"into Adam \(12 problems\)")
    assert "parameter 9 (group 0)" in message and "parameter 10 (group 0)" not in message
    assert message.endswith("... and 2 more")


def test_an_optimizer_that_does_not_describe_its_state_still_loads_it():
    """A subclass without ``_state_keys``: keys are not checked, shapes and counts are."""
    class Counting(optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {"lr": 0.1})

        def _update(self, group):
            for p, grad in self._trainable(group):
                s = self.state.setdefault(p, {"step": 0, "last": np.zeros_like(p.data),
                                              "flag": None})
                s["step"] += 1
                s["last"] = grad.copy()

    p = lk.Parameter(np.ones(3))
    opt = Counting([p])
    p.grad = np.full(3, 2.0)
    opt.step()
    twin = Counting([lk.Parameter(np.ones(3))])
    twin.load_state_dict(opt.state_dict())
    (entry,) = twin.state.values()
    assert entry["step"] == 1 and entry["flag"] is None
    np.testing.assert_array_equal(entry["last"], np.full(3, 2.0))
    sd = opt.state_dict()
    sd["state"][0]["last"] = np.zeros(4)
    _load_fails(twin, sd, r"'last' of parameter 0 has shape \(4,\)")
