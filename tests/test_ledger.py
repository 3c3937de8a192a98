"""The ledger: worked examples, memory measured from the real closures, PyTorch cross-checks,
findings (and the LayerNorm/BatchNorm bias proof), errors, side effects, other sources."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from closure_oracle import closure_bytes

import linearkit as lk
from linearkit.analysis.ledger import Ledger, human_bytes, ledger, preset
from linearkit.core.module import Module


def rng(seed=0):
    return np.random.default_rng(seed)


# ---------------------------------------------------------------- the textbook arithmetic
def test_linear_4096_parameters_and_float32_bytes():
    L = ledger(lk.Linear(4096, 4096, rng=rng()), (1, 4096))
    assert L.totals["params"] == 4096 * 4096 + 4096 == 16_781_312
    assert L.memory["weights"] == 16_781_312 * 4
    assert human_bytes(L.memory["weights"]) == "64.0 MiB"
    assert "16,781,312" in str(L) and "64.0 MiB" in str(L)


def test_linear_512_256_training_state_with_adam_is_16_bytes_per_param():
    L = ledger(lk.Linear(512, 256, rng=rng()), (64, 512), optimizer="adam")
    assert L.totals["params"] == 131_328
    assert L.memory["weights"] == 525_312
    assert L.memory["grads"] == 525_312 and L.memory["optimizer"] == 2 * 525_312
    assert L.memory["training_state"] == 2_101_248 == 16 * 131_328
    assert ledger(lk.Linear(512, 256), (64, 512), optimizer="adamw").memory["training_state"] \
        == 2_101_248
    assert ledger(lk.Linear(512, 256), (64, 512), optimizer="sgd-momentum") \
        .memory["training_state"] == 12 * 131_328
    assert ledger(lk.Linear(512, 256), (64, 512), optimizer="sgd").memory["training_state"] \
        == 8 * 131_328


def test_output_activation_of_linear_1024_4096_on_64_128():
    L = ledger(lk.Linear(1024, 4096, rng=rng()), (64, 128, 1024), rank_check=False)
    assert L[""].output_shape == (64, 128, 4096)
    assert L[""].output_bytes == 64 * 128 * 4096 * 4 == 134_217_728
    B = 64 * 128
    assert L.totals["flops"] == 2 * B * 1024 * 4096 + B * 4096
    assert L.memory["activations"] == 64 * 128 * 1024 * 4  # the backward keeps x, not y


@pytest.mark.parametrize("shape,n_in,n_out,bias", [((7, 5), 5, 3, True), ((2, 3, 4), 4, 6, True),
                                                    ((4,), 4, 2, False), ((0, 3), 3, 2, True)])
def test_forward_flops_formula(shape, n_in, n_out, bias):
    L = ledger(lk.Linear(n_in, n_out, bias=bias, rng=rng()), shape)
    B = math.prod(shape[:-1])
    assert L.totals["macs"] == B * n_in * n_out
    assert L.totals["flops"] == 2 * B * n_in * n_out + (B * n_out if bias else 0)


# ------------------------------------------------------------------ memory matches reality
def _models():
    yield "mlp-mnist", preset("mlp-mnist"), (64, 784)
    yield "mnist1d", preset("mnist1d"), (32, 40)
    yield "norms+dropout", lk.Sequential(
        lk.Linear(20, 32), lk.BatchNorm1d(32), lk.ReLU(), lk.Linear(32, 30), lk.Dropout(0.1),
        lk.Linear(30, 8), lk.LayerNorm(8), lk.GELU(), lk.Linear(8, 3), lk.Tanh(), lk.Flatten(),
        lk.Softmax(dim=-1)), (16, 20)
    yield "3-d, views", lk.Sequential(lk.Flatten(), lk.Linear(12, 5), lk.SiLU(), lk.Identity(),
                                      lk.Linear(5, 2), lk.LeakyReLU(), lk.Sigmoid(),
                                      lk.LogSoftmax(dim=1)), (7, 3, 4)
    frozen = preset("mlp-mnist")
    frozen[0].requires_grad_(False)
    yield "frozen first layer", frozen, (8, 784)
    yield "eval mode", lk.Sequential(lk.Linear(6, 6), lk.BatchNorm1d(6), lk.Dropout(0.5),
                                     lk.Linear(6, 2)).eval(), (5, 6)


@pytest.mark.parametrize("name,model,shape", list(_models()), ids=lambda v: v
                         if isinstance(v, str) else "")
def test_saved_activations_equal_what_the_closures_hold(name, model, shape):
    L = ledger(model, shape, rank_check=False)
    dtype = next(model.parameters()).dtype
    _, backward = model.vjp(np.zeros(shape, dtype), input_grad=False)
    real = closure_bytes(backward, model)
    assert abs(L.memory["activations"] - real) <= 0.10 * real  # the required bound ...
    assert L.memory["activations"] == real  # ... and in fact exact


def test_memory_by_hand_for_the_mnist_mlp():
    L = ledger("mlp-mnist", (64, 784))
    params = 784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10
    assert L.totals["params"] == params == 269_322
    # Linear 0 keeps the input; each ReLU keeps its output, which the next Linear keeps too.
    assert L.memory["activations"] == 64 * 784 * 4 + 2 * 64 * 256 * 4 == 331_776
    assert L["0"].saved_bytes == 64 * 784 * 4 and L["2"].saved_bytes == 0
    assert L.memory["total"] == 16 * params + 331_776
    assert ledger("mlp-mnist", (64, 784), optimizer=None).memory["total"] == 4 * params


def test_mixed_precision_counts_the_float32_master_copy():
    model = lk.Linear(512, 256, rng=rng()).to(np.float16)
    L = ledger(model, (64, 512))
    assert L.dtype == "float16"
    # gradients as the precision policy stores them: float32 by default, float16 under
    # grads="storage" (tests/test_ledger_precision.py checks every field against tracemalloc)
    assert L.memory["weights"] == 2 * 131_328 and L.memory["grads"] == 4 * 131_328
    assert L.memory["master"] == 4 * 131_328 and L.memory["optimizer"] == 8 * 131_328
    with lk.precision.policy(grads="storage"):
        assert ledger(model, (64, 512)).memory["grads"] == 2 * 131_328
    assert ledger(model, (64, 512), master_dtype=None).memory["master"] == 0
    assert ledger(lk.Linear(512, 256), (64, 512), dtype=np.float16).memory["master"] == 4 * 131_328


# ------------------------------------------------------------------ backward FLOPs
def test_backward_skips_first_layer_dx_and_frozen_dw():
    model = lk.Sequential(lk.Linear(10, 20), lk.ReLU(), lk.Linear(20, 5))
    B = 8
    L = ledger(model, (B, 10))
    # first Linear: dW only; second: dX and dW
    assert L.totals["backward_macs"] == B * 10 * 20 + 2 * B * 20 * 5
    model[0].requires_grad_(False)  # a frozen prefix: nothing before Linear 2 needs a gradient
    L = ledger(model, (B, 10))
    assert L.totals["backward_macs"] == B * 20 * 5
    assert L.totals["backward_flops"] == 2 * B * 20 * 5 + B * 5  # dW + db, no ReLU backward
    assert L.totals["trainable_params"] == 20 * 5 + 5


# ------------------------------------------------------------------ PyTorch as the oracle
def _torch_mlp(torch):
    torch.manual_seed(0)
    nn = torch.nn
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 10))


def test_torch_mlp_params_shapes_and_flop_counter():
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    model = _torch_mlp(torch)
    L = ledger(model, (64, 784))
    assert L.source == "torch"
    assert L.totals["params"] == sum(p.numel() for p in model.parameters())
    assert L.totals["trainable_params"] == sum(p.numel() for p in model.parameters()
                                               if p.requires_grad)
    shapes = {}
    hooks = [m.register_forward_hook(lambda m, i, o, n=n: shapes.__setitem__(n, tuple(o.shape)))
             for n, m in model.named_modules() if n]
    x = torch.zeros(64, 784)
    with FlopCounterMode(display=False) as fwd:
        y = model(x)
    for h in hooks:
        h.remove()
    with FlopCounterMode(display=False) as bwd:
        y.sum().backward()
    assert {r.path: r.output_shape for r in L.rows if r.path} == shapes
    # FlopCounterMode counts 2*M*N*K per matmul/addmm and no bias adds, so exactly:
    #   FlopCounterMode forward  == 2 * MACs == flops - bias_flops - elementwise_flops
    #   FlopCounterMode backward == 2 * backward MACs (the first layer's dX is not computed)
    assert fwd.get_total_flops() == 2 * L.totals["macs"] == \
        L.totals["flops"] - L.totals["bias_flops"] - L.totals["elementwise_flops"]
    assert L.totals["bias_flops"] == 64 * (256 + 256 + 10)
    assert bwd.get_total_flops() == 2 * L.totals["backward_macs"]
    # the same architecture in linearkit gets the same ledger
    mine = ledger("mlp-mnist", (64, 784))
    for key in ("params", "macs", "flops", "backward_macs", "backward_flops"):
        assert mine.totals[key] == L.totals[key], key
    assert mine.memory == L.memory  # torch's saved tensors weigh exactly what our closures keep


def test_torchinfo_agrees_on_params_when_installed():
    torch = pytest.importorskip("torch")
    torchinfo = pytest.importorskip("torchinfo")
    model = _torch_mlp(torch)
    stats = torchinfo.summary(model, input_size=(64, 784), verbose=0)
    assert stats.total_params == ledger(model, (64, 784)).totals["params"]


def test_torch_lazy_tied_frozen_and_errors():
    torch = pytest.importorskip("torch")
    nn = torch.nn
    lazy = nn.Sequential(nn.LazyLinear(8), nn.ReLU(), nn.Linear(8, 3))
    L = ledger(lazy, (4, 5))
    assert "uninitialized (in_features=?)" in L["0"].note and L["0"].params == 0
    assert isinstance(lazy[0].weight, nn.parameter.UninitializedParameter)  # left as it was
    a, b = nn.Linear(6, 6), nn.Linear(6, 6)
    b.weight = a.weight
    tied = nn.Sequential(a, nn.Tanh(), b)
    assert ledger(tied, (2, 6)).totals["params"] == sum(p.numel() for p in tied.parameters())
    bn = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    before = bn[1].running_mean.clone()
    ledger(bn, (3, 4))
    assert torch.equal(bn[1].running_mean, before) and int(bn[1].num_batches_tracked) == 0
    with pytest.raises(lk.ShapeError, match="module '0'"):
        ledger(_torch_mlp(torch), (64, 28, 28))


# ------------------------------------------------------------------ findings
def _kinds(L: Ledger):
    return [f.kind for f in L.findings]


def test_consecutive_linears_are_mergeable_with_w2_w1():
    l1, l2 = lk.Linear(6, 5, rng=rng(1)), lk.Linear(5, 4, rng=rng(2))
    L = ledger(lk.Sequential(l1, lk.Identity(), l2), (3, 6))
    (f,) = [f for f in L.findings if f.kind == "mergeable-linear"]
    assert f.paths == ("0", "2") and "W2 W1" in f.message
    assert f.transform.startswith("transforms.merge_linear") and "Apply: " in str(f)
    assert f.saving_params == (6 * 5 + 5 + 5 * 4 + 4) - (6 * 4 + 4)
    x = rng(3).standard_normal((3, 6)).astype(np.float32)
    w1, b1, w2, b2 = l1.weight.data, l1.bias.data, l2.weight.data, l2.bias.data
    merged = x @ (w2 @ w1).T + (w2 @ b1 + b2)
    np.testing.assert_allclose(merged, l2(l1(x)), rtol=1e-5, atol=1e-6)
    # a nonlinearity between them: nothing to merge
    assert "mergeable-linear" not in _kinds(ledger(lk.Sequential(l1, lk.ReLU(), l2), (3, 6)))


def test_bias_before_batchnorm_is_flagged_but_not_before_layernorm():
    L = ledger(lk.Sequential(lk.Linear(8, 6), lk.BatchNorm1d(6)), (4, 8))
    assert {"bias-before-batchnorm", "fold-batchnorm"} <= set(_kinds(L))
    (f,) = [f for f in L.findings if f.kind == "bias-before-batchnorm"]
    assert f.saving_params == 6
    L = ledger(lk.Sequential(lk.Linear(8, 6), lk.LayerNorm(6)), (4, 8))
    assert "bias-before-batchnorm" not in _kinds(L)
    assert not any("LayerNorm" in str(f) or "cancel" in str(f) for f in L.findings)
    assert "bias-before-batchnorm" not in _kinds(
        ledger(lk.Sequential(lk.Linear(8, 6, bias=False), lk.BatchNorm1d(6)), (4, 8)))


def test_a_bias_before_layernorm_is_not_cancelled_but_before_batchnorm_it_is():
    """LayerNorm removes only the mean of the bias across features; BatchNorm removes it all."""
    x = rng(4).standard_normal((16, 8))
    lin = lk.Linear(8, 6, dtype=np.float64, rng=rng(5))
    lin.bias.data[:] = [3.0, -1.0, 0.5, 2.0, -2.5, 1.0]  # not constant across features
    no_bias = x @ lin.weight.data.T
    ln = lk.LayerNorm(6, dtype=np.float64)
    assert np.abs(ln(lin(x)) - ln(no_bias)).max() > 0.1  # removing the bias changes LayerNorm
    bn = lk.BatchNorm1d(6, dtype=np.float64)  # train mode: batch statistics
    np.testing.assert_allclose(bn(lin(x)), bn(no_bias), atol=1e-12)  # ... but not BatchNorm


def test_fold_batchnorm_formula_matches_eval_output():
    lin, bn = lk.Linear(5, 4, dtype=np.float64, rng=rng(6)), lk.BatchNorm1d(4, dtype=np.float64)
    bn.running_mean[:] = [0.1, -0.2, 0.3, 0.0]
    bn.running_var[:] = [1.5, 0.5, 2.0, 1.0]
    bn.weight.data[:] = [1.0, 2.0, 0.5, -1.0]
    bn.bias.data[:] = [0.0, 0.1, -0.1, 0.2]
    bn.eval()
    L = ledger(lk.Sequential(lin, bn), (3, 5))
    assert "fold-batchnorm" in _kinds(L)
    s = bn.weight.data / np.sqrt(bn.running_var + bn.eps)
    w = lin.weight.data * s[:, None]
    b = (lin.bias.data - bn.running_mean) * s + bn.bias.data
    x = rng(7).standard_normal((3, 5))
    np.testing.assert_allclose(x @ w.T + b, bn(lin(x)), atol=1e-12)


def test_low_rank_weight_is_found_with_its_saving():
    layer = lk.Linear(48, 64, rng=rng(8))
    g = rng(9)
    layer.weight.data[:] = (g.standard_normal((64, 3)) @ g.standard_normal((3, 48)))
    L = ledger(layer, (2, 48))
    (f,) = [f for f in L.findings if f.kind == "low-rank"]
    assert "rank 3" in f.message and f.saving_params == 64 * 48 - 3 * (48 + 64)
    assert f.transform.startswith("transforms.factorize(model, rank=3, targets=['']")
    assert "low-rank" not in _kinds(ledger(lk.Linear(48, 64, rng=rng(10)), (2, 48)))


def test_alignment_hint_names_unaligned_layers_only():
    L = ledger(lk.Sequential(lk.Linear(64, 128), lk.ReLU(), lk.Linear(128, 10)), (4, 64))
    (f,) = [f for f in L.findings if f.kind == "alignment"]
    assert f.paths == ("2",) and "128x10 -> 128x16" in f.message


# ------------------------------------------------------------------ errors, laziness, tying
def test_a_wrong_input_shape_gives_a_shape_error_naming_the_layer():
    with pytest.raises(lk.ShapeError) as info:
        ledger("mlp-mnist", (64, 28, 28))
    assert "module '0'" in str(info.value) and "flatten" in str(info.value)
    with pytest.raises(lk.ShapeError, match="module '2.module.0'"):
        ledger(lk.Sequential(lk.Linear(4, 6), lk.ReLU(),
                             lk.Residual(lk.Sequential(lk.Linear(5, 6)))), (2, 4))


def test_lazy_layers_are_reported_uninitialized_and_left_lazy():
    model = lk.Sequential(lk.LazyLinear(10), lk.ReLU(), lk.Linear(10, 3))
    L = ledger(model, (4, 7))
    assert L["0"].note.startswith("uninitialized (in_features=?)")
    assert L["0"].params == 0 and L.totals["macs"] == 4 * 7 * 10 + 4 * 10 * 3
    assert model[0].in_features is None and type(model[0]) is lk.LazyLinear
    assert "uninitialized (in_features=?)" in str(ledger(lk.LazyLinear(3)))


def test_tied_parameters_are_counted_once():
    a, b = lk.Linear(8, 8, rng=rng()), lk.Linear(8, 8, rng=rng())
    b.weight = a.weight
    L = ledger(lk.Sequential(a, lk.Tanh(), b), (2, 8))
    assert L.totals["params"] == 64 + 8 + 8 == sum(p.size for p in L_params(a, b))
    assert "tied with 0" in L["2"].note


def L_params(*modules):
    return {id(p): p for m in modules for p in m.parameters()}.values()


def test_the_model_is_left_untouched():
    model = lk.Sequential(lk.Linear(4, 4), lk.BatchNorm1d(4), lk.Dropout(0.5))
    gen = lk.random.default_generator()
    state = gen.bit_generator.state
    ledger(model, (8, 4))
    assert gen.bit_generator.state == state
    assert int(model[1].num_batches_tracked) == 0 and not model[1].running_mean.any()


class _Custom(Module):
    """A user's own module: the ledger has no rule for it and runs it once, on a copy."""

    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = lk.Linear(16, 32), lk.ReLU(), lk.Linear(32, 4)
        self.drop = lk.Dropout(0.5)

    def forward(self, x):
        return self.fc2(self.drop(self.act(self.fc1(x))))

    def vjp(self, x, input_grad=True):
        h, b1 = self.fc1.vjp(x, input_grad=input_grad)
        a, b2 = self.act.vjp(h)
        d, b3 = self.drop.vjp(a)
        y, b4 = self.fc2.vjp(d)
        return y, lambda dy: b1(b2(b3(b4(dy))))


def test_custom_modules_are_costed_by_their_layers_and_measured():
    model = _Custom()
    gen = lk.random.default_generator()
    state = gen.bit_generator.state
    L = ledger(model, (8, 16))
    assert gen.bit_generator.state == state
    same = ledger(lk.Sequential(lk.Linear(16, 32), lk.ReLU(), lk.Dropout(0.5),
                                lk.Linear(32, 4)), (8, 16))
    for key in ("params", "macs", "flops", "backward_macs"):
        assert L.totals[key] == same.totals[key], key
    _, backward = model.vjp(np.zeros((8, 16), np.float32), input_grad=False)
    assert L.memory["activations"] == closure_bytes(backward, model)


# ------------------------------------------------------------------ sources and outputs
def test_safetensors_file_gives_params_and_memory_only(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    path = tmp_path / "mlp.safetensors"
    st.save_file({k: np.ascontiguousarray(v) for k, v in preset("mlp-mnist").state_dict().items()},
                 str(path))
    L = ledger(str(path))
    assert L.source == "safetensors" and L.totals["params"] == 269_322
    assert L.totals["flops"] is None and L.memory["activations"] is None
    assert L.memory["training_state"] == 16 * 269_322
    assert L["2"].type == "Linear(256, 256)"


def test_outputs_table_markdown_dict_and_presets():
    L = ledger("mnist1d", (64, 40))
    text = str(L)
    assert "Conventions:" in text and "2*B*in*out + B*out" in text and "2.module.0" in text
    assert "KiB" in text
    md = L.to_markdown()
    assert md.count("\n|") > 10 and "`2.module.0`" in md
    d = json.loads(json.dumps(L.to_dict()))
    assert d["totals"]["params"] == 40 * 100 + 100 + 100 * 100 + 100 + 100 * 10 + 10
    assert [r["path"] for r in d["rows"]][:3] == ["", "0", "1"]
    assert L.totals["elementwise_flops"] == 2 * 64 * 100 + 64 * 100  # two ReLUs + residual add
    for name in ("mlp-mnist", "mnist1d", "linear-4096"):
        assert isinstance(preset(name), Module)
    assert ledger(lk.Linear(3, 2), (3,), batch=5).input_shape == (5, 3)
    with pytest.raises(KeyError):
        preset("nope")
    with pytest.raises(ValueError, match="optimizer"):
        ledger(lk.Linear(3, 2), (1, 3), optimizer="rmsprop")
