"""The train recipe's learning-rate schedules: the rates torch's schedulers give, step by step."""

import json

import numpy as np
import pytest

import linearkit as lk
from linearkit.recipes.train_mnist1d import Dataset, build_schedule, train

torch = pytest.importorskip("torch")
tsched = torch.optim.lr_scheduler


def _torch_schedule(optimizer, schedule, steps, warmup):
    """The torch spelling of each schedule, written out independently of build_schedule."""
    if schedule == "onecycle":
        return tsched.OneCycleLR(optimizer, max_lr=optimizer.param_groups[0]["lr"],
                                 total_steps=steps, pct_start=warmup / steps)
    parts = []
    if warmup:
        parts.append(tsched.LinearLR(optimizer, start_factor=1 / warmup, total_iters=warmup))
    if schedule == "cosine":
        parts.append(tsched.CosineAnnealingLR(optimizer, T_max=steps - warmup))
    if len(parts) == 2:
        return tsched.SequentialLR(optimizer, parts, milestones=[warmup])
    return parts[0] if parts else None


def _rates(optimizer, scheduler, steps, opt_step):
    """The learning rate (and Adam's beta1) each of ``steps`` steps ran with."""
    seen = []
    for _ in range(steps):
        group = optimizer.param_groups[0]
        seen.append((group["lr"], group["betas"][0]))
        opt_step()
        if scheduler is not None:
            scheduler.step()
    return np.array(seen)


@pytest.mark.parametrize("schedule, warmup", [("constant", 0), ("constant", 20),
                                              ("cosine", 0), ("cosine", 20),
                                              ("onecycle", 60), ("onecycle", 0)])
def test_each_schedule_runs_torchs_rates_every_step(schedule, warmup):
    steps = 200
    p = lk.Parameter(np.zeros(3))
    ours = lk.optim.Adam([p], lr=3e-3)
    mine = _rates(ours, build_schedule(ours, schedule, steps, warmup), steps, ours.step)
    tp = torch.zeros(3, requires_grad=True)
    theirs = torch.optim.Adam([tp], lr=3e-3)
    ref = _rates(theirs, _torch_schedule(theirs, schedule, steps, warmup), steps, theirs.step)
    np.testing.assert_allclose(mine, ref, rtol=1e-15, atol=1e-18)
    assert len(np.unique(mine[:, 0])) > (1 if schedule != "constant" or warmup else 0)


def _data(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((200, 8)).astype(np.float32)
    y = rng.integers(0, 3, 200)
    return Dataset(x, y, x, y)


def test_train_steps_the_schedule_after_every_optimizer_step():
    data = _data()
    model = lk.Sequential(lk.Linear(8, 3, rng=np.random.default_rng(1)))
    optimizer = lk.optim.Adam(model.parameters(), lr=1e-2)
    _, result = train(model=model, optimizer=optimizer, steps=50, batch_size=20, eval_every=0,
                      dataset=data, schedule="cosine", warmup=10)
    tp = torch.zeros(1, requires_grad=True)
    ref = torch.optim.Adam([tp], lr=1e-2)
    sched = _torch_schedule(ref, "cosine", 50, 10)
    for _ in range(50):
        ref.step()
        sched.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(ref.param_groups[0]["lr"], abs=1e-18)
    assert (result.schedule, result.warmup) == ("cosine", 10)


def test_a_schedule_changes_the_run_and_constant_without_warmup_does_not():
    data = _data()
    kwargs = dict(steps=40, batch_size=20, eval_every=0, dataset=data, hidden=5)
    plain, _ = train("mlp", **kwargs)
    constant, _ = train("mlp", schedule="constant", warmup=0, **kwargs)
    cosine, _ = train("mlp", schedule="cosine", **kwargs)
    w = [p.data for p in plain.parameters()]
    assert all(np.array_equal(a, b.data) for a, b in zip(w, constant.parameters()))
    assert not all(np.array_equal(a, b.data) for a, b in zip(w, cosine.parameters()))


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(schedule="linear"), ValueError, "schedule must be one of constant, cosine, onecycle"),
    (dict(warmup=40), ValueError, "warmup=40 must be fewer than steps=40"),
    (dict(warmup=-1), ValueError, "warmup"),
    (dict(warmup=2.5), TypeError, "warmup"),
])
def test_bad_schedules_raise_before_any_step(kwargs, error, match):
    with pytest.raises(error, match=match):
        train("linear", steps=40, batch_size=20, eval_every=0, dataset=_data(), **kwargs)


def test_cli_records_the_schedule_in_json_and_refuses_a_warmup_without_steps(tmp_path):
    from test_cli import cli, one_line_usage_error

    rc, out, err = cli("train", "--steps", "30", "--schedule", "onecycle", "--json",
                       "--eval-every", "0", "--out", tmp_path / "m.safetensors")
    assert rc == 0, err
    record = json.loads(out)
    assert (record["schedule"], record["warmup"]) == ("onecycle", 9)   # 30% of 30 steps
    err = one_line_usage_error(*cli("train", "--steps", "30", "--warmup", "30",
                                    "--out", tmp_path / "n.safetensors"))
    assert "--warmup 29 or less" in err
