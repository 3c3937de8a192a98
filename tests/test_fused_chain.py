"""Sequential's thin path (runtime/thin_path.py) gives the guarded, unfused chain's bits.

Each model runs twice on the same inputs: on the thin path (built-in children unguarded,
``Linear -> ReLU`` fused) and with the thin path switched off (every child through its guard),
with and without the compiled kernels; outputs, input gradients and every parameter gradient
must be bitwise equal. The protocol's errors (wrong shapes, second backward, anomalies) still
name the failing child.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import pytest
from fresh_process import imports

import linearkit as lk
from linearkit.backend import gemm
from linearkit.runtime import thin_path as fused

DTYPES = [np.float32, np.float64]


def _models(dtype, rng):
    def lin(a, b, bias=True):
        return lk.Linear(a, b, bias=bias, dtype=dtype, rng=rng)

    return {
        "mlp": lk.Sequential(lin(6, 8), lk.ReLU(), lin(8, 8), lk.ReLU(), lin(8, 3)),
        "recipe": lk.Sequential(lin(6, 8), lk.ReLU(), lk.Residual(lk.Sequential(lin(8, 8),
                                                                                lk.ReLU())),
                                lin(8, 3)),
        "no-bias+others": lk.Sequential(lin(6, 8, bias=False), lk.ReLU(), lk.Identity(),
                                        lin(8, 8), lk.Tanh(), lin(8, 5), lk.GELU(),
                                        lk.LayerNorm(5, dtype=dtype), lin(5, 3), lk.ReLU()),
        "relu-first": lk.Sequential(lk.ReLU(), lin(6, 3), lk.Sigmoid(), lk.Dropout(0.0)),
    }


def _run(model, x, dy, input_grad, thin, monkeypatch):
    with nullcontext() if thin else lk.runtime.disabled("thin_path"):
        model.zero_grad()
        y, backward = model.vjp(x, input_grad=input_grad)
        dx = backward(dy)
        grads = [None if p.grad is None else p.grad.copy() for p in model.parameters()]
    return y, dx, grads


def _same(a, b):
    assert (a is None) == (b is None)
    if a is not None:
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("fast_env", ["1", "0"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["mlp", "recipe", "no-bias+others", "relu-first"])
@pytest.mark.parametrize("lead", [(5,), (1,), (2, 3), ()])
@pytest.mark.parametrize("input_grad", [True, False])
def test_thin_path_is_bitwise_the_guarded_chain(monkeypatch, fast_env, dtype, name, lead,
                                                input_grad):
    monkeypatch.setenv("LINEARKIT_FAST", fast_env)
    rng = np.random.default_rng(0)
    model = _models(dtype, rng)[name]
    x = rng.standard_normal(lead + (6,)).astype(dtype)
    x.reshape(-1)[:1] = 0.0                        # a unit exactly at the ReLU's kink
    y0, _ = model.vjp(x)
    dy = rng.standard_normal(y0.shape).astype(dtype)
    thin = _run(model, x, dy, input_grad, True, monkeypatch)
    guarded = _run(model, x, dy, input_grad, False, monkeypatch)
    _same(thin[0], guarded[0])
    _same(thin[1], guarded[1])
    for a, b in zip(thin[2], guarded[2]):
        _same(a, b)
    _same(thin[0], model(x))                       # and the plain forward


@pytest.mark.parametrize("fast_env", ["1", "0"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_large_output_adds_its_bias_in_the_gemm_fused_too(monkeypatch, fast_env, dtype):
    """1024 rows through 1024 -> 256: the GEMM adds the bias (backend.gemm.BIAS_FIRST), in
    Linear's forward and in the fused Linear -> ReLU alike; K = 1024 spans several of
    OpenBLAS's K-blocks, so adding it afterwards would change bits (checked first)."""
    from linearkit import functional as F

    monkeypatch.setenv("LINEARKIT_FAST", fast_env)
    rng = np.random.default_rng(1)
    model = lk.Sequential(lk.Linear(1024, 256, dtype=dtype, rng=rng), lk.ReLU(),
                          lk.Linear(256, 4, dtype=dtype, rng=rng))
    x = rng.standard_normal((1024, 1024)).astype(dtype)
    first = model[0]
    if gemm.forward_layout(1024, 1024, 256, x.dtype, first.weight.data,
                           first.bias.data) is not gemm.BIAS_FIRST:
        pytest.skip("NumPy's BLAS is not the ILP64 OpenBLAS backend/fast/blas.py binds")
    added_after = np.dot(x, first.weight.data.T) + first.bias.data
    assert not np.array_equal(first(x), added_after)
    dy = rng.standard_normal((1024, 4)).astype(dtype)
    with lk.threads.num_threads(1):     # OpenBLAS's bits depend on it (docs/threads.md)
        thin = _run(model, x, dy, True, True, monkeypatch)
        guarded = _run(model, x, dy, True, False, monkeypatch)
        _same(thin[0], model(x))
    for a, b in zip(thin[:2] + tuple(thin[2]), guarded[:2] + tuple(guarded[2])):
        _same(a, b)


@pytest.mark.parametrize("fast_env", ["1", "0"])
@pytest.mark.parametrize("dtype", DTYPES + ["bfloat16"])
@pytest.mark.parametrize("name", ["mlp", "recipe", "no-bias+others", "relu-first"])
@pytest.mark.parametrize("lead", [(5,), (1,), (2, 3), ()])
def test_thin_forward_is_bitwise_each_childs_call(monkeypatch, fast_env, dtype, name, lead):
    """``model(x)`` on the thin path (children's forward, Linear -> ReLU in one step) gives the
    bits of every child called through ``__call__`` one by one."""
    monkeypatch.setenv("LINEARKIT_FAST", fast_env)
    lk.fast.kernels()        # loaded (numba installed): the forward may use them, not import them
    rng = np.random.default_rng(2)
    model = _models(np.float32 if dtype == "bfloat16" else dtype, rng)[name]
    if dtype == "bfloat16":
        model.to("bfloat16")                     # 16-bit storage: Linear's own path
    x = rng.standard_normal(lead + (6,)).astype(np.float32 if dtype == "bfloat16" else dtype)
    x.reshape(-1)[:1] = 0.0
    thin = model(x)
    with lk.runtime.disabled("thin_path"):
        guarded = model(x)
    _same(thin, guarded)


def test_inference_alone_never_imports_numba():
    """A plain forward uses the compiled bias+ReLU only once training loaded the kernels."""
    assert not imports("import numpy as np, linearkit as lk\n"
                       "m = lk.Sequential(lk.Linear(4, 8), lk.ReLU(), lk.Linear(8, 2))\n"
                       "m(np.ones((3, 4), np.float32))", "numba")


def test_frozen_prefix_is_not_visited_and_gets_no_gradient(monkeypatch):
    rng = np.random.default_rng(1)
    model = _models(np.float32, rng)["mlp"]
    for p in model[0].parameters():
        p.requires_grad = False
    x = rng.standard_normal((4, 6)).astype(np.float32)
    y, backward = model.vjp(x, input_grad=False)
    assert backward(np.ones_like(y)) is None
    assert model[0].weight.grad is None and model[2].weight.grad is not None


def test_a_dy_of_another_dtype_is_cast_as_the_guards_cast_it(monkeypatch):
    rng = np.random.default_rng(2)
    model = lk.Sequential(lk.Linear(4, 5, dtype=np.float64, rng=rng), lk.ReLU(),
                          lk.Linear(5, 2, dtype=np.float64, rng=rng))
    x = rng.standard_normal((3, 4))
    dy = rng.standard_normal((3, 2)).astype(np.float32)
    thin = _run(model, x, dy, True, True, monkeypatch)
    guarded = _run(model, x, dy, True, False, monkeypatch)
    for a, b in zip([thin[1], *thin[2]], [guarded[1], *guarded[2]]):
        _same(a, b)


def test_errors_still_name_the_child():
    rng = np.random.default_rng(3)
    model = lk.Sequential(lk.Linear(6, 8, rng=rng), lk.ReLU(), lk.Linear(7, 3, rng=rng))
    with pytest.raises(lk.ShapeError, match=r"module '2' \(Linear\(in_features=7"):
        model.vjp(np.ones((2, 6), np.float32))
    model = lk.Sequential(lk.Linear(6, 8, rng=rng), lk.ReLU())
    _, backward = model.vjp(np.ones((2, 6), np.float32))
    with pytest.raises(lk.ShapeError, match="dy of shape"):
        backward(np.ones((2, 7), np.float32))
    _, backward = model.vjp(np.ones((2, 6), np.float32))
    backward(np.ones((2, 8), np.float32))
    with pytest.raises(lk.BackwardError, match="already called"):
        backward(np.ones((2, 8), np.float32))


class _WrongShape(lk.Module):
    """A custom module whose backward returns dx of the wrong shape."""

    def forward(self, x):
        return x

    def vjp(self, x, input_grad=True):
        return x, lambda dy: dy[:, :-1]


def test_a_custom_module_bad_dx_is_caught_at_the_next_child():
    model = lk.Sequential(lk.Linear(4, 5), lk.ReLU(), _WrongShape())
    _, backward = model.vjp(np.ones((2, 4), np.float32))
    with pytest.raises(lk.ShapeError, match=r"module '1' \(ReLU.*dy of shape \(2, 4\)"):
        backward(np.ones((2, 5), np.float32))


def test_anomaly_turned_on_after_the_forward_checks_each_child():
    model = lk.Sequential(lk.Linear(3, 2), lk.ReLU(), lk.Linear(2, 2))
    _, backward = model.vjp(np.ones((1, 3), np.float32))
    # inf * 0 in the GEMMs is NaN, NumPy's "invalid value" RuntimeWarning: provoked here, on purpose
    with lk.detect_anomaly(), np.errstate(invalid="ignore"), pytest.raises(
            lk.AnomalyError, match=r"'2'.*backward \(input gradient\).*inf"):
        backward(np.array([[np.inf, 1.0]], np.float32))


def test_hooks_see_every_child():
    model = lk.Sequential(lk.Linear(3, 4), lk.ReLU(), lk.Linear(4, 2))
    seen = []
    handle = model[1].register_forward_hook(lambda m, a, y: seen.append(("fwd", y.shape)))
    back = model[0].register_full_backward_hook(lambda m, gi, go: seen.append(("bwd", go[0].shape)))
    y, backward = model.vjp(np.ones((5, 3), np.float32))
    backward(np.ones_like(y))
    assert seen == [("fwd", (5, 4)), ("bwd", (5, 4))]
    handle.remove()
    back.remove()
