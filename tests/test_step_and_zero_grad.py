"""``Optimizer.step_and_zero_grad``: ``step()`` then ``zero_grad(set_to_none)``, the same result.

Adam's compiled step zeroes the flat gradient buffer in its own pass (after reading it), so
``linearkit.training.loop.step`` saves the separate fill. These tests pin that every bit matches the
two-call sequence (parameters, states, gradients), that a held reference to a gradient sees
the zeros, that the next backward overwrites the buffers, and that everything else (SGD, a
custom ``step``, ``set_to_none=True``, the NumPy path) falls back to the two calls.
"""

from __future__ import annotations

import numpy as np
import pytest

import linearkit as lk
from linearkit.optim.optimizer import Optimizer
from linearkit.training.loop import step as loop_step


def _model(seed=0):
    rng = np.random.default_rng(seed)
    return lk.Sequential(lk.Linear(6, 8, rng=rng), lk.ReLU(), lk.Linear(8, 3, rng=rng))


def _batches(n, seed=1):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((5, 6)).astype(np.float32), rng.integers(0, 3, 5))
            for _ in range(n)]


def _train(make_opt, fused: bool, set_to_none: bool):
    model = _model()
    opt = make_opt(model.parameters())
    loss_fn = lk.CrossEntropyLoss()
    for x, y in _batches(6):
        pred, backward = model.vjp(x, input_grad=False)
        _, loss_backward = loss_fn.vjp(pred, y)
        backward(loss_backward())
        if fused:
            opt.step_and_zero_grad(set_to_none)
        else:
            opt.step()
            opt.zero_grad(set_to_none)
    return model, opt


OPTIMIZERS = {
    "adam": lambda ps: lk.optim.Adam(ps, lr=1e-2),
    "adamw-amsgrad": lambda ps: lk.optim.AdamW(ps, lr=1e-2, amsgrad=True, weight_decay=0.1),
    "adam-l2-maximize": lambda ps: lk.optim.Adam(ps, lr=1e-2, weight_decay=0.05, maximize=True),
    "sgd-momentum": lambda ps: lk.optim.SGD(ps, lr=0.1, momentum=0.9),
}


@pytest.mark.parametrize("env_fast", [None, "0"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("set_to_none", [False, True])
def test_same_bits_as_step_then_zero_grad(monkeypatch, env_fast, name, set_to_none):
    if env_fast is None:
        monkeypatch.delenv("LINEARKIT_FAST", raising=False)
    else:
        monkeypatch.setenv("LINEARKIT_FAST", env_fast)
    fused_model, fused_opt = _train(OPTIMIZERS[name], True, set_to_none)
    plain_model, plain_opt = _train(OPTIMIZERS[name], False, set_to_none)
    for a, b in zip(fused_model.parameters(), plain_model.parameters()):
        assert a.data.tobytes() == b.data.tobytes()
        assert (a.grad is None) == (b.grad is None) == set_to_none
        if not set_to_none:
            assert not a.grad.any() and a.grad.shape == b.grad.shape
    fused_state, plain_state = fused_opt.state_dict()["state"], plain_opt.state_dict()["state"]
    for key in plain_state:
        for field, value in plain_state[key].items():
            assert np.asarray(fused_state[key][field]).tobytes() == np.asarray(value).tobytes()


def test_adam_zeroes_in_its_own_pass_and_the_next_backward_overwrites(monkeypatch):
    pytest.importorskip("numba", reason="the compiled Adam step needs numba (linearkit[fast])")
    monkeypatch.delenv("LINEARKIT_FAST", raising=False)
    model = _model()
    opt = lk.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = lk.CrossEntropyLoss()
    batches = _batches(3)
    loop_step(model, loss_fn, opt, *batches[0])       # the first step adopts the gradients
    held = [p.grad for p in model.parameters()]
    pred, backward = model.vjp(batches[1][0], input_grad=False)
    _, loss_backward = loss_fn.vjp(pred, batches[1][1])
    backward(loss_backward())
    assert all(g.any() for g in held)

    calls = []
    real = Optimizer._zero_group
    monkeypatch.setattr(Optimizer, "_zero_group", lambda self, *a: calls.append(a) or real(
        self, *a))
    opt.step_and_zero_grad(set_to_none=False)
    assert calls == []                                  # no separate fill
    for p, g in zip(model.parameters(), held):
        assert p.grad is g and not g.any()              # in place: a held reference sees it
    # zeroed-and-marked: the next backward writes the gradient, as after zero_grad(False)
    x, y = batches[2]
    pred, backward = model.vjp(x, input_grad=False)
    _, loss_backward = loss_fn.vjp(pred, y)
    backward(loss_backward())
    twin = _model()
    for src, dst in zip(model.parameters(), twin.parameters()):
        dst.data[...] = src.data
    pred, backward = twin.vjp(x, input_grad=False)
    _, loss_backward = loss_fn.vjp(pred, y)
    backward(loss_backward())
    for a, b in zip(model.parameters(), twin.parameters()):
        assert a.grad.tobytes() == b.grad.tobytes()


def test_a_group_whose_gradients_are_not_the_flat_buffer_is_zeroed_apart(monkeypatch):
    """After set_to_none=True the backward made fresh arrays: the kernel does not zero them
    (they could share memory); the ordinary zero_grad does, and nothing differs."""
    pytest.importorskip("numba", reason="the compiled Adam step needs numba (linearkit[fast])")
    model = _model()
    opt = lk.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = lk.CrossEntropyLoss()
    x, y = _batches(1)[0]
    for _ in range(2):
        loop_step(model, loss_fn, opt, x, y, set_to_none=True)
    shared = np.ones(3, np.float32)
    params = list(model.parameters())
    params[-1].grad = shared                             # the last bias: a user's own array
    for p in params[:-1]:
        p.grad = np.ones_like(p.data)
    opt.step_and_zero_grad(set_to_none=False)
    assert all(not p.grad.any() for p in params) and params[-1].grad is shared


def test_an_optimizer_with_its_own_step_gets_step_then_zero_grad():
    class Halving(lk.optim.Adam):
        def step(self, closure=None):
            for p in self.param_groups[0]["params"]:
                p.data *= 0.5

    p = lk.Parameter(np.ones(3, np.float32))
    opt = Halving([p], lr=0.1)
    p.grad = np.ones(3, np.float32)
    opt.step_and_zero_grad(set_to_none=False)
    assert p.data.tolist() == [0.5] * 3 and p.grad.tolist() == [0.0] * 3


def test_loop_step_uses_it_and_a_duck_typed_optimizer_still_works():
    class Plain:                        # step/zero_grad only, as linearkit train accepts
        def __init__(self, params):
            self.params, self.calls = list(params), []

        def step(self):
            self.calls.append("step")

        def zero_grad(self, set_to_none=True):
            self.calls.append(("zero_grad", set_to_none))

    model = _model()
    opt = Plain(model.parameters())
    loop_step(model, lk.CrossEntropyLoss(), opt, *_batches(1)[0])
    assert opt.calls == ["step", ("zero_grad", False)]
