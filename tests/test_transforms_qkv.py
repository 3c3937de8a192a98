"""Fused QKV: fuse_qkv_weights, fuse_qkv, split_qkv."""

import numpy as np
import pytest

import linearkit as lk
from linearkit.transforms import fuse_qkv, fuse_qkv_weights, split_qkv

torch = pytest.importorskip("torch")


def _qkv(d=16, sizes=(16, 16, 16), bias=(True, True, True), dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(lk.Linear(d, n, bias=b, dtype=dtype, rng=rng) for n, b in zip(sizes, bias))


def _integer_valued(layers, seed=1):
    """Small-integer weights and biases: every dot product is exact in float32, whatever order
    a BLAS kernel sums it in, so fused and separate outputs must agree bitwise."""
    rng = np.random.default_rng(seed)
    for m in layers:
        m.weight.data[...] = rng.integers(-8, 9, m.weight.shape)
        if m.bias is not None:
            m.bias.data[...] = rng.integers(-8, 9, m.bias.shape)
    return layers


def _concat(q, k, v, x):
    return np.concatenate([q(x), k(x), v(x)], axis=-1)


def test_fuse_qkv_weights_by_hand():
    wq, wk, wv = np.full((2, 3), 1.0), np.full((1, 3), 2.0), np.full((1, 3), 3.0)
    w, b = fuse_qkv_weights(wq, np.array([1.0, 2.0]), wk, np.array([3.0]), wv, np.array([4.0]))
    np.testing.assert_array_equal(w, [[1, 1, 1], [1, 1, 1], [2, 2, 2], [3, 3, 3]])
    np.testing.assert_array_equal(b, [1, 2, 3, 4])
    assert fuse_qkv_weights(wq, None, wk, None, wv, None)[1] is None
    _, b = fuse_qkv_weights(wq, None, wk, np.array([3.0]), wv, None)
    np.testing.assert_array_equal(b, [0, 0, 3, 0])
    with pytest.raises(ValueError, match="same in_features, got q: 3, k: 4, v: 3"):
        fuse_qkv_weights(wq, None, np.ones((1, 4)), None, wv, None)


@pytest.mark.parametrize("sizes", [(16, 16, 16), (16, 4, 4), (37, 5, 5)])
@pytest.mark.parametrize("rows", [1, 3, 32])
def test_fused_output_equals_the_three_outputs_exactly(sizes, rows):
    q, k, v = _integer_valued(_qkv(d=24, sizes=sizes))
    probe = np.random.default_rng(2).integers(-8, 9, (rows, 24)).astype(np.float32)
    fused, report = fuse_qkv(q, k, v, probe=probe)
    assert fused.weight.shape == (sum(sizes), 24)
    np.testing.assert_array_equal(fused(probe), _concat(q, k, v, probe))
    # the report's own 64 random rows are not integers: exact or float32 rounding, as the BLAS
    # kernel sums them (OpenBLAS's Haswell kernel orders the fused shape's sums differently)
    assert report.max_rel_error < 1e-6 and report.params_before == report.params_after


def test_fused_output_on_random_floats_agrees_to_float32_rounding():
    # BLAS may order the sums differently for the fused shape (OpenBLAS's small-matrix
    # kernels do), so on arbitrary floats the two agree to rounding, not always bitwise.
    q, k, v = _qkv(d=100, sizes=(37, 5, 5))
    x = np.random.default_rng(3).standard_normal((3, 100)).astype(np.float32)
    fused, report = fuse_qkv(q, k, v, probe=x)
    torch.testing.assert_close(torch.from_numpy(fused(x)), torch.from_numpy(_concat(q, k, v, x)))
    assert report.max_rel_error < 1e-6


def test_fused_output_matches_torch_linear_on_concatenated_weights():
    q, k, v = _qkv(d=32, sizes=(32, 8, 8))
    x = np.random.default_rng(4).standard_normal((5, 32)).astype(np.float32)
    fused, _ = fuse_qkv(q, k, v)
    w = torch.cat([torch.from_numpy(m.weight.data) for m in (q, k, v)])
    b = torch.cat([torch.from_numpy(m.bias.data) for m in (q, k, v)])
    expected = torch.nn.functional.linear(torch.from_numpy(x), w, b)
    torch.testing.assert_close(torch.from_numpy(fused(x)), expected)
    ints = _integer_valued(_qkv(d=32, sizes=(32, 8, 8)))
    fused, _ = fuse_qkv(*ints)
    xi = np.random.default_rng(5).integers(-8, 9, (5, 32)).astype(np.float32)
    w = torch.cat([torch.from_numpy(m.weight.data) for m in ints])
    b = torch.cat([torch.from_numpy(m.bias.data) for m in ints])
    assert torch.equal(torch.from_numpy(fused(xi)),
                       torch.nn.functional.linear(torch.from_numpy(xi), w, b))


def test_split_of_fuse_is_the_identity_bitwise_and_copies():
    q, k, v = _qkv(d=20, sizes=(20, 8, 8))
    fused, _ = fuse_qkv(q, k, v)
    (q2, k2, v2), report = split_qkv(fused, sizes=(20, 8, 8))
    for a, b in zip((q, k, v), (q2, k2, v2)):
        assert type(b) is lk.Linear and b.weight.shape == a.weight.shape
        np.testing.assert_array_equal(b.weight.data, a.weight.data)
        np.testing.assert_array_equal(b.bias.data, a.bias.data)
        assert b.weight.data.flags.c_contiguous and b.weight.data.flags.owndata
        assert not np.shares_memory(b.weight.data, fused.weight.data)
        assert not np.shares_memory(b.bias.data, fused.bias.data)
    assert report.max_rel_error < 1e-6      # random probes: exact or float32 rounding
    before = fused.weight.data.copy(), fused.bias.data.copy()
    k2.weight.data[...] = 7.0
    k2.bias.data[...] = 7.0
    np.testing.assert_array_equal(fused.weight.data, before[0])
    np.testing.assert_array_equal(fused.bias.data, before[1])


def test_split_defaults_to_thirds_and_refuses_what_does_not_divide():
    (q, k, v), _ = split_qkv(lk.Linear(6, 12, bias=False))
    assert [m.out_features for m in (q, k, v)] == [4, 4, 4]
    assert all(m.bias is None for m in (q, k, v))
    with pytest.raises(ValueError, match="out_features=10, not divisible by 3.*sizes="):
        split_qkv(lk.Linear(6, 10))
    with pytest.raises(ValueError, match=r"summing to out_features=10.*got \(4, 4, 4\)"):
        split_qkv(lk.Linear(6, 10), sizes=(4, 4, 4))
    with pytest.raises(ValueError, match="three positive ints"):
        split_qkv(lk.Linear(6, 10), sizes=(10, 0, 0))


def test_mixed_biases_are_zero_filled_and_said():
    q, k, v = _qkv(sizes=(16, 4, 4), bias=(True, False, True))
    fused, report = fuse_qkv(q, k, v)
    np.testing.assert_array_equal(fused.bias.data[16:20], 0.0)
    assert any("'k' had no bias: zeros fill" in line for line in report.changed)
    (_, k2, _), _ = split_qkv(fused, sizes=(16, 4, 4))
    np.testing.assert_array_equal(k2.bias.data, np.zeros(4, np.float32))
    fused, report = fuse_qkv(*_qkv(bias=(False, False, False)))
    assert fused.bias is None and len(report.changed) == 1


def test_fuse_refuses_different_inputs_dtypes_and_non_linears():
    q, k, _ = _qkv()
    with pytest.raises(ValueError, match=r"^fuse_qkv\(\): q, k and v must have the same "
                       "in_features, got q: 16, k: 16, v: 8"):
        fuse_qkv(q, k, lk.Linear(8, 16))
    with pytest.raises(ValueError, match=r"^fuse_qkv\(\): .*same dtype, got q: float32, "
                       "k: float32, v: float64"):
        fuse_qkv(q, k, lk.Linear(16, 16, dtype=np.float64))
    with pytest.raises(TypeError, match="v must be a materialized linearkit Linear"):
        fuse_qkv(q, k, lk.LazyLinear(16))


def test_fuse_leaves_the_three_layers_untouched():
    layers = _qkv(sizes=(16, 4, 4))
    before = [{n: a.copy() for n, a in m.state_dict().items()} for m in layers]
    fused, _ = fuse_qkv(*layers)
    fused.weight.data[...] = 0
    for m, saved in zip(layers, before):
        assert all(np.array_equal(saved[n], a) for n, a in m.state_dict().items())
