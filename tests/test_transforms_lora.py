"""LoRA: LoRALinear (linearkit/layers/lora.py), its rule, and add_lora / merge_lora /
extract_lora / save_adapter / load_adapter (linearkit/transforms/lora_transforms.py)."""

import copy
import json
import math
import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transform_checks import assert_unchanged, snapshot

import linearkit as lk
from linearkit.analysis.ledger.custom import _closure_arrays
from linearkit.io.safetensors import save as save_tensors
from linearkit.layers.lora import LoRALinear
from linearkit.recipes.train_mnist1d import build_model
from linearkit.rules import rule_for
from linearkit.storage.safetensors_header import read_tensors
from linearkit.training.loop import evaluate, step
from linearkit.transforms import (
    add_lora,
    extract_lora,
    load_adapter,
    merge_lora,
    save_adapter,
)
from linearkit.transforms.lora_transforms import extract_lora_weights, merge_lora_weights

F32 = {"rtol": 1.3e-6, "atol": 1e-5}


def _x(n_in, rows=16, seed=1, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal((rows, n_in)).astype(dtype)


def _loras(model):
    return [(p, m) for p, m in model.named_modules() if isinstance(m, LoRALinear)]


def _randomize_b(model, seed=3, scale=0.1):
    rng = np.random.default_rng(seed)
    for _, m in _loras(model):
        m.lora_B.weight.data[...] = scale * rng.standard_normal(m.lora_B.weight.shape)
    return model


def _mlp(seed=0):
    return build_model("mlp", rng=np.random.default_rng(seed))  # 40-100-res(100)-10


# ---------------------------------------------------------------- LoRALinear
def test_lora_linear_names_init_and_scaling():
    layer = LoRALinear(lk.Linear(256, 32), rank=64, alpha=16, rng=0)
    assert [n for n, _ in layer.named_children()] == ["base_layer", "lora_dropout", "lora_A",
                                                      "lora_B"]
    assert list(layer.state_dict()) == ["base_layer.weight", "base_layer.bias", "lora_A.weight",
                                        "lora_B.weight"]
    assert (layer.rank, layer.alpha, layer.scaling) == (64, 16, 0.25)
    assert (layer.in_features, layer.out_features) == (256, 32)
    assert not layer.base_layer.weight.requires_grad and not layer.base_layer.bias.requires_grad
    assert layer.lora_A.weight.requires_grad and layer.lora_B.weight.requires_grad
    assert layer.lora_A.bias is None and layer.lora_B.bias is None
    assert isinstance(layer.lora_dropout, lk.Identity)
    assert isinstance(LoRALinear(lk.Linear(4, 2), dropout=0.1).lora_dropout, lk.Dropout)
    # B = 0; A ~ U(-k, k), k = 1/sqrt(in) (kaiming_uniform_(a=sqrt(5))): 16,384 draws
    assert not layer.lora_B.weight.data.any()
    a, k = layer.lora_A.weight.data, 1 / math.sqrt(256)
    assert np.abs(a).max() <= k and np.abs(a).max() > 0.999 * k
    assert abs(a.std() - k / math.sqrt(3)) < 0.02 * k / math.sqrt(3)
    assert abs(a.mean()) < 0.02 * k


def test_lora_linear_forward_and_gradients_match_torch_autograd():
    # y = x Wᵀ + b + s · (x Aᵀ) Bᵀ, written out in torch; only A and B get gradients
    layer = _randomize_b(lk.Sequential(LoRALinear(lk.Linear(7, 5, dtype=np.float64), rank=3,
                                                  alpha=6, rng=0)))[0]
    x = _x(7, rows=11, dtype=np.float64)
    dy = _x(5, rows=11, seed=2, dtype=np.float64)
    y, back = layer.vjp(x)
    dx = back(dy)
    tx = torch.tensor(x, requires_grad=True)
    w, b = (torch.tensor(p.data) for p in (layer.base_layer.weight, layer.base_layer.bias))
    ta = torch.tensor(layer.lora_A.weight.data, requires_grad=True)
    tb = torch.tensor(layer.lora_B.weight.data, requires_grad=True)
    ty = tx @ w.T + b + (tx @ ta.T @ tb.T) * 2.0
    ty.backward(torch.tensor(dy))
    torch.testing.assert_close(torch.tensor(y), ty.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.tensor(dx), tx.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.tensor(layer.lora_A.weight.grad), ta.grad)
    torch.testing.assert_close(torch.tensor(layer.lora_B.weight.grad), tb.grad)
    assert layer.base_layer.weight.grad is None and layer.base_layer.bias.grad is None
    assert np.array_equal(layer(x), y)
    # input_grad=False: no dx; the same parameter gradients
    layer.zero_grad()
    _, back = layer.vjp(x, input_grad=False)
    assert back(dy) is None
    torch.testing.assert_close(torch.tensor(layer.lora_A.weight.grad), ta.grad)


def test_lora_linear_float32_matches_torch_and_keeps_only_its_input():
    layer = _randomize_b(lk.Sequential(LoRALinear(lk.Linear(40, 30), rank=4, rng=0)))[0]
    x = _x(40)
    y, back = layer.vjp(x, input_grad=False)
    t = torch.tensor
    ref = (t(x) @ t(layer.base_layer.weight.data).T + t(layer.base_layer.bias.data)
           + (t(x) @ t(layer.lora_A.weight.data).T @ t(layer.lora_B.weight.data).T) * 4.0)
    torch.testing.assert_close(t(y), ref, **F32)
    assert y.dtype == np.float32
    # the frozen base keeps no activation: the closure holds x (for dA) and A's output (for dB)
    params = {id(p.data) for p in layer.parameters()}
    kept = sorted(a.shape for a in _closure_arrays(back, params))
    assert kept == [(16, 4), (16, 40)]
    assert any(a is x for a in _closure_arrays(back, params))


def test_lora_linear_dropout_touches_only_the_adapter_path():
    layer = LoRALinear(lk.Linear(6, 4), rank=2, dropout=0.5, rng=0)
    x = _x(6)
    assert np.array_equal(layer(x), layer.base_layer(x))  # B = 0: dropout or not
    _randomize_b(lk.Sequential(layer))
    layer.eval()
    reference = layer.base_layer(x) + layer.lora_B(layer.lora_A(x)) * layer.scaling
    assert np.array_equal(layer(x), reference)            # eval: dropout is the identity
    layer.train()
    assert not np.allclose(layer(x), reference)


def test_lora_linear_refuses_what_it_cannot_adapt():
    with pytest.raises(TypeError, match="plain linearkit Linear, got ReLU"):
        LoRALinear(lk.ReLU())
    with pytest.raises(TypeError, match="materialize"):
        LoRALinear(lk.LazyLinear(3))
    with pytest.raises(ValueError, match="rank must be a positive int, got 0"):
        LoRALinear(lk.Linear(3, 2), rank=0)
    with pytest.raises(ValueError, match="alpha must be a positive number"):
        LoRALinear(lk.Linear(3, 2), alpha=-1)
    with pytest.raises(lk.ShapeError, match=r"base_layer.*expected input of shape \(\*, 3\)"):
        lk.Sequential(LoRALinear(lk.Linear(3, 2)))(np.ones((2, 4), np.float32))


# ---------------------------------------------------------------- peft, the reference
def test_add_lora_matches_peft(tmp_path):
    peft = pytest.importorskip("peft", reason="peft is not installed: pip install peft")
    torch.manual_seed(0)
    tm = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    lm = lk.Sequential(lk.Linear(6, 5), lk.ReLU(), lk.Linear(5, 3))
    lm.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    pm = peft.get_peft_model(tm, peft.LoraConfig(
        target_modules=["0", "2"], r=2, lora_alpha=4, lora_dropout=0.0, init_lora_weights=True))
    adapted, report = add_lora(lm, rank=2, alpha=4, targets=["0", "2"], rng=0)

    def ours(key):
        return key.removeprefix("base_model.model.").replace(".default", "")

    # peft's names, its frozen set, its parameter count, its scaling and its init
    assert list(adapted.state_dict()) == [ours(k) for k in pm.state_dict()]
    assert [n for n, p in adapted.named_parameters() if p.requires_grad] == \
        [ours(n) for n, p in pm.named_parameters() if p.requires_grad]
    assert (report.trainable_params, report.total_params) == pm.get_nb_trainable_parameters()
    for path, layer in _loras(adapted):
        theirs = pm.base_model.model[int(path)]
        assert layer.scaling == theirs.scaling["default"] == 2.0
        assert not theirs.lora_B["default"].weight.any() and not layer.lora_B.weight.data.any()
        k = 1 / math.sqrt(layer.in_features)
        assert theirs.lora_A["default"].weight.abs().max() <= k
        assert np.abs(layer.lora_A.weight.data).max() <= k
    # the same factors give the same outputs and gradients
    for path, layer in _loras(adapted):
        theirs = pm.base_model.model[int(path)]
        torch.nn.init.normal_(theirs.lora_B["default"].weight, std=0.3)
        layer.lora_A.weight.data[...] = theirs.lora_A["default"].weight.detach().numpy()
        layer.lora_B.weight.data[...] = theirs.lora_B["default"].weight.detach().numpy()
    x = _x(6)
    ty = pm(torch.tensor(x))
    y, back = adapted.vjp(x, input_grad=False)
    torch.testing.assert_close(torch.tensor(y), ty.detach(), **F32)
    dy = _x(3, seed=4)
    ty.backward(torch.tensor(dy))
    back(dy)
    for path, layer in _loras(adapted):
        theirs = pm.base_model.model[int(path)]
        for name in ("lora_A", "lora_B"):
            torch.testing.assert_close(torch.tensor(getattr(layer, name).weight.grad),
                                       getattr(theirs, name)["default"].weight.grad, **F32)
    # the adapter file holds peft's adapter keys (less the prefix), and peft loads it
    path = str(tmp_path / "a.safetensors")
    save_adapter(adapted, path)
    from safetensors.torch import load_file

    tensors = load_file(path)
    assert sorted(tensors) == sorted(ours(k) for k in peft.get_peft_model_state_dict(pm))
    for p in pm.parameters():
        if p.requires_grad:
            torch.nn.init.zeros_(p)
    peft.set_peft_model_state_dict(pm, {"base_model.model." + k: v for k, v in tensors.items()})
    torch.testing.assert_close(pm(torch.tensor(x)).detach(), torch.tensor(adapted(x)), **F32)


# ---------------------------------------------------------------- add / merge
def test_merge_of_a_fresh_adapter_gives_the_model_back_exactly():
    model = _mlp()
    before = snapshot(model)
    adapted, report = add_lora(model, rank=4, rng=0)
    assert_unchanged(model, before)
    assert report.max_abs_error == 0.0 and len(report.changed) == 3
    assert report.trainable_params == 4 * (140 + 200 + 110)
    merged, merge_report = merge_lora(adapted)
    assert merge_report.max_abs_error == 0.0
    assert list(merged.state_dict()) == list(model.state_dict())
    for key, value in model.state_dict().items():
        assert np.array_equal(merged.state_dict()[key], value), key
    x = _x(40)
    assert np.array_equal(merged(x), model(x))
    assert all(type(m) is not LoRALinear for m in merged.modules())


def test_merge_drift_is_below_1e6_in_float32_and_the_adapted_model_is_kept():
    adapted = _randomize_b(add_lora(_mlp(), rank=8, rng=0)[0], scale=0.3)
    before = snapshot(adapted)
    x = _x(40, rows=32, seed=5)
    merged, report = merge_lora(adapted, probe=x)
    assert_unchanged(adapted, before)
    assert 0 < report.max_rel_error < 1e-6
    torch.testing.assert_close(torch.tensor(merged(x)), torch.tensor(adapted(x)), **F32)
    for path, layer in _loras(adapted):
        w = dict(merged.named_modules())[path].weight
        expect = (layer.base_layer.weight.data.astype(np.float64) + layer.scaling
                  * layer.lora_B.weight.data.astype(np.float64)
                  @ layer.lora_A.weight.data.astype(np.float64)).astype(np.float32)
        assert np.array_equal(w.data, expect) and w.requires_grad  # trains again
    assert [row["path"] for row in report.layers] == ["0", "2.module.0", "3"]
    assert all(row["delta_norm"] > 0 for row in report.layers)


def test_merge_lora_weights_by_hand():
    w = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    a = np.array([[1.0, 2.0]], np.float32)      # (1, 2)
    b = np.array([[3.0], [-1.0]], np.float32)   # (2, 1)
    assert merge_lora_weights(w, a, b, 0.5).tolist() == [[2.5, 3.0], [-0.5, 0.0]]
    assert merge_lora_weights(w, a, b, 0.5).dtype == np.float32
    with pytest.raises(ValueError, match=r"lora_b \(out, r\)"):
        merge_lora_weights(w, a, b.T, 1.0)


def test_add_lora_freezes_everything_else_and_reports_it():
    model = lk.Sequential(lk.Linear(8, 6), lk.LayerNorm(6), lk.ReLU(), lk.Linear(6, 3))
    adapted, report = add_lora(model, rank=2, alpha=4, targets="0", rng=0)
    assert [n for n, p in adapted.named_parameters() if p.requires_grad] == \
        ["0.lora_A.weight", "0.lora_B.weight"]
    assert report.trainable_params == 2 * (8 + 6)
    assert report.total_params == sum(p.numel() for p in adapted.parameters())
    assert len(report.left) == 2 and report.left[0].startswith("'1' (LayerNorm((6,)))")
    assert "trainable params 28 of" in report.summary()
    assert report.layers[0] == {"path": "0", "rank": 2, "alpha": 4, "scaling": 2.0,
                                "dropout": 0.0, "in": 8, "out": 6, "trainable": 28}
    # a second call adapts the rest and leaves the first adapter as it is
    again, report2 = add_lora(adapted, rank=3, rng=1)
    assert [p for p, _ in _loras(again)] == ["0", "3"]
    assert again[0].rank == 2 and again[3].rank == 3
    assert report2.left[0].startswith("'0' (LoRALinear(8, 6, r=2)): already adapted")


def test_add_lora_refuses_a_target_that_is_not_a_linear_naming_it():
    model = lk.Sequential(lk.Linear(8, 6), lk.ReLU(), lk.Linear(6, 3))
    before = snapshot(model)
    with pytest.raises(TypeError, match=r"target '1' \(ReLU\) is not a Linear"):
        add_lora(model, targets=["0", "1"])
    with pytest.raises(ValueError, match="target 'fc9' names no Linear layer.*'0', '2'"):
        add_lora(model, targets="fc9")
    adapted = add_lora(model, rank=2, targets="0")[0]
    with pytest.raises(TypeError, match=r"'0' \(LoRALinear\(8, 6, r=2\)\) already has a LoRA"):
        add_lora(adapted, targets="0")
    with pytest.raises(ValueError, match=r"'0.lora_A' .* is inside the LoRA adapter '0'"):
        add_lora(adapted, targets="0.lora_A")
    with pytest.raises(ValueError, match=r"'0.lora_B', which is inside '0' \(LoRALinear"):
        add_lora(adapted, targets="lora_B")
    tied = lk.Linear(4, 4)
    with pytest.raises(ValueError, match=r"used at '0', '1' \(tied\)"):
        add_lora(lk.Sequential(tied, tied))
    with pytest.raises(ValueError, match="rank must be a positive int"):
        add_lora(model, rank=0)
    with pytest.raises(TypeError, match="convert a PyTorch model first"):
        add_lora(torch.nn.Linear(3, 2))
    assert_unchanged(model, before)


def test_merge_and_save_refuse_a_model_without_adapters():
    with pytest.raises(ValueError, match="holds no LoRALinear layer, so there is nothing"):
        merge_lora(_mlp())
    with pytest.raises(ValueError, match="holds no LoRALinear layer: nothing to save"):
        save_adapter(_mlp(), "unused.safetensors")


# ---------------------------------------------------------------- the rule: ledger, model files
def test_ledger_counts_adapters_trainable_and_the_base_frozen():
    adapted = add_lora(lk.Sequential(lk.Linear(784, 256), lk.ReLU(), lk.Linear(256, 10)),
                       rank=8, targets="0", rng=0)[0]
    assert rule_for(adapted[0]).describe_module(adapted[0]) == "LoRALinear(784, 256, r=8)"
    L = lk.analysis.ledger(adapted, (64, 784), optimizer="adam")
    rows = {r.path: r for r in L.rows}
    assert (rows["0"].params, rows["0"].trainable_params) == (200_960 + 8 * 1040, 8 * 1040)
    assert rows["0.base_layer"].trainable_params == 0 and rows["0.base_layer"].saved_bytes == 0
    assert rows["0"].kind == "lora" and rows["0"].type == "LoRALinear(784, 256, r=8)"
    assert L.totals["trainable_params"] == 8 * 1040
    # the base costs its forward only: no dW (frozen), no dX (first layer)
    assert rows["0.base_layer"].backward_flops == 0
    assert rows["0.lora_A"].saved_bytes == 64 * 784 * 4  # x, for dA
    assert rows["0.lora_A"].backward_flops == 2 * 64 * 784 * 8  # dA only (no one needs dx)
    assert rows["0.lora_B"].backward_flops == 2 * 2 * 64 * 8 * 256  # dB, and dX for dA
    assert rows["0"].backward_flops == (2 * 64 * 784 * 8 + 4 * 64 * 8 * 256
                                        + 64 * 256)  # + dy·scaling
    assert not [f for f in L.findings if f.kind == "mergeable-linear"]


def test_model_file_round_trips_an_adapted_model(tmp_path):
    adapted = _randomize_b(add_lora(_mlp(), rank=4, alpha=8, dropout=0.25, rng=0)[0]).eval()
    path = str(tmp_path / "adapted.safetensors")
    lk.save(adapted, path)
    again = lk.load_model(path)
    assert [(p, type(m)) for p, m in again.named_modules()] == \
        [(p, type(m)) for p, m in adapted.named_modules()]
    x = _x(40)
    assert np.array_equal(again(x), adapted(x))
    layer = again[0]
    assert (layer.rank, layer.alpha, layer.dropout, layer.training) == (4, 8, 0.25, False)
    assert not layer.base_layer.weight.requires_grad and layer.lora_A.weight.requires_grad


def test_onnx_export_of_an_adapted_model_runs_in_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime", reason="pip install 'linearkit[onnx]'")
    from linearkit.io import export_onnx

    adapted = _randomize_b(add_lora(_mlp(), rank=4, rng=0)[0])
    path = export_onnx(adapted, str(tmp_path / "a.onnx"), (8, 40))
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    x = _x(40, rows=8)
    got = session.run(None, {"input": x})[0]
    torch.testing.assert_close(torch.tensor(got), torch.tensor(adapted(x)), **F32)


# ---------------------------------------------------------------- extract
@settings(max_examples=25, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.integers(1, 7), st.integers(0, 2**31))
def test_extract_lora_weights_is_the_best_rank_r_approximation(n_out, n_in, rank, seed):
    delta = np.random.default_rng(seed).standard_normal((n_out, n_in))
    a, b, energy = extract_lora_weights(delta, rank, scaling=0.5)
    assert a.shape == (rank, n_in) and b.shape == (n_out, rank)
    s = np.linalg.svd(delta, compute_uv=False)
    # Eckart–Young: the error is exactly the dropped singular values
    err = np.linalg.norm(delta - 0.5 * b @ a)
    np.testing.assert_allclose(err, np.sqrt(np.sum(s[rank:] ** 2)), atol=1e-10)
    np.testing.assert_allclose(energy, np.sum(s[:rank] ** 2) / np.sum(s ** 2), rtol=1e-12)


def test_extract_lora_refuses_mismatched_architectures_naming_the_path():
    tuned = _mlp(1)
    with pytest.raises(ValueError, match=r"differ at '2.module.0' \(Linear\(100, 100\)\).*"
                                         r"'2.module.0' \(Linear\(100, 50\)\)"):
        extract_lora(tuned, lk.Sequential(lk.Linear(40, 100), lk.ReLU(), lk.Residual(
            lk.Sequential(lk.Linear(100, 50), lk.ReLU())), lk.Linear(100, 10)), 4)
    with pytest.raises(ValueError, match=r"differ at '3' \(Linear\(100, 10\)\): only the tuned"):
        extract_lora(tuned, lk.Sequential(*list(tuned)[:3]), 4)
    with pytest.raises(ValueError, match=r"tuned holds LoRA adapters.*merge_lora\(tuned\)"):
        extract_lora(add_lora(tuned, rng=0)[0], _mlp(), 4)
    with pytest.raises(ValueError, match="no targeted Linear differs"):
        extract_lora(tuned, _mlp(1), 4)


def test_extract_lora_carries_a_changed_bias_and_says_so():
    base = lk.Sequential(lk.Linear(6, 5), lk.LayerNorm(5), lk.Linear(5, 3))
    tuned = copy.deepcopy(base)
    rng = np.random.default_rng(0)
    tuned[0].weight.data += np.outer(rng.standard_normal(5), rng.standard_normal(6)).astype(
        np.float32)                                   # a rank-1 change
    tuned[0].bias.data += 1.0                         # a bias change LoRA cannot express
    tuned[1].weight.data *= 2.0                       # a norm change
    tuned[2].bias.data -= 1.0                         # only a bias change
    snapshots = snapshot(tuned), snapshot(base)
    adapted, report = extract_lora(tuned, base, rank=1, probe=_x(6))
    assert_unchanged(tuned, snapshots[0])
    assert_unchanged(base, snapshots[1])
    assert report.max_rel_error < 1e-6              # rank 1 reproduces it; the rest is carried
    assert [p for p, _ in _loras(adapted)] == ["0"]
    assert np.array_equal(adapted[0].base_layer.weight.data, base[0].weight.data)
    assert np.array_equal(adapted[0].base_layer.bias.data, tuned[0].bias.data)
    assert report.layers[0]["bias_carried"] and report.layers[0]["energy"] > 1 - 1e-9
    assert (report.layers[0]["alpha"], report.layers[0]["scaling"]) == (2, 2.0)
    assert "bias carried from tuned" in report.changed[0]
    assert any(line.startswith("'1' (LayerNorm((5,))): differs from the base") for line in
               report.left)
    assert any(line.startswith("'2' (Linear(5, 3)): weight equal") and "bias is kept" in line
               for line in report.left)


# ---------------------------------------------------------------- the fine-tune that matters
@pytest.fixture(scope="module")
def finetune():
    """A base trained briefly on MNIST-1D, and its LoRA fine-tune to shifted labels."""
    lk.manual_seed(0)
    data = lk.data.mnist1d()
    loss = lk.CrossEntropyLoss()
    rng = np.random.default_rng(1)
    base = _mlp(0)
    opt = lk.optim.Adam(base.parameters(), lr=1e-2)
    for _ in range(500):
        i = rng.integers(0, len(data.x_train), 100)
        step(base, loss, opt, data.x_train[i], data.y_train[i])
    before = snapshot(base)

    def shift(y):
        return (y + 3) % 10           # the same digits, other names: a derangement of labels

    adapted, report = add_lora(base, rank=4, alpha=8, rng=2)
    opt = lk.optim.Adam(adapted.parameters(), lr=1e-2)
    i = rng.integers(0, len(data.x_train), 100)
    step(adapted, loss, opt, data.x_train[i], shift(data.y_train[i]), set_to_none=False)
    grads = {id(p): p.grad for p in adapted.parameters() if p.grad is not None}
    state = {id(p): dict(s) for p, s in opt.state.items()}
    for _ in range(300):
        i = rng.integers(0, len(data.x_train), 100)
        step(adapted, loss, opt, data.x_train[i], shift(data.y_train[i]))
    return {"data": data, "base": base, "before": before, "adapted": adapted, "shift": shift,
            "grads": grads, "state": state, "report": report}


def test_lora_finetune_trains_only_a_and_b_and_learns_the_shifted_task(finetune):
    data, base, adapted, shift = (finetune[k] for k in ("data", "base", "adapted", "shift"))
    assert_unchanged(base, finetune["before"])
    for path, layer in _loras(adapted):
        ref = dict(base.named_modules())[path]
        assert np.array_equal(layer.base_layer.weight.data, ref.weight.data)  # bitwise
        assert np.array_equal(layer.base_layer.bias.data, ref.bias.data)
        assert layer.lora_B.weight.data.any()
    assert set(finetune["grads"]) == {id(p) for _, m in _loras(adapted)
                                      for p in (m.lora_A.weight, m.lora_B.weight)}
    on_base = evaluate(base, data.x_test, data.y_test)["accuracy"]
    base_shifted = evaluate(base, data.x_test, shift(data.y_test))["accuracy"]
    lora_shifted = evaluate(adapted, data.x_test, shift(data.y_test))["accuracy"]
    assert on_base > 0.5 and base_shifted < 0.15    # measured 0.62 and 0.05
    assert lora_shifted > base_shifted + 0.3        # measured 0.58 with 1,800 of 17,010 params


def test_ledger_memory_matches_what_the_optimizer_holds(finetune):
    adapted = finetune["adapted"]
    L = lk.analysis.ledger(adapted, (100, 40), optimizer="adam")
    state_bytes = sum(v.nbytes for s in finetune["state"].values() for k, v in s.items()
                      if k in ("exp_avg", "exp_avg_sq"))
    assert set(finetune["state"]) == set(finetune["grads"])     # A and B only
    assert L.memory["optimizer"] == state_bytes == 2 * 4 * 1800
    assert L.memory["grads"] == sum(g.nbytes for g in finetune["grads"].values())
    assert L.totals["trainable_params"] == finetune["report"].trainable_params == 1800
    # the activations: what one real backward closure keeps, measured by walking it
    _, back = adapted.vjp(finetune["data"].x_train[:100].copy(), input_grad=False)
    kept = _closure_arrays(back, {id(p.data) for p in adapted.parameters()})
    assert L.memory["activations"] == sum(a.nbytes for a in kept)


def test_extract_from_the_merged_finetune_reproduces_the_adapted_model(finetune):
    adapted, base = finetune["adapted"], finetune["base"]
    merged, merge_report = merge_lora(adapted)
    assert merge_report.max_rel_error < 1e-6
    x = finetune["data"].x_test
    extracted, report = extract_lora(merged, base, rank=4, probe=x)
    torch.testing.assert_close(torch.tensor(extracted(x)), torch.tensor(adapted(x)),
                               rtol=1e-5, atol=1e-5)
    assert report.max_rel_error < 1e-5
    assert [row["path"] for row in report.layers] == ["0", "2.module.0", "3"]
    assert all(row["energy"] > 1 - 1e-9 and row["rel_error"] < 1e-5 for row in report.layers)
    assert not any(row["bias_carried"] for row in report.layers)
    # a lower rank keeps less, and says how much
    low = extract_lora(merged, base, rank=1)[1]
    assert all(row["energy"] < 1 - 1e-6 for row in low.layers)
    assert low.max_rel_error > report.max_rel_error


# ---------------------------------------------------------------- adapter files
def test_adapter_file_holds_only_the_adapters_and_round_trips(finetune, tmp_path):
    adapted, base = finetune["adapted"], finetune["base"]
    path = str(tmp_path / "adapter.safetensors")
    assert save_adapter(adapted, path) == path
    tensors, metadata = read_tensors(path)
    assert sorted(tensors) == sorted(f"{p}.{n}.weight" for p in ("0", "2.module.0", "3")
                                     for n in ("lora_A", "lora_B"))
    meta = json.loads(metadata["linearkit.lora"])
    assert (meta["format"], meta["rank"], meta["alpha"], meta["dropout"]) == (
        "linearkit.lora/1", 4, 8, 0.0)
    assert meta["targets"] == ["0", "2.module.0", "3"]
    assert os.path.getsize(path) < 4 * 1800 + 2048      # no base weight in it
    before = snapshot(base)
    loaded, report = load_adapter(base, path)
    assert_unchanged(base, before)
    x = finetune["data"].x_test
    assert np.array_equal(loaded(x), adapted(x))
    assert report.trainable_params == 1800 and len(report.changed) == 3
    assert [n for n, p in loaded.named_parameters() if p.requires_grad] == \
        [n for n, p in adapted.named_parameters() if p.requires_grad]


def test_load_adapter_refuses_bad_files_naming_file_and_key(finetune, tmp_path):
    adapted, base = finetune["adapted"], finetune["base"]
    good = str(tmp_path / "good.safetensors")
    save_adapter(adapted, good)
    before = snapshot(base)
    truncated = str(tmp_path / "truncated.safetensors")
    with open(good, "rb") as f:
        data = f.read()
    with open(truncated, "wb") as f:
        f.write(data[: len(data) // 2])
    with pytest.raises(lk.FormatError, match="truncated.safetensors"):
        load_adapter(base, truncated)
    whole = str(tmp_path / "model.safetensors")
    lk.save(base, whole)
    with pytest.raises(lk.FormatError, match=r"model.safetensors: holds no LoRA adapter"):
        load_adapter(base, whole)
    with pytest.raises(lk.FormatError, match=r"good.safetensors: tensor '2.module.0.lora_A."
                                             r"weight': the base model has no layer"):
        load_adapter(lk.Sequential(*list(base)[:2]), good)
    other = lk.Sequential(lk.Linear(40, 100), lk.ReLU(), lk.Residual(lk.Sequential(
        lk.Linear(100, 100), lk.ReLU())), lk.Linear(100, 12))
    with pytest.raises(lk.FormatError, match=r"tensor '3.lora_B.weight' has shape \(10, 4\), "
                                             r"but the base model's layer needs \(12, 4\)"):
        load_adapter(other, good)
    with pytest.raises(lk.FormatError, match=r"'0' \(LoRALinear.*is not a plain Linear"):
        load_adapter(adapted, good)
    tensors = lk.load(good)
    tensors["extra.weight"] = np.zeros(2, np.float32)
    edited = str(tmp_path / "edited.safetensors")
    save_tensors(tensors, edited, metadata={"linearkit.lora": json.dumps(
        {"format": "linearkit.lora/1", "targets": ["0"], "layers": {"0": {
            "rank": 4, "alpha": 8, "dropout": 0.0}}})})
    with pytest.raises(lk.FormatError, match="edited.safetensors: tensor '2.module.0.lora_A."
                                             "weight' is not a LoRA factor of a listed layer"):
        load_adapter(base, edited)
    assert_unchanged(base, before)
