"""The flat fast path (linearkit/optim/flat.py): same bits as the per-parameter path, no copies.

A group whose parameters all step together is updated over contiguous arrays; these tests pin
that it gives the per-parameter path's bits, survives state-dict round trips, adopts the
gradients once (then zero_grad is one fill and the backward writes in place), and never
zero-fills a state that lacks a key (a bug it once had) — it raises as the per-parameter path
does. test_optim_adam.py checks both paths against the reference function ``adam_step``.
"""

from __future__ import annotations

import numpy as np
import pytest

import linearkit as lk
from linearkit import optim
from linearkit.optim.flat import FlatState

torch = pytest.importorskip("torch")


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
            _loss, loss_back = loss_fn.vjp(pred, y)
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


def _stepped(cls, sizes, steps=2, **kwargs):
    rng = np.random.default_rng(8)
    params = [lk.Parameter(rng.standard_normal((n,))) for n in sizes]
    opt = cls(params, lr=0.05, **kwargs)
    for step in range(steps):
        for p in params:
            p.grad = np.cos(p.data) + step
        opt.step()
    return opt, params


@pytest.mark.parametrize("sizes", [(3,), (3, 2)], ids=["per-parameter", "flat"])
def test_amsgrad_switched_on_mid_run_raises_in_both_paths_as_torch_does(sizes):
    """PyTorch raises a bare KeyError here; ours names the parameter and key, in both paths."""
    tparams = [torch.nn.Parameter(torch.ones(n)) for n in sizes]
    topt = torch.optim.Adam(tparams)
    for p in tparams:
        p.grad = torch.ones_like(p)
    topt.step()
    topt.param_groups[0]["amsgrad"] = True
    with pytest.raises(KeyError, match="max_exp_avg_sq"):
        topt.step()

    opt, params = _stepped(optim.Adam, sizes)
    opt.param_groups[0]["amsgrad"] = True
    before = {p: dict(s) for p, s in opt.state.items()}
    data = [p.data.copy() for p in params]
    with pytest.raises(ValueError, match=r"parameter 0 \(group 0\) lacks 'max_exp_avg_sq'.*"
                                         r"amsgrad=True"):
        opt.step()
    assert {p: dict(s) for p, s in opt.state.items()} == before    # nothing half-done
    for p, d in zip(params, data):
        np.testing.assert_array_equal(p.data, d)


@pytest.mark.parametrize("sizes", [(3,), (3, 2), (3, 2, 4)], ids=["per-parameter", "flat-2",
                                                                  "flat-3"])
@pytest.mark.parametrize("key", ["exp_avg_sq", "exp_avg", "step"])
def test_a_state_that_lost_a_key_raises_never_zero_filled(key, sizes):
    """The defect's other door: the flat path used to pack a missing moment as zeros."""
    opt, params = _stepped(optim.Adam, sizes)
    del opt.state[params[-1]][key]
    data = [p.data.copy() for p in params]
    with pytest.raises(ValueError, match=rf"parameter {len(sizes) - 1} \(group 0\) lacks '{key}'"):
        opt.step()
    for p, d in zip(params, data):                                # no parameter stepped
        np.testing.assert_array_equal(p.data, d)


def test_gradients_are_adopted_once_then_written_in_place(monkeypatch):
    """Same work as before the split: one gather on adoption, none after (no extra copies)."""
    gathers = []
    real = FlatState.gather
    monkeypatch.setattr(FlatState, "gather",
                        lambda self, arrays, into="grad": gathers.append(into) or
                        real(self, arrays, into))
    lk.manual_seed(1)
    model = lk.Sequential(lk.Linear(4, 6), lk.ReLU(), lk.Linear(6, 2))
    opt = optim.Adam(model.parameters(), lr=0.01)
    loss_fn = lk.MSELoss()
    x, y = np.ones((3, 4), np.float32), np.zeros((3, 2), np.float32)
    for step in range(4):
        pred, back = model.vjp(x, input_grad=False)
        back(loss_fn.vjp(pred, y)[1]())
        opt.step()
        opt.zero_grad(set_to_none=False)
    assert gathers == ["grad"]                                    # adopted on the first step only
    flat = opt._flat[id(opt.param_groups[0])]
    for i, p in enumerate(model.parameters()):
        assert np.shares_memory(p.grad, flat.buffers["grad"])
        for key in ("exp_avg", "exp_avg_sq"):
            assert opt.state[p][key] is flat.views[key][i]
