"""The compiled step as training runs it: no spy around the kernel, so after its first call
through numba's dispatcher every step calls the compiled entry point with the kept plan's
arrays (linearkit/runtime/compiled_step.py). A copy trains beside it with the compiled step
switched off (the parts, each bitwise the NumPy path in its own tests); after every step the
loss, parameters, gradients and optimizer state must be bitwise equal, and each step must have
run compiled (``compiled_step.run`` returns its loss) or fallen back, as the test says.

What can change between steps without the structure token changing is changed here, on the
kept plan: a Parameter's array or ``requires_grad``, an optimizer state entry, the learning
rate, a gradient left to accumulate, ``set_to_none``, the batch size, the input's dtype.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import linearkit as lk
from linearkit.runtime import compiled_step

pytest.importorskip("numba", reason="the compiled step needs numba (linearkit[fast])")


def _model(kind, dtype, seed=0):
    rng = np.random.default_rng(seed)

    def lin(a, b, bias=True):
        return lk.Linear(a, b, bias=bias, dtype=dtype, rng=rng)

    if kind == "recipe":
        return lk.Sequential(lin(12, 16), lk.ReLU(),
                             lk.Residual(lk.Sequential(lin(16, 16), lk.ReLU())), lin(16, 5))
    if kind == "two-residuals":
        return lk.Sequential(lin(12, 16), lk.ReLU(),
                             lk.Residual(lk.Sequential(lin(16, 16), lk.ReLU())),
                             lk.Residual(lk.Sequential(lin(16, 8), lk.ReLU(), lin(8, 16),
                                                       lk.ReLU())), lin(16, 5))
    if kind == "no-bias":
        return lk.Sequential(lin(12, 16, bias=False), lk.ReLU(), lin(16, 5, bias=False))
    if kind == "wide-few-rows":          # the WEIGHT_FIRST forward at 2-48 float32 rows
        return lk.Sequential(lin(12, 300), lk.ReLU(), lin(300, 5))
    raise ValueError(kind)


def _batches(dtype, n=6, rows=10, classes=5, seed=1, width=12):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((rows, width)).astype(dtype), rng.integers(0, classes, rows))
            for _ in range(n)]


def _parts(model, loss_fn, opt, x, y, set_to_none):
    """``loop.step``'s four lines, written out: the parts, without switching the compiled
    step off (a switch replaces the structure token, and the kept plan would never be reused
    as it is in training)."""
    pred, backward = model.vjp(x, input_grad=False)
    loss, loss_backward = loss_fn.vjp(pred, y)
    backward(loss_backward())
    opt.step_and_zero_grad(set_to_none)
    return float(loss)


class _Pair:
    """A model stepped by ``compiled_step.run`` (the parts when it declines) and its copy
    stepped by the parts; ``prepared`` counts the steps that went through ``prepare``."""

    def __init__(self, kind, dtype, make_opt=None, monkeypatch=None):
        make_opt = make_opt or (lambda m: lk.optim.Adam(m.parameters(), lr=1e-2))
        self.model = _model(kind, dtype)
        self.twin = copy.deepcopy(self.model)
        self.opt, self.twin_opt = make_opt(self.model), make_opt(self.twin)
        self.loss_fn = lk.CrossEntropyLoss()
        self.prepared = 0
        if monkeypatch is not None:
            real = compiled_step.prepare

            def counting(*args):
                self.prepared += 1
                return real(*args)
            monkeypatch.setattr(compiled_step, "prepare", counting)

    def step(self, x, y, set_to_none=False) -> bool:
        """One step of both; whether the model's ran compiled."""
        loss = compiled_step.run(self.model, self.loss_fn, self.opt, x, y, set_to_none)
        compiled = loss is not None
        if not compiled:
            loss = _parts(self.model, self.loss_fn, self.opt, x, y, set_to_none)
        parts = _parts(self.twin, self.loss_fn, self.twin_opt, x, y, set_to_none)
        assert np.float64(loss).tobytes() == np.float64(parts).tobytes()
        self.same()
        return compiled

    def same(self):
        for a, b in zip(self.model.parameters(), self.twin.parameters()):
            assert a.data.tobytes() == b.data.tobytes()
            assert (a.grad is None) == (b.grad is None)
            if a.grad is not None:
                assert a.grad.tobytes() == b.grad.tobytes()
        for a, b in zip(self.opt.param_groups[0]["params"],
                        self.twin_opt.param_groups[0]["params"]):
            sa, sb = self.opt.state[a], self.twin_opt.state[b]
            assert sa.keys() == sb.keys()
            for key in sa:
                assert np.asarray(sa[key]).tobytes() == np.asarray(sb[key]).tobytes(), key

    def plan(self):
        return self.opt.__dict__.get("_compiled_step")


OPTIMIZERS = {
    "adam": lambda m: lk.optim.Adam(m.parameters(), lr=1e-2),
    "adamw-amsgrad": lambda m: lk.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1,
                                              amsgrad=True),
    "adam-l2-maximize": lambda m: lk.optim.Adam(m.parameters(), lr=1e-2, weight_decay=0.1,
                                                betas=(0.3, 0.9), maximize=True),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["recipe", "two-residuals", "no-bias", "wide-few-rows"])
@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_entry_point_steps_have_the_parts_bits(kind, dtype, opt_name, monkeypatch):
    pair = _Pair(kind, dtype, OPTIMIZERS[opt_name], monkeypatch)
    ran = [pair.step(x, y) for x, y in _batches(dtype)]
    assert ran == [False] + [True] * 5          # the first step packs Adam's flat state
    assert pair.prepared == 2                   # the first two; the others kept the plan
    assert pair.plan().entry is not None        # and called the kernel's entry point


def test_changes_the_token_does_not_see_are_checked_each_step(monkeypatch):
    pair = _Pair("recipe", np.float32, monkeypatch=monkeypatch)
    batches = _batches(np.float32, n=16)
    ran = []
    for i, (x, y) in enumerate(batches):
        if i == 3:                                   # a Parameter's array replaced
            for m in (pair.model, pair.twin):
                m[0].weight.data = m[0].weight.data * 0.5
        if i == 8:                                   # a state entry that is not the flat view
            for opt in (pair.opt, pair.twin_opt):
                p = opt.param_groups[0]["params"][1]
                opt.state[p]["exp_avg"] = opt.state[p]["exp_avg"].copy()
        if i == 10:                                  # hyperparameters
            for opt in (pair.opt, pair.twin_opt):
                opt.param_groups[0]["lr"] = 3e-3
                opt.param_groups[0]["betas"] = [0.8, 0.99]
        if i == 11:                                  # changed in place
            for opt in (pair.opt, pair.twin_opt):
                opt.param_groups[0]["betas"][0] = 0.7
        ran.append(pair.step(x, y, set_to_none=i in (12, 13)))
    assert ran[1:8] == [True] * 7 and all(ran[9:])
    assert not ran[8]       # the parts step a state that holds other arrays (and repack it)
    # prepared: the first two steps, the replaced array (3), the foreign state (8) and the new
    # flat state (9); the new hyperparameters and set_to_none either way are read without it
    assert pair.prepared == 5


def test_a_parameter_frozen_between_steps_hands_the_steps_to_the_parts():
    """The frozen bias is still in the group but no longer trained by the chain; Adam skips
    it, so the parameters' step counts part and the parts keep the steps from then on."""
    pair = _Pair("recipe", np.float32)
    ran = []
    for i, (x, y) in enumerate(_batches(np.float32, n=8)):
        if i == 4:
            for m in (pair.model, pair.twin):
                m[3].bias.requires_grad = False
        ran.append(pair.step(x, y))
    assert ran == [False, True, True, True, False, False, False, False]


def test_accumulated_gradients_are_added_into():
    pair = _Pair("recipe", np.float64)
    x0, y0 = _batches(np.float64, n=1, seed=5)[0]
    for i, (x, y) in enumerate(_batches(np.float64, n=7)):
        if i in (2, 3, 5):
            for m in (pair.model, pair.twin):
                pred, backward = m.vjp(x0, input_grad=False)
                backward(pair.loss_fn.vjp(pred, y0)[1]())
        assert pair.step(x, y) == (i > 0)


def test_batch_sizes_and_dtypes_between_steps():
    pair = _Pair("recipe", np.float32)
    rng = np.random.default_rng(3)
    for i, rows in enumerate([10, 10, 7, 10, 2, 7, 33, 10]):
        x = rng.standard_normal((rows, 12)).astype(np.float32)
        assert pair.step(x, rng.integers(0, 5, rows)) == (i > 0)
    assert len(pair.plan().by_rows) <= 4
    x64 = rng.standard_normal((10, 12))          # float64 into a float32 model: the parts
    assert compiled_step.run(pair.model, pair.loss_fn, pair.opt, x64, rng.integers(0, 5, 10),
                             False) is None


def test_targets_of_other_integer_types_and_layouts():
    pair = _Pair("recipe", np.float32)
    for i, (x, y) in enumerate(_batches(np.float32, n=5)):
        kinds = [y, y.astype(np.int32), np.repeat(y, 2)[::2], y.astype(np.uint8), y]
        assert pair.step(x, kinds[i]) == (i > 0)


def test_out_of_range_targets_leave_the_state_as_it_was():
    pair = _Pair("recipe", np.float32)
    batches = _batches(np.float32, n=3)
    for x, y in batches[:2]:
        pair.step(x, y)
    before = [p.data.copy() for p in pair.model.parameters()]
    x, y = batches[2]
    bad = np.where(np.arange(10) == 4, 7, y)
    assert compiled_step.run(pair.model, pair.loss_fn, pair.opt, x, bad, False) is None
    assert all((p.data == b).all() for p, b in zip(pair.model.parameters(), before))
    assert pair.step(x, y)


def test_lk_fast_zero_between_steps(monkeypatch):
    pair = _Pair("recipe", np.float32)
    batches = _batches(np.float32, n=5)
    for x, y in batches[:3]:
        pair.step(x, y)
    monkeypatch.setenv("LINEARKIT_FAST", "0")
    assert not pair.step(*batches[3])
    monkeypatch.delenv("LINEARKIT_FAST")
    assert pair.step(*batches[4])
