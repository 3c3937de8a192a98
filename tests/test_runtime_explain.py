"""``lk.runtime.explain`` names the route each module takes, checked against the route actually
taken (spies on the compiled kernels and on Linear's guarded vjp), and ``lk.runtime.disabled``
is the switch that picks one."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_spies import KernelCalls

import linearkit as lk
from linearkit.recipes.train_mnist1d import build_model

pytestmark = pytest.mark.skipif(not lk.fast.available(), reason="needs numba (the fast extra)")


class GuardedLinearCalls:
    """Counts calls of Linear's guarded ``vjp`` (the unguarded routes call the function it
    wraps, ``__wrapped_vjp__``, directly)."""

    def __init__(self, monkeypatch):
        real = lk.Linear.vjp
        self.calls = 0

        def spy(module, *args, **kwargs):
            self.calls += 1
            return real(module, *args, **kwargs)
        spy.__wrapped_vjp__ = real.__wrapped_vjp__
        monkeypatch.setattr(lk.Linear, "vjp", spy)


def readme_model():
    lk.manual_seed(0)
    return lk.Sequential(lk.Linear(40, 100), lk.ReLU(),
                         lk.Residual(lk.Sequential(lk.Linear(100, 100), lk.ReLU())),
                         lk.Linear(100, 10))


def batch(rows=32, width=40, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, width)).astype(np.float32), rng.integers(0, 10, rows)


def test_the_readme_model_runs_as_one_compiled_chain(monkeypatch):
    model = readme_model()
    x, _ = batch()
    chain = KernelCalls(monkeypatch, "chain.chain_forward")     # loads the kernels
    report = lk.runtime.explain(model, x)
    assert report.routes("vjp") == ["compiled_chain"] * 4
    assert report.routes("forward") == ["compiled_chain"] * 4
    assert {r.vjp for r in report.rows if r.path} == {"compiled_chain"}
    model.vjp(x)
    model(x)
    assert chain.calls == 2
    text = report.text()
    assert "compiled_chain" in text and "2.module.0" in text


def test_one_row_forward_and_unloaded_kernels_are_explained():
    model = readme_model()
    x, _ = batch(rows=1)
    report = lk.runtime.explain(model, x)
    assert report.row("0").why_vjp.startswith("compiled chain: no — the input is not")


def test_the_recipe_step_is_one_compiled_call_from_its_second_step(monkeypatch):
    model = build_model("mlp", hidden=32, rng=np.random.default_rng(0))
    opt = lk.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = lk.CrossEntropyLoss()
    x, y = batch()
    steps = KernelCalls(monkeypatch, "train_step")
    first = lk.runtime.explain(model, x, loss_fn=loss_fn, optimizer=opt, y=y)
    assert first.step == "parts" and "first step packs it" in first.why_step
    lk.loop.step(model, loss_fn, opt, x, y)
    assert steps.calls == 0
    second = lk.runtime.explain(model, x, loss_fn=loss_fn, optimizer=opt, y=y)
    assert second.step == "compiled_step" and second.why_step is None
    lk.loop.step(model, loss_fn, opt, x, y)
    assert steps.calls == 1
    with lk.runtime.disabled("compiled_step"):
        off = lk.runtime.explain(model, x, loss_fn=loss_fn, optimizer=opt, y=y)
        lk.loop.step(model, loss_fn, opt, x, y)
    assert off.step == "parts" and "switched off" in off.why_step and steps.calls == 1


def test_a_hook_sends_its_module_through_the_guard_and_names_it(monkeypatch):
    model = readme_model()
    x, _ = batch()
    fired = []
    model[3].register_forward_hook(lambda *args: fired.append(1))
    chain = KernelCalls(monkeypatch, "chain.chain_forward")
    fused = KernelCalls(monkeypatch, "bias_relu_")
    guarded = GuardedLinearCalls(monkeypatch)
    report = lk.runtime.explain(model, x)
    assert report.routes("vjp") == ["fused_linear_relu", "fused_linear_relu", "guarded",
                                    "guarded"]
    assert report.row("3").why_vjp == "thin path: no — a call hook is registered on it"
    assert "a call hook is registered on it: Linear at '3'" in report.row("0").why_vjp
    # the Residual's inner Sequential decides for itself: one compiled chain
    assert report.row("2.module.0").vjp == "compiled_chain"
    model.vjp(x)
    assert (fused.calls, chain.calls, guarded.calls, len(fired)) == (1, 1, 1, 1)


def test_a_bf16_policy_keeps_every_child_guarded(monkeypatch):
    model = readme_model().to("bfloat16")
    x, _ = batch()
    chain = KernelCalls(monkeypatch, "chain.chain_forward")
    fused = KernelCalls(monkeypatch, "bias_relu_")
    guarded = GuardedLinearCalls(monkeypatch)
    with lk.precision.policy(activations="bfloat16"):
        report = lk.runtime.explain(model, x)
        model.vjp(x)
    assert set(report.routes("vjp")) == {"guarded"}
    assert report.row("0").why_vjp == ("thin path: no — a precision policy sets the compute "
                                       "or activation dtype")
    assert report.row("0").gemm == "16-bit blocks"
    assert (chain.calls, fused.calls, guarded.calls) == (0, 0, 3)
    # the same model without the policy: the thin path, Linear's own path for 16-bit storage
    report = lk.runtime.explain(model, x)
    model.vjp(x)
    assert report.routes("vjp") == ["unguarded", "unguarded", "guarded", "unguarded"]
    assert "16-bit storage" in report.row("0").why_vjp
    assert report.row("2.module.0").vjp == "unguarded"      # the inner chain decides alike
    assert (chain.calls, fused.calls, guarded.calls) == (0, 0, 3)   # no guarded Linear more


class Scale(lk.Module):
    """A custom module: ``y = 2 x``, with its own vjp."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        return 2 * x

    def vjp(self, x, input_grad=True):
        self.calls += 1
        return 2 * x, lambda dy: 2 * dy


def test_a_custom_module_is_guarded_and_keeps_the_chain_off(monkeypatch):
    lk.manual_seed(1)
    custom = Scale()
    model = lk.Sequential(lk.Linear(40, 64), lk.ReLU(), custom, lk.Linear(64, 10))
    x, _ = batch()
    chain = KernelCalls(monkeypatch, "chain.chain_forward")
    fused = KernelCalls(monkeypatch, "bias_relu_")
    report = lk.runtime.explain(model, x)
    assert report.routes("vjp") == ["fused_linear_relu", "fused_linear_relu", "guarded",
                                    "unguarded"]
    assert report.routes("forward") == ["fused_linear_relu", "fused_linear_relu", "direct",
                                        "direct"]
    assert report.row("2").why_vjp.startswith("thin path: no — its vjp is not one")
    assert "a step the kernels do not run" in report.row("3").why_vjp
    assert "Scale at '2'" in report.row("3").why_vjp
    model.vjp(x)
    assert (custom.calls, chain.calls, fused.calls) == (1, 0, 1)


def test_disabled_turns_routes_off_and_restores_them(monkeypatch):
    model = readme_model()
    x, _ = batch()
    chain = KernelCalls(monkeypatch, "chain.chain_forward")
    y_fast = model(x)
    with lk.runtime.disabled("compiled_chain", "fused_linear_relu"):
        assert lk.runtime.explain(model, x).routes("vjp") == ["unguarded", "unguarded",
                                                              "guarded", "unguarded"]
        with lk.runtime.disabled("thin_path"):
            assert set(lk.runtime.explain(model, x).routes()) == {"guarded"}
            y_guarded = model(x)
        assert not lk.runtime.enabled("compiled_chain") and lk.runtime.enabled("thin_path")
    assert lk.runtime.enabled("compiled_chain") and lk.runtime.enabled("fused_linear_relu")
    assert chain.calls == 1 and y_fast.tobytes() == y_guarded.tobytes()
    with pytest.raises(ValueError, match="unknown route 'thin'"):
        with lk.runtime.disabled("thin"):
            pass


def test_everything_off_gives_the_guarded_bits():
    model = readme_model()
    x, _ = batch()
    dy = np.ones((32, 10), np.float32)
    y, back = model.vjp(x)
    dx = back(dy)
    grads = [p.grad.copy() for p in model.parameters()]
    model.zero_grad()
    with lk.runtime.disabled():
        assert not any(lk.runtime.enabled(r) for r in lk.runtime.ROUTES)
        y2, back2 = model.vjp(x)
        dx2 = back2(dy)
    assert y.tobytes() == y2.tobytes() and dx.tobytes() == dx2.tobytes()
    assert all(a.tobytes() == p.grad.tobytes() for a, p in zip(grads, model.parameters()))


def test_a_single_layer_is_not_routed():
    report = lk.runtime.explain(lk.Linear(4, 3), np.ones((2, 4), np.float32))
    assert report.routes() == ["guarded"] and "not a Sequential" in report.rows[0].why_vjp
    assert report.rows[0].gemm == "dot"


def test_an_empty_sequential_runs_and_is_explained():
    lk.fast.kernels()                    # the compiled chain would be asked
    x = np.ones((3, 4), np.float32)
    model = lk.Sequential()
    assert model(x) is x
    y, back = model.vjp(x)
    assert y is x and back(np.ones_like(x)).shape == x.shape
    nested = lk.Sequential(lk.Sequential())
    assert nested(x) is x
    assert "no Linear in the chain" in lk.runtime.explain(nested, x).row("0").why_forward
