"""Adam's update as a function (``adam_step``) against PyTorch, and both optimizer paths against it.

``adam_step`` is the reference. It follows PyTorch's single-tensor Adam operation by operation
and agrees with it to rounding, not bit for bit: PyTorch 2.13's CPU kernels fuse ``lerp`` into
one FMA (NumPy has no fused multiply-add) and its AVX-512 ``sqrt`` is not correctly rounded
(NumPy's is), so the two differ by about an ulp. The optimizer's flat path (a whole group over
contiguous arrays) and its per-parameter path must equal ``adam_step`` exactly: same
parameters, same state, same bits.
"""

from __future__ import annotations

import doctest

import numpy as np
import pytest

import linearkit as lk
from linearkit import optim
from linearkit.optim.adam import adam_step

torch = pytest.importorskip("torch")
from torch.testing import assert_close

SHAPES = [(4, 3), (3,), (2, 2, 2), (1,)]          # group 0; group 1 gets two more
OPTIONS = {
    "plain": {},
    "weight_decay": {"weight_decay": 0.1},
    "amsgrad": {"amsgrad": True},
    "everything": {"weight_decay": 0.05, "amsgrad": True, "maximize": True},
    "small_betas_big_eps": {"betas": (0.3, 0.6), "eps": 1e-2},    # lerp's weight >= 0.5 branch
}
STEPS = 8


def _grad(data: np.ndarray, step: int, index: int) -> np.ndarray:
    rng = np.random.default_rng(100 * step + index)
    return (np.sin(3.0 * data) + rng.standard_normal(data.shape)).astype(data.dtype)


def _hyper(name: str, options: dict, lr: float) -> dict:
    beta1, beta2 = options.get("betas", (0.9, 0.999))
    decoupled = name == "AdamW"
    return {"lr": lr, "beta1": beta1, "beta2": beta2, "eps": options.get("eps", 1e-8),
            "weight_decay": options.get("weight_decay", 1e-2 if decoupled else 0.0),
            "maximize": options.get("maximize", False), "decoupled_weight_decay": decoupled}


def _reference(name, options, initial, lrs, steps=STEPS):
    """Every parameter stepped by ``adam_step`` alone, on plain arrays."""
    amsgrad = options.get("amsgrad", False)
    out = []
    for i, (data, lr) in enumerate(zip(initial, lrs)):
        p = data.copy()
        m, v = np.zeros_like(p), np.zeros_like(p)
        v_max = np.zeros_like(p) if amsgrad else None
        for t in range(1, steps + 1):
            adam_step(p, _grad(p, t, i), m, v, v_max, step=t, **_hyper(name, options, lr))
        out.append((p, {"step": steps, "exp_avg": m, "exp_avg_sq": v,
                        **({"max_exp_avg_sq": v_max} if amsgrad else {})}))
    return out


def _initial(dtype):
    rng = np.random.default_rng(0)
    return [rng.standard_normal(s).astype(dtype) for s in [*SHAPES, (5,), (2, 3)]]


def _optimizer_run(name, options, dtype, grouping, in_place):
    """The optimizer over the same parameters: ``grouping`` 'flat' (two groups of 4 and 2) or
    'single' (one group per parameter: the per-parameter path)."""
    params = [lk.Parameter(a) for a in _initial(dtype)]
    if grouping == "flat":
        groups = [{"params": params[:4], "lr": 0.05}, {"params": params[4:], "lr": 0.02}]
    else:
        groups = [{"params": [p], "lr": 0.05 if i < 4 else 0.02} for i, p in enumerate(params)]
    opt = getattr(optim, name)(groups, **options)
    for t in range(1, STEPS + 1):
        for i, p in enumerate(params):
            g = _grad(p.data, t, i)
            if in_place:
                p.add_grad(g)               # overwrites a buffer zeroed in place
            else:
                p.grad = g
        opt.step()
        if in_place:
            opt.zero_grad(set_to_none=False)
    return params, opt


@pytest.mark.parametrize("in_place", [False, True], ids=["new-grads", "in-place-grads"])
@pytest.mark.parametrize("grouping", ["flat", "single"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_both_paths_equal_the_reference_function_bitwise(name, options, dtype, grouping,
                                                         in_place):
    params, opt = _optimizer_run(name, options, dtype, grouping, in_place)
    lrs = [0.05] * 4 + [0.02] * 2
    expected = _reference(name, options, _initial(dtype), lrs)
    ran_flat = [id(g) in opt._flat for g in opt.param_groups]
    assert all(ran_flat) if grouping == "flat" else not any(ran_flat)
    for p, (data, state) in zip(params, expected):
        assert p.data.dtype == dtype
        np.testing.assert_array_equal(p.data, data)
        assert opt.state[p].keys() == state.keys()
        for key, value in state.items():
            np.testing.assert_array_equal(opt.state[p][key], value, err_msg=key)
            if key != "step":
                assert opt.state[p][key].dtype == dtype


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_reference_function_matches_torch(name, options, dtype):
    """20 steps against PyTorch's single-tensor Adam/AdamW: parameter and moments to rounding."""
    rng = np.random.default_rng(1)
    grads = [rng.standard_normal((6, 5)).astype(dtype) for _ in range(20)]
    start = rng.standard_normal((6, 5)).astype(dtype)
    hyper = _hyper(name, options, 0.05)
    tp = torch.nn.Parameter(torch.from_numpy(start.copy()))
    topt = getattr(torch.optim, name)([tp], lr=0.05, foreach=False,
                                      weight_decay=hyper["weight_decay"],
                                      **{k: v for k, v in options.items() if k != "weight_decay"})
    p, m, v = start.copy(), np.zeros_like(start), np.zeros_like(start)
    v_max = np.zeros_like(start) if options.get("amsgrad") else None
    for t, g in enumerate(grads, start=1):
        tp.grad = torch.from_numpy(g.copy())
        topt.step()
        adam_step(p, g, m, v, v_max, step=t, **hyper)
    tstate = topt.state[tp]
    assert int(tstate["step"]) == 20
    moments = {"exp_avg": m, "exp_avg_sq": v, **({"max_exp_avg_sq": v_max} if v_max is not None
                                                  else {})}
    assert moments.keys() == set(tstate) - {"step"}
    tol = {} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-14}
    for key, value in moments.items():
        assert_close(torch.from_numpy(value), tstate[key], **tol, msg=key)
    assert_close(torch.from_numpy(p), tp.detach(), **tol)
    assert p.dtype == dtype


def test_reference_function_leaves_the_gradient_alone_and_keeps_float32():
    p = np.ones(4, np.float32)
    g = np.full(4, 0.5, np.float32)
    m, v, v_max = (np.zeros(4, np.float32) for _ in range(3))
    adam_step(p, g, m, v, v_max, step=1, lr=np.float64(0.1), beta1=np.float64(0.9), beta2=0.999,
              eps=1e-8, weight_decay=np.float64(0.1), maximize=True)
    np.testing.assert_array_equal(g, np.full(4, 0.5, np.float32))
    assert all(a.dtype == np.float32 for a in (p, m, v, v_max))
    assert (p > 1).all()                     # maximize: uphill


def test_the_package_examples_run():
    for module in (optim, optim.adam):
        result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert result.failed == 0 and result.attempted > 0, module.__name__
