"""Optimizers and gradient clipping against PyTorch: trajectories, state, state_dict, dtypes."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import linearkit as lk
from linearkit import optim

torch = pytest.importorskip("torch")
from torch.testing import assert_close

SHAPES = [(3, 4), (4,), (2, 2), (5,)]
STEPS = 20


def _grad_fn(data: np.ndarray, step: int, index: int) -> np.ndarray:
    """A gradient that depends on the parameter (so errors feed back) and on the step."""
    rng = np.random.default_rng(1000 * step + index)
    return np.sin(3.0 * data) + 0.5 * data + rng.standard_normal(data.shape)


def _initial(dtype=np.float64):
    rng = np.random.default_rng(0)
    return [rng.standard_normal(shape).astype(dtype) for shape in SHAPES]


def _groups(params, group_options):
    """Two groups with different lr (and whatever else the case overrides)."""
    first, second = group_options
    return [{"params": params[:2], **first}, {"params": params[2:], **second}]


def _run_ours(cls, kwargs, group_options, steps=STEPS, dtype=np.float64):
    params = [lk.Parameter(a) for a in _initial(dtype)]
    opt = cls(_groups(params, group_options), **kwargs)
    for step in range(steps):
        for i, p in enumerate(params):
            # the last parameter has no gradient on every third step: it is skipped then
            p.grad = None if (i == 3 and step % 3 == 1) else _grad_fn(p.data, step, i).astype(dtype)
        opt.step()
    return params, opt


def _run_torch(cls, kwargs, group_options, steps=STEPS, dtype=np.float64):
    params = [torch.nn.Parameter(torch.from_numpy(a)) for a in _initial(dtype)]
    opt = cls(_groups(params, group_options), **kwargs)
    for step in range(steps):
        for i, p in enumerate(params):
            if i == 3 and step % 3 == 1:
                p.grad = None
            else:
                p.grad = torch.from_numpy(_grad_fn(p.detach().numpy(), step, i).astype(dtype))
        opt.step()
    return params, opt


SGD_CASES = {
    "plain": {},
    "momentum": {"momentum": 0.9},
    "dampening": {"momentum": 0.8, "dampening": 0.3},
    "nesterov": {"momentum": 0.9, "nesterov": True},
    "weight_decay": {"weight_decay": 0.1},
    "maximize": {"maximize": True, "momentum": 0.5},
    "everything": {"momentum": 0.7, "nesterov": True, "weight_decay": 0.05, "maximize": True},
}
ADAM_CASES = {
    "plain": {},
    "weight_decay": {"weight_decay": 0.1},
    "amsgrad": {"amsgrad": True},
    "maximize": {"maximize": True},
    "small_betas_big_eps": {"betas": (0.3, 0.6), "eps": 1e-2},   # lerp's weight >= 0.5 branch
    "everything": {"weight_decay": 0.3, "amsgrad": True, "maximize": True},
}
CASES = ([("SGD", name, kw) for name, kw in SGD_CASES.items()]
         + [("Adam", name, kw) for name, kw in ADAM_CASES.items()]
         + [("AdamW", name, kw) for name, kw in ADAM_CASES.items()])
GROUPS = ({"lr": 0.05}, {"lr": 0.01})


@pytest.mark.parametrize("foreach", [False, None], ids=["foreach=False", "default"])
@pytest.mark.parametrize("name, case, kwargs", CASES, ids=[f"{n}-{c}" for n, c, _ in CASES])
def test_trajectory_matches_torch_float64(name, case, kwargs, foreach):
    ours, opt = _run_ours(getattr(optim, name), kwargs, GROUPS)
    theirs, topt = _run_torch(getattr(torch.optim, name), {**kwargs, "foreach": foreach}, GROUPS)
    for p, q in zip(ours, theirs):
        np.testing.assert_allclose(p.data, q.detach().numpy(), rtol=0, atol=1e-10)
        assert p.data.dtype == np.float64
    # same state keys, same values
    for p, q in zip(ours, theirs):
        state, tstate = opt.state.get(p, {}), topt.state.get(q, {})
        assert set(state) == set(tstate)
        for key, value in tstate.items():
            if key == "step":
                assert state[key] == int(value)
            elif value is not None:
                np.testing.assert_allclose(state[key], value.numpy(), rtol=0, atol=1e-10)


def test_group_specific_hyperparameters_match_torch():
    groups = ({"lr": 0.05, "betas": (0.8, 0.99)}, {"lr": 0.02, "amsgrad": True,
                                                    "weight_decay": 0.2})
    ours, _ = _run_ours(optim.AdamW, {}, groups)
    theirs, _ = _run_torch(torch.optim.AdamW, {"foreach": False}, groups)
    for p, q in zip(ours, theirs):
        np.testing.assert_allclose(p.data, q.detach().numpy(), rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW"])
def test_float32_stays_float32_and_matches_torch(name):
    kwargs = {"momentum": 0.9, "weight_decay": 0.01} if name == "SGD" else {"weight_decay": 0.01}
    ours, opt = _run_ours(getattr(optim, name), kwargs, GROUPS, steps=5, dtype=np.float32)
    theirs, _ = _run_torch(getattr(torch.optim, name), kwargs, GROUPS, steps=5,
                           dtype=np.float32)
    for p, q in zip(ours, theirs):
        assert p.data.dtype == np.float32
        assert_close(torch.from_numpy(p.data), q.detach())
    for state in opt.state.values():
        for key, value in state.items():
            if isinstance(value, np.ndarray):
                assert value.dtype == np.float32, key


def test_float64_scalar_hyperparameters_do_not_promote():
    p = lk.Parameter(np.ones(3, np.float32))
    opt = optim.Adam([p], lr=np.float64(0.1), betas=(np.float64(0.9), np.float64(0.99)),
                     eps=np.float64(1e-8), weight_decay=np.float64(0.1))
    data = p.data
    for _ in range(3):
        p.grad = np.ones(3, np.float32)
        opt.step()
    assert p.data is data and p.data.dtype == np.float32   # updated in place


def test_frozen_and_gradless_parameters_get_no_state():
    frozen = lk.Parameter(np.ones(3), requires_grad=False)
    frozen.grad = np.ones(3)                        # even with a stale gradient: skipped
    no_grad = lk.Parameter(np.ones(2))
    live = lk.Parameter(np.ones(2))
    for cls, kwargs in [(optim.SGD, {"momentum": 0.9}), (optim.Adam, {}), (optim.AdamW, {})]:
        opt = cls([frozen, no_grad, live], lr=0.1, **kwargs)
        live.grad = np.ones(2)
        opt.step()
        assert list(opt.state) == [live]
        np.testing.assert_array_equal(frozen.data, np.ones(3))
        np.testing.assert_array_equal(no_grad.data, np.ones(2))
        assert set(opt.state_dict()["state"]) == {2}
    # plain SGD keeps no state at all, as in PyTorch
    opt = optim.SGD([live], lr=0.1)
    opt.step()
    assert opt.state == {}


def test_zero_grad_both_modes():
    a, b = lk.Parameter(np.ones(3)), lk.Parameter(np.ones(2))
    opt = optim.SGD([a, b], lr=0.1)
    a.grad = np.full(3, 2.0)
    grad = a.grad
    opt.zero_grad(set_to_none=False)
    assert a.grad is grad and not a.grad.any() and b.grad is None
    opt.zero_grad()
    assert a.grad is None and b.grad is None


# ------------------------------------------------------------------------ state dicts
@pytest.mark.parametrize("cls, kwargs", [
    (optim.SGD, {"momentum": 0.9, "nesterov": True}),
    (optim.Adam, {"amsgrad": True}),
    (optim.AdamW, {"weight_decay": 0.1}),
], ids=["SGD", "Adam", "AdamW"])
def test_state_dict_resume_is_exact(cls, kwargs):
    def grads(params, step):
        for i, p in enumerate(params):
            p.grad = _grad_fn(p.data, step, i)

    params = [lk.Parameter(a) for a in _initial()]
    opt = cls(_groups(params, GROUPS), **kwargs)
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
    opt2 = cls(_groups(fresh, ({"lr": 0.5}, {"lr": 0.5})), **kwargs)
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
    _, opt = _run_ours(optim.Adam, {"amsgrad": True}, GROUPS, steps=2)
    _, topt = _run_torch(torch.optim.Adam, {"amsgrad": True}, GROUPS, steps=2)
    sd, tsd = opt.state_dict(), topt.state_dict()
    assert sd["state"].keys() == tsd["state"].keys()
    for index in sd["state"]:
        assert sd["state"][index].keys() == tsd["state"][index].keys()
    assert [g["params"] for g in sd["param_groups"]] == [g["params"] for g in tsd["param_groups"]]
    for group, tgroup in zip(sd["param_groups"], tsd["param_groups"]):
        for key, value in group.items():
            assert tgroup[key] == value, key


def test_load_torch_state_dict_and_continue():
    """A PyTorch Adam state dict (tensors as arrays) resumes to PyTorch's trajectory."""
    theirs, topt = _run_torch(torch.optim.Adam, {"weight_decay": 0.1}, GROUPS, steps=4)
    tsd = topt.state_dict()
    converted = {
        "state": {i: {k: v.numpy().copy() for k, v in s.items()} for i, s in tsd["state"].items()},
        "param_groups": copy.deepcopy(tsd["param_groups"]),
    }
    params = [lk.Parameter(q.detach().numpy().copy()) for q in theirs]
    opt = optim.Adam(_groups(params, GROUPS), weight_decay=0.1)
    opt.load_state_dict(converted)
    assert opt.state[params[0]]["step"] == 4
    for step in range(4, 8):
        for i, (p, q) in enumerate(zip(params, theirs)):
            p.grad = _grad_fn(p.data, step, i)
            q.grad = torch.from_numpy(_grad_fn(q.detach().numpy(), step, i))
        opt.step()
        topt.step()
    for p, q in zip(params, theirs):
        np.testing.assert_allclose(p.data, q.detach().numpy(), rtol=0, atol=1e-10)


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


# ------------------------------------------------------------------------ construction
@pytest.mark.parametrize("make, match", [
    (lambda p: optim.SGD(p, lr=-0.1), "Invalid learning rate"),
    (lambda p: optim.SGD(p, momentum=-0.5), "Invalid momentum"),
    (lambda p: optim.SGD(p, weight_decay=-1), "Invalid weight_decay"),
    (lambda p: optim.SGD(p, nesterov=True), "Nesterov momentum requires a momentum"),
    (lambda p: optim.SGD(p, momentum=0.9, dampening=0.1, nesterov=True), "zero dampening"),
    (lambda p: optim.Adam(p, lr=-1e-3), "Invalid learning rate"),
    (lambda p: optim.Adam(p, betas=(1.0, 0.999)), "beta parameter at index 0"),
    (lambda p: optim.Adam(p, betas=(0.9, -0.1)), "beta parameter at index 1"),
    (lambda p: optim.Adam(p, eps=-1e-8), "Invalid epsilon"),
    (lambda p: optim.AdamW(p, weight_decay=-0.01), "Invalid weight_decay"),
    (lambda p: optim.Adam([{"params": p, "lr": -1.0}]), "Invalid learning rate"),
])
def test_hyperparameter_validation(make, match):
    with pytest.raises(ValueError, match=match):
        make([lk.Parameter(np.ones(2))])


def test_params_argument_errors():
    p = lk.Parameter(np.ones(2))
    with pytest.raises(ValueError, match="empty parameter list"):
        optim.SGD([], lr=0.1)
    with pytest.raises(TypeError, match="not a set"):
        optim.SGD({p}, lr=0.1)
    with pytest.raises(TypeError, match=r"only optimize Parameters, got ndarray.*Parameter\("):
        optim.SGD([np.ones(2)], lr=0.1)
    with pytest.raises(ValueError, match="more than one parameter group"):
        optim.SGD([{"params": [p]}, {"params": [p]}], lr=0.1)
    with pytest.raises(ValueError, match="same Parameter twice"):
        optim.SGD([p, p], lr=0.1)


def test_param_groups_defaults_and_add_param_group():
    a, b = lk.Parameter(np.ones(2)), lk.Parameter(np.ones(3))
    model = lk.Linear(3, 2)
    opt = optim.Adam(model.parameters(), lr=0.01)        # a generator works
    assert len(opt.param_groups) == 1 and len(opt.param_groups[0]["params"]) == 2
    opt.add_param_group({"params": [a, b], "lr": 0.5})
    group = opt.param_groups[1]
    assert group["lr"] == 0.5 and group["betas"] == (0.9, 0.999) and group["eps"] == 1e-8
    assert "Parameter Group 1" in repr(opt) and "lr: 0.5" in repr(opt)


def test_step_closure_returns_loss():
    p = lk.Parameter(np.array([2.0]))
    opt = optim.SGD([p], lr=0.1)

    def closure():
        p.grad = 2 * p.data
        return float(p.data[0] ** 2)

    assert opt.step(closure) == 4.0
    np.testing.assert_allclose(p.data, [1.6])


# ------------------------------------------------------------------------ clipping
def _clip_pair(dtype, seed=0):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s).astype(dtype) * 3 for s in [(4, 3), (5,), (2, 2)]]
    ours = [lk.Parameter(np.zeros_like(a)) for a in arrays]
    theirs = [torch.nn.Parameter(torch.zeros(a.shape, dtype=torch.from_numpy(a).dtype))
              for a in arrays]
    for p, q, a in zip(ours, theirs, arrays):
        p.grad, q.grad = a.copy(), torch.from_numpy(a.copy())
    extra = lk.Parameter(np.zeros(3, dtype))          # no gradient: ignored by both
    textra = torch.nn.Parameter(torch.zeros(3, dtype=theirs[0].dtype))
    return ours + [extra], theirs + [textra]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.5, float("inf")])
@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_clip_grad_norm_matches_torch(max_norm, norm_type, dtype):
    ours, theirs = _clip_pair(dtype)
    total = optim.clip_grad_norm_(ours, max_norm, norm_type)
    ttotal = torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type)
    assert isinstance(total, np.ndarray) and total.shape == () and total.dtype == dtype
    assert_close(torch.from_numpy(total), ttotal)
    for p, q in zip(ours, theirs):
        if q.grad is None:
            assert p.grad is None
        else:
            assert p.grad.dtype == dtype
            assert_close(torch.from_numpy(p.grad), q.grad)


def test_clip_grad_norm_edge_cases():
    p = lk.Parameter(np.ones(3))
    p.grad = np.array([1.0, np.inf, 0.0])
    with pytest.raises(RuntimeError, match="non-finite"):
        optim.clip_grad_norm_([p], 1.0, error_if_nonfinite=True)
    assert np.isinf(optim.clip_grad_norm_([p], 1.0))
    total = optim.clip_grad_norm_([lk.Parameter(np.ones(2))], 1.0)   # no gradients at all
    assert total == 0.0
    single = lk.Parameter(np.ones(2))
    single.grad = np.array([3.0, 4.0])
    assert optim.clip_grad_norm_(single, 1.0) == 5.0                # a bare Parameter works
    np.testing.assert_allclose(single.grad, np.array([3.0, 4.0]) / (5.0 + 1e-6))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_clip_grad_value_matches_torch(dtype):
    ours, theirs = _clip_pair(dtype, seed=1)
    assert optim.clip_grad_value_(ours, 1.5) is None
    torch.nn.utils.clip_grad_value_(theirs, 1.5)
    for p, q in zip(ours, theirs):
        if q.grad is not None:
            assert p.grad.dtype == dtype
            assert_close(torch.from_numpy(p.grad), q.grad)


# ------------------------------------------------------------------------ end to end
def test_mlp_training_matches_torch_end_to_end():
    """10 Adam steps of Linear(8,16)-ReLU-Linear(16,3) + CrossEntropyLoss, float64."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 8))
    y = rng.integers(0, 3, 32)
    model = lk.Sequential(lk.Linear(8, 16, dtype=np.float64, rng=rng), lk.ReLU(),
                          lk.Linear(16, 3, dtype=np.float64, rng=rng))
    tmodel = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                 torch.nn.Linear(16, 3)).double()
    tmodel.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in model.state_dict().items()})
    loss_fn, tloss_fn = lk.CrossEntropyLoss(), torch.nn.CrossEntropyLoss()
    opt = optim.Adam(model.parameters(), lr=1e-2)
    topt = torch.optim.Adam(tmodel.parameters(), lr=1e-2)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    for _ in range(10):
        pred, back = model.vjp(x, input_grad=False)
        loss, loss_back = loss_fn.vjp(pred, y)
        back(loss_back())
        opt.step()
        opt.zero_grad()
        tloss = tloss_fn(tmodel(xt), yt)
        tloss.backward()
        topt.step()
        topt.zero_grad()
        assert_close(torch.from_numpy(loss), tloss.detach())
    for key, value in tmodel.state_dict().items():
        assert_close(torch.from_numpy(model.state_dict()[key]), value)


# ------------------------------------------------------------------ the flat fast path (issue 3)
@pytest.mark.parametrize("name", ["Adam", "AdamW"])
@pytest.mark.parametrize("kwargs", [{}, {"weight_decay": 0.1}, {"amsgrad": True, "maximize": True}])
def test_flat_fast_path_equals_the_per_parameter_path_bitwise(name, kwargs):
    """Two parameters step together (flat path); each alone in its own group steps per parameter."""
    def run(grouped):
        rng = np.random.default_rng(3)
        params = [lk.Parameter(rng.standard_normal(s)) for s in [(4, 3), (3,), (2, 2)]]
        groups = [{"params": params}] if grouped else [{"params": [p]} for p in params]
        opt = getattr(optim, name)(groups, lr=0.03, **kwargs)
        for step in range(15):
            for i, p in enumerate(params):
                p.grad = np.cos(2.0 * p.data) + 0.1 * step * (i + 1)
            opt.step()
        return params, opt

    fast, fast_opt = run(grouped=True)
    plain, _ = run(grouped=False)
    assert id(fast_opt.param_groups[0]) in fast_opt._flat  # the fast path really ran
    for a, b in zip(fast, plain):
        np.testing.assert_array_equal(a.data, b.data)


def test_flat_state_survives_state_dict_round_trip_and_load():
    rng = np.random.default_rng(4)
    params = [lk.Parameter(rng.standard_normal(s).astype(np.float32)) for s in [(3, 2), (2,)]]
    opt = optim.Adam(params, lr=0.1)
    for _ in range(3):
        for p in params:
            p.grad = np.ones_like(p.data)
        opt.step()
    saved = opt.state_dict()
    assert saved["state"][0]["exp_avg"].shape == (3, 2) and saved["state"][0]["step"] == 3
    twin_params = [lk.Parameter(p.data.copy()) for p in params]
    twin = optim.Adam(twin_params, lr=0.1)
    twin.load_state_dict(saved)
    for group in (params, twin_params):
        for p in group:
            p.grad = np.full_like(p.data, 0.5)
    opt.step()
    twin.step()
    for a, b in zip(params, twin_params):
        np.testing.assert_array_equal(a.data, b.data)
        assert a.data.dtype == np.float32
    assert opt.state[params[0]]["exp_avg"].dtype == np.float32


def test_in_place_zero_grad_training_equals_set_to_none_and_reuses_buffers():
    def run(set_to_none):
        lk.manual_seed(5)
        model = lk.Sequential(lk.Linear(6, 8, dtype=np.float64), lk.ReLU(),
                              lk.Linear(8, 3, dtype=np.float64))
        opt = optim.Adam(model.parameters(), lr=0.01)
        loss_fn = lk.CrossEntropyLoss()
        rng = np.random.default_rng(0)
        grad_ids = []
        for _ in range(6):
            x, y = rng.standard_normal((5, 6)), rng.integers(0, 3, 5)
            pred, back = model.vjp(x, input_grad=False)
            loss, loss_back = loss_fn.vjp(pred, y)
            back(loss_back())
            opt.step()
            grad_ids.append([id(p.grad) for p in model.parameters()])
            opt.zero_grad(set_to_none=set_to_none)
            if not set_to_none:  # zeroed in place: the next backward may overwrite
                assert all(p._zeroed is p.grad and not p.grad.any() for p in model.parameters())
        return [p.data.copy() for p in model.parameters()], grad_ids

    plain, _ = run(True)
    reused, ids = run(False)
    for a, b in zip(plain, reused):
        np.testing.assert_array_equal(a, b)
    assert all(step == ids[0] for step in ids[1:])  # the same gradient buffers every step
