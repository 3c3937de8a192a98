"""fold_batchnorm_weights, fold_layernorm_weights and fold_norm (linearkit/transforms/fold.py)."""

import copy

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.utils.fusion import fuse_linear_bn_eval
from transform_checks import assert_unchanged, snapshot

import linearkit as lk
from linearkit.transforms import (
    fold_batchnorm_weights,
    fold_layernorm_weights,
    fold_norm,
    merge_linear,
)
from linearkit.transforms.fold import _Folder


def _x(n_in, rows=16, seed=1, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal((rows, n_in)).astype(dtype)


def _torch_linear_bn(n_in, n_out, bias=True, seed=0):
    """A torch Linear and BatchNorm1d with running statistics from real batches and a random
    affine, in eval mode."""
    torch.manual_seed(seed)
    linear, bn = torch.nn.Linear(n_in, n_out, bias=bias), torch.nn.BatchNorm1d(n_out)
    with torch.no_grad():
        for _ in range(5):  # running statistics from training batches
            bn(linear(torch.randn(32, n_in) * 3 + 1))
        bn.weight.copy_(torch.randn(n_out))
        bn.bias.copy_(torch.randn(n_out))
    return linear.eval(), bn.eval()


def _lk_twin(linear, bn):
    """The linearkit Sequential(Linear, BatchNorm1d) holding the torch modules' state."""
    model = lk.Sequential(lk.Linear(linear.in_features, linear.out_features,
                                    bias=linear.bias is not None),
                          lk.BatchNorm1d(bn.num_features))
    state = {f"0.{k}": v.detach().numpy() for k, v in linear.state_dict().items()}
    state.update({f"1.{k}": v.detach().numpy() for k, v in bn.state_dict().items()})
    model.load_state_dict(state)
    return model.eval()


def _bn(c, rng, dtype=np.float32, **kw):
    bn = lk.BatchNorm1d(c, dtype=dtype, **kw)
    if bn.running_mean is not None:
        bn.running_mean[...] = rng.standard_normal(c)
        bn.running_var[...] = rng.uniform(0.5, 2.0, c)
    if bn.weight is not None:
        bn.weight.data[...] = rng.uniform(0.5, 2.0, c) * rng.choice([-1, 1], c)
    if bn.bias is not None:
        bn.bias.data[...] = rng.standard_normal(c)
    return bn


def _ln(d, rng, dtype=np.float32):
    ln = lk.LayerNorm(d, dtype=dtype)
    ln.weight.data[...] = rng.uniform(0.5, 2.0, d)
    ln.bias.data[...] = rng.standard_normal(d)
    return ln


# ---------------------------------------------------------------- the array tier
@pytest.mark.parametrize("bias", [True, False])
def test_fold_batchnorm_weights_is_torchs_fuse_linear_bn_eval(bias):
    linear, bn = _torch_linear_bn(6, 5, bias=bias)
    fused = fuse_linear_bn_eval(linear, bn)
    arrays = [None if t is None else t.detach().numpy()
              for t in (linear.weight, linear.bias, bn.running_mean, bn.running_var)]
    w, b = fold_batchnorm_weights(*arrays, bn.eps, bn.weight.detach().numpy(),
                                  bn.bias.detach().numpy())
    assert w.dtype == np.float32 and b.dtype == np.float32
    torch.testing.assert_close(torch.from_numpy(w), fused.weight.detach(), rtol=1.3e-6, atol=1e-5)
    torch.testing.assert_close(torch.from_numpy(b), fused.bias.detach(), rtol=1.3e-6, atol=1e-5)


def test_fold_batchnorm_weights_none_means_zeros_ones_zeros():
    rng = np.random.default_rng(0)
    w, rm, rv = rng.standard_normal((3, 2)), rng.standard_normal(3), rng.uniform(1, 2, 3)
    full = fold_batchnorm_weights(w, np.zeros(3), rm, rv, 1e-5, np.ones(3), np.zeros(3))
    bare = fold_batchnorm_weights(w, None, rm, rv, 1e-5, None, None)
    assert all(np.array_equal(a, b) for a, b in zip(full, bare))
    with pytest.raises(ValueError, match=r"bn_running_var has shape \(2,\).*out_features is 3"):
        fold_batchnorm_weights(w, None, rm, rv[:2], 1e-5, None, None)
    with pytest.raises(ValueError, match="without running statistics"):
        fold_batchnorm_weights(w, None, None, None, 1e-5, None, None)


def test_fold_layernorm_weights_by_hand_and_against_torch():
    rng = np.random.default_rng(1)
    ln_t, lin_t = torch.nn.LayerNorm(5), torch.nn.Linear(5, 3)
    with torch.no_grad():
        ln_t.weight.copy_(torch.randn(5))
        ln_t.bias.copy_(torch.randn(5))
    w, b = fold_layernorm_weights(ln_t.weight.detach().numpy(), ln_t.bias.detach().numpy(),
                                  lin_t.weight.detach().numpy(), lin_t.bias.detach().numpy())
    x = torch.from_numpy(_x(5, seed=2))
    xhat = torch.nn.functional.layer_norm(x, (5,))
    torch.testing.assert_close(xhat @ torch.from_numpy(w).T + torch.from_numpy(b),
                               lin_t(ln_t(x)).detach(), rtol=1.3e-6, atol=1e-5)
    # no biases anywhere: no bias; gamma None: W unchanged
    w0 = rng.standard_normal((2, 3))
    assert fold_layernorm_weights(None, None, w0, None)[1] is None
    assert np.array_equal(fold_layernorm_weights(None, None, w0, None)[0], w0)
    with pytest.raises(ValueError, match=r"ln_w has shape \(2,\).*in_features is 3"):
        fold_layernorm_weights(np.ones(2), None, w0, None)


# ---------------------------------------------------------------- Linear then BatchNorm1d
@pytest.mark.parametrize("bias", [True, False])
def test_fold_norm_matches_torch_fused_linear(bias):
    linear, bn = _torch_linear_bn(8, 6, bias=bias, seed=3)
    model = _lk_twin(linear, bn)
    new, report = fold_norm(model)
    assert [type(m) for m in new] == [lk.Linear] and new[0].bias is not None  # a bias appears
    fused = fuse_linear_bn_eval(linear, bn)
    x = _x(8, rows=64)
    torch.testing.assert_close(torch.from_numpy(new(x)), fused(torch.from_numpy(x)).detach(),
                               rtol=1.3e-6, atol=1e-5)
    torch.testing.assert_close(torch.from_numpy(new(x)), bn(linear(torch.from_numpy(x))).detach(),
                               rtol=1.3e-6, atol=1e-5)
    before = 8 * 6 + 6 * bias + 4 * 6  # the BatchNorm: weight, bias, running mean and var
    assert (report.params_before, report.params_after) == (before, 8 * 6 + 6)
    assert report.layers == [{"path": "0", "folded": "1", "kind": "batchnorm",
                              "bias_added": not bias, "params_before": before,
                              "params_after": 54}]
    assert report.changed[0].startswith("'0'+'1': Linear(8, 6") and "BatchNorm removed" in \
        report.changed[0]
    assert report.max_rel_error < 1e-6


def test_folding_a_batchnorm_in_training_mode_is_refused_naming_it():
    rng = np.random.default_rng(2)
    model = lk.Sequential(lk.Linear(3, 4), lk.ReLU(),
                          lk.Sequential(lk.Linear(4, 4), _bn(4, rng)))
    with pytest.raises(ValueError, match=r"'2\.1' \(BatchNorm1d\(4\)\) into '2\.0' .*is in "
                                         r"training mode.*each batch's statistics.*no fixed "
                                         r"affine map.*call model\.eval\(\) first"):
        fold_norm(model)
    model[2][1].eval()  # the BatchNorm alone in eval: the model is still in training mode
    with pytest.raises(ValueError, match=r"'2\.1' .*belongs to a model that is in training mode"):
        fold_norm(model)
    new, report = fold_norm(model.eval())
    assert len(new[2]) == 1 and report.layers[0]["path"] == "2.0"


def test_a_batchnorm_without_running_statistics_is_left_with_why():
    rng = np.random.default_rng(3)
    model = lk.Sequential(lk.Linear(3, 4), _bn(4, rng, track_running_stats=False)).eval()
    new, report = fold_norm(model)
    assert [type(m) for m in new] == [lk.Linear, lk.BatchNorm1d] and report.changed == []
    assert report.left == [("'0' (Linear(3, 4)) . '1' (BatchNorm1d(4)): not folded: the "
                           "BatchNorm has no running statistics (track_running_stats=False), so "
                           "it always normalizes with each batch's own and no fixed affine map "
                           "exists")]


def test_affine_free_batchnorm_and_a_mismatched_one():
    rng = np.random.default_rng(4)
    model = lk.Sequential(lk.Linear(3, 4, rng=rng), _bn(4, rng, affine=False)).eval()
    new, report = fold_norm(model)
    assert len(new) == 1 and report.max_rel_error < 1e-6
    x = _x(3)
    np.testing.assert_allclose(new(x), model(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_keep_batchnorm_removes_the_bias_it_cancels_in_either_mode(mode):
    rng = np.random.default_rng(5)
    model = lk.Sequential(lk.Linear(5, 4, dtype=np.float64, rng=rng),
                          _bn(4, rng, dtype=np.float64), lk.ReLU())
    model.train(mode == "train")
    before = snapshot(model)
    new, report = fold_norm(model, keep_batchnorm=True)
    assert_unchanged(model, before)
    assert new[0].bias is None and isinstance(new[1], lk.BatchNorm1d)
    np.testing.assert_allclose(new[1].running_mean,
                               model[1].running_mean - model[0].bias.data, rtol=0, atol=1e-15)
    assert report.layers[0]["kind"] == "batchnorm_bias" and report.params_after == \
        report.params_before - 4
    assert "cancels the bias exactly" in report.changed[0]
    x = _x(5, rows=32, dtype=np.float64)
    # eval: the shifted running mean gives the same outputs
    np.testing.assert_allclose(new.eval()(x), model.eval()(x), rtol=1e-12, atol=1e-12)
    # training: the batch mean moves by the bias too — same outputs on the same batch, and
    # the running statistics keep the shift
    model.train(), new.train()
    for seed in range(3):
        xb = _x(5, rows=32, seed=seed, dtype=np.float64)
        np.testing.assert_allclose(new(xb), model(xb), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(new[1].running_mean, model[1].running_mean - model[0].bias.data,
                               rtol=0, atol=1e-12)
    np.testing.assert_allclose(new[1].running_var, model[1].running_var, rtol=1e-12)


def test_keep_batchnorm_without_running_stats_just_drops_the_bias():
    rng = np.random.default_rng(6)
    model = lk.Sequential(lk.Linear(5, 4, rng=rng), _bn(4, rng, track_running_stats=False))
    new, report = fold_norm(model, keep_batchnorm=True)
    assert new[0].bias is None and "shifted" not in report.changed[0]
    x = _x(5)
    np.testing.assert_allclose(new(x), model(x), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- LayerNorm
def test_layernorm_affine_folds_into_the_following_linear():
    rng = np.random.default_rng(7)
    ln, lin = _ln(6, rng), lk.Linear(6, 3, rng=rng)
    model = lk.Sequential(ln, lin)  # training mode is fine: LayerNorm has no batch statistics
    new, report = fold_norm(model)
    assert isinstance(new[0], lk.LayerNorm) and new[0].weight is None and new[0].bias is None
    assert new[0].normalized_shape == (6,) and new[0].eps == ln.eps
    assert report.layers == [{"path": "1", "folded": "0", "kind": "layernorm_affine",
                              "params_before": 12 + 21, "params_after": 21}]
    t = torch.nn.Sequential(torch.nn.LayerNorm(6), torch.nn.Linear(6, 3))
    t.load_state_dict({k: torch.from_numpy(v) for k, v in model.state_dict().items()})
    x = _x(6, rows=32)
    torch.testing.assert_close(torch.from_numpy(new(x)), t(torch.from_numpy(x)).detach(),
                               rtol=1.3e-6, atol=1e-5)


def test_a_bias_before_layernorm_is_not_cancelled_only_its_mean_is():
    rng = np.random.default_rng(8)
    lin = lk.Linear(4, 6, dtype=np.float64, rng=rng)
    lin.bias.data[...] = rng.standard_normal(6) + 2.0  # a mean and a rest
    model = lk.Sequential(lin, lk.LayerNorm(6, dtype=np.float64))
    x = _x(4, rows=32, dtype=np.float64)
    b = lin.bias.data.copy()

    def with_bias(bias):
        other = copy.deepcopy(model)
        other[0].bias.data[...] = bias
        return other(x)

    # dropping the whole bias changes the outputs: LayerNorm does not cancel it ...
    assert np.abs(with_bias(np.zeros(6)) - model(x)).max() > 0.1
    # ... but its mean is cancelled exactly
    np.testing.assert_allclose(with_bias(b - b.mean()), model(x), rtol=1e-12, atol=1e-12)
    new, report = fold_norm(model)
    np.testing.assert_allclose(new[0].bias.data, b - b.mean(), rtol=0, atol=1e-15)
    np.testing.assert_allclose(new(x), model(x), rtol=1e-12, atol=1e-12)
    assert report.layers[0]["kind"] == "layernorm_bias_mean"
    assert report.layers[0]["mean_removed"] == pytest.approx(b.mean(), rel=1e-12)
    assert f"({b.mean():.6g}) removed" in report.changed[0]
    assert report.left[0].startswith("'0' (Linear(4, 6)): the rest of the bias (b - mean(b)")
    assert "the LayerNorm does not cancel it" in report.left[0]


def test_layernorm_over_other_dims_is_left():
    # on (N, 2, 4) inputs; the random probes are (N, 4), so look at the chain edit directly
    model = lk.Sequential(lk.Linear(4, 6), lk.LayerNorm((2, 6)), lk.Linear(6, 3))
    folder = _Folder(model, keep_batchnorm=False)
    assert folder.edit("", model.named_steps()) is None and folder.changed == []
    assert folder.left == [
        ("'0' (Linear(4, 6)) . '1' (LayerNorm((2, 6))): bias kept: the LayerNorm normalizes over "
        "(2, 6), not the Linear's 6 outputs"),
        ("'1' (LayerNorm((2, 6))) . '2' (Linear(6, 3)): affine not folded: the LayerNorm's weight "
        "spans (2, 6), not just the Linear's 6 input features")]


# ---------------------------------------------------------------- whole models
def test_chains_fold_left_to_right_in_nested_sequentials_and_the_input_is_untouched():
    rng = np.random.default_rng(9)
    model = lk.Sequential(lk.Linear(5, 6, rng=rng), _bn(6, rng), _ln(6, rng),
                          lk.Linear(6, 6, bias=False, rng=rng), _bn(6, rng), lk.ReLU(),
                          lk.Residual(lk.Sequential(_ln(6, rng), lk.Linear(6, 6, rng=rng))),
                          lk.Linear(6, 2, rng=rng)).eval()
    before = snapshot(model)
    new, report = fold_norm(model)
    assert_unchanged(model, before)
    assert list(dict(new.named_children())) == ["0", "2", "3", "5", "6", "7"]
    assert [(d["path"], d["kind"]) for d in report.layers] == [
        ("6.module.1", "layernorm_affine"), ("0", "batchnorm"), ("0", "layernorm_bias_mean"),
        ("3", "layernorm_affine"), ("3", "batchnorm")]
    x = _x(5, rows=64)
    np.testing.assert_allclose(new(x), model(x), rtol=1e-4, atol=1e-4)
    assert report.max_rel_error < 1e-5
    assert not any(isinstance(m, lk.BatchNorm1d) for m in new.modules())
    assert report.params_after < report.params_before


@settings(max_examples=25, deadline=None)
@given(n_in=st.integers(1, 10), n_out=st.integers(1, 10), bias=st.booleans(),
       affine=st.booleans(), seed=st.integers(0, 2**16))
def test_property_folded_batchnorm_equals_the_original(n_in, n_out, bias, affine, seed):
    rng = np.random.default_rng(seed)
    model = lk.Sequential(lk.Linear(n_in, n_out, bias=bias, rng=rng),
                          _bn(n_out, rng, affine=affine)).eval()
    new, _ = fold_norm(model)
    x = rng.standard_normal((8, n_in)).astype(np.float32)
    reference = model(x)
    torch.testing.assert_close(new(x), reference, rtol=1e-5,
                               atol=1e-5 * max(1.0, float(np.abs(reference).max())))


def test_fold_on_a_model_trained_on_mnist1d_keeps_predictions():
    data = lk.data.mnist1d()
    rng = np.random.default_rng(0)
    model = lk.Sequential(lk.Linear(40, 64, rng=rng), lk.BatchNorm1d(64), lk.ReLU(),
                          lk.LayerNorm(64), lk.Linear(64, 10, rng=rng))
    opt = lk.optim.Adam(model.parameters(), lr=1e-2)
    for i in range(30):
        rows = slice(100 * i, 100 * i + 100)
        lk.loop.step(model, lk.CrossEntropyLoss(), opt, data.x_train[rows], data.y_train[rows])
    with pytest.raises(ValueError, match=r"'1' \(BatchNorm1d\(64\)\).*training mode"):
        fold_norm(model)
    model.eval()
    new, _ = fold_norm(model, probe=data.x_test)
    assert [type(m) for m in new] == [lk.Linear, lk.ReLU, lk.LayerNorm, lk.Linear]
    x = data.x_test
    np.testing.assert_array_equal(new(x).argmax(1), model(x).argmax(1))
    np.testing.assert_allclose(new(x), model(x), rtol=1e-4, atol=1e-4)
    merged, _ = merge_linear(new)  # nothing to merge across the ReLU
    assert len(merged) == 4
    assert lk.loop.evaluate(new, x, data.y_test)["accuracy"] > 0.2


def test_a_folded_model_saves_and_loads_as_plain_layers(tmp_path):
    rng = np.random.default_rng(10)
    model = lk.Sequential(_ln(4, rng), lk.Linear(4, 5, rng=rng), _bn(5, rng), lk.Tanh()).eval()
    new, _ = fold_norm(model)
    path = tmp_path / "folded.safetensors"
    lk.save(new, path)
    again = lk.load_model(path)
    assert list(dict(again.named_children())) == ["0", "1", "3"]
    assert again[0].weight is None
    x = _x(4)
    np.testing.assert_array_equal(again.eval()(x), new(x))


# ---------------------------------------------------------------- RMSNorm
def _rms(d, rng, dtype=np.float64, **kw):
    norm = lk.RMSNorm(d, dtype=dtype, **kw)
    norm.weight.data[...] = rng.uniform(0.5, 2.0, d) * rng.choice([-1, 1], d)
    return norm


@pytest.mark.parametrize("eps", [None, 1e-3])
@pytest.mark.parametrize("bias", [True, False])
def test_rmsnorm_weight_folds_into_the_following_linear_exactly(eps, bias):
    rng = np.random.default_rng(11)
    norm, lin = _rms(6, rng, eps=eps), lk.Linear(6, 3, bias=bias, dtype=np.float64, rng=rng)
    model = lk.Sequential(norm, lin)
    new, report = fold_norm(model)
    assert isinstance(new[0], lk.RMSNorm) and new[0].weight is None and new[0].eps == eps
    np.testing.assert_array_equal(new[1].weight.data, lin.weight.data * norm.weight.data)
    if bias:  # an RMSNorm has no bias: the Linear's is unchanged
        np.testing.assert_array_equal(new[1].bias.data, lin.bias.data)
    else:
        assert new[1].bias is None
    assert report.layers == [{"path": "1", "folded": "0", "kind": "rmsnorm_weight",
                              "params_before": 6 + 18 + 3 * bias, "params_after": 18 + 3 * bias}]
    x = _x(6, rows=64, dtype=np.float64) * 5
    y = model(x)
    assert np.abs(new(x) - y).max() <= 8 * np.finfo(np.float64).eps * np.abs(y).max()
    assert report.max_abs_error < 1e-13
    t = torch.nn.Sequential(torch.nn.RMSNorm(6, eps=eps),
                            torch.nn.Linear(6, 3, bias=bias)).double()
    t.load_state_dict({k: torch.from_numpy(v) for k, v in model.state_dict().items()})
    torch.testing.assert_close(torch.from_numpy(new(x)), t(torch.from_numpy(x)).detach(),
                               rtol=1e-12, atol=1e-12)


def test_rmsnorm_without_weight_or_over_other_dims_or_after_a_linear_is_left():
    rng = np.random.default_rng(12)
    plain = lk.Sequential(lk.RMSNorm(4, elementwise_affine=False), lk.Linear(4, 2))
    new, report = fold_norm(plain)
    assert report.changed == [] and report.left == []
    wide = lk.Sequential(lk.Linear(4, 6), lk.RMSNorm((2, 6)), lk.Linear(6, 3))
    folder = _Folder(wide, keep_batchnorm=False)
    assert folder.edit("", wide.named_steps()) is None
    assert folder.left == [
        ("'1' (RMSNorm((2, 6))) . '2' (Linear(6, 3)): weight not folded: the RMSNorm's weight "
         "spans (2, 6), not just the Linear's 6 input features")]
    # a Linear's bias before an RMSNorm is not cancelled (no mean is subtracted): kept whole
    after = lk.Sequential(lk.Linear(4, 6, rng=rng), _rms(6, rng, dtype=np.float32))
    new, report = fold_norm(after)
    assert report.changed == []
    np.testing.assert_array_equal(new[0].bias.data, after[0].bias.data)


def test_a_tied_rmsnorm_is_left_with_why():
    rng = np.random.default_rng(13)
    norm = _rms(4, rng)
    model = lk.Sequential(lk.Sequential(norm, lk.Linear(4, 4, dtype=np.float64, rng=rng)),
                          lk.Sequential(norm, lk.Linear(4, 2, dtype=np.float64, rng=rng)))
    new, report = fold_norm(model)
    assert report.changed == [] and all("not folded" in line for line in report.left)
    x = _x(4, dtype=np.float64)
    np.testing.assert_array_equal(new(x), model(x))
