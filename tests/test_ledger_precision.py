"""The ledger counts what 16-bit training stores, checked against tracemalloc.

What one Adam training step keeps, as linearkit does it and as the ledger counts it (the
precision policy read when ``ledger()`` runs):

* **weights** in their storage dtype: 2 bytes an element for bfloat16/float16;
* **master**: a float32 copy (``state[p]['master_param']``) of each 16-bit trainable parameter,
  none for float32 ones or frozen ones; **optimizer**: Adam's two states, float32 for 16-bit
  parameters;
* **grads** as ``precision.grad_dtype`` stores them: float32 by default, the storage dtype under
  ``policy(grads="storage")``;
* **activations**: what the backward closures keep, in the dtype they keep it — float32 (the
  compute dtype) by default; under ``policy(activations=float16)`` a Linear's input and a norm's
  xhat are float16 copies; a float16 Linear also keeps its weight's float32 copy for dx.

The popular claim that fp16 activations and gradients "cut memory in half" (显存直接砍半) is
about activations only: ``policy(activations=float16)`` halves what a Linear/LayerNorm stack
keeps for its backward. It does not touch weights, gradients, the master copy or the
optimizer's states, and it does *not* halve an MLP with ReLU: the ReLU keeps its own float32
output for its backward and the next Linear keeps a float16 copy beside it —
7/6 of the float32 activations (measured, and counted).

tracemalloc traces NumPy's allocations: the bytes held after a step (weights, gradients, master,
states) and the bytes held between forward and backward (the closures' arrays) are compared with
the ledger's fields within the required 10%; each field is also checked exactly against the arrays
the model and optimizer hold.
"""

import functools
import gc
import os
import tracemalloc

import numpy as np
import pytest
from closure_oracle import closure_bytes

import linearkit as lk
from linearkit import precision as P
from linearkit.analysis import ledger
from linearkit.core.module import Module
from linearkit.optim.optimizer import MASTER

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
WIDTH, BATCH = 1024, 256


# ------------------------------------------------------------------ models
def mlp(dtype, width=WIDTH, seed=0):
    """Linear(width, width) x3 with ReLU between, stored in ``dtype``."""
    r = np.random.default_rng(seed)
    return lk.Sequential(lk.Linear(width, width, dtype=dtype, rng=r), lk.ReLU(),
                         lk.Linear(width, width, dtype=dtype, rng=r), lk.ReLU(),
                         lk.Linear(width, width, dtype=dtype, rng=r))


def norm_stack(dtype, width=WIDTH, seed=0):
    """Linear, LayerNorm, Linear, LayerNorm, Linear: every saved array goes through
    precision.saved_activation (a Linear's input, a norm's xhat) but the norms' rstd."""
    r = np.random.default_rng(seed)
    return lk.Sequential(lk.Linear(width, width, dtype=dtype, rng=r),
                         lk.LayerNorm(width, dtype=dtype),
                         lk.Linear(width, width, dtype=dtype, rng=r),
                         lk.LayerNorm(width, dtype=dtype),
                         lk.Linear(width, width, dtype=dtype, rng=r))


def mixed(width=WIDTH, seed=0):
    """A frozen bfloat16 Linear, a float32 LayerNorm, a bfloat16 Linear, ReLU, a float32 head:
    master copies only for the trainable bfloat16 parameters."""
    r = np.random.default_rng(seed)
    model = lk.Sequential(lk.Linear(width, width, dtype=BF16, rng=r), lk.LayerNorm(width),
                          lk.Linear(width, width, dtype=BF16, rng=r), lk.ReLU(),
                          lk.Linear(width, width, rng=r))
    model[0].requires_grad_(False)
    return model


CASES = {
    "float32": (lambda: mlp(np.float32), {}),
    "bf16": (lambda: mlp(BF16), {}),
    "fp16 grads=storage": (lambda: mlp(F16), {"grads": "storage"}),
    "bf16 activations=fp16": (lambda: mlp(BF16), {"activations": F16}),
    "bf16 norms": (lambda: norm_stack(BF16), {}),
    "bf16 norms activations=fp16": (lambda: norm_stack(BF16), {"activations": F16}),
    "mixed": (mixed, {}),
}


# ------------------------------------------------------------------ measurement
def _now() -> int:
    return tracemalloc.get_traced_memory()[0]


def _step(model, opt, seed: int) -> int:
    """One Adam training step (loss = mean(y)); returns the bytes held between forward and
    backward: everything the forward allocated and kept but its output."""
    base = _now()
    x = np.random.default_rng(seed).standard_normal((BATCH, WIDTH), dtype=np.float32)
    y, backward = model.vjp(x, input_grad=False)
    del x  # the caller's reference: only what the closures keep stays
    held = _now() - base - y.nbytes
    dy = np.full_like(y, 1.0 / y.size)
    del y
    backward(dy)
    del backward, dy
    opt.step()
    opt.zero_grad(set_to_none=False)  # the gradient buffers stay, as a training loop keeps them
    return held


@functools.cache
def measured(case: str) -> dict:
    """tracemalloc bytes of a training step of ``CASES[case]`` beside its ledger.

    ``weights``: allocated by building the model; ``persistent``: held after a step (weights,
    gradients, master copies, optimizer states); ``held``: kept from forward to backward.
    """
    build, policy = CASES[case]
    # The NumPy optimizer path, whose buffers the ledger models: the numba kernels, when
    # installed, also keep a flat group's packed parameters (one more array of its size).
    os.environ["LINEARKIT_FAST"], before = "0", os.environ.get("LINEARKIT_FAST")
    try:
        return _measured(build, policy)
    finally:
        if before is None:
            del os.environ["LINEARKIT_FAST"]
        else:
            os.environ["LINEARKIT_FAST"] = before


def _measured(build, policy) -> dict:
    np.zeros(4, BF16).astype(np.float32)  # ml_dtypes' one-time allocations, outside the trace
    gc.collect()
    with P.policy(**policy):
        tracemalloc.start()
        try:
            start = _now()
            model = build()
            weights = _now() - start
            opt = lk.optim.Adam(model.parameters(), lr=1e-4)
            _step(model, opt, 0)  # makes the gradients, masters and states
            gc.collect()
            persistent = _now() - start
            held = _step(model, opt, 1)
        finally:
            tracemalloc.stop()
        report = ledger(model, (BATCH, WIDTH), optimizer="adam", rank_check=False)
    return {"weights": weights, "persistent": persistent, "held": held, "ledger": report,
            "model": model, "opt": opt}


def held_arrays(model, opt) -> dict:
    """The bytes of each field, from the arrays themselves (distinct buffers)."""
    def nbytes(arrays):
        roots = {}
        for a in arrays:
            while isinstance(a.base, np.ndarray):
                a = a.base
            roots[id(a)] = a.nbytes
        return sum(roots.values())

    params = list(model.parameters())
    states = [s for p in params for s in [opt.state.get(p, {})]]
    return {
        "weights": nbytes(p.data for p in params),
        "grads": nbytes(p.grad for p in params if p.grad is not None),
        "master": nbytes(s[MASTER] for s in states if MASTER in s),
        "optimizer": nbytes(v for s in states for k, v in s.items()
                            if k != MASTER and isinstance(v, np.ndarray)),
    }


@pytest.mark.parametrize("case", list(CASES))
def test_ledger_matches_tracemalloc_for_a_training_step(case):
    r = measured(case)
    m = r["ledger"].memory
    assert m["weights"] == pytest.approx(r["weights"], rel=0.10)
    assert m["training_state"] == pytest.approx(r["persistent"], rel=0.10)
    assert m["activations"] == pytest.approx(r["held"], rel=0.10)
    # and field by field, exactly, against the arrays the model and the optimizer hold
    real = held_arrays(r["model"], r["opt"])
    assert {k: m[k] for k in real} == real


def test_what_each_field_counts_in_16_bits():
    n = 3 * (WIDTH * WIDTH + WIDTH)  # the MLP's parameters
    f32, bf16, fp16 = (measured(c)["ledger"].memory
                       for c in ("float32", "bf16", "fp16 grads=storage"))
    assert (f32["weights"], f32["grads"], f32["master"], f32["optimizer"]) == (
        4 * n, 4 * n, 0, 8 * n)
    # bfloat16 weights; float32 gradients (the default policy), master and states
    assert (bf16["weights"], bf16["grads"], bf16["master"], bf16["optimizer"]) == (
        2 * n, 4 * n, 4 * n, 8 * n)
    # grads="storage": float16 gradients
    assert (fp16["weights"], fp16["grads"], fp16["master"]) == (2 * n, 2 * n, 4 * n)
    # activations: float32, as float32's (a 16-bit layer computes and keeps in float32) ...
    act = BATCH * WIDTH * 4  # the input and two ReLU outputs
    assert bf16["activations"] == f32["activations"] == 3 * act
    # ... and a float16 Linear keeps its weight's float32 copy for dx (the two that need dx)
    assert fp16["activations"] == 3 * act + 2 * WIDTH * WIDTH * 4


def test_master_copies_only_for_trainable_16_bit_parameters():
    r = measured("mixed")
    m = r["ledger"].memory
    lin, norm = WIDTH * WIDTH + WIDTH, 2 * WIDTH
    assert m["weights"] == 2 * 2 * lin + 4 * (norm + lin)
    assert m["master"] == 4 * lin  # model[2] only: model[0] is frozen, the rest float32
    assert m["grads"] == 4 * (lin + norm + lin) and m["optimizer"] == 8 * (lin + norm + lin)
    assert [p for p in r["model"].parameters() if MASTER in r["opt"].state.get(p, {})] == \
        list(r["model"][2].parameters())
    assert any("master weights" in note and f"{lin:,} of the" in note
               for note in r["ledger"].notes)


def test_16_bit_activations_halve_a_norm_stack_not_an_mlp_with_relu():
    """The claim that fp16 "cuts memory in half": what is halved, what is not (module docstring)."""
    plain, half = measured("bf16 norms"), measured("bf16 norms activations=fp16")
    a, b = plain["ledger"].memory, half["ledger"].memory
    rstd = 2 * BATCH * 4  # the norms' 1/std rows stay float32
    assert b["activations"] - rstd == (a["activations"] - rstd) // 2
    assert half["held"] / plain["held"] == pytest.approx(0.5, abs=0.05)
    for key in ("weights", "grads", "master", "optimizer"):
        assert a[key] == b[key]  # the policy keeps activations only
    plain, half = measured("bf16"), measured("bf16 activations=fp16")
    assert half["ledger"].memory["activations"] * 6 == plain["ledger"].memory["activations"] * 7
    assert half["held"] / plain["held"] == pytest.approx(7 / 6, rel=0.05)


def test_the_ledger_reads_the_policy_when_it_is_called():
    model = mlp(F16, width=64)
    default = ledger(model, (8, 64)).memory
    with P.policy(grads="storage", activations=BF16):
        inside = ledger(model, (8, 64))
    assert (default["grads"], inside.memory["grads"]) == (4 * 3 * 4160, 2 * 3 * 4160)
    w32 = 2 * 64 * 64 * 4  # the float16 weights' float32 copies (two layers need dx)
    assert default["activations"] == 3 * 8 * 64 * 4 + w32
    # bfloat16 copies of the Linears' inputs, beside the ReLUs' own float32 outputs
    assert inside.memory["activations"] == 8 * 64 * 2 + 2 * (8 * 64 * 4 + 8 * 64 * 2) + w32
    assert any("grads='storage'" in n and "activations='bfloat16'" in n for n in inside.notes)
    assert ledger(model, (8, 64)).memory == default  # restored with the policy


# ------------------------------------------------------------------ exact, on small models
class Wrapped(Module):
    """A module type without a rule: the ledger runs it once and walks its closure."""

    def __init__(self, dtype):
        super().__init__()
        self.inner = lk.Linear(12, 12, dtype=dtype)

    def vjp(self, x, input_grad=True):
        y, back = self.inner.vjp(x, input_grad=input_grad)
        return y * 2.0, lambda dy: back(dy * 2.0)


def small_models():
    for dtype in (BF16, F16):
        yield f"{dtype} zoo", lk.Sequential(
            lk.Linear(10, 12, dtype=dtype), lk.BatchNorm1d(12, dtype=dtype), lk.GELU(),
            lk.Residual(lk.Sequential(lk.Linear(12, 12, dtype=dtype), lk.ReLU())),
            lk.Dropout(0.2), lk.LayerNorm(12, dtype=dtype), Wrapped(dtype),
            lk.Linear(12, 3, dtype=dtype), lk.Tanh())
    model = lk.Sequential(lk.Linear(10, 12), lk.LayerNorm(12, dtype=BF16), lk.ReLU(),
                          lk.Linear(12, 12, dtype=F16), lk.Linear(12, 3, dtype=BF16))
    model[3].requires_grad_(False)
    yield "mixed, frozen fp16", model


POLICIES = [{}, {"activations": F16}, {"activations": BF16}, {"grads": "storage"}]


@pytest.mark.parametrize("policy", POLICIES,
                         ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()) or "default")
@pytest.mark.parametrize("name,model", list(small_models()), ids=lambda v: v
                         if isinstance(v, str) else "")
def test_saved_activations_equal_what_16_bit_closures_hold(name, model, policy):
    with P.policy(**policy):
        L = ledger(model, (16, 10))
        x = np.random.default_rng(0).standard_normal((16, 10)).astype(np.float32)
        y, backward = model.vjp(x, input_grad=False)
    assert L.memory["activations"] == closure_bytes(backward, model)
    assert L.totals["output_bytes"] > 0 and L[""].output_bytes == y.nbytes  # float32 out


def test_a_16_bit_layer_outputs_float32_bytes():
    L = ledger(lk.Linear(64, 32, dtype=BF16), (8, 64))
    assert L[""].output_bytes == 8 * 32 * 4 and L.dtype == "bfloat16"
    assert ledger(lk.Linear(64, 32, dtype=np.float64), (8, 64))[""].output_bytes == 8 * 32 * 8


@pytest.mark.parametrize("dtype", [BF16, F16], ids=str)
def test_rank_check_of_a_16_bit_weight(dtype):
    """np.finfo refuses bfloat16 (kind 'V'): the low-rank finding reads ml_dtypes' epsilon, and
    its tolerance is the 16-bit rounding's bound, not max(n, m) * eps * s_max (half of s_max for
    a 64-wide bfloat16 weight: a random one looked rank 26 of 64)."""
    assert [f.kind for f in ledger(lk.Linear(64, 64, dtype=dtype), (4, 64)).findings] == []
    layer = lk.Linear(64, 64, dtype=dtype)
    r = np.random.default_rng(0)
    layer.weight.data[...] = r.standard_normal((64, 2)) @ r.standard_normal((2, 64))
    L = ledger(layer, (4, 64))
    assert [f.kind for f in L.findings] == ["low-rank"]
    assert "rank 2 of 64" in L.findings[0].message
