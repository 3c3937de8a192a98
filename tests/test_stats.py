"""linearkit.analysis.stats: per-layer activation/gradient statistics and their flags."""

import numpy as np
import pytest

import linearkit as lk
from linearkit.analysis.stats import StatsRecorder, find_flags, record_stats


def deep_mlp(depth, init, d_in=40, width=256, classes=10, seed=0):
    """``depth`` Linear layers with ReLU between; weights drawn here with NumPy directly."""
    rng = np.random.default_rng(seed)
    layers, d = [], d_in
    for i in range(depth):
        out = classes if i == depth - 1 else width
        layer = lk.Linear(d, out, rng=rng)
        if init == "small":
            layer.weight.data[...] = rng.normal(0.0, 0.01, layer.weight.shape)
            layer.bias.data[...] = 0
        elif init == "kaiming":
            layer.weight.data[...] = rng.normal(0.0, np.sqrt(2.0 / d), layer.weight.shape)
            layer.bias.data[...] = 0
        elif init == "large":
            layer.weight.data[...] = rng.normal(0.0, 0.3, layer.weight.shape)
        layers.append(layer)
        if i < depth - 1:
            layers.append(lk.ReLU())
        d = out
    return lk.Sequential(*layers)


def batch(n=64, d=40, seed=1):
    return np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)


def tiny():
    model = lk.Sequential(lk.Linear(3, 4), lk.ReLU(), lk.Linear(4, 2))
    rng = np.random.default_rng(3)
    for p in model.parameters():
        p.data[...] = rng.normal(size=p.shape)
    return model


# ----------------------------------------------------------------------------- flags
def test_small_constant_init_is_flagged_vanishing_kaiming_is_not():
    x = batch()
    small = record_stats(deep_mlp(16, "small"), x, steps=2)
    kinds = {f.kind for f in small.flags}
    assert {"vanishing_activation", "vanishing_gradient", "small_param_grad"} <= kinds
    # The last hidden activations are many orders of magnitude below the first layer's.
    assert small.layers[-2].std < 1e-10 * small.layers[0].std
    flagged = {f.layer for f in small.flagged("vanishing_activation")}
    assert str(len(small.layers) - 1) in flagged

    kaiming = record_stats(deep_mlp(16, "kaiming"), x, steps=2)
    assert kaiming.flags == []
    stds = [s.std for s in kaiming.layers]
    assert max(stds) / min(stds) < 5
    assert "flags: none" in str(kaiming)


def test_depth8_small_init_is_flagged_too():
    report = record_stats(deep_mlp(8, "small"), batch(), steps=1)
    assert report.flagged("vanishing_activation")
    assert report.flagged("vanishing_gradient")


def test_large_init_is_flagged_exploding():
    report = record_stats(deep_mlp(8, "large"), batch(), steps=1)
    assert report.flagged("exploding_activation")
    assert not report.flagged("vanishing_activation")


def test_dead_units_flag():
    model = lk.Sequential(lk.Linear(5, 6), lk.ReLU(), lk.Linear(6, 2))
    model[0].bias.data[...] = -100.0  # every pre-activation negative: all ReLUs dead
    report = record_stats(model, batch(8, 5))
    dead = report.flagged("dead_units")
    assert [f.layer for f in dead] == ["1"]
    # No gradient reaches the first layer at all.
    assert report.layers[0].param_grad_norms["weight"] == 0.0
    assert any(f.layer == "0.weight" for f in report.flagged("small_param_grad"))


def test_thresholds_are_arguments():
    x = batch()
    model = deep_mlp(8, "kaiming")
    assert record_stats(model, x).flags == []
    # A ratio of 1.01 makes ordinary layer-to-layer fluctuations count.
    assert record_stats(model, x, ratio=1.01).flags
    assert record_stats(model, x, grad_rtol=1e9).flagged("small_param_grad")


# ----------------------------------------------------------------------------- numbers
def test_statistics_equal_a_hand_computation():
    model = tiny()
    w1, b1 = model[0].weight.data.astype(np.float64), model[0].bias.data.astype(np.float64)
    w2, b2 = model[2].weight.data.astype(np.float64), model[2].bias.data.astype(np.float64)
    x = batch(5, 3, seed=7)
    report = record_stats(model, x)

    h = x.astype(np.float64) @ w1.T + b1
    r = np.maximum(h, 0)
    out = r @ w2.T + b2
    dout = np.ones_like(out)  # no loss_fn: the gradient of out.sum()
    dw2, db2 = dout.T @ r, dout.sum(0)
    dr = dout @ w2
    dh = dr * (h > 0)
    dw1, db1 = dh.T @ x, dh.sum(0)

    s0, s1, s2 = report.layers
    assert [s.name for s in report.layers] == ["0", "1", "2"]
    assert [s.type for s in report.layers] == ["Linear", "ReLU", "Linear"]
    for s, y in ((s0, h), (s1, r), (s2, out)):
        assert s.shape == y.shape
        np.testing.assert_allclose(s.mean, y.mean(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(s.std, y.std(), rtol=1e-5)
        np.testing.assert_allclose(s.max_abs, np.abs(y).max(), rtol=1e-5)
        assert s.zero_fraction == np.mean(y == 0)
    assert s1.zero_fraction == np.mean(h <= 0) > 0
    nrm = np.linalg.norm
    np.testing.assert_allclose(s2.grad_out_norm, nrm(dout), rtol=1e-5)
    np.testing.assert_allclose(s2.grad_in_norm, nrm(dr), rtol=1e-5)
    np.testing.assert_allclose(s1.grad_out_norm, nrm(dr), rtol=1e-5)
    np.testing.assert_allclose(s1.grad_in_norm, nrm(dh), rtol=1e-5)
    np.testing.assert_allclose(s0.grad_out_norm, nrm(dh), rtol=1e-5)
    assert s0.grad_in_norm is None  # the first layer is asked for no input gradient
    np.testing.assert_allclose(s2.param_grad_norms["weight"], nrm(dw2), rtol=1e-5)
    np.testing.assert_allclose(s2.param_grad_norms["bias"], nrm(db2), rtol=1e-5)
    np.testing.assert_allclose(s0.param_grad_norms["weight"], nrm(dw1), rtol=1e-5)
    np.testing.assert_allclose(s0.param_grad_norms["bias"], nrm(db1), rtol=1e-5)
    np.testing.assert_allclose(s0.param_grad_norm, np.sqrt(nrm(dw1) ** 2 + nrm(db1) ** 2),
                               rtol=1e-5)
    np.testing.assert_allclose(s0.param_norms["weight"], nrm(w1), rtol=1e-6)
    assert s1.param_grad_norms == {} and s1.param_grad_norm is None


def test_gradients_match_torch_with_a_loss():
    torch = pytest.importorskip("torch")
    model = tiny()
    x = batch(6, 3, seed=2)
    target = np.array([0, 1, 1, 0, 1, 0])
    report = record_stats(model, x, target, lk.CrossEntropyLoss())

    tm = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    tm.load_state_dict({k: torch.tensor(v) for k, v in model.state_dict().items()})
    h = tm[0](torch.tensor(x))
    r = tm[1](h)
    out = tm[2](r)
    for t in (h, r, out):
        t.retain_grad()
    loss = torch.nn.functional.cross_entropy(out, torch.tensor(target))
    loss.backward()
    np.testing.assert_allclose(report.losses, [loss.item()], rtol=1e-5)
    for s, t in zip(report.layers, (h, r, out)):
        np.testing.assert_allclose(s.std, t.detach().double().std(unbiased=False).item(),
                                   rtol=1e-5)
        np.testing.assert_allclose(s.grad_out_norm, t.grad.norm().item(), rtol=1e-5)
    np.testing.assert_allclose(report.layers[0].param_grad_norms["weight"],
                               tm[0].weight.grad.norm().item(), rtol=1e-5)
    np.testing.assert_allclose(report.layers[2].param_grad_norms["bias"],
                               tm[2].bias.grad.norm().item(), rtol=1e-5)


def test_steps_are_averaged_and_records_kept():
    model = lk.Sequential(lk.Linear(3, 4), lk.Dropout(0.5), lk.Linear(4, 2))
    report = record_stats(model, batch(16, 3), steps=3)
    assert len(report.records) == 9
    assert [r["step"] for r in report.records] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    drop = [r for r in report.records if r["path"] == "1"]
    assert report.layers[1].steps == 3
    np.testing.assert_allclose(report.layers[1].std, np.mean([r["std"] for r in drop]))
    assert report.layers[1].max_abs == max(r["max_abs"] for r in drop)


def test_param_grads_count_only_this_calls_contribution():
    model = tiny()
    for p in model.parameters():
        p.grad = np.full(p.shape, 1e3, p.dtype)  # stale gradients from an earlier pass
    x = batch(5, 3)
    with StatsRecorder(model) as rec:
        _, back = model.vjp(x)
        back(np.ones((5, 2), np.float32))
    fresh = record_stats(tiny(), x)
    got = rec.report().layers[0].param_grad_norms["weight"]
    np.testing.assert_allclose(got, fresh.layers[0].param_grad_norms["weight"], rtol=1e-4)


def test_a_reused_module_gets_one_row_per_call():
    shared = lk.Linear(4, 4)
    model = lk.Sequential(shared, lk.ReLU(), shared)
    report = record_stats(model, batch(3, 4))
    assert [s.name for s in report.layers] == ["0", "1", "0#1"]


# ----------------------------------------------------------------------------- nothing left behind
def test_model_is_unchanged_after_recording():
    model = tiny()
    x = batch(5, 3)
    before = {k: v.copy() for k, v in model.state_dict().items()}
    y_before = model(x)
    grads = [np.full(p.shape, 0.5, p.dtype) for p in model.parameters()]
    for p, g in zip(model.parameters(), grads):
        p.grad = g
    def attributes(m):       # the runtime's kept plans are caches it may replace, not state
        return {k: v for k, v in m.__dict__.items() if k not in lk.runtime.PLAN_ATTRIBUTES}

    dicts = [attributes(m) for m in model.modules()]

    record_stats(model, x, steps=3)

    assert all("vjp" not in m.__dict__ for m in model.modules())
    assert [attributes(m) for m in model.modules()] == dicts
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v, before[k])
    for p, g in zip(model.parameters(), grads):
        assert p.grad is g and np.all(g == 0.5)
    np.testing.assert_array_equal(model(x), y_before)
    # vjp still behaves: a second backward call raises, as the protocol says.
    _, back = model.vjp(x)
    back(np.ones((5, 2), np.float32))
    with pytest.raises(lk.BackwardError):
        back(np.ones((5, 2), np.float32))


def test_batchnorm_running_statistics_are_put_back():
    model = lk.Sequential(lk.Linear(3, 4), lk.BatchNorm1d(4), lk.ReLU(), lk.Linear(4, 2))
    bn = model[1]
    before = {k: np.array(v, copy=True) for k, v in model.state_dict().items()}
    report = record_stats(model, batch(8, 3), steps=2)
    assert report.layers[1].type == "BatchNorm1d"
    np.testing.assert_allclose(report.layers[1].mean, 0.0, atol=1e-6)  # batch-normalized
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)
    assert bn.training


def test_wrappers_are_removed_after_an_error():
    model = tiny()

    class Boom:
        def vjp(self, pred, target):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        record_stats(model, batch(2, 3), np.zeros(2), Boom())
    assert all("vjp" not in m.__dict__ for m in model.modules())
    assert all(p.grad is None for p in model.parameters())


def test_an_existing_instance_vjp_is_put_back():
    model = tiny()
    relu = model[1]
    calls = []
    original = relu.vjp

    def spy(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    object.__setattr__(relu, "vjp", spy)
    with StatsRecorder(model):
        model.vjp(batch(2, 3))
    assert relu.__dict__["vjp"] is spy
    assert calls == [1]
    with StatsRecorder(model) as rec:
        pass
    assert rec.records == [] and relu.__dict__["vjp"] is spy


def test_forward_only_is_not_recorded_and_recorder_is_reusable_once_closed():
    model = tiny()
    rec = StatsRecorder(model)
    with rec:
        model(batch(2, 3))
        with pytest.raises(RuntimeError):
            rec.__enter__()
    assert rec.records == []


# ----------------------------------------------------------------------------- output
def test_table_plot_and_markdown(tmp_path):
    pytest.importorskip("matplotlib")
    report = record_stats(deep_mlp(8, "small"), batch(), steps=1)
    text = str(report)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["layer", "type", "shape"]
    assert len({len(line) for line in lines[2:2 + len(report.layers)]} | {len(lines[1])}) <= 2
    assert "vanishing_activation" in text and "worst" in text
    md = report.to_markdown()
    assert md.count("\n") == len(report.layers) + 1
    path = report.plot(tmp_path / "stats.png")
    with open(path, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"


def test_every_axis_of_the_plot_is_labelled():
    pytest.importorskip("matplotlib")
    from linearkit.analysis.stats_plot import report_figure

    fig = report_figure(record_stats(deep_mlp(4, "small"), batch(), steps=1))
    assert len(fig.axes) == 2
    forward, backward = (ax.get_ylabel() for ax in fig.axes)
    assert "std" in forward and "gradient norm" in backward and "log" in forward + backward
    assert fig.axes[1].get_xlabel().startswith("layer")  # the shared x axis, under the bottom


def test_find_flags_on_handmade_layers():
    from linearkit.analysis.stats import LayerStats

    def layer(name, std, dy):
        return LayerStats(name, "Linear", 0, (1,), 1, 0.0, std, std, 0.0, dy, None,
                          {"weight": 1e-7}, {"weight": 1.0})

    flags = find_flags([layer("a", 1.0, 1.0), layer("b", 0.05, 0.05), layer("c", 20.0, 1.0)])
    kinds = sorted((f.kind, f.layer) for f in flags)
    assert ("vanishing_activation", "b") in kinds
    assert ("exploding_activation", "c") in kinds
    assert ("vanishing_gradient", "b") in kinds
    assert ("small_param_grad", "a.weight") in kinds


def test_bad_arguments():
    with pytest.raises(ValueError):
        record_stats(tiny(), batch(2, 3), steps=0)
    with pytest.raises(ValueError):
        record_stats(tiny(), batch(2, 3), loss_fn=object())
    with pytest.raises(TypeError):
        StatsRecorder("not a model")


def test_with_an_optimizer_it_trains_exactly_as_the_library_step():
    import copy

    from linearkit.training.loop import step

    model = tiny()
    twin = copy.deepcopy(model)
    x, target = batch(6, 3), np.arange(6) % 2
    loss_fn = lk.CrossEntropyLoss()
    report = record_stats(model, x, target, loss_fn, steps=3,
                          optimizer=lk.optim.SGD(model.parameters(), lr=0.5))
    opt = lk.optim.SGD(twin.parameters(), lr=0.5)
    expected = [step(twin, loss_fn, opt, x, target) for _ in range(3)]
    assert report.losses == expected and expected[-1] < expected[0]
    for p, q in zip(model.parameters(), twin.parameters()):
        np.testing.assert_array_equal(p.data, q.data)
    assert all(r["grad_in_norm"] is not None for r in report.records if r["path"] != "0")
