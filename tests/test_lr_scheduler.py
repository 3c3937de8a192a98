"""linearkit.optim.lr_scheduler against torch.optim.lr_scheduler, step by step.

Each scripted case builds the same scheduler on a linearkit optimizer and on a torch optimizer
with the same three parameter groups (different lrs), steps both 200 times (optimizer.step(),
then scheduler.step()) and compares every group's lr after every step: the arithmetic is the
same float64 operations in the same order, so they must agree to 1e-15 relative (in practice
bit for bit). Variants: resuming with ``last_epoch`` and ``state_dict``/``load_state_dict``
halfway. A training test checks that Adam follows a OneCycleLR schedule (lr and beta1 changed
every step) exactly as torch's does.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

import linearkit as lk
from linearkit.optim import lr_scheduler as lks

torch = pytest.importorskip("torch")
tls = torch.optim.lr_scheduler

STEPS = 200
LRS = (0.1, 0.03, 0.5)
RTOL = 1e-15

# Each case: (name, optimizer kind, factory(module, optimizer) -> scheduler). ``module`` is
# linearkit's or torch's lr_scheduler module, so one factory builds both twins.
CASES = [
    ("lambda", "sgd", lambda m, o: m.LambdaLR(o, lambda e: 0.97 ** e)),
    ("lambda-list", "adam", lambda m, o: m.LambdaLR(
        o, [lambda e: 1.0 / (1 + e), lambda e: 0.99 ** e, lambda e: min(1.0, (e + 1) / 10)])),
    ("step", "sgd", lambda m, o: m.StepLR(o, step_size=7, gamma=0.7)),
    ("multistep", "adam", lambda m, o: m.MultiStepLR(o, milestones=[10, 50, 50, 120], gamma=0.3)),
    ("exponential", "sgd", lambda m, o: m.ExponentialLR(o, gamma=0.98)),
    ("cosine", "adam", lambda m, o: m.CosineAnnealingLR(o, T_max=37, eta_min=1e-3)),
    ("cosine-zero", "sgd", lambda m, o: m.CosineAnnealingLR(o, T_max=50)),
    ("linear", "sgd", lambda m, o: m.LinearLR(o, start_factor=0.1, end_factor=0.9,
                                               total_iters=60)),
    ("linear-decay", "adam", lambda m, o: m.LinearLR(o, start_factor=1.0, end_factor=0.0,
                                                      total_iters=150)),
    ("onecycle-cos-adam", "adam", lambda m, o: m.OneCycleLR(o, max_lr=[0.2, 0.05, 1.0],
                                                             total_steps=STEPS)),
    ("onecycle-linear-sgd", "sgd", lambda m, o: m.OneCycleLR(
        o, max_lr=0.3, total_steps=STEPS, anneal_strategy="linear", pct_start=0.25)),
    ("onecycle-three-phase", "adamw", lambda m, o: m.OneCycleLR(
        o, max_lr=0.1, epochs=20, steps_per_epoch=10, three_phase=True,
        base_momentum=[0.8, 0.85, 0.7], max_momentum=0.9)),
    ("onecycle-no-momentum", "sgd", lambda m, o: m.OneCycleLR(
        o, max_lr=0.2, total_steps=STEPS, cycle_momentum=False, div_factor=10.0,
        final_div_factor=100.0)),
    ("sequential", "adam", lambda m, o: m.SequentialLR(
        o, [m.LinearLR(o, start_factor=0.01, total_iters=20),
            m.CosineAnnealingLR(o, T_max=180, eta_min=1e-4)], milestones=[20])),
    ("sequential-three", "sgd", lambda m, o: m.SequentialLR(
        o, [m.LinearLR(o, start_factor=0.2, total_iters=10), m.ExponentialLR(o, gamma=0.99),
            m.StepLR(o, step_size=30, gamma=0.5)], milestones=[10, 90])),
]
# schedulers that PyTorch lets resume with last_epoch >= 0 (OneCycle needs its group keys,
# which a resumed construction does not write; SequentialLR passes it differently)
RESUMABLE = {"lambda", "lambda-list", "step", "multistep", "exponential", "cosine",
             "cosine-zero", "linear", "linear-decay"}


def _groups(make_param):
    return [{"params": [make_param()], "lr": lr} for lr in LRS]


def _optimizers(kind):
    """The same optimizer, three groups, in linearkit and in torch (float64 parameters)."""
    ours = _groups(lambda: lk.Parameter(np.zeros(3, np.float64)))
    theirs = _groups(lambda: torch.nn.Parameter(torch.zeros(3, dtype=torch.float64)))
    if kind == "sgd":
        return (lk.optim.SGD(ours, lr=0.1, momentum=0.9),
                torch.optim.SGD(theirs, lr=0.1, momentum=0.9))
    if kind == "adam":
        return lk.optim.Adam(ours), torch.optim.Adam(theirs)
    return lk.optim.AdamW(ours), torch.optim.AdamW(theirs)


def _hypers(opt):
    """Per group: lr and the momentum term OneCycleLR cycles (momentum or beta1)."""
    return [(g["lr"], g.get("momentum", g.get("betas", (None,))[0])) for g in opt.param_groups]


def _rel(a, b):
    return 0.0 if a == b else abs(a - b) / max(abs(a), abs(b))


def _compare(sched, tsched, opt, topt, where):
    """Max relative difference of lrs (and momenta) between the twins; asserts <= RTOL."""
    worst = 0.0
    ours, theirs = sched.get_last_lr(), tsched.get_last_lr()
    assert len(ours) == len(theirs) == len(LRS)
    pairs = list(zip(ours, theirs))
    for (lr, mom), (tlr, tmom) in zip(_hypers(opt), _hypers(topt)):
        pairs.append((lr, tlr))
        if tmom is not None:
            pairs.append((mom, tmom))
    for a, b in pairs:
        assert isinstance(a, float), where
        d = _rel(a, b)
        assert d <= RTOL, f"{where}: {a!r} != {b!r}"
        worst = max(worst, d)
    return worst


def _step(opt, sched):
    opt.step()          # no gradients: nothing moves, but the step is recorded
    sched.step()


@pytest.mark.parametrize("name,kind,make", CASES, ids=[c[0] for c in CASES])
def test_schedule_matches_torch(name, kind, make):
    opt, topt = _optimizers(kind)
    sched, tsched = make(lks, opt), make(tls, topt)
    worst = _compare(sched, tsched, opt, topt, "construction")
    for t in range(STEPS):
        _step(opt, sched)
        _step(topt, tsched)
        worst = max(worst, _compare(sched, tsched, opt, topt, f"step {t + 1}"))
        assert sched.last_epoch == tsched.last_epoch
    assert worst <= RTOL


@pytest.mark.parametrize("name,kind,make", CASES, ids=[c[0] for c in CASES])
def test_state_dict_midway_matches_torch(name, kind, make):
    """Save both at step 100, load into fresh twins, continue; the same as uninterrupted."""
    opt, topt = _optimizers(kind)
    sched, tsched = make(lks, opt), make(tls, topt)
    for _ in range(STEPS // 2):
        _step(opt, sched)
        _step(topt, tsched)
    saved, opt_saved = copy.deepcopy(sched.state_dict()), copy.deepcopy(opt.state_dict())
    opt2, _ = _optimizers(kind)
    sched2 = make(lks, opt2)          # construct first, then load (PyTorch's advice)
    opt2.load_state_dict(opt_saved)
    sched2.load_state_dict(saved)
    assert sched2.get_last_lr() == sched.get_last_lr()
    for t in range(STEPS // 2, STEPS):
        _step(opt2, sched2)
        _step(topt, tsched)
        _compare(sched2, tsched, opt2, topt, f"step {t + 1} after load")


@pytest.mark.parametrize("name,kind,make", [c for c in CASES if c[0] in RESUMABLE],
                         ids=[c[0] for c in CASES if c[0] in RESUMABLE])
@pytest.mark.parametrize("start", [0, 9, 73])
def test_last_epoch_resumption_matches_torch(name, kind, make, start):
    """A scheduler built with last_epoch=start on groups that hold 'initial_lr'."""
    opt, topt = _optimizers(kind)
    for o in (opt, topt):
        for g, lr in zip(o.param_groups, LRS):
            g["initial_lr"] = lr * 2       # the original lrs; 'lr' is where a run had reached
    sched = _with_last_epoch(make, lks, opt, start)
    tsched = _with_last_epoch(make, tls, topt, start)
    _compare(sched, tsched, opt, topt, "construction")
    assert sched.base_lrs == tsched.base_lrs == [lr * 2 for lr in LRS]
    for t in range(STEPS):
        _step(opt, sched)
        _step(topt, tsched)
        _compare(sched, tsched, opt, topt, f"step {t + 1}")


def _with_last_epoch(make, module, opt, start):
    """``make`` with ``last_epoch=start`` passed to the scheduler's constructor."""
    class Shim:
        def __getattr__(self, attr):
            cls = getattr(module, attr)
            return lambda *a, **k: cls(*a, **k, last_epoch=start)

    return make(Shim(), opt)


def test_resuming_without_initial_lr_raises_key_error():
    opt, _ = _optimizers("sgd")
    with pytest.raises(KeyError, match="initial_lr"):
        lks.StepLR(opt, step_size=3, last_epoch=5)


@pytest.mark.parametrize("name,cls,kwargs", [
    ("step", "StepLR", {"step_size": 5, "gamma": 0.5}),
    ("multistep", "MultiStepLR", {"milestones": [3, 3, 20], "gamma": 0.5}),
    ("exponential", "ExponentialLR", {"gamma": 0.9}),
    ("cosine", "CosineAnnealingLR", {"T_max": 13, "eta_min": 0.01}),
    ("linear", "LinearLR", {"start_factor": 0.25, "total_iters": 17}),
])
def test_closed_form_with_epoch_matches_torch(name, cls, kwargs):
    """step(epoch) (deprecated: warns) uses the closed form, as torch does."""
    opt, topt = _optimizers("sgd")
    sched, tsched = getattr(lks, cls)(opt, **kwargs), getattr(tls, cls)(topt, **kwargs)
    for epoch in [1, 4, 5, 3, 30, 12, 0, 40]:
        opt.step()
        topt.step()
        with pytest.warns(UserWarning, match="epoch parameter"):
            sched.step(epoch)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tsched.step(epoch)
        _compare(sched, tsched, opt, topt, f"epoch {epoch}")


PLATEAU = [
    {},
    {"mode": "max", "factor": 0.5, "patience": 2, "threshold": 0.01, "cooldown": 3},
    {"mode": "min", "threshold_mode": "abs", "threshold": 0.05, "patience": 0,
     "min_lr": [0.01, 0.001, 0.2]},
    {"mode": "max", "threshold_mode": "abs", "factor": 0.3, "patience": 4, "min_lr": 0.002,
     "eps": 1e-3},
]


@pytest.mark.parametrize("kwargs", PLATEAU, ids=[str(i) for i in range(len(PLATEAU))])
def test_reduce_on_plateau_matches_torch(kwargs):
    opt, topt = _optimizers("adam")
    sched, tsched = lks.ReduceLROnPlateau(opt, **kwargs), tls.ReduceLROnPlateau(topt, **kwargs)
    rng = np.random.default_rng(3)
    # a metric that improves, then stalls noisily: several reductions happen
    metrics = np.concatenate([np.linspace(1.0, 0.5, 40), 0.5 + 0.05 * rng.random(STEPS - 40)])
    for t, metric in enumerate(metrics):
        opt.step()
        topt.step()
        sched.step(metric)
        tsched.step(metric)
        _compare(sched, tsched, opt, topt, f"step {t + 1}")
        assert (sched.best, sched.num_bad_epochs, sched.cooldown_counter) == \
            (tsched.best, tsched.num_bad_epochs, tsched.cooldown_counter)
        if t == STEPS // 2:        # through a state dict into a fresh scheduler
            saved = copy.deepcopy(sched.state_dict())
            sched = lks.ReduceLROnPlateau(opt)
            sched.load_state_dict(saved)
    assert sched.get_last_lr() != list(LRS)      # it did reduce


def test_warns_when_scheduler_steps_before_optimizer():
    opt, topt = _optimizers("sgd")
    sched = lks.StepLR(opt, step_size=2)
    with pytest.warns(UserWarning, match=r"lr_scheduler.step\(\)` before `optimizer.step\(\)"):
        sched.step()
    tsched = tls.StepLR(topt, step_size=2)
    with pytest.warns(UserWarning, match=r"lr_scheduler.step\(\)` before `optimizer.step\(\)"):
        tsched.step()
    # in the right order: no warning; step_and_zero_grad counts as an optimizer step too
    for stepper in ("step", "step_and_zero_grad"):
        opt, _ = _optimizers("adam")
        sched = lks.ExponentialLR(opt, gamma=0.5)
        getattr(opt, stepper)()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            sched.step()
    # a second scheduler on the same optimizer does not wrap step twice
    opt, _ = _optimizers("sgd")
    lks.StepLR(opt, step_size=2)
    wrapped = opt.step
    lks.ExponentialLR(opt, gamma=0.5)
    assert opt.step is wrapped


def test_import_linearkit_does_not_load_the_module():
    import subprocess
    import sys
    code = ("import sys, linearkit, linearkit.optim; "
            "assert 'linearkit.optim.lr_scheduler' not in sys.modules; "
            "linearkit.optim.lr_scheduler.StepLR; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False)
    assert out.stdout.strip() == "ok", out.stderr


def _mlp_twins(seed=0):
    rng = np.random.default_rng(seed)
    ours = lk.Sequential(lk.Linear(5, 16, dtype=np.float64, rng=rng), lk.Tanh(),
                         lk.Linear(16, 8, dtype=np.float64, rng=rng), lk.ReLU(),
                         lk.Linear(8, 3, dtype=np.float64, rng=rng))
    theirs = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8),
                                 torch.nn.ReLU(), torch.nn.Linear(8, 3)).double()
    theirs.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in ours.state_dict().items()})
    return ours, theirs


@pytest.mark.parametrize("stepper", ["step", "step_and_zero_grad"])
def test_adam_with_one_cycle_trains_like_torch(stepper):
    """50 steps of Adam + OneCycleLR (lr and beta1 change every step): weights within 1e-10.

    ``step_and_zero_grad`` with set_to_none=False takes linearkit's compiled one-pass Adam
    update after the first step, which must read the group's lr and betas afresh each step.
    """
    ours, theirs = _mlp_twins()
    opt = lk.optim.Adam(ours.parameters(), lr=1e-3, weight_decay=1e-3)
    topt = torch.optim.Adam(theirs.parameters(), lr=1e-3, weight_decay=1e-3, foreach=False)
    sched = lks.OneCycleLR(opt, max_lr=0.05, total_steps=50)
    tsched = tls.OneCycleLR(topt, max_lr=0.05, total_steps=50)
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((32, 5)), rng.standard_normal((32, 3))
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    lrs = set()
    for t in range(50):
        pred, back = ours.vjp(x, input_grad=False)
        _, loss_back = lk.MSELoss().vjp(pred, y)
        back(loss_back())
        torch.nn.functional.mse_loss(theirs(tx), ty).backward()
        if stepper == "step":
            opt.step()
            opt.zero_grad()
        else:
            opt.step_and_zero_grad(set_to_none=False)
        topt.step()
        topt.zero_grad()
        sched.step()
        tsched.step()
        lrs.add(opt.param_groups[0]["lr"])
        assert _rel(opt.param_groups[0]["lr"], topt.param_groups[0]["lr"]) <= RTOL
    assert len(lrs) > 40          # a new lr (nearly) every step
    mine = ours.state_dict()
    worst = max(float(np.max(np.abs(mine[k] - v.detach().numpy())))
                for k, v in theirs.state_dict().items())
    assert worst <= 1e-10, worst
