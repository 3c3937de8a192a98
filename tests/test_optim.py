"""Optimizers against PyTorch: 20-step trajectories, groups, dtypes, construction, zero_grad.

The package's other parts have their own files: test_optim_adam.py (the Adam update as a
function), test_optim_flat.py (the flat fast path), test_optim_state.py (state dicts and what
load_state_dict refuses), test_optim_clip.py (gradient clipping).
"""

from __future__ import annotations

import numpy as np
import pytest
from optim_cases import GROUPS, run_ours, run_torch

import linearkit as lk
from linearkit import optim

torch = pytest.importorskip("torch")
from torch.testing import assert_close

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


@pytest.mark.parametrize("foreach", [False, None], ids=["foreach=False", "default"])
@pytest.mark.parametrize("name, case, kwargs", CASES, ids=[f"{n}-{c}" for n, c, _ in CASES])
def test_trajectory_matches_torch_float64(name, case, kwargs, foreach):
    ours, opt = run_ours(getattr(optim, name), kwargs, GROUPS)
    theirs, topt = run_torch(getattr(torch.optim, name), {**kwargs, "foreach": foreach}, GROUPS)
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
    ours, _ = run_ours(optim.AdamW, {}, groups)
    theirs, _ = run_torch(torch.optim.AdamW, {"foreach": False}, groups)
    for p, q in zip(ours, theirs):
        np.testing.assert_allclose(p.data, q.detach().numpy(), rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW"])
def test_float32_stays_float32_and_matches_torch(name):
    kwargs = {"momentum": 0.9, "weight_decay": 0.01} if name == "SGD" else {"weight_decay": 0.01}
    ours, opt = run_ours(getattr(optim, name), kwargs, GROUPS, steps=5, dtype=np.float32)
    theirs, _ = run_torch(getattr(torch.optim, name), kwargs, GROUPS, steps=5,
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
