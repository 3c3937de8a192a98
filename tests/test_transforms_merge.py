"""merge_weights and merge_linear (linearkit/transforms/merge.py)."""

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transform_checks import assert_unchanged, snapshot

import linearkit as lk
from linearkit.transforms import fold_norm, merge_linear, merge_weights
from linearkit.transforms.merge import _Chain


def _set(layer, w, b=None):
    layer.weight.data[...] = w
    if b is not None:
        layer.bias.data[...] = b
    return layer


def _x(n_in, rows=16, seed=1, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal((rows, n_in)).astype(dtype)


# ---------------------------------------------------------------- the array tier
def test_merge_weights_by_hand_is_w2_times_w1_and_w2_b1_plus_b2():
    w1 = np.arange(12, dtype=np.float32).reshape(4, 3) - 5   # Linear(3, 4)
    b1 = np.array([1, -2, 3, 0], np.float32)
    w2 = np.array([[1, 0, 2, -1], [0, 3, 1, 1]], np.float32)  # Linear(4, 2)
    b2 = np.array([10, 20], np.float32)
    w, b = merge_weights(w1, b1, w2, b2)
    # by hand, W1's rows are [-5,-4,-3], [-2,-1,0], [1,2,3], [4,5,6]:
    # row 0 of W2 W1 = W1[0] + 2 W1[2] - W1[3] = [-5,-4,-3] + [2,4,6] - [4,5,6] = [-7,-5,-3]
    # row 1 of W2 W1 = 3 W1[1] + W1[2] + W1[3] = [-6,-3,0] + [1,2,3] + [4,5,6] = [-1,4,9]
    assert w.tolist() == [[-7.0, -5.0, -3.0], [-1.0, 4.0, 9.0]]
    assert b.tolist() == [1 + 6 + 10, -6 + 3 + 20]
    assert w.dtype == np.float32 and b.dtype == np.float32
    x = np.array([[1, 2, 3]], np.float32)
    assert np.array_equal((x @ w1.T + b1) @ w2.T + b2, x @ w.T + b)


def test_merge_weights_missing_biases_count_as_zeros():
    w1, w2 = np.eye(2) * 2, np.array([[1.0, 1.0]])
    assert merge_weights(w1, None, w2, None)[1] is None
    assert merge_weights(w1, np.array([1.0, 2.0]), w2, None)[1].tolist() == [3.0]
    assert merge_weights(w1, None, w2, np.array([5.0]))[1].tolist() == [5.0]


def test_merge_weights_computes_in_float64_and_returns_w1s_dtype():
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((30, 20)).astype(np.float32)
    w2 = rng.standard_normal((10, 30)).astype(np.float32)
    w, _ = merge_weights(w1, None, w2, None)
    assert w.dtype == np.float32
    assert np.array_equal(w, (w2.astype(np.float64) @ w1.astype(np.float64)).astype(np.float32))


@pytest.mark.parametrize("args, match", [
    ((np.ones((4, 3)), None, np.ones((2, 3)), None), (r"w2 has shape \(2, 3\).*takes 3 inputs.*"
                                                     r"gives 4 outputs")),
    ((np.ones(3), None, np.ones((2, 3)), None), "2-D weights"),
    ((np.ones((4, 3)), np.ones(3), np.ones((2, 4)), None), r"b1 has shape \(3,\).*\(4,\)"),
    ((np.ones((4, 3)), None, np.ones((2, 4)), np.ones(4)), r"b2 has shape \(4,\).*\(2,\)"),
])
def test_merge_weights_names_the_shape_mismatch(args, match):
    with pytest.raises(ValueError, match=match):
        merge_weights(*args)


# ---------------------------------------------------------------- the module tier
def _by_hand_model():
    first = _set(lk.Linear(3, 4), np.arange(12).reshape(4, 3) - 5, [1, -2, 3, 0])
    second = _set(lk.Linear(4, 2), [[1, 0, 2, -1], [0, 3, 1, 1]], [10, 20])
    return lk.Sequential(first, lk.Identity(), second)


def test_merge_linear_by_hand_and_its_report():
    model = _by_hand_model()
    new, report = merge_linear(model)
    assert list(dict(new.named_children())) == ["0"]
    merged = new[0]
    assert type(merged) is lk.Linear and (merged.in_features, merged.out_features) == (3, 2)
    assert merged.weight.data.tolist() == [[-7, -5, -3], [-1, 4, 9]]
    assert merged.bias.data.tolist() == [17, 17]
    assert report.changed == [("'0'+'2': Linear(3, 4) . Linear(4, 2) -> Linear(3, 2) (params "
                              "26 -> 8, FLOPs per row 46 -> 14)")]
    assert report.layers == [{"path": "0", "merged": ["0", "2"], "removed": ["1"],
                              "params_before": 26, "params_after": 8, "flops_before": 46,
                              "flops_after": 14}]
    assert (report.params_before, report.params_after) == (26, 8)
    assert (report.bytes_before, report.bytes_after) == (26 * 4, 8 * 4)
    assert report.max_rel_error < 1e-6 and report.left == []
    x = np.array([[1, 2, 3], [-4, 0, 5]], np.float32)  # small integers: exact in float32
    assert np.array_equal(new(x), model(x))


def test_merged_output_equals_torch_running_the_original_weights():
    rng = np.random.default_rng(3)
    dims = [7, 9, 5, 6]
    layers = [lk.Linear(a, b, rng=rng) for a, b in itertools.pairwise(dims)]
    model = lk.Sequential(layers[0], lk.Dropout(0.3), layers[1], lk.Identity(), layers[2]).eval()
    t = torch.nn.Sequential(*[torch.nn.Linear(a, b) for a, b in itertools.pairwise(dims)])
    with torch.no_grad():
        for tl, layer in zip(t, layers):
            tl.weight.copy_(torch.from_numpy(layer.weight.data))
            tl.bias.copy_(torch.from_numpy(layer.bias.data))
    new, report = merge_linear(model)
    assert len(new) == 1 and report.layers[0]["merged"] == ["0", "2", "4"]
    x = _x(7, rows=32)
    expected = t(torch.from_numpy(x))
    torch.testing.assert_close(torch.from_numpy(new(x)), expected, rtol=1.3e-6, atol=1e-5)
    assert report.max_rel_error < 1e-6


def test_float64_layers_merge_in_float64():
    rng = np.random.default_rng(4)
    model = lk.Sequential(lk.Linear(6, 8, dtype=np.float64, rng=rng),
                          lk.Linear(8, 3, dtype=np.float64, rng=rng))
    new, report = merge_linear(model)
    assert new[0].weight.dtype == np.float64
    x = _x(6, dtype=np.float64)
    np.testing.assert_allclose(new(x), model(x), rtol=1e-13, atol=1e-14)
    assert report.max_abs_error < 1e-13


def test_merging_across_relu_is_refused_when_asked_and_left_otherwise():
    model = lk.Sequential(lk.Linear(3, 4), lk.ReLU(), lk.Linear(4, 2))
    with pytest.raises(ValueError, match=r"cannot merge '0'\.\.'2': '1' \(ReLU\) is nonlinear"):
        merge_linear(model, only=[("0", "2")])
    new, report = merge_linear(model)
    assert report.changed == [] and report.left == ["'0'+'2' not merged: '1' (ReLU) is nonlinear"]
    assert [type(m) for m in new] == [lk.Linear, lk.ReLU, lk.Linear]


@pytest.mark.parametrize("between, why", [
    (lambda: lk.Tanh(), "is nonlinear"),
    (lambda: lk.LayerNorm(4), "normalizes each row"),
    (lambda: lk.BatchNorm1d(4).eval(), "fold_norm folds an eval-mode BatchNorm1d"),
    (lambda: lk.Flatten(), "reshapes its input"),
    (lambda: lk.Sequential(lk.Identity()), "is a container"),
])
def test_each_kind_of_blocker_is_named_with_why(between, why):
    model = lk.Sequential(lk.Linear(4, 4), between(), lk.Linear(4, 4)).eval()
    _, report = merge_linear(model)
    assert report.changed == [] and len(report.left) == 1
    assert report.left[0].startswith("'0'+'2' not merged: '1' (") and why in report.left[0]


def test_dropout_passes_in_eval_or_at_p0_and_blocks_in_training():
    def model():
        return lk.Sequential(lk.Linear(4, 4), lk.Dropout(0.5), lk.Linear(4, 4), lk.Dropout(0.0),
                             lk.Linear(4, 4))

    training = model()
    new, report = merge_linear(training)
    # the p=0 Dropout passes even in training mode; the p=0.5 one ends the run
    assert report.layers[0]["merged"] == ["2", "4"] and report.layers[0]["removed"] == ["3"]
    assert report.left == [("'0'+'2' not merged: '1' (Dropout(p=0.5)) drops at random in "
                           "training mode: call eval() first")]
    with pytest.raises(ValueError, match=r"'1' \(Dropout\(p=0\.5\)\) drops at random in "
                                         r"training mode: call eval\(\) first"):
        merge_linear(training, only=[("0", "2")])
    new, report = merge_linear(model().eval())
    assert list(dict(new.named_children())) == ["0"] and report.layers[0]["removed"] == ["1", "3"]
    assert new.training is False and new[0].training is False


def test_a_bottleneck_is_left_with_both_counts_unless_forced():
    model = lk.Sequential(lk.Linear(16, 2), lk.Linear(2, 16))
    new, report = merge_linear(model)
    assert len(new) == 2 and report.changed == []
    # 16·2+2 + 2·16+16 = 82 params; merged 16·16+16 = 272. FLOPs 66+80 -> 528
    assert report.left == [("'0' . '1' not merged: a rank-2 bottleneck: merging would take params "
                           "82 -> 272 (FLOPs per row 146 -> 528); pass force=True to merge "
                           "anyway")]
    forced, report = merge_linear(model, force=True)
    assert len(forced) == 1 and report.layers[0]["params_after"] == 272
    assert report.max_rel_error < 1e-6
    # a named bottleneck is merged whole or not at all
    _, report = merge_linear(model, only=[("0", "1")])
    assert report.changed == [] and "rank-2 bottleneck" in report.left[0]


def test_a_long_run_that_does_not_save_merges_its_saving_part_greedily():
    # 32 -> 4 -> 2 -> 32: whole costs (238 -> 1,056 params); 32 -> 4 -> 2 saves (142 -> 66)
    model = lk.Sequential(lk.Linear(32, 4), lk.Linear(4, 2), lk.Linear(2, 32))
    new, report = merge_linear(model)
    assert list(dict(new.named_children())) == ["0", "2"]
    assert (new[0].in_features, new[0].out_features) == (32, 2)
    assert report.layers[0]["merged"] == ["0", "1"]
    assert (report.layers[0]["params_before"], report.layers[0]["params_after"]) == (142, 66)
    assert report.left == [("'0'+'1' . '2' not merged: a rank-2 bottleneck: merging would take "
                           "params 162 -> 1,056 (FLOPs per row 290 -> 2,080); pass force=True "
                           "to merge anyway")]
    assert report.max_rel_error < 1e-6


def test_nested_sequentials_merge_in_their_own_chain_and_keep_names():
    rng = np.random.default_rng(5)
    inner = lk.Sequential(lk.Linear(8, 8, rng=rng), lk.Identity(), lk.Linear(8, 8, rng=rng))
    model = lk.Sequential(lk.Linear(4, 8, rng=rng), inner, lk.ReLU(),
                          lk.Residual(lk.Sequential(lk.Linear(8, 8, rng=rng),
                                                    lk.Linear(8, 8, rng=rng))),
                          lk.Linear(8, 3, rng=rng))
    before = snapshot(model)
    new, report = merge_linear(model)
    assert [d["merged"] for d in report.layers] == [["3.module.0", "3.module.1"], ["1.0", "1.2"]]
    assert list(dict(new.named_children())) == ["0", "1", "2", "3", "4"]
    assert list(dict(new[1].named_children())) == ["0"]
    assert len(new[3].module) == 1
    assert report.left == [("'0'+'4' not merged: '1' (Sequential) is a container: its own steps "
                           "are merged within it, not across it")]
    x = _x(4)
    np.testing.assert_allclose(new(x), model(x), rtol=1e-5, atol=1e-5)
    assert_unchanged(model, before)


def test_input_model_untouched_state_and_training_flags():
    model = lk.Sequential(lk.Linear(5, 5), lk.Dropout(0.2), lk.Linear(5, 5), lk.Dropout(0.2))
    model[1].eval()
    before = snapshot(model)
    new, report = merge_linear(model)
    assert len(report.changed) == 1 and new is not model
    assert_unchanged(model, before)
    assert isinstance(model[1], lk.Dropout) and len(model) == 4


def test_only_merges_exactly_the_named_runs():
    model = lk.Sequential(lk.Linear(4, 4), lk.Linear(4, 4), lk.ReLU(), lk.Linear(4, 4),
                          lk.Identity(), lk.Linear(4, 4))
    new, report = merge_linear(model, only=[("3", "5")])
    assert list(dict(new.named_children())) == ["0", "1", "2", "3"]
    assert [d["merged"] for d in report.layers] == [["3", "5"]]
    _, report = merge_linear(model, only=("0", "1"))  # one pair alone is accepted
    assert [d["merged"] for d in report.layers] == [["0", "1"]]


@pytest.mark.parametrize("only, match", [
    ([("0", "2")], r"'2' \(ReLU\) is not a Linear"),
    ([("1", "0")], r"'1' comes after '0'.*\('0', '1'\)"),
    ([("0", "9")], r"no layer at path '9'.*'0', '1', '3', '4\.0'"),
    ([("0", "4.0")], "not two steps of one Sequential"),
    ([("0", "1"), ("1", "1")], "not two steps"),
    ([("0", "1"), ("0", "1")], "overlap at '0'"),
    (["0"], r"\(first_path, last_path\) pairs"),
])
def test_only_rejects_what_is_not_one_run(only, match):
    model = lk.Sequential(lk.Linear(4, 4), lk.Linear(4, 4), lk.ReLU(), lk.Linear(4, 4),
                          lk.Sequential(lk.Linear(4, 4)))
    with pytest.raises((ValueError, TypeError), match=match):
        merge_linear(model, only=only)


def test_an_unmaterialized_lazy_linear_is_left_with_why():
    model = lk.Sequential(lk.Linear(3, 4), lk.LazyLinear(4), lk.Linear(4, 4))
    new, report = merge_linear(model)
    assert isinstance(model[1], lk.LazyLinear) and isinstance(new[1], lk.LazyLinear)
    assert report.max_abs_error == 0.0 and report.params_before == 16 + 20
    assert report.changed == [] and len(report.left) == 2
    assert all("'1' (LazyLinear(?, 4)) is not materialized" in line for line in report.left)
    with pytest.raises(ValueError, match=r"'1' \(LazyLinear\(\?, 4\)\) is not materialized"):
        merge_linear(model, only=[("0", "2")])
    model(np.ones((2, 3), np.float32))  # materialized: now it is a Linear
    _, report = merge_linear(model)
    assert report.layers[0]["merged"] == ["0", "1", "2"]


def test_mixed_dtypes_end_a_run():
    steps = [("0", lk.Linear(3, 3)), ("1", lk.Linear(3, 3, dtype=np.float64)),
             ("2", lk.Linear(3, 3, dtype=np.float64))]
    left = []
    assert _Chain("", steps).runs(left) == [[1, 2]]
    assert left == [("'0'+'1' not merged: mixed dtypes ('0' float32, '1' float64): one merged "
                    "layer would compute in one dtype")]


def test_frozen_flags_and_bias_free_runs():
    a, b = lk.Linear(4, 4, bias=False), lk.Linear(4, 4, bias=False)
    a.requires_grad_(False)
    new, _ = merge_linear(lk.Sequential(a, b))
    assert new[0].bias is None and new[0].weight.requires_grad
    b.requires_grad_(False)
    new, _ = merge_linear(lk.Sequential(a, b))
    assert not new[0].weight.requires_grad


@settings(max_examples=40, deadline=None)
@given(dims=st.lists(st.integers(1, 12), min_size=3, max_size=6),
       biases=st.lists(st.booleans(), min_size=5, max_size=5),
       between=st.lists(st.sampled_from(["none", "identity", "dropout"]), min_size=5,
                        max_size=5),
       seed=st.integers(0, 2**16))
def test_property_merged_equals_original(dims, biases, between, seed):
    rng = np.random.default_rng(seed)
    steps = []
    for k, (n_in, n_out) in enumerate(itertools.pairwise(dims)):
        if k and between[k] != "none":
            steps.append(lk.Identity() if between[k] == "identity" else lk.Dropout(0.5))
        steps.append(lk.Linear(n_in, n_out, bias=biases[k], rng=rng))
    model = lk.Sequential(*steps).eval()
    new, report = merge_linear(model, force=True)
    assert len(new) == 1 and (new[0].bias is not None) == any(biases[:len(dims) - 1])
    x = rng.standard_normal((8, dims[0])).astype(np.float32)
    reference = model(x)
    scale = max(1.0, float(np.abs(reference).max()))
    torch.testing.assert_close(new(x), reference, rtol=1.3e-6 * len(dims), atol=1e-5 * scale)
    # unforced: merged only where it saves, and the result is still the same map
    unforced, report = merge_linear(model)
    torch.testing.assert_close(unforced(x), reference, rtol=1.3e-6 * len(dims),
                               atol=1e-5 * scale)
    for d in report.layers:
        assert d["params_after"] < d["params_before"] or d["flops_after"] < d["flops_before"]


def test_fold_then_merge_a_model_trained_on_mnist1d_keeps_its_predictions():
    data = lk.data.mnist1d()
    rng = np.random.default_rng(0)
    model = lk.Sequential(lk.Linear(40, 48, rng=rng), lk.BatchNorm1d(48), lk.Dropout(0.1),
                          lk.Linear(48, 32, rng=rng), lk.Identity(), lk.Linear(32, 32, rng=rng),
                          lk.ReLU(), lk.Linear(32, 10, rng=rng))
    opt = lk.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = lk.CrossEntropyLoss()
    for i in range(30):
        rows = slice(100 * i, 100 * i + 100)
        lk.loop.step(model, loss_fn, opt, data.x_train[rows], data.y_train[rows])
    model.eval()
    folded, fold_report = fold_norm(model)
    merged, merge_report = merge_linear(folded, probe=data.x_test)
    assert [type(m) for m in merged] == [lk.Linear, lk.ReLU, lk.Linear]
    assert [d["merged"] for d in merge_report.layers] == [["0", "3", "5"]]
    x = data.x_test
    before, after = model(x), merged(x)
    np.testing.assert_array_equal(after.argmax(1), before.argmax(1))
    np.testing.assert_allclose(after, before, rtol=1e-4, atol=1e-4)
    assert merge_report.params_after < fold_report.params_before
    accuracy = lk.loop.evaluate(merged, x, data.y_test)["accuracy"]
    assert accuracy == lk.loop.evaluate(model, x, data.y_test)["accuracy"] and accuracy > 0.2


def test_a_merged_model_saves_and_loads_as_plain_layers(tmp_path):
    model = lk.Sequential(lk.Linear(3, 4), lk.Identity(), lk.Linear(4, 2), lk.ReLU(),
                          lk.Linear(2, 2))
    new, _ = merge_linear(model)
    path = tmp_path / "merged.safetensors"
    lk.save(new, path)
    again = lk.load_model(path)
    assert list(dict(again.named_children())) == ["0", "3", "4"]
    x = _x(3)
    np.testing.assert_array_equal(again(x), new(x))
