"""GradScaler against torch.amp.GradScaler("cpu"): scales, skipped steps, weights, misuse.

The scripted runs drive a linearkit model and a torch model holding the same weights through
the same sequence of clean and poisoned (inf/NaN) iterations, and compare after every
``update()``: the scale and growth tracker exactly, which steps were skipped exactly, the
weights within float32 rounding (measured: 5.6e-6 relative at most for SGD, 8.6e-7 for Adam).
That difference is the two frameworks' GEMMs rounding differently, not the scaler: scaling by
a power of two is exact, so the same linearkit run without a scaler (skipping the same steps
by hand) gives the same bits, and the injected-gradient test shows the unscaling arithmetic
is torch's bit for bit, power of two or not.
"""

from __future__ import annotations

import numpy as np
import pytest

import linearkit as lk
from linearkit.optim import clip_grad_norm_
from linearkit.training.amp import GradScaler

torch = pytest.importorskip("torch")

# iteration -> what is injected into the gradients after the backward (None: a clean step)
SCRIPT = {3: ("0.weight", np.inf), 6: ("2.bias", np.nan), 7: ("0.bias", -np.inf),
          8: ("2.weight", np.inf), 14: ("0.weight", np.nan)}
OVERFLOW = 11          # scale set to 2^126 and inputs x 1e6: the scaled backward overflows
SKIPPED = [3, 6, 7, 8, OVERFLOW, 14]
SCALES = [1024.0, 1024.0, 2048.0, 1024.0, 1024.0, 1024.0, 512.0, 256.0, 128.0, 128.0, 128.0,
          2.0**125, 2.0**125, 2.0**125, 2.0**124, 2.0**124, 2.0**124, 2.0**125]
GROWTH_INTERVAL = 3


def _models(seed=0):
    rng = np.random.default_rng(seed)
    ours = lk.Sequential(lk.Linear(6, 8, rng=rng), lk.ReLU(), lk.Linear(8, 4, rng=rng))
    theirs = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    theirs.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in ours.state_dict().items()})
    return ours, theirs


def _optimizers(kind, ours, theirs):
    if kind == "sgd":
        return (lk.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9),
                torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9))
    return (lk.optim.Adam(ours.parameters(), lr=0.01),
            torch.optim.Adam(theirs.parameters(), lr=0.01))


def _weights(model):
    if isinstance(model, torch.nn.Module):
        return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    return {k: np.array(v, copy=True) for k, v in model.state_dict().items()}


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_a_scripted_run_matches_torch(kind):
    ours, theirs = _models()
    opt, topt = _optimizers(kind, ours, theirs)
    plain, _ = _models()                    # no scaler; skips the same steps by hand
    popt, _ = _optimizers(kind, plain, theirs)
    scaler = GradScaler(init_scale=2.0**10, growth_interval=GROWTH_INTERVAL)
    tscaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=GROWTH_INTERVAL)
    rng = np.random.default_rng(1)
    tparams = dict(theirs.named_parameters())
    skipped, tskipped, scales = [], [], []
    for it in range(len(SCALES)):
        x = rng.standard_normal((10, 6)).astype(np.float32)
        y = rng.integers(0, 4, 10)
        if it == OVERFLOW:                  # a real overflow: scale * gradient > float32 max
            scaler.update(new_scale=2.0**126)
            tscaler.update(new_scale=2.0**126)
            x *= 1e6
        before, tbefore = _weights(ours), _weights(theirs)

        pred, back = ours.vjp(x, input_grad=False)
        _, loss_back = lk.CrossEntropyLoss().vjp(pred, y)
        with np.errstate(over="ignore", invalid="ignore"):      # OVERFLOW overflows
            back(scaler.scale(loss_back)())
        tloss = torch.nn.functional.cross_entropy(theirs(torch.from_numpy(x)),
                                                  torch.from_numpy(y))
        tscaler.scale(tloss).backward()
        if it in SCRIPT:
            name, value = SCRIPT[it]
            dict(ours.named_parameters())[name].grad.reshape(-1)[0] = value
            tparams[name].grad.view(-1)[0] = value
        if it % 2:                          # clipping after unscale_ on odd iterations
            scaler.unscale_(opt)
            tscaler.unscale_(topt)
            clip_grad_norm_(ours.parameters(), 0.5)
            torch.nn.utils.clip_grad_norm_(theirs.parameters(), 0.5)
        scaler.step(opt)
        tscaler.step(topt)
        scaler.update()
        tscaler.update()
        opt.zero_grad()
        topt.zero_grad()

        pred, back = plain.vjp(x, input_grad=False)
        back(lk.CrossEntropyLoss().vjp(pred, y)[1]())
        if it % 2:
            clip_grad_norm_(plain.parameters(), 0.5)
        if it not in SKIPPED:
            popt.step()
        popt.zero_grad()
        for k, v in plain.state_dict().items():   # scaling by 2^n is exact: same bits
            np.testing.assert_array_equal(ours.state_dict()[k], v, err_msg=f"{it} {k}")

        after, tafter = _weights(ours), _weights(theirs)
        skipped.append(all(np.array_equal(before[k], after[k]) for k in before))
        tskipped.append(all(np.array_equal(tbefore[k], tafter[k]) for k in tbefore))
        assert scaler.get_scale() == tscaler.get_scale(), it
        assert scaler._get_growth_tracker() == tscaler._get_growth_tracker(), it
        scales.append(scaler.get_scale())
        for k in after:
            np.testing.assert_allclose(after[k], tafter[k], rtol=2e-5, atol=2e-6, err_msg=k)
    assert skipped == tskipped
    assert [i for i, s in enumerate(skipped) if s] == SKIPPED
    assert scales == SCALES          # growth after 3 clean steps in a row, backoff on each skip


def _grads(dtype, rng):
    arrays = [rng.standard_normal(s) * 100 for s in [(3, 4), (5,), (2, 2)]]
    return [a.astype(dtype) for a in arrays]


def _torch_tensor(a):
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.uint16).view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def _numpy(t, dtype):
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16).view(dtype)
    return t.numpy()


def _dtypes():
    out = [np.float32, np.float64]
    try:
        import ml_dtypes
    except ImportError:
        return out
    return [*out, ml_dtypes.bfloat16]


@pytest.mark.parametrize("dtype", _dtypes())
@pytest.mark.parametrize("init_scale", [3.0, 2.0**16, 1000.1])
def test_unscale_is_torchs_arithmetic_bit_for_bit(dtype, init_scale):
    """Same scaled gradients in, same unscaled bits out (float32, float64, bfloat16)."""
    rng = np.random.default_rng(2)
    grads = _grads(dtype, rng)
    params = [lk.Parameter(np.zeros(g.shape, np.float32)) for g in grads]
    tparams = [torch.nn.Parameter(torch.zeros(g.shape, dtype=_torch_tensor(g).dtype))
               for g in grads]
    for p, q, g in zip(params, tparams, grads):
        p.grad, q.grad = g.copy(), _torch_tensor(g)
    opt, topt = lk.optim.SGD(params, lr=0.1), torch.optim.SGD(tparams, lr=0.1)
    scaler = GradScaler(init_scale=init_scale)
    tscaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    assert scaler.get_scale() == tscaler.get_scale() == init_scale     # before scale(): as given
    scaler.scale(1.0)
    tscaler.scale(torch.ones(()))
    assert scaler.get_scale() == tscaler.get_scale()                   # now float32-rounded
    scaler.unscale_(opt)
    tscaler.unscale_(topt)
    for p, q in zip(params, tparams):
        assert p.grad.dtype == dtype
        np.testing.assert_array_equal(p.grad.view(np.uint8),
                                      _numpy(q.grad, dtype).view(np.uint8))


def test_scaled_loss_and_arrays_match_torch():
    scaler, tscaler = GradScaler(init_scale=1000.1), torch.amp.GradScaler("cpu", init_scale=1000.1)
    a = np.linspace(-3, 3, 7, dtype=np.float32)
    out = scaler.scale(a)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, tscaler.scale(torch.from_numpy(a)).numpy())
    pair = scaler.scale((a, [np.float64(2.0)]))
    assert isinstance(pair, tuple) and isinstance(pair[1], list)
    assert pair[1][0] == 2.0 * scaler.get_scale()
    assert scaler.scale(lk.MSELoss()(a, np.zeros_like(a))).dtype == np.float32


def test_scale_of_a_loss_backward_is_the_backward_of_the_scaled_loss():
    pred, y = np.arange(6, dtype=np.float64).reshape(3, 2), np.ones((3, 2))
    scaler = GradScaler(init_scale=8.0)
    for reduction, dy in (("mean", None), ("sum", 0.25), ("none", np.full((3, 2), 0.5))):
        scaled = scaler.scale(lk.MSELoss(reduction=reduction).vjp(pred, y)[1])(dy)
        loss_back = lk.MSELoss(reduction=reduction).vjp(pred, y)[1]
        np.testing.assert_array_equal(scaled, loss_back(8.0 if dy is None else dy * 8.0))


def test_float16_gradients_are_unscaled_into_float32_and_their_buffer_comes_back():
    """torch refuses float16 gradients; ours keeps the small values the scale protected."""
    true = np.full(4, 1e-8, np.float32)                  # below float16's smallest subnormal
    assert not np.float16(1e-8)
    p = lk.Parameter(np.zeros(4, np.float32))
    opt = lk.optim.SGD([p], lr=1.0)
    scaler = GradScaler()
    scaled = (true * np.float32(scaler.scale(1.0))).astype(np.float16)  # backward's storage
    p.grad = scaled
    scaler.unscale_(opt)
    assert p.grad.dtype == np.float32                    # exact, for clipping and the step
    np.testing.assert_allclose(p.grad, true, rtol=1e-3)
    scaler.step(opt)
    assert p.grad is scaled                              # the parameter's own buffer is back
    assert not p.grad.any()                              # holding the rounded (underflowed) value
    np.testing.assert_allclose(p.data, -true, rtol=1e-3)  # but the update used the exact one
    scaler.update()
    tp = torch.nn.Parameter(torch.zeros(4, dtype=torch.float16))   # torch's fp16 model
    tp.grad = torch.from_numpy(scaled)
    tscaler = torch.amp.GradScaler("cpu")
    tscaler.scale(torch.ones(()))
    with pytest.raises(ValueError, match="FP16"):
        tscaler.unscale_(torch.optim.SGD([tp], lr=1.0))


def test_float16_inf_is_found_and_the_buffer_comes_back_on_update_too():
    p = lk.Parameter(np.zeros(2, np.float32))
    own = np.array([np.inf, 1.0], np.float16)
    p.grad = own
    opt, scaler = lk.optim.SGD([p], lr=1.0), GradScaler(init_scale=4.0)
    scaler.scale(1.0)
    scaler.unscale_(opt)
    scaler.update()                                      # unscale_ then update, no step: allowed
    assert p.grad is own and own[1] == 0.25 and scaler.get_scale() == 2.0


def test_clipping_composes_after_unscale_and_not_before():
    """clip_grad_norm_ on scaled gradients clips a norm S times too large: the pitfall."""
    def grads(scaled, clip_first=False):
        model, _ = _models()
        opt = lk.optim.SGD(model.parameters(), lr=0.1)
        x = np.random.default_rng(3).standard_normal((10, 6)).astype(np.float32)
        y = np.arange(10) % 4
        pred, back = model.vjp(x, input_grad=False)
        _, loss_back = lk.CrossEntropyLoss().vjp(pred, y)
        scaler = GradScaler(enabled=scaled)
        back(scaler.scale(loss_back)())
        norm = None
        if clip_first:
            norm = clip_grad_norm_(model.parameters(), 0.1)
        scaler.unscale_(opt)
        if not clip_first:
            norm = clip_grad_norm_(model.parameters(), 0.1)
        return [p.grad.copy() for p in model.parameters()], float(norm)

    plain, plain_norm = grads(False)
    right, right_norm = grads(True)
    wrong, wrong_norm = grads(True, clip_first=True)
    assert right_norm == plain_norm and plain_norm > 0.1          # clipping was needed
    for a, b in zip(plain, right):
        np.testing.assert_array_equal(a, b)                       # S = 2^16: exact
    assert wrong_norm == pytest.approx(2.0**16 * plain_norm, rel=1e-6)
    total = np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in wrong))
    assert total == pytest.approx(0.1 / 2.0**16, rel=1e-4)        # S times too small


def test_two_optimizers_skip_separately_and_back_off_together():
    ours, theirs = _models()
    opts = [lk.optim.SGD(m.parameters(), lr=0.1) for m in (ours[0], ours[2])]
    topts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (theirs[0], theirs[2])]
    scaler, tscaler = GradScaler(), torch.amp.GradScaler("cpu")
    x = np.ones((2, 6), np.float32)
    pred, back = ours.vjp(x, input_grad=False)
    back(scaler.scale(lk.MSELoss().vjp(pred, np.zeros((2, 4), np.float32))[1])())
    tscaler.scale(torch.nn.functional.mse_loss(theirs(torch.from_numpy(x)),
                                               torch.zeros(2, 4))).backward()
    ours[2].bias.grad[0] = np.inf
    theirs[2].bias.grad[0] = np.inf
    before = _weights(ours)
    for o, t in zip(opts, topts):
        scaler.step(o)
        tscaler.step(t)
    scaler.update()
    tscaler.update()
    after, tafter = _weights(ours), _weights(theirs)
    assert not np.array_equal(before["0.weight"], after["0.weight"])   # clean: stepped
    assert np.array_equal(before["2.weight"], after["2.weight"])       # poisoned: skipped
    np.testing.assert_allclose(after["0.weight"], tafter["0.weight"], rtol=1e-6)
    assert scaler.get_scale() == tscaler.get_scale() == 2.0**15


def test_growth_stops_below_float32_overflow_as_torch():
    p, tp = lk.Parameter(np.zeros(1, np.float32)), torch.nn.Parameter(torch.zeros(1))
    opt, topt = lk.optim.SGD([p], lr=0.1), torch.optim.SGD([tp], lr=0.1)
    scaler = GradScaler(init_scale=2.0**127, growth_interval=1)
    tscaler = torch.amp.GradScaler("cpu", init_scale=2.0**127, growth_interval=1)
    for _ in range(2):
        scaler.scale(1.0)
        tscaler.scale(torch.ones(()))
        p.grad, tp.grad = np.ones(1, np.float32), torch.ones(1)
        scaler.step(opt)
        tscaler.step(topt)
        scaler.update()
        tscaler.update()
        assert scaler.get_scale() == tscaler.get_scale() == 2.0**127
        assert scaler._get_growth_tracker() == tscaler._get_growth_tracker() == 0


def test_state_dict_has_torchs_keys_and_round_trips_both_ways():
    scaler = GradScaler(init_scale=256.0, growth_interval=5)
    p = lk.Parameter(np.zeros(2, np.float32))
    opt = lk.optim.SGD([p], lr=0.1)
    for _ in range(3):
        scaler.scale(1.0)
        p.grad = np.ones(2, np.float32)
        scaler.step(opt)
        scaler.update()
    sd = scaler.state_dict()
    tscaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=5)
    assert set(sd) == set(tscaler.state_dict())
    assert sd == {"scale": 256.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                  "growth_interval": 5, "_growth_tracker": 3}
    tscaler.load_state_dict(sd)
    fresh = GradScaler()
    fresh.load_state_dict(tscaler.state_dict())
    assert fresh.state_dict() == sd
    # continuing: two more clean steps grow both to 512
    for s in (fresh, tscaler):
        q = torch.nn.Parameter(torch.zeros(1)) if s is tscaler else lk.Parameter(np.zeros(1))
        o = (torch.optim.SGD if s is tscaler else lk.optim.SGD)([q], lr=0.1)
        for _ in range(2):
            s.scale(torch.ones(()) if s is tscaler else 1.0)
            q.grad = torch.ones(1) if s is tscaler else np.ones(1)
            s.step(o)
            s.update()
    assert fresh.get_scale() == tscaler.get_scale() == 512.0


def test_disabled_passes_everything_through():
    scaler = GradScaler(enabled=False)
    p = lk.Parameter(np.zeros(2, np.float32))
    p.grad = np.array([np.inf, 1.0], np.float32)
    opt = lk.optim.SGD([p], lr=1.0)
    loss_back = lk.MSELoss().vjp(np.zeros(2, np.float32), np.ones(2, np.float32))[1]
    a = np.ones(3, np.float32)
    assert scaler.scale(a) is a and scaler.scale(loss_back) is loss_back
    scaler.unscale_(opt)
    scaler.unscale_(opt)                                 # no-op, no error
    scaler.step(opt)                                     # steps even on inf, as torch
    assert p.data[0] == -np.inf
    scaler.update()
    assert scaler.get_scale() == 1.0 and not scaler.is_enabled()
    assert scaler.state_dict() == {}
    scaler.load_state_dict({})
    assert repr(scaler) == "GradScaler(enabled=False)"


def _ready(init_scale=2.0):
    p = lk.Parameter(np.zeros(2, np.float32))
    p.grad = np.ones(2, np.float32)
    return GradScaler(init_scale=init_scale), lk.optim.SGD([p], lr=0.1), p


def test_misuse_raises_clear_errors():
    scaler, opt, _ = _ready()
    for call in (lambda: scaler.unscale_(opt), lambda: scaler.step(opt),
                 lambda: scaler.update()):
        with pytest.raises(RuntimeError, match=r"GradScaler\.\w+: the scaler has not scaled"):
            call()
    scaler.scale(1.0)
    with pytest.raises(RuntimeError, match="no inf/NaN checks"):
        scaler.update()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already called on this optimizer"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="after step"):
        scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="step: already called"):
        scaler.step(opt)
    scaler.update()
    with pytest.raises(RuntimeError, match="closures are not supported"):
        scaler.step(opt, lambda: 0.0)
    with pytest.raises(TypeError, match="pass the loss's backward closure"):
        scaler.scale(lk.MSELoss())
    with pytest.raises(TypeError, match="expected a loss backward closure"):
        scaler.scale("loss")
    with pytest.raises(ValueError, match="new_scale must be finite"):
        scaler.update(new_scale=0.0)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"growth_factor": 1.0}, ValueError, "growth_factor must be > 1.0"),
    ({"backoff_factor": 1.0}, ValueError, r"backoff_factor must be in \(0, 1\)"),
    ({"init_scale": -1.0}, ValueError, "init_scale must be finite and > 0"),
    ({"init_scale": "cpu"}, TypeError, "no device argument"),
    ({"growth_interval": 0}, ValueError, "growth_interval must be an int >= 1"),
    ({"growth_interval": 2.5}, ValueError, "growth_interval must be an int >= 1"),
])
def test_bad_construction_is_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        GradScaler(**kwargs)


@pytest.mark.parametrize("sd, error, match", [
    ({}, RuntimeError, "empty"),
    ({"scale": 2.0}, ValueError, "missing"),
    ({"scale": -2.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3,
      "_growth_tracker": 0}, ValueError, "scale must be finite"),
    ({"scale": 2.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3,
      "_growth_tracker": -1}, ValueError, "_growth_tracker"),
])
def test_load_state_dict_checks_before_assigning(sd, error, match):
    scaler = GradScaler(init_scale=8.0)
    with pytest.raises(error, match=match):
        scaler.load_state_dict(sd)
    assert scaler.state_dict()["scale"] == 8.0


def test_new_scale_sets_the_scale_and_keeps_the_tracker_as_torch():
    scaler, opt, p = _ready()
    tscaler = torch.amp.GradScaler("cpu", init_scale=2.0)
    tp = torch.nn.Parameter(torch.zeros(2))
    topt = torch.optim.SGD([tp], lr=0.1)
    for s, o, q, g in ((scaler, opt, p, np.ones(2, np.float32)),
                       (tscaler, topt, tp, torch.ones(2))):
        s.scale(torch.ones(()) if s is tscaler else 1.0)
        q.grad = g
        s.step(o)
        s.update(new_scale=1000.1)
    assert scaler.get_scale() == tscaler.get_scale()
    assert scaler._get_growth_tracker() == tscaler._get_growth_tracker() == 0


def test_amp_imports_nothing_optional():
    import subprocess
    import sys
    code = ("import sys, linearkit.training.amp; "
            "print(sorted({'ml_dtypes', 'torch', 'scipy'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_odd_factors_round_to_float32_as_torch():
    """Backoff 0.3 and growth 1.7 leave float32 values that are not powers of two."""
    scaler = GradScaler(init_scale=1000.1, growth_factor=1.7, backoff_factor=0.3,
                        growth_interval=1)
    tscaler = torch.amp.GradScaler("cpu", init_scale=1000.1, growth_factor=1.7,
                                   backoff_factor=0.3, growth_interval=1)
    p, tp = lk.Parameter(np.zeros(1, np.float32)), torch.nn.Parameter(torch.zeros(1))
    opt, topt = lk.optim.SGD([p], lr=0.1), torch.optim.SGD([tp], lr=0.1)
    for poison in [True, False, True, True, False, False]:
        scaler.scale(1.0)
        tscaler.scale(torch.ones(()))
        value = np.inf if poison else 1.0
        p.grad, tp.grad = np.full(1, value, np.float32), torch.full((1,), value)
        scaler.step(opt)
        tscaler.step(topt)
        scaler.update()
        tscaler.update()
        assert scaler.get_scale() == tscaler.get_scale()
    assert scaler.get_scale() != float(np.float64(1000.1) * 0.3 * 1.7 * 0.3 * 0.3 * 1.7 * 1.7)


def test_bfloat16_inf_is_found_and_the_step_skipped():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    p = lk.Parameter(np.zeros(3, np.float32))
    p.grad = np.array([1.0, np.inf, 2.0], ml_dtypes.bfloat16)
    scaler, opt = GradScaler(init_scale=4.0), lk.optim.SGD([p], lr=1.0)
    scaler.scale(1.0)
    scaler.step(opt)
    scaler.update()
    assert not p.data.any() and scaler.get_scale() == 2.0
    assert p.grad.dtype == ml_dtypes.bfloat16 and float(p.grad[0]) == 0.25   # in place


def test_a_scale_backed_off_to_zero_keeps_skipping_like_torch():
    """After enough non-finite steps the scale underflows to 0: torch's reciprocal is then inf,
    every step is skipped, and nothing raises; ours does the same (it once divided by zero)."""
    import warnings

    torch = pytest.importorskip("torch")
    layer = lk.Linear(3, 2)
    before = layer.weight.data.copy()
    opt = lk.optim.SGD(layer.parameters(), lr=0.1)
    ours = lk.amp.GradScaler(init_scale=2.0 ** -148)
    ref = torch.amp.GradScaler("cpu", init_scale=2.0 ** -148)
    t_layer = torch.nn.Linear(3, 2)
    t_opt = torch.optim.SGD(t_layer.parameters(), lr=0.1)
    for _ in range(4):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            _, back = layer.vjp(np.ones((1, 3), np.float32))
            back(np.full((1, 2), ours.scale(np.float32(np.inf)), np.float32))
            ours.step(opt)
        ours.update()
        opt.zero_grad()
        ref.scale(t_layer(torch.ones(1, 3)).sum() * float("inf")).backward()
        ref.step(t_opt)
        ref.update()
        t_opt.zero_grad()
        assert ours.get_scale() == ref.get_scale()
    assert ours.get_scale() == 0.0 and np.array_equal(layer.weight.data, before)
