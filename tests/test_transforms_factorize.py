"""factorize_weight, factorize and rank_sweep (linearkit.transforms.factorize / sweep)."""

import numpy as np
import pytest
import torch

import linearkit as lk
from linearkit.training.loop import step
from linearkit.transforms import factorize, factorize_weight, rank_sweep
from linearkit.transforms.factorize_sweep import RankSweep, default_ranks


def _rng(seed=0):
    return np.random.default_rng(seed)


def _mlp(seed=0, bias=True):
    rng = _rng(seed)
    return lk.Sequential(lk.Linear(40, 64, rng=rng), lk.ReLU(),
                         lk.Linear(64, 48, bias=bias, rng=rng), lk.ReLU(),
                         lk.Linear(48, 10, rng=rng))


def _state(model):
    return {k: v.copy() for k, v in model.state_dict().items()}


def _untouched(model, state, modes):
    assert all(np.array_equal(v, state[k]) for k, v in model.state_dict().items())
    assert [m.training for m in model.modules()] == modes


# ---------------------------------------------------------------- the array tier
@pytest.mark.parametrize("seed, k", [(0, 5), (1, 7), (5, 5)])  # (1, 7), (5, 5): the rounding
def test_a_weight_of_rank_k_is_rebuilt_exactly_at_rank_k_and_at_energy_one(seed, k):
    # of the cumulative energy leaves it a hair under 1.0 at rank k: energy=1.0 still means k
    rng = _rng(seed)
    w = rng.standard_normal((30, k)) @ rng.standard_normal((k, 20))
    for kwargs in ({"rank": k}, {"energy": 1.0}):
        a, b, info = factorize_weight(w, **kwargs)
        assert a.shape == (k, 20) and b.shape == (30, k) and info["rank"] == k
        np.testing.assert_allclose(b @ a, w, rtol=0, atol=1e-12 * np.abs(w).max())
        assert info["rel_error"] < 1e-13 and info["energy_kept"] == pytest.approx(1.0, abs=1e-15)
    # one rank less loses exactly the smallest singular value's share
    a, b, info = factorize_weight(w, rank=k - 1)
    s = np.linalg.svd(w, compute_uv=False)
    assert info["rel_error"] == pytest.approx(s[k - 1] / np.sqrt(np.sum(s ** 2)), rel=1e-10)


def test_energy_picks_the_smallest_rank_that_keeps_it_as_a_numpy_svd_by_hand():
    w = _rng(1).standard_normal((24, 16)) * np.linspace(3, 0.1, 16)
    s = np.linalg.svd(w, compute_uv=False)
    for energy in (0.05, 0.3, 0.5, 0.8, 0.9, 0.99, 0.999):
        by_hand = next(r for r in range(1, 17) if np.sum(s[:r] ** 2) / np.sum(s ** 2) >= energy)
        a, b, info = factorize_weight(w, energy=energy)
        assert info["rank"] == by_hand and a.shape == (by_hand, 16) and b.shape == (24, by_hand)
        assert info["energy_kept"] == pytest.approx(np.sum(s[:by_hand] ** 2) / np.sum(s ** 2))
        assert info["energy_kept"] >= energy
        np.testing.assert_allclose(info["singular_values"], s, rtol=1e-12)
        tail = np.sqrt(np.sum(s[by_hand:] ** 2) / np.sum(s ** 2))
        assert info["rel_error"] == pytest.approx(tail, rel=1e-9, abs=1e-14)


def test_sigma_is_split_evenly_and_the_dtype_kept():
    w = _rng(2).standard_normal((12, 9)).astype(np.float32)
    a, b, info = factorize_weight(w, rank=3)
    assert a.dtype == b.dtype == np.float32
    root = np.sqrt(info["singular_values"][:3])
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), root, rtol=1e-6)  # rows sqrt(s_i) v_i
    np.testing.assert_allclose(np.linalg.norm(b, axis=0), root, rtol=1e-6)  # cols u_i sqrt(s_i)
    # the rank-3 truncation of a numpy SVD, up to float32 rounding of the factors
    u, s, vt = np.linalg.svd(w.astype(np.float64))
    np.testing.assert_allclose(b @ a, (u[:, :3] * s[:3]) @ vt[:3], atol=1e-5)


@pytest.mark.parametrize("kwargs, match", [
    ({"rank": 0}, "rank must be >= 1"),
    ({"rank": 7}, r"rank 7 > min\(out, in\) = 6"),
    ({"energy": 0.0}, "0 < energy <= 1"),
    ({"energy": 1.5}, "0 < energy <= 1"),
    ({"energy": float("nan")}, "0 < energy <= 1"),
    ({"rank": 2, "energy": 0.9}, "exactly one.*got both"),
    ({}, "exactly one.*got neither"),
])
def test_factorize_weight_refuses_bad_choices(kwargs, match):
    with pytest.raises(ValueError, match=match):
        factorize_weight(np.ones((6, 8)), **kwargs)


def test_factorize_weight_refuses_bad_weights():
    with pytest.raises(ValueError, match="2-D"):
        factorize_weight(np.ones(8), rank=1)
    with pytest.raises(ValueError, match="NaN or inf"):
        factorize_weight(np.array([[1.0, np.nan], [0.0, 1.0]]), rank=1)
    with pytest.raises(TypeError, match="rank must be an int"):
        factorize_weight(np.ones((3, 3)), rank=1.5)


# ---------------------------------------------------------------- the module tier
def test_the_factorized_model_computes_what_torch_computes_with_the_factors():
    model = _mlp()
    new, report = factorize(model, rank=6, timing=False)
    x = _rng(3).standard_normal((17, 40)).astype(np.float32)
    ref = torch.nn.Sequential()
    for path, layer in (("0", model[0]), ("2", model[2]), ("4", model[4])):  # 6·58 < 480: all
        a, b, _ = factorize_weight(layer.weight.data, rank=6)
        lin_a = torch.nn.Linear(layer.in_features, 6, bias=False)
        lin_b = torch.nn.Linear(6, layer.out_features)
        with torch.no_grad():
            lin_a.weight.copy_(torch.from_numpy(a))
            lin_b.weight.copy_(torch.from_numpy(b))
            lin_b.bias.copy_(torch.from_numpy(layer.bias.data))
        ref.append(torch.nn.Sequential(lin_a, lin_b))
        if path != "4":
            ref.append(torch.nn.ReLU())
    with torch.no_grad():
        expected = ref(torch.from_numpy(x)).numpy()
    torch.testing.assert_close(new(x), expected, rtol=1.3e-6, atol=1e-5)
    assert [entry["rank"] for entry in report.layers] == [6, 6, 6]
    assert set(new.state_dict()) == {f"{p}.{k}" for p in "024"
                                     for k in ("0.weight", "1.weight", "1.bias")}
    # the report's error is the whole model's, measured on probes
    assert 0 < report.max_rel_error < 1 and report.params_after < report.params_before


def test_bias_and_flags_are_carried_and_the_changed_line_reads_well():
    model = _mlp(bias=False)
    model[0].weight.requires_grad = False
    model[4].eval()
    new, report = factorize(model, rank=4, timing=False)
    np.testing.assert_array_equal(new[0][1].bias.data, model[0].bias.data)
    assert new[2][1].bias is None and new[2][0].bias is None
    assert not new[0][0].weight.requires_grad and not new[0][1].weight.requires_grad
    assert new[0][1].bias.requires_grad
    assert not new[4].training and not new[4][0].training and new[0].training
    entry = report.layers[0]
    assert entry["params_before"] == 40 * 64 + 64 and entry["params_after"] == 4 * (40 + 64) + 64
    assert entry["speedup"] is None and entry["path"] == "0"
    assert report.changed[0] == (
        f"'0': Linear(40, 64) -> rank 4 (Linear(40, 4, bias=False), Linear(4, 64)); energy "
        f"{entry['energy_kept']:.1%}, params 2,624 -> 480")


def test_layers_where_it_would_not_save_are_left_with_both_counts():
    model = lk.Sequential(lk.Linear(10, 10), lk.ReLU(), lk.Linear(10, 30))
    # Linear(10, 10): 5·20 = 100 >= 100 does not save; Linear(10, 30): 5·40 = 200 < 300 does
    new, report = factorize(model, rank=5, timing=False)
    assert type(new[0]) is lk.Linear and isinstance(new[2], lk.Sequential)
    assert report.left == [("'0' (Linear(10, 10)): rank 5 would not save: 5·(10 + 10) = 100 "
                            "weights >= 10·10 = 100; left as it is (it saves below rank 5)")]
    new, report = factorize(model, rank=4, timing=False)
    assert isinstance(new[0], lk.Sequential) and not report.left
    # by energy: 100% of a full-rank weight needs rank 10, which never saves
    new, report = factorize(model, energy=1.0, timing=False)
    assert type(new[0]) is lk.Linear and type(new[2]) is lk.Linear
    assert "energy 100.0% needs rank 10, which would not save" in report.left[0]
    assert report.max_abs_error == 0 and report.params_after == report.params_before


def test_targets_choose_the_layers_and_the_input_model_is_untouched():
    model = _mlp()
    model[2].eval()
    state, modes = _state(model), [m.training for m in model.modules()]
    new, report = factorize(model, energy=0.5, targets="2", timing=False)
    _untouched(model, state, modes)
    assert type(new[0]) is lk.Linear and isinstance(new[2], lk.Sequential)
    assert type(new[4]) is lk.Linear and [e["path"] for e in report.layers] == ["2"]
    new, _ = factorize(model, rank=3, targets=["0", "4"], timing=False)
    assert [type(new[i]).__name__ for i in (0, 2, 4)] == ["Sequential", "Linear", "Sequential"]
    with pytest.raises(ValueError, match="names no Linear"):
        factorize(model, rank=3, targets="fc9")
    _untouched(model, state, modes)


def test_a_bare_linear_and_a_shared_linear():
    layer = lk.Linear(32, 32, rng=_rng(4))
    new, report = factorize(layer, rank=2, timing=False)
    assert isinstance(new, lk.Sequential) and report.changed[0].startswith("the model: ")
    shared = lk.Linear(16, 16, rng=_rng(5))
    model = lk.Sequential(shared, lk.Tanh(), shared)
    new, report = factorize(model, rank=3, timing=False)
    assert new[0] is new[2] and isinstance(new[0], lk.Sequential) and len(report.layers) == 1


def test_a_non_finite_weight_is_refused_naming_the_layer():
    model = _mlp()
    model[2].weight.data[0, 0] = np.inf
    with pytest.raises(ValueError, match=r"'2' \(Linear\(64, 48\)\) holds NaN or inf"):
        factorize(model, rank=2, timing=False)


def test_bad_choices_are_refused_before_any_work():
    with pytest.raises(ValueError, match="exactly one"):
        factorize(_mlp(), timing=False)
    with pytest.raises(ValueError, match="rank must be >= 1"):
        factorize(_mlp(), rank=0)
    with pytest.raises(TypeError, match="from_torch"):
        factorize(torch.nn.Linear(3, 3), rank=1)


def test_the_factorized_model_saves_and_loads(tmp_path):
    new, _ = factorize(_mlp(), rank=5, targets="0", timing=False)
    path = tmp_path / "f.safetensors"
    lk.save(new, path)
    back = lk.load_model(path)
    x = _rng(6).standard_normal((9, 40)).astype(np.float32)
    np.testing.assert_array_equal(back(x), new(x))
    assert set(back.state_dict()) == set(new.state_dict())
    assert isinstance(back[0], lk.Sequential) and back[0][0].bias is None


def test_gradients_flow_through_the_factors_as_in_torch():
    rng = _rng(7)
    new, _ = factorize(lk.Sequential(lk.Linear(12, 20, rng=rng), lk.Tanh(),
                                     lk.Linear(20, 5, rng=rng)), rank=3, timing=False)
    x = rng.standard_normal((6, 12)).astype(np.float32)
    dy = rng.standard_normal((6, 5)).astype(np.float32)
    y, backward = new.vjp(x)
    dx = backward(dy)
    tx = torch.from_numpy(x).requires_grad_()
    params = {k: torch.from_numpy(v.copy()).requires_grad_() for k, v in new.state_dict().items()}
    h = torch.tanh(tx @ params["0.0.weight"].T @ params["0.1.weight"].T + params["0.1.bias"])
    ty = h @ params["2.0.weight"].T @ params["2.1.weight"].T + params["2.1.bias"]
    ty.backward(torch.from_numpy(dy))
    torch.testing.assert_close(y, ty.detach().numpy())
    torch.testing.assert_close(dx, tx.grad.numpy())
    for key, p in new.named_parameters():
        torch.testing.assert_close(p.grad, params[key].grad.numpy(), rtol=1.3e-6, atol=1e-5)


def test_the_measured_speedup_of_a_much_smaller_pair():
    # Linear(512, 512) at rank 4: 64x fewer multiply-adds; measured, it must at least be faster
    _, report = factorize(lk.Linear(512, 512, rng=_rng(8)), rank=4)
    speedup = report.layers[0]["speedup"]
    assert speedup > 1.5
    assert report.changed[0].endswith(f", {speedup:.1f}x faster")


# ---------------------------------------------------------------- rank_sweep
@pytest.fixture(scope="module")
def trained():
    """A small MLP trained 150 Adam steps on MNIST-1D, and the data."""
    ds = lk.data.mnist1d()
    model = _mlp(9)
    opt = lk.optim.Adam(model.parameters(), lr=3e-3)
    rng, loss_fn = _rng(9), lk.CrossEntropyLoss()
    for _ in range(150):
        batch = rng.integers(0, len(ds.x_train), 128)
        step(model, loss_fn, opt, ds.x_train[batch], ds.y_train[batch])
    return model, ds


def test_default_ranks_climb_geometrically_to_the_largest_useful_rank():
    assert default_ranks(_mlp()) == [1, 2, 4, 8, 16, 27]  # Linear(64, 48): 27·112 < 3072
    assert default_ranks(_mlp(), targets="0") == [1, 2, 4, 8, 16, 24]  # 24·104 < 2560 <= 25·104
    assert default_ranks(_mlp(), targets="4") == [1, 2, 4, 8]  # Linear(48, 10): 8·58 < 480
    with pytest.raises(ValueError, match="no targeted Linear saves"):
        default_ranks(lk.Sequential(lk.Linear(2, 2)))


def test_rank_sweep_measures_each_rank_and_full_rank_is_the_original(trained):
    model, ds = trained
    # make layer '0' exactly rank 8: from rank 8 on, its factorization is the layer itself
    low = model[0].weight.data.astype(np.float64)
    u, s, vt = np.linalg.svd(low, full_matrices=False)
    model = lk.transforms.walk.copy_model(model, "test")
    model[0].weight.data[...] = (u[:, :8] * s[:8]) @ vt[:8]
    state, modes = _state(model), [m.training for m in model.modules()]
    data = (ds.x_test, ds.y_test)
    sweep = rank_sweep(model, data, targets="0", repeats=2)
    _untouched(model, state, modes)
    rows = sweep.rows
    assert [r["rank"] for r in rows] == [None, 1, 2, 4, 8, 16, 24]
    original = lk.loop.evaluate(model, *data)["accuracy"]
    assert rows[0]["accuracy"] == original and rows[0]["speedup"] == 1.0
    for row in rows[4:]:  # ranks 8, 16, 24: the same function, to float32 rounding
        assert row["accuracy"] == original and row["output_error"] < 1e-5
        assert row["energy_kept"] == pytest.approx(1.0)
    assert rows[1]["accuracy"] < original and rows[1]["output_error"] > 0.1
    params = [r["params"] for r in rows[1:]]
    assert params == sorted(params) and params[-1] < rows[0]["params"]
    assert all(r["bytes"] == 4 * r["params"] for r in rows)
    assert all(r["forward_ms"] > 0 and r["layers"] == (0 if i == 0 else 1)
               for i, r in enumerate(rows))
    assert all(r["speedup"] == pytest.approx(rows[0]["forward_ms"] / r["forward_ms"])
               for r in rows)
    text = str(sweep).splitlines()
    assert len(text) == 8 and text[0].split()[:2] == ["rank", "layers"]
    assert text[1].split()[0] == "original" and len({len(line) for line in text}) == 1
    markdown = sweep.to_markdown().splitlines()
    assert markdown[0].startswith("| rank | layers |") and len(markdown) == 9


def test_rank_sweep_on_a_trained_model_is_monotone_ish_and_finetuning_helps(trained):
    model, ds = trained
    tune = {"x": ds.x_train, "y": ds.y_train, "steps": 20, "lr": 1e-3, "batch_size": 128}
    sweep = rank_sweep(model, (ds.x_test, ds.y_test), ranks=[2, 8, 24], finetune=tune,
                       repeats=2)
    rows = sweep.rows
    errors = [r["output_error"] for r in rows[1:]]
    assert errors == sorted(errors, reverse=True)
    assert rows[3]["accuracy"] > rows[1]["accuracy"]
    assert abs(rows[3]["accuracy"] - rows[0]["accuracy"]) < 0.05
    for row in rows:
        assert row["tune_loss_after"] <= row["tune_loss_before"]
        assert 0 <= row["accuracy_tuned"] <= 1
    assert rows[1]["accuracy_tuned"] > rows[1]["accuracy"]  # rank 2 loses most, recovers most
    assert "tuned accuracy" in str(sweep).splitlines()[0]
    # by energy: each layer its own rank
    sweep = rank_sweep(model, (ds.x_test, ds.y_test), energy=[0.5, 0.9], repeats=1)
    assert [r["energy"] for r in sweep.rows] == [None, 0.5, 0.9]
    assert all(r["energy_kept"] >= r["energy"] for r in sweep.rows[1:])
    assert len(sweep.rows[2]["ranks"]) == 3 and str(sweep).split()[0] == "energy"


def test_rank_sweep_refusals():
    x, y = np.zeros((4, 40), np.float32), np.zeros(4, np.int64)
    with pytest.raises(ValueError, match="integer class labels"):
        rank_sweep(_mlp(), (x, y.astype(np.float32)))
    with pytest.raises(ValueError, match="not both"):
        rank_sweep(_mlp(), (x, y), ranks=[2], energy=0.9)
    with pytest.raises(ValueError, match="rank must be >= 1"):
        rank_sweep(_mlp(), (x, y), ranks=[2, 0])
    with pytest.raises(ValueError, match="unknown \\['epochs'\\]"):
        rank_sweep(_mlp(), (x, y), ranks=[2], finetune={"x": x, "y": y, "steps": 2, "epochs": 1})
    with pytest.raises(TypeError, match=r"pair \(x, y\)"):
        rank_sweep(_mlp(), x)
    assert isinstance(rank_sweep(_mlp(), (x, y), ranks=2, repeats=1), RankSweep)
