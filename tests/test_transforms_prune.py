"""Pruning, SparseLinear and to_sparse: masks against torch.nn.utils.prune, the CSR layer's
forward and gradients against the dense masked weight (and torch), its model files, and the
end-to-end MNIST-1D path prune -> to_sparse."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
import torch.nn.utils.prune as tprune

import linearkit as lk
from linearkit.analysis import gradcheck
from linearkit.layers.sparse import SparseLinear, csr_problem
from linearkit.recipes.train_mnist1d import build_model
from linearkit.rules import rule_for
from linearkit.training.loop import step
from linearkit.transforms import prune, prune_weight, to_sparse
from linearkit.transforms.pruning import csr_bytes


def _weights(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)  # no ties


def _torch_mask(w, amount, structured):
    layer = torch.nn.Linear(w.shape[1], w.shape[0])
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(w))
    if structured:
        tprune.ln_structured(layer, "weight", amount=amount, n=2, dim=0)
    else:
        tprune.l1_unstructured(layer, "weight", amount=amount)
    return layer.weight_mask.numpy().astype(bool)


def _masked_linear(n_in, n_out, density, seed=0, dtype=np.float32, bias=True):
    layer = lk.Linear(n_in, n_out, bias=bias, dtype=dtype, rng=np.random.default_rng(seed))
    keep = np.random.default_rng(seed + 1).random((n_out, n_in)) < density
    layer.weight.data[~keep] = 0
    return layer


def _state(model):
    return {k: np.array(v, copy=True) for k, v in model.state_dict().items()}


def _assert_untouched(model, before, flags):
    after = model.state_dict()
    assert before.keys() == after.keys()
    for k in before:
        np.testing.assert_array_equal(before[k], after[k])
    assert [m.training for m in model.modules()] == flags


# ---------------------------------------------------------------- prune_weight vs torch
@pytest.mark.parametrize("shape", [(7, 5), (16, 33), (1, 9)])
@pytest.mark.parametrize("amount", [0.0, 0.3, 0.5, 0.9, 1.0, 0, 4])
def test_unstructured_mask_matches_torch(shape, amount):
    w = _weights(shape, seed=shape[1])
    mask = prune_weight(w, amount)
    assert mask.dtype == bool and mask.shape == w.shape
    np.testing.assert_array_equal(mask, _torch_mask(w, amount, structured=False))


@pytest.mark.parametrize("amount", [0.0, 0.25, 0.5, 0.7, 1.0, 0, 3, 8])
def test_structured_mask_matches_torch(amount):
    w = _weights((8, 13), seed=3)
    mask = prune_weight(w, amount, structured=True)
    np.testing.assert_array_equal(mask, _torch_mask(w, amount, structured=True))
    assert all(row.all() or not row.any() for row in mask)  # whole rows


def test_mask_by_hand():
    w = np.array([[0.5, -0.1, 2.0], [0.3, -4.0, 0.2]])
    # 0.5·6 = 3 smallest |w|: 0.1, 0.2, 0.3; row norms: 2.07 < 4.02
    assert prune_weight(w, 0.5).tolist() == [[True, False, True], [False, True, False]]
    assert prune_weight(w, 1, structured=True).tolist() == [[False] * 3, [True] * 3]
    # round(0.25·6) = round(1.5) = 2 (Python's round, as torch)
    assert np.count_nonzero(~prune_weight(w, 0.25)) == 2


@pytest.mark.parametrize("amount, error, match", [
    (1.5, ValueError, "fraction in"), (-0.1, ValueError, "fraction in"),
    (float("nan"), ValueError, "fraction in"), (-1, ValueError, "non-negative"),
    (13, ValueError, "more than the 12 weights"), (True, TypeError, "bool"),
    ("half", TypeError, "str"),
])
def test_prune_weight_bad_amounts(amount, error, match):
    with pytest.raises(error, match=match):
        prune_weight(_weights((3, 4)), amount)


def test_prune_weight_structured_errors():
    with pytest.raises(ValueError, match="more than the 3 output rows"):
        prune_weight(_weights((3, 4)), 4, structured=True)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        prune_weight(_weights((5,)), 0.5, structured=True)
    with pytest.raises(TypeError, match="floating"):
        prune_weight(np.ones((2, 2), np.int64), 0.5)


# ---------------------------------------------------------------- prune (module level)
def _mlp(seed=0):
    rng = np.random.default_rng(seed)
    return lk.Sequential(lk.Linear(20, 10, rng=rng), lk.ReLU(), lk.Linear(10, 5, rng=rng))


def test_prune_report_numbers():
    model = _mlp()
    before, flags = _state(model), [m.training for m in model.modules()]
    x = _weights((16, 20), seed=9)
    new, report = prune(model, 0.5, probe=x)
    _assert_untouched(model, before, flags)
    assert [d["path"] for d in report.layers] == ["0", "2"]
    assert [(d["weights"], d["pruned"], d["sparsity"]) for d in report.layers] == \
        [(200, 100, 0.5), (50, 25, 0.5)]
    assert [d["dense_params"] for d in report.layers] == [200, 50]
    # still dense: the same values and bytes are stored, zeros included
    assert (report.params_after, report.bytes_after) == (report.params_before, report.bytes_before)
    assert all("still a dense matrix" in line and "to_sparse" in line for line in report.changed)
    for path, layer in [("0", new[0]), ("2", new[2])]:
        np.testing.assert_array_equal(layer.weight.data != 0,
                                      prune_weight(dict(model.named_modules())[path].weight.data,
                                                   0.5))
    # the measured error is the pruning's change of the function, on the user's batch too
    probe = np.random.default_rng(0).standard_normal((64, 20)).astype(np.float32)
    err = max(np.abs(new(p).astype(np.float64) - model(p)).max() for p in (probe, x))
    assert report.max_abs_error == pytest.approx(err, rel=1e-12) and err > 0


def test_prune_structured_and_targets():
    model = _mlp()
    new, report = prune(model, 3, structured=True, targets="0")
    assert [d["path"] for d in report.layers] == ["0"]
    assert report.layers[0]["rows_pruned"] == 3 and report.layers[0]["pruned"] == 60
    assert np.count_nonzero(~new[0].weight.data.any(axis=1)) == 3
    np.testing.assert_array_equal(new[2].weight.data, model[2].weight.data)
    _, none = prune(model, 0.0)
    assert none.changed == [] and len(none.left) == 2 and "prunes none" in none.left[0]


def test_prune_errors_name_the_layer():
    model = _mlp()
    with pytest.raises(ValueError, match=r"'2' \(Linear\(10, 5\)\).*more than the 50 weights"):
        prune(model, 60)
    with pytest.raises(ValueError, match=r"'2' \(Linear\(10, 5\)\).*more than the 5 output rows"):
        prune(model, 6, structured=True)
    with pytest.raises(ValueError, match=r"prune\(\): amount=1.5"):
        prune(model, 1.5)
    with pytest.raises(TypeError, match=r"prune\(\): amount must be"):
        prune(model, None)
    broken = _mlp()
    broken[2].weight.data[0, 0] = np.nan
    with pytest.raises(ValueError, match=r"'2' \(Linear\(10, 5\)\) has non-finite"):
        prune(broken, 0.5)
    with pytest.raises(ValueError, match="names no Linear"):
        prune(model, 0.5, targets="fc9")


# ---------------------------------------------------------------- SparseLinear forward
@pytest.mark.parametrize("shape", [(6, 30), (2, 3, 30), (30,), (0, 30)])
def test_sparse_forward_matches_dense_and_torch(shape):
    dense = _masked_linear(30, 17, 0.2)
    layer = SparseLinear.from_linear(dense)
    assert layer.nnz == np.count_nonzero(dense.weight.data)
    assert layer.weight_indices.dtype == layer.weight_indptr.dtype == np.int32
    assert layer.weight_indptr.shape == (18,) and layer.density == layer.nnz / 510
    x = _weights(shape, seed=4)
    y = layer(x)
    assert y.shape == shape[:-1] + (17,) and y.dtype == np.float32
    torch.testing.assert_close(torch.from_numpy(np.ascontiguousarray(y)),
                               torch.from_numpy(dense(x)))
    ref = TF.linear(torch.from_numpy(x), torch.from_numpy(dense.weight.data),
                    torch.from_numpy(dense.bias.data))
    torch.testing.assert_close(torch.from_numpy(np.ascontiguousarray(y)), ref)


def test_sparse_edge_cases_and_errors():
    empty = SparseLinear.from_linear(_masked_linear(8, 4, 0.0, bias=False))
    assert empty.nnz == 0 and empty.bias is None
    np.testing.assert_array_equal(empty(np.ones((3, 8), np.float32)), np.zeros((3, 4)))
    layer = SparseLinear.from_linear(_masked_linear(8, 4, 0.5))
    y, backward = layer.vjp(np.ones((0, 8), np.float32))
    assert y.shape == (0, 4) and backward(np.ones((0, 4), np.float32)).shape == (0, 8)
    np.testing.assert_array_equal(layer.weight_values.grad, 0)
    np.testing.assert_array_equal(layer.bias.grad, 0)
    with pytest.raises(lk.ShapeError, match=r"expected input of shape \(\*, 8\)"):
        layer(np.ones((2, 7), np.float32))
    with pytest.raises(lk.DTypeError):
        layer(np.ones((2, 8), np.float64))
    with pytest.raises(TypeError, match="float32 or float64"):
        SparseLinear(3, 2, 1, dtype=np.float16)
    with pytest.raises(ValueError, match="nnz=7 is more than the 6"):
        SparseLinear(3, 2, 7)
    with pytest.raises(TypeError, match="takes a Linear"):
        SparseLinear.from_linear(lk.ReLU())


def test_from_linear_mask_and_to_dense():
    dense = lk.Linear(6, 4, rng=np.random.default_rng(0))
    dense.weight.data[0, 0] = 0.0
    mask = np.zeros((4, 6), bool)
    mask[0, :3] = mask[3, 5] = True  # includes the zero at (0, 0): stored explicitly
    layer = SparseLinear.from_linear(dense, mask)
    assert layer.nnz == 4 and layer.weight_indptr.tolist() == [0, 3, 3, 3, 4]
    back = layer.to_dense()
    assert type(back) is lk.Linear
    np.testing.assert_array_equal(back.weight.data, np.where(mask, dense.weight.data, 0))
    np.testing.assert_array_equal(back.bias.data, dense.bias.data)
    with pytest.raises(lk.ShapeError, match="bool array of the weight's shape"):
        SparseLinear.from_linear(dense, mask[:2])
    dense.weight.requires_grad = False
    assert SparseLinear.from_linear(dense).weight_values.requires_grad is False


def test_module_to_float64_rebuilds_the_product():
    layer = SparseLinear.from_linear(_masked_linear(10, 5, 0.4))
    x = _weights((3, 10))
    y32 = layer(x)
    layer.to(np.float64)
    assert layer.weight_values.dtype == np.float64 and layer.weight_indices.dtype == np.int32
    y64 = layer(x.astype(np.float64))
    assert y64.dtype == np.float64
    np.testing.assert_allclose(y64, y32, rtol=1e-5, atol=1e-6)
    layer.weight_values.data *= 2  # in place, as an optimizer: the product sees it
    np.testing.assert_allclose(layer(x.astype(np.float64)) - layer.bias.data,
                               2 * (y64 - layer.bias.data), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- gradients
def test_sparse_gradcheck_float64():
    layer = SparseLinear.from_linear(_masked_linear(7, 5, 0.4, dtype=np.float64))
    x = np.random.default_rng(2).standard_normal((4, 7))
    result = gradcheck(layer, x)
    assert result.ok, str(result)
    assert set(result.tensors) == {"input[0]", "weight_values", "bias"}


def test_sparse_gradients_match_torch_autograd():
    dense = _masked_linear(30, 17, 0.15, seed=5)
    layer = SparseLinear.from_linear(dense)
    x, dy = _weights((2, 6, 30), seed=6), _weights((2, 6, 17), seed=7)
    y, backward = layer.vjp(x)
    dx = backward(dy)
    mask = torch.from_numpy(dense.weight.data != 0)
    w = torch.tensor(dense.weight.data, requires_grad=True)
    b = torch.tensor(dense.bias.data, requires_grad=True)
    xt = torch.tensor(x, requires_grad=True)
    yt = TF.linear(xt, w * mask, b)
    yt.backward(torch.from_numpy(dy))
    torch.testing.assert_close(torch.from_numpy(np.ascontiguousarray(y)), yt.detach())
    torch.testing.assert_close(torch.from_numpy(np.ascontiguousarray(dx)), xt.grad)
    torch.testing.assert_close(torch.from_numpy(layer.bias.grad), b.grad)
    rows, cols = np.nonzero(dense.weight.data)
    torch.testing.assert_close(torch.from_numpy(layer.weight_values.grad), w.grad[rows, cols])
    # a second pass adds; a frozen pattern gets no gradient and keeps no input
    first = layer.weight_values.grad.copy()
    layer.vjp(x)[1](dy)
    np.testing.assert_allclose(layer.weight_values.grad, 2 * first, rtol=1e-6)
    layer.zero_grad()
    layer.weight_values.requires_grad = False
    _, backward = layer.vjp(x, input_grad=False)
    assert backward(dy) is None and layer.weight_values.grad is None
    assert backward.__closure__ is None or all(
        c.cell_contents is not x for c in backward.__closure__ if c.cell_contents is not None
        and isinstance(c.cell_contents, np.ndarray))


def test_sparse_training_keeps_the_pattern():
    dense = _masked_linear(12, 4, 0.3, seed=8)
    model = lk.Sequential(SparseLinear.from_linear(dense))
    opt = lk.optim.SGD(model.parameters(), lr=0.1)
    x, y = _weights((32, 12), seed=9), np.arange(32) % 4
    losses = [step(model, lk.CrossEntropyLoss(), opt, x, y) for _ in range(5)]
    assert losses[-1] < losses[0]
    trained = model[0].dense_weight()
    assert np.array_equal(trained != 0, dense.weight.data != 0)  # zeros stay zeros
    assert not np.array_equal(trained, dense.weight.data)


# ---------------------------------------------------------------- rule, files
def test_rule_describe_cost_and_ledger():
    layer = SparseLinear.from_linear(_masked_linear(784, 256, 0.1, seed=0))
    layer.weight_values.data[: layer.nnz - 20070] = 0  # keep nnz; only the pattern counts
    rule = rule_for(layer)
    assert rule.kind == "sparse_linear"
    density = layer.density
    assert rule.describe_module(layer) == f"SparseLinear(784, 256, density={density:.2f})"
    assert rule.shape_of_output(layer, (32, 784)) == (32, 256)
    macs, flops, bias_flops, _, bwd_macs, _ = rule.cost(layer, (32, 784), True)
    assert (macs, flops, bias_flops, bwd_macs) == (32 * layer.nnz, 64 * layer.nnz, 32 * 256,
                                                   64 * layer.nnz)
    with pytest.raises(lk.ShapeError):
        rule.shape_of_output(layer, (32, 783))
    tiny = SparseLinear.from_linear(_masked_linear(100, 10, 0.004, bias=False))
    assert rule.describe_module(tiny) == \
        f"SparseLinear(100, 10, density={tiny.density:.2g}, bias=False)"
    row = lk.analysis.ledger(lk.Sequential(layer, lk.ReLU()), (32, 784)).rows[1]
    assert row.type.startswith("SparseLinear(784, 256") and row.macs == 32 * layer.nnz


def test_save_load_round_trip_and_file_size(tmp_path):
    x = _weights((5, 300), seed=1)
    sizes = {}
    for density in (0.5, 0.1, 0.01):
        model = lk.Sequential(SparseLinear.from_linear(_masked_linear(300, 200, density)),
                              lk.ReLU())
        path = tmp_path / f"{density}.safetensors"
        lk.save(model, path)
        again = lk.load_model(path)
        assert type(again[0]) is SparseLinear and again[0].nnz == model[0].nnz
        np.testing.assert_array_equal(again(x), model(x))
        sizes[density] = (model[0].nnz, os.path.getsize(path))
    (n1, s1), (n2, s2), (n3, s3) = sizes[0.5], sizes[0.1], sizes[0.01]
    # each stored entry costs a float32 value and an int32 index, nothing else scales
    assert (s1 - s2) / (n1 - n2) == pytest.approx(8, abs=0.05)
    assert (s2 - s3) / (n2 - n3) == pytest.approx(8, abs=0.05)
    dense_path = tmp_path / "dense.safetensors"
    lk.save(lk.Sequential(_masked_linear(300, 200, 0.01)), dense_path)
    assert s3 < os.path.getsize(dense_path) / 25  # 60,000 floats vs ~600 entries


def test_load_refuses_a_bad_pattern():
    layer = SparseLinear.from_linear(_masked_linear(6, 4, 0.5))
    state = _state(layer)
    bad = dict(state, weight_indices=np.full_like(state["weight_indices"], 6))
    target = SparseLinear(6, 4, layer.nnz)
    with pytest.raises(RuntimeError, match=r"invalid sparsity pattern.*\[0, 6\)"):
        target.load_state_dict(bad)
    np.testing.assert_array_equal(target.weight_values.data, 0)  # nothing loaded
    with pytest.raises(RuntimeError, match="size mismatch for weight_values"):
        SparseLinear(6, 4, layer.nnz + 1).load_state_dict(state)
    target.load_state_dict(state)
    np.testing.assert_array_equal(target.dense_weight(), layer.dense_weight())
    assert csr_problem(np.array([0, 0]), np.array([0, 2]), 3, 1) == \
        "a column index repeats within a row"
    assert csr_problem(np.array([0]), np.array([0, 2]), 3, 1).startswith("indptr must run")


# ---------------------------------------------------------------- to_sparse
def test_to_sparse_end_to_end_on_mnist1d():
    data = lk.data.mnist1d()
    model = build_model("mlp", rng=np.random.default_rng(0))
    opt = lk.optim.Adam(model.parameters(), lr=1e-2)
    for i in range(40):
        rows = slice(100 * i, 100 * i + 100)
        step(model, lk.CrossEntropyLoss(), opt, data.x_train[rows], data.y_train[rows])
    before, flags = _state(model), [m.training for m in model.modules()]
    pruned, prune_report = prune(model, 0.9, probe=data.x_test)
    pruned_state, pruned_flags = _state(pruned), [m.training for m in pruned.modules()]
    sparse, report = to_sparse(pruned, probe=data.x_test)
    _assert_untouched(model, before, flags)
    _assert_untouched(pruned, pruned_state, pruned_flags)
    assert [d["path"] for d in report.layers] == ["0", "2.module.0", "3"]
    assert all(type(m) is SparseLinear for m in (sparse[0], sparse[2].module[0], sparse[3]))
    assert report.left == [] and len(report.changed) == 3
    pruned.eval(), sparse.eval()
    a, b = pruned(data.x_test), sparse(data.x_test)
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)  # float32 rounding of the sums
    assert report.max_abs_error < 1e-4
    agree = np.argmax(a, 1) == np.argmax(b, 1)
    top2 = np.sort(a, 1)[:, -2:]
    assert np.all(agree | (top2[:, 1] - top2[:, 0] < 1e-4))
    # the bytes really go: values + int32 indices + indptr for the weights, biases as before
    expected = sum(csr_bytes(d["nnz"], m.out_features, 4) - d["dense_bytes"]
                   for d, m in zip(report.layers, (pruned[0], pruned[2].module[0], pruned[3])))
    assert report.bytes_after - report.bytes_before == expected
    assert report.bytes_after < 0.25 * report.bytes_before
    assert prune_report.bytes_after == prune_report.bytes_before
    assert prune_report.max_abs_error > 0.01  # pruning 90% does change the function


def test_to_sparse_leaves_dense_layers_and_says_why():
    model = lk.Sequential(_masked_linear(40, 20, 0.75, seed=1), lk.ReLU(),
                          _masked_linear(20, 10, 0.3, seed=2), lk.ReLU(),
                          _masked_linear(10, 5, 0.05, seed=3))
    new, report = to_sparse(model, min_sparsity=0.8)
    assert [d["path"] for d in report.layers] == ["4"]
    assert type(new[0]) is lk.Linear and type(new[2]) is lk.Linear
    assert report.left[1] == "'2' (Linear(20, 10)): sparsity 0.725 < min_sparsity=0.8"
    _, report = to_sparse(model)
    assert len(report.left) == 1 and report.left[0].startswith("'0' (Linear(40, 20)): too dense")
    assert "smaller only below 50% density" in report.left[0]
    _, report64 = to_sparse(model.to(np.float64))
    assert "below 67% density" in report64.left[0]
    with pytest.raises(ValueError, match="min_sparsity must be a fraction"):
        to_sparse(model, min_sparsity=1.5)
    root, report = to_sparse(_masked_linear(10, 5, 0.1))
    assert type(root) is SparseLinear and report.changed[0].startswith("the model (Linear")


def test_init_sparse_makes_zeros_and_saves_nothing():
    w = np.empty((100, 80), np.float32)
    nbytes = w.nbytes
    out = lk.init.sparse_(w, 0.9, rng=np.random.default_rng(0))
    assert out is w and type(w) is np.ndarray and w.nbytes == nbytes == 100 * 80 * 4
    assert np.mean(w == 0) == pytest.approx(0.9)  # ceil(0.9·100) of each column
    layer = lk.Linear(80, 100)
    lk.init.sparse_(layer.weight, 0.9, rng=np.random.default_rng(0))
    model = lk.Sequential(layer)
    _, pruned_report = prune(model, 0.0)
    assert pruned_report.bytes_after == pruned_report.bytes_before == (8000 + 100) * 4
    _, report = to_sparse(model)  # only this saves memory
    assert report.bytes_after == csr_bytes(800, 100, 4) + 400 < report.bytes_before / 4


# ---------------------------------------------------------------- imports
def test_missing_scipy_names_the_extra(monkeypatch):
    layer = SparseLinear.from_linear(_masked_linear(4, 3, 0.5))
    monkeypatch.setitem(sys.modules, "scipy.sparse", None)
    with pytest.raises(ImportError, match=r"pip install 'linearkit\[sparse\]'"):
        layer(np.ones((1, 4), np.float32))


def test_import_stays_free_of_scipy():
    code = ("import sys, linearkit, linearkit.rules, linearkit.layers.sparse, "
            "linearkit.transforms.pruning; assert 'scipy' not in sys.modules, 'scipy imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
