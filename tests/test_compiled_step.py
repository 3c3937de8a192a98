"""``loop.step`` in one compiled call (linearkit/runtime/compiled_step.py) leaves the parts' bits.

Two copies of each model train side by side for several steps, one with the compiled step and
one with it switched off (the parts: the compiled chain, the fused loss and Adam's flat step,
each bitwise the NumPy path in its own tests). After every step the losses, the parameters,
the gradients (values, or None) and every optimizer state must be bitwise equal, and the kernel
must have run (a silent fallback would prove nothing). Steps the kernel does not take must
fall back and still give the parts' results and errors.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from kernel_spies import KernelCalls

import linearkit as lk
from linearkit.runtime import compiled_step
from linearkit.training.loop import step

pytest.importorskip("numba", reason="the compiled step needs numba (linearkit[fast])")


def _lin(a, b, dtype, rng, bias=True):
    return lk.Linear(a, b, bias=bias, dtype=dtype, rng=rng)


def _model(kind, dtype, seed=0):
    rng = np.random.default_rng(seed)

    def lin(a, b, bias=True):
        return _lin(a, b, dtype, rng, bias)

    if kind == "recipe":
        return lk.Sequential(lin(12, 16), lk.ReLU(),
                             lk.Residual(lk.Sequential(lin(16, 16), lk.ReLU())), lin(16, 5))
    if kind == "mlp":
        return lk.Sequential(lin(12, 16), lk.ReLU(), lk.Sequential(lin(16, 16), lk.ReLU()),
                             lin(16, 5))
    if kind == "no-bias":
        return lk.Sequential(lin(12, 16, bias=False), lk.ReLU(), lin(16, 5, bias=False))
    if kind == "ends-in-relu":
        return lk.Sequential(lin(12, 16), lk.ReLU(), lin(16, 5), lk.ReLU())
    raise ValueError(kind)


def _Count(monkeypatch):
    """Counts the steps the kernel completed (not those it handed back, returning -1)."""
    return KernelCalls(monkeypatch, "train_step", counts=lambda total: total >= 0)


def _batches(dtype, n=6, rows=10, classes=5, seed=1):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((rows, 12)).astype(dtype), rng.integers(0, classes, rows))
            for _ in range(n)]


def _state_arrays(opt):
    out = []
    for p in opt.param_groups[0]["params"]:
        entry = opt.state.get(p, {})
        out.append(sorted((k, v if np.isscalar(v) else np.array(v).tobytes())
                          for k, v in entry.items()))
    return out


def _same_state(a_model, a_opt, b_model, b_opt):
    for pa, pb in zip(a_model.parameters(), b_model.parameters()):
        assert pa.data.tobytes() == pb.data.tobytes()
        assert (pa.grad is None) == (pb.grad is None)
        if pa.grad is not None:
            assert pa.grad.tobytes() == pb.grad.tobytes()
    assert _state_arrays(a_opt) == _state_arrays(b_opt)


def _pair(kind, dtype, make_opt, loss_fn=None):
    model = _model(kind, dtype)
    twin = copy.deepcopy(model)
    loss_fn = loss_fn or lk.CrossEntropyLoss()
    return (model, make_opt(model), twin, make_opt(twin), loss_fn)


def _train_both(pair, batches, monkeypatch, set_to_none=False, between=None):
    model, opt, twin, twin_opt, loss_fn = pair
    for i, (x, y) in enumerate(batches):
        if between is not None:
            between(i, opt, twin_opt)
        compiled_loss = step(model, loss_fn, opt, x, y, set_to_none=set_to_none)
        with lk.runtime.disabled("compiled_step"):
            parts_loss = step(twin, loss_fn, twin_opt, x, y, set_to_none=set_to_none)
        assert np.float64(compiled_loss).tobytes() == np.float64(parts_loss).tobytes()
        _same_state(model, opt, twin, twin_opt)


OPTIMIZERS = {
    "adam": lambda m: lk.optim.Adam(m.parameters(), lr=1e-2),
    "adam-l2": lambda m: lk.optim.Adam(m.parameters(), lr=1e-2, weight_decay=0.1),
    "adamw": lambda m: lk.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1),
    "amsgrad": lambda m: lk.optim.Adam(m.parameters(), lr=1e-2, amsgrad=True),
    "maximize": lambda m: lk.optim.Adam(m.parameters(), lr=1e-2, betas=(0.3, 0.9),
                                        maximize=True),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["recipe", "mlp", "no-bias", "ends-in-relu"])
@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_same_bits_as_the_parts(kind, dtype, opt_name, monkeypatch):
    count = _Count(monkeypatch)
    _train_both(_pair(kind, dtype, OPTIMIZERS[opt_name]), _batches(dtype), monkeypatch)
    assert count.calls == 5          # every step but the first (it packs Adam's flat state)


@pytest.mark.parametrize("set_to_none", [True, False])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_set_to_none_and_sum(set_to_none, reduction, monkeypatch):
    count = _Count(monkeypatch)
    pair = _pair("recipe", np.float32, OPTIMIZERS["adam"],
                 lk.CrossEntropyLoss(reduction=reduction))
    _train_both(pair, _batches(np.float32), monkeypatch, set_to_none=set_to_none)
    assert count.calls == 5
    assert all((p.grad is None) == set_to_none for p in pair[0].parameters())


def test_switching_set_to_none_between_steps(monkeypatch):
    """Gradients None after one step, the flat buffer's zeroed views after the next."""
    pair = _pair("mlp", np.float32, OPTIMIZERS["adamw"])
    count = _Count(monkeypatch)
    for i, (x, y) in enumerate(_batches(np.float32, n=8)):
        _train_both(pair, [(x, y)], monkeypatch, set_to_none=i % 3 == 1)
    assert count.calls == 7


def test_accumulated_gradient_is_added_to(monkeypatch):
    """A gradient left in ``.grad`` (not zeroed) is added into, as the parts add."""
    pair = _pair("recipe", np.float64, OPTIMIZERS["adam"])
    model, _, twin, _, loss_fn = pair
    x0, y0 = _batches(np.float64, n=1, seed=5)[0]

    def accumulate(i, a, b):
        if i >= 2:
            for m in (model, twin):
                pred, backward = m.vjp(x0, input_grad=False)
                backward(loss_fn.vjp(pred, y0)[1]())
    count = _Count(monkeypatch)
    _train_both(pair, _batches(np.float64), monkeypatch, between=accumulate)
    assert count.calls == 5


def test_learning_rate_changes_are_read_each_step(monkeypatch):
    def schedule(i, a, b):
        for opt in (a, b):
            opt.param_groups[0]["lr"] = 1e-2 / (1 + i)
            opt.param_groups[0]["betas"] = (0.9 - 0.05 * i, 0.999)
    count = _Count(monkeypatch)
    _train_both(_pair("recipe", np.float32, OPTIMIZERS["adam"]), _batches(np.float32),
                monkeypatch, between=schedule)
    assert count.calls == 5


def test_frozen_first_layer_trains_the_rest(monkeypatch):
    def make(model):
        model[0].weight.requires_grad = False
        model[0].bias.requires_grad = False
        return lk.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    count = _Count(monkeypatch)
    pair = _pair("recipe", np.float32, make)
    _train_both(pair, _batches(np.float32), monkeypatch)
    assert count.calls == 5
    assert pair[0][0].weight.grad is None


def _fallback(pair, monkeypatch, batches=None, **kw):
    count = _Count(monkeypatch)
    _train_both(pair, batches or _batches(np.float32), monkeypatch, **kw)
    return count.calls


def test_falls_back_when_a_parameter_is_not_the_optimizers(monkeypatch):
    """The chain trains a parameter the optimizer does not step: the parts handle it."""
    pair = _pair("recipe", np.float32,
                 lambda m: lk.optim.Adam(list(m.parameters())[2:], lr=1e-2))
    assert _fallback(pair, monkeypatch) == 0


def test_falls_back_for_other_optimizers_groups_and_losses(monkeypatch):
    assert _fallback(_pair("mlp", np.float32,
                           lambda m: lk.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)),
                     monkeypatch) == 0

    def two_groups(m):
        return lk.optim.Adam([{"params": list(m.parameters())[:2]},
                              {"params": list(m.parameters())[2:]}], lr=1e-2)
    assert _fallback(_pair("mlp", np.float32, two_groups), monkeypatch) == 0
    for loss_fn in (lk.CrossEntropyLoss(label_smoothing=0.1),
                    lk.CrossEntropyLoss(weight=np.linspace(0.5, 1.5, 5))):
        assert _fallback(_pair("mlp", np.float32, OPTIMIZERS["adam"], loss_fn),
                         monkeypatch) == 0


def test_falls_back_under_hooks_anomaly_and_tracemalloc(monkeypatch):
    import tracemalloc

    pair = _pair("mlp", np.float32, OPTIMIZERS["adam"])
    seen = []
    for m in (pair[0], pair[2]):
        m.register_forward_hook(lambda module, args, out: seen.append(1))
    assert _fallback(pair, monkeypatch) == 0 and len(seen) == 12
    pair = _pair("mlp", np.float32, OPTIMIZERS["adam"])
    with lk.detect_anomaly():
        assert _fallback(pair, monkeypatch) == 0
    pair = _pair("mlp", np.float32, OPTIMIZERS["adam"])
    tracemalloc.start()
    try:
        assert _fallback(pair, monkeypatch) == 0
    finally:
        tracemalloc.stop()


def test_ignored_and_bad_targets_take_the_parts(monkeypatch):
    pair = _pair("recipe", np.float32, OPTIMIZERS["adam"], lk.CrossEntropyLoss(ignore_index=2))
    batches = _batches(np.float32)
    held = sum(2 in y for _, y in batches[1:])
    assert held and _fallback(pair, monkeypatch, batches) == 5 - held   # the parts ignore 2
    model, opt, *_ = _pair("recipe", np.float32, OPTIMIZERS["adam"])
    x, y = batches[0]
    step(model, lk.CrossEntropyLoss(), opt, x, y)
    before = [p.data.copy() for p in model.parameters()]
    with pytest.raises(ValueError, match="class index 7"):
        step(model, lk.CrossEntropyLoss(), opt, x, np.where(np.arange(10) == 4, 7, y))
    assert all((p.data == b).all() for p, b in zip(model.parameters(), before))


def test_strided_and_read_only_targets(monkeypatch):
    count = _Count(monkeypatch)
    batches = []
    for x, y in _batches(np.float32):
        wide = np.repeat(y, 2)[::2]           # a strided view
        wide.flags.writeable = False
        batches.append((x, wide.astype(np.int32)[::1] if len(batches) % 2 else wide))
    _train_both(_pair("mlp", np.float32, OPTIMIZERS["adam"]), batches, monkeypatch)
    assert count.calls == 5


def test_kept_plan_follows_a_replaced_parameter(monkeypatch):
    """``p.data = new`` between steps: the next step reads the new array."""
    pair = _pair("recipe", np.float32, OPTIMIZERS["adam"])
    model, _, twin, _, _ = pair

    def replace(i, a, b):
        if i == 3:
            for m in (model, twin):
                m[0].weight.data = m[0].weight.data * 0.5
    count = _Count(monkeypatch)
    _train_both(pair, _batches(np.float32), monkeypatch, between=replace)
    assert count.calls == 5


def test_lk_fast_zero_turns_it_off(monkeypatch):
    monkeypatch.setenv("LINEARKIT_FAST", "0")
    pair = _pair("mlp", np.float32, OPTIMIZERS["adam"])
    model, opt, *_ = pair
    for x, y in _batches(np.float32, n=3):
        assert compiled_step.run(model, pair[4], opt, x, y, False) is None
        step(model, pair[4], opt, x, y)


def test_deep_copied_model_and_optimizer_train_on_their_own(monkeypatch):
    """``copy.deepcopy((model, opt))`` mid-training: the copy's steps update the copy's
    parameters (a kept plan's views would be arrays of their own in the copy) and match the
    original's, step for step; the original is untouched by them."""
    model, opt, *_ = _pair("recipe", np.float32, OPTIMIZERS["adam"])
    loss_fn = lk.CrossEntropyLoss()
    batches = _batches(np.float32, n=8)
    for x, y in batches[:3]:
        step(model, loss_fn, opt, x, y)
    twin, twin_opt = copy.deepcopy((model, opt))
    before = [p.data.copy() for p in model.parameters()]
    count = _Count(monkeypatch)
    for x, y in batches[3:]:
        step(twin, loss_fn, twin_opt, x, y)
    assert count.calls >= 3
    assert all((p.data == b).all() for p, b in zip(model.parameters(), before))
    with lk.runtime.disabled("compiled_step"):
        for x, y in batches[3:]:
            step(model, loss_fn, opt, x, y)
    _same_state(model, opt, twin, twin_opt)


def test_linearkit_train_runs_the_compiled_step_with_the_parts_bits(monkeypatch):
    """The main job (``linearkit.recipes.train_mnist1d.train``, the recipe's MLP) takes the one-call step, and
    trains to the weights the parts give."""
    from linearkit.recipes.train_mnist1d import train

    count = _Count(monkeypatch)
    fast_model, fast_result = train("mlp", hidden=16, steps=40, eval_every=0)
    assert count.calls == 39
    with lk.runtime.disabled("compiled_step"):
        parts_model, parts_result = train("mlp", hidden=16, steps=40, eval_every=0)
    assert count.calls == 39
    for a, b in zip(fast_model.parameters(), parts_model.parameters()):
        assert a.data.tobytes() == b.data.tobytes()
    assert fast_result.test_accuracy == parts_result.test_accuracy
