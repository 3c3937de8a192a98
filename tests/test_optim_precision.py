"""Optimizers on 16-bit parameters: a float32 master copy and float32 states, rounded into p.data.

torch has no master-weight optimizer, so the reference is written out: the same optimizer on
float32 parameters holding the master values (ours: identical bits, the same elementwise
arithmetic; torch's float32 optimizer: within float32 rounding), then torch's ``.to(dtype)``
rounding of the master: identical bits to what lands in ``p.data``.
"""

import copy

import ml_dtypes
import numpy as np
import pytest
import torch

import linearkit as lk
from linearkit import optim
from linearkit import precision as P

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
TORCH = {BF16: torch.bfloat16, F16: torch.float16}
CASES = {
    "SGD": ("SGD", {"lr": 0.1}),
    "SGD-momentum": ("SGD", {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-2,
                             "nesterov": True}),
    "Adam": ("Adam", {"lr": 1e-2, "weight_decay": 0.1}),
    "Adam-amsgrad": ("Adam", {"lr": 1e-2, "amsgrad": True, "maximize": True}),
    "AdamW": ("AdamW", {"lr": 1e-2}),
}
STEPS = 6


def torch_bits(a32: np.ndarray, dtype) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(a32)).to(TORCH[dtype]).view(torch.int16) \
        .numpy().view(np.uint16)


def start(dtype, seed=0):
    """Two 16-bit parameters and a float32 one (a mixed group), and float32 twins of them."""
    rng = np.random.default_rng(seed)
    values = [rng.standard_normal((5, 7)), rng.standard_normal(7), rng.standard_normal((3, 7))]
    dtypes = [dtype, dtype, np.float32]
    params = [lk.Parameter(v.astype(d)) for v, d in zip(values, dtypes)]
    twins = [lk.Parameter(p.data.astype(np.float32)) for p in params]
    return params, twins


def grads_for(step: int, params, storage: bool):
    rng = np.random.default_rng(100 + step)
    out = []
    for p in params:
        g = rng.standard_normal(p.shape).astype(np.float32)
        out.append(g.astype(p.dtype) if storage and P.is_16bit(p.dtype) else g)
    return out


def run(name, kwargs, params, twins, storage, steps=STEPS, opts=None):
    opt, ref = opts or (getattr(optim, name)(params, **kwargs),
                        getattr(optim, name)(twins, **kwargs))
    for step in range(steps):
        for p, t, g in zip(params, twins, grads_for(step, params, storage)):
            p.grad = g.copy()
            t.grad = g.astype(np.float32)
        opt.step()
        ref.step()
    return opt, ref


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("storage", [False, True], ids=["grads-f32", "grads-storage"])
@pytest.mark.parametrize("case", CASES)
def test_master_steps_as_float32_and_rounds_as_torch(case, storage, dtype):
    name, kwargs = CASES[case]
    params, twins = start(dtype)
    opt, ref = run(name, kwargs, params, twins, storage)
    flat = bool(opt._flat)
    assert flat == (name != "SGD" and not storage)    # mixed group: flat unless storage grads
    for p, t in zip(params, twins):
        if P.is_16bit(p.dtype):
            state = opt.state[p]
            master = state["master_param"]
            assert p.dtype == dtype and master.dtype == np.float32
            np.testing.assert_array_equal(master, t.data)                      # our float32 step
            np.testing.assert_array_equal(p.data.view(np.uint16), torch_bits(master, dtype))
            assert state.keys() - {"master_param"} == ref.state.get(t, {}).keys()
            for key, value in state.items():
                if key != "master_param" and isinstance(value, np.ndarray):
                    assert value.dtype == np.float32, key
                    np.testing.assert_array_equal(value, ref.state[t][key], err_msg=key)
        else:
            np.testing.assert_array_equal(p.data, t.data)
            assert "master_param" not in opt.state.get(p, {})


@pytest.mark.parametrize("case", CASES)
def test_the_float32_reference_is_torchs_optimizer(case):
    """The master's trajectory: torch's float32 optimizer on the same values, to rounding."""
    name, kwargs = CASES[case]
    params, _ = start(BF16)
    masters = [torch.nn.Parameter(torch.from_numpy(p.data.astype(np.float32))) for p in params]
    topt = getattr(torch.optim, name)(masters, foreach=False, **kwargs)
    opt = getattr(optim, name)(params, **kwargs)
    for step in range(STEPS):
        for p, m, g in zip(params, masters, grads_for(step, params, False)):
            p.grad = g.copy()
            m.grad = torch.from_numpy(g.copy())
        opt.step()
        topt.step()
    for p, m in zip(params, masters):
        ours = opt.state[p]["master_param"] if P.is_16bit(p.dtype) else p.data
        torch.testing.assert_close(torch.from_numpy(ours), m.detach())


@pytest.mark.parametrize("case", ["SGD-momentum", "Adam", "AdamW"])
def test_state_dict_round_trip_continues_bit_for_bit(case):
    name, kwargs = CASES[case]
    params, twins = start(BF16)
    opt, _ = run(name, kwargs, params, twins, False, steps=3)
    saved = opt.state_dict()
    assert saved["state"][0]["master_param"].dtype == np.float32
    again = [lk.Parameter(p.data.copy()) for p in params]
    opt2 = getattr(optim, name)(again, **kwargs)
    opt2.load_state_dict(copy.deepcopy(saved))
    for step in range(3, 6):
        for p, q, g in zip(params, again, grads_for(step, params, False)):
            p.grad, q.grad = g.copy(), g.copy()
        opt.step()
        opt2.step()
    for p, q in zip(params, again):
        np.testing.assert_array_equal(p.data.view(np.uint8), q.data.view(np.uint8))
        if P.is_16bit(p.dtype):
            np.testing.assert_array_equal(opt.state[p]["master_param"],
                                          opt2.state[q]["master_param"])


def test_loaded_states_are_float32_and_a_master_is_optional():
    params, twins = start(F16)
    opt, _ = run("Adam", {}, twins, [lk.Parameter(t.data.copy()) for t in twins], False,
                   steps=2)
    saved = opt.state_dict()                         # a float32 model's state: no master
    fresh = optim.Adam(params)
    fresh.load_state_dict(saved)
    for p in params:
        assert all(v.dtype == np.float32 for v in fresh.state[p].values()
                   if isinstance(v, np.ndarray))
    for p in params:
        p.grad = np.ones(p.shape, np.float32)
    fresh.step()                                     # the master is made from p.data
    assert fresh.state[params[0]]["master_param"].dtype == np.float32
    bad = copy.deepcopy(fresh.state_dict())
    bad["state"][2]["master_param"] = np.zeros((3, 7), np.float32)   # a float32 parameter's
    with pytest.raises(ValueError, match=r"parameter 2 \(group 0\) holds 'master_param'"):
        optim.Adam(params).load_state_dict(bad)
    bad = copy.deepcopy(fresh.state_dict())
    bad["state"][0]["master_param"] = np.zeros((2, 2), np.float32)
    with pytest.raises(ValueError, match="state 'master_param' of parameter 0 has shape"):
        optim.Adam(params).load_state_dict(bad)


def test_a_replaced_array_remakes_the_master_and_sync_masters_reads_p_data():
    p = lk.Parameter(np.ones(4, BF16))
    opt = optim.SGD([p], lr=0.5)
    p.grad = np.ones(4, np.float32)
    opt.step()
    assert opt.state[p]["master_param"][0] == 0.5
    p.data = np.full(4, 3.0, BF16)                   # e.g. model.to(...) makes new arrays
    opt.step()
    np.testing.assert_array_equal(p.data.astype(np.float32), 2.5)
    p.data[...] = 10                                  # in place: the master still rules
    opt.step()
    np.testing.assert_array_equal(p.data.astype(np.float32), 2.0)
    p.data[...] = 10
    opt.sync_masters()
    opt.step()
    np.testing.assert_array_equal(p.data.astype(np.float32), 9.5)


def test_training_a_bfloat16_model_end_to_end():
    """A bf16 MLP with the documented step: float32 outputs and gradients, loss going down."""
    rng = np.random.default_rng(0)
    model = lk.Sequential(lk.Linear(8, 32), lk.ReLU(), lk.LayerNorm(32), lk.Linear(32, 3))
    model.to("bfloat16")
    opt = optim.AdamW(model.parameters(), lr=1e-2)
    x = rng.standard_normal((64, 8)).astype(np.float32)
    target = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0)
    loss_fn = lk.CrossEntropyLoss()
    losses = []
    for _ in range(60):
        pred, back = model.vjp(x, input_grad=False)
        loss, loss_back = loss_fn.vjp(pred, target)
        back(loss_back())
        opt.step()
        opt.zero_grad(set_to_none=False)
        losses.append(float(loss))
    assert pred.dtype == np.float32
    assert all(p.dtype == BF16 and p.grad.dtype == np.float32 for p in model.parameters())
    assert opt._flat                                 # one flat float32 pass over a bf16 model
    assert losses[-1] < 0.5 * losses[0]
