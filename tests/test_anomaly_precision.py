"""detect_anomaly in 16-bit runs: the first layer that produced a non-finite value is named by
its path, where without it the NaN shows up at a later layer (the known pitfall: an
initialization fine in float32 turns the loss NaN after switching precision, "the error points
at a later layer"); analysis.range_check flags the cause before training.

16-bit storage computes in float32, so outputs overflow only as float32 does. What does overflow
16 bits: a weight rounded by ``model.to(np.float16)``, a float16 copy a layer keeps for its
backward under ``precision.policy(activations=float16)``, and a gradient stored in 16 bits under
``grads="storage"`` (bfloat16 has NumPy dtype kind 'V': checked as float32).
"""

import numpy as np
import pytest

import linearkit as lk
from linearkit import precision as P

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)


def mlp(seed=0):
    """Linear, Tanh, Linear '2', ReLU, Linear '4', ReLU, Linear '6' (float32)."""
    r = np.random.default_rng(seed)
    return lk.Sequential(lk.Linear(8, 16, rng=r), lk.Tanh(), lk.Linear(16, 16, rng=r), lk.ReLU(),
                         lk.Linear(16, 16, rng=r), lk.ReLU(), lk.Linear(16, 4, rng=r))


X = np.random.default_rng(1).standard_normal((32, 8)).astype(np.float32)


def outputs(model, x) -> dict:
    """Each child's forward output, by path (in forward order)."""
    seen = {}
    with lk.hooks.observe(model, forward=lambda m, args, y: seen.setdefault(m, y)):
        model(x)
    paths = {m: p for p, m in model.named_modules()}
    return {paths[m]: y for m, y in seen.items() if paths[m]}


def test_a_weight_that_overflows_float16_storage_is_named_where_it_is():
    model = mlp()
    model[2].weight.data[0, 0] = 1e5  # fine in float32; inf once stored in float16
    assert lk.analysis.range_check(model, X, np.float16).first_problem.path == "2"  # before
    assert lk.analysis.range_check(model, X, np.float16).first_problem.flag == "overflow"
    with np.errstate(over="ignore", invalid="ignore"):
        model.to(np.float16)
        assert np.isinf(model[2].weight.data[0, 0])
        outs = outputs(model, X)
        # without detect_anomaly: the first NaN is in a later layer ('2' makes +-inf, the
        # ReLU passes it, '4' spreads it, '6' sums +inf and -inf)
        first_nan = next(p for p, y in outs.items() if np.isnan(y).any())
        first_inf = next(p for p, y in outs.items() if not np.isfinite(y).all())
        assert (first_inf, first_nan) == ("2", "6")
        with lk.detect_anomaly(), pytest.raises(lk.AnomalyError, match=r"'2'.*forward output"):
            model.vjp(X, input_grad=False)


def large_second_layer():
    """Layer '2' makes outputs up to ~2e5: fine in float32 (storage and compute), beyond
    float16's 65504; its weights (up to ~6e4) still fit float16 storage."""
    model = mlp()
    model[2].weight.data[...] = np.abs(model[2].weight.data) * 2.4e5
    return model.to(np.float16)


def test_an_activation_kept_in_float16_is_named_at_the_layer_that_kept_it():
    """Under policy(activations=float16), Linear '4' keeps its input (ReLU '3' of '2') as a
    float16 copy: inf. The loss is finite; the backward reaches '6' first (it runs in reverse),
    whose kept input overflowed too — a gradient check alone points at the later layer.
    detect_anomaly checks what each layer keeps when its forward runs and names '4'; range_check
    names '2', the layer whose output does not fit float16, before any training."""
    model = large_second_layer()
    report = lk.analysis.range_check(model, X, np.float16)
    assert (report.first_problem.path, report.first_problem.flag) == ("2", "overflow")
    with P.policy(activations=np.float16), np.errstate(over="ignore", invalid="ignore"):
        y, backward = model.vjp(X, input_grad=False)
        assert np.isfinite(y).all()  # outputs are float32: nothing to see in the forward
        with lk.detect_anomaly(), pytest.raises(lk.AnomalyError) as caught:
            backward(np.full_like(y, 1 / y.size))
        assert "'6'" in str(caught.value) and "gradient of weight" in str(caught.value)
        with lk.detect_anomaly(), pytest.raises(lk.AnomalyError) as caught:
            model.vjp(X, input_grad=False)
    message = str(caught.value)
    assert "'4'" in message and "kept for the backward (float16)" in message
    assert "range_check" in message and "activations='float16'" in message
    # without any check: the step runs, the loss is NaN at the next one
    model = large_second_layer()
    opt = lk.optim.SGD(model.parameters(), lr=1e-3)
    with P.policy(activations=np.float16), np.errstate(over="ignore", invalid="ignore"):
        y, backward = model.vjp(X, input_grad=False)
        backward(np.full_like(y, 1 / y.size))
        opt.step()
        assert np.isfinite(y).all()
        assert [p for p in ("0", "2", "4", "6") if not np.isfinite(
            model[int(p)].weight.data.astype(np.float32)).all()] == ["4", "6"]
        assert np.isnan(model(X)).all()


def test_the_default_policy_keeps_float32_and_nothing_overflows():
    model = large_second_layer()
    with lk.detect_anomaly():
        y, backward = model.vjp(X, input_grad=False)
        backward(np.full_like(y, 1 / y.size))
    assert all(np.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float16)], ids=str)
def test_a_gradient_stored_in_16_bits_is_checked(dtype):
    """grads='storage': the weight gradient of '0' is inf in its storage dtype while the outputs
    and the input gradients are finite. bfloat16 (kind 'V') is checked as float32."""
    layer = lk.Linear(4, 4, bias=False, dtype=dtype)
    layer.weight.data[...] = 1e-3
    x = np.full((8, 4), 3e4 if dtype == np.float16 else 1e30, np.float32)
    model = lk.Sequential(layer, lk.Linear(4, 2, dtype=dtype))
    dy = np.full((8, 2), 1.0 if dtype == np.float16 else 1e10, np.float32)
    with P.policy(grads="storage"), np.errstate(over="ignore"):
        y, backward = model.vjp(x)
        assert np.isfinite(y).all()
        with lk.detect_anomaly(), pytest.raises(lk.AnomalyError,
                                                match=r"'0'.*gradient of weight.*inf"):
            backward(dy)
    assert layer.weight.grad.dtype == dtype


def test_first_nonfinite_reads_bfloat16_arrays():
    a = np.array([1.0, np.inf, np.nan], np.float32).astype(BF16)
    assert lk.anomaly.first_nonfinite(a) == (
        "output of shape (3,) has 2 non-finite value(s), first inf at index (1,)")
    assert lk.anomaly.first_nonfinite(np.ones(3, BF16)) is None
    assert lk.anomaly.first_nonfinite(np.array([1, 2])) is None


def test_kept_arrays_of_a_checkpoint_and_a_clean_run_pass():
    """The kept-array check raises only on non-finite values: a checkpointed bf16 model with
    16-bit activations and Dropout trains under detect_anomaly."""
    model = lk.Sequential(lk.checkpoint(lk.Sequential(lk.Linear(8, 16), lk.Dropout(0.1),
                                                      lk.LayerNorm(16), lk.GELU())),
                          lk.Linear(16, 3)).to(BF16)
    with P.policy(activations=BF16), lk.detect_anomaly():
        y, backward = model.vjp(X, input_grad=False)
        backward(np.ones_like(y))
    assert np.isfinite(model[1].weight.grad).all()


class MaskedIdentity(lk.Module):
    """Keeps a float32 -inf mask on purpose (as an attention mask is): not an anomaly."""

    def vjp(self, x, input_grad=True):
        mask = np.full(x.shape, -np.inf, np.float32)
        return np.maximum(x, mask), lambda dy: dy + 0 * (mask > 0)


def test_kept_float32_arrays_are_not_checked():
    with lk.detect_anomaly():
        y, backward = lk.Sequential(lk.Linear(8, 4), MaskedIdentity()).vjp(X)
        backward(np.ones_like(y))
