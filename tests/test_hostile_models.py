"""Models that stress the edges of transforms and interop: tied layers, bfloat16 weights, user
hooks, a verify with no probe, a micro-batch that fails halfway, 0-d losses, and what the
reference safetensors loader accepts that linearkit refuses."""

import copy
import json
import struct

import ml_dtypes
import numpy as np
import pytest
import torch
from transform_checks import assert_unchanged, snapshot

import linearkit as lk
from linearkit import transforms as T
from linearkit.errors import ShapeError
from linearkit.io import verify
from linearkit.training.accumulation import accumulate, accumulated_step

BF16 = np.dtype(ml_dtypes.bfloat16)


def _bits(a):
    """An array's raw bytes, so bfloat16 (and NaN payloads, signed zeros) compare exactly."""
    a = np.ascontiguousarray(a)
    return a.view(np.uint8).tobytes()


def _ties(model):
    """``[(path, path), ...]``: every pair of paths holding one module object."""
    where = {}
    for path, m in model.named_modules(remove_duplicate=False):
        where.setdefault(id(m), []).append(path)
    return [(paths[0], p) for paths in where.values() for p in paths[1:]]


def _assert_ties_kept(old, new):
    """Each tie of ``old`` whose paths both still exist in ``new`` is a tie of ``new``."""
    modules = dict(new.named_modules(remove_duplicate=False))
    pairs = [(a, b) for a, b in _ties(old) if a in modules and b in modules]
    assert pairs, "the model under test has no tie left to check"
    for a, b in pairs:
        assert modules[a] is modules[b], f"'{a}' and '{b}' were one module; now they are two"


def _x(n_in, rows=5, seed=1):
    return np.random.default_rng(seed).standard_normal((rows, n_in)).astype(np.float32)


# ----------------------------------------------------------------------------- tied layers
def _tied():
    a = lk.Linear(8, 8)
    return lk.Sequential(a, lk.ReLU(), a)


def _pruned_tied():
    model = _tied()
    model[0].weight.data[np.abs(model[0].weight.data) < 0.3] = 0  # sparse enough for CSR
    return model


TIE_CASES = {
    "quantize": (_tied, lambda m: T.quantize(m), "QuantizedLinear"),
    "to_sparse": (_pruned_tied, lambda m: T.to_sparse(m), "SparseLinear"),
    "factorize": (_tied, lambda m: T.factorize(m, rank=2, timing=False), "Sequential"),
    "prune": (_tied, lambda m: T.prune(m, 0.5), "Linear"),
    "merge": (_tied, lambda m: T.merge_linear(m, force=True), "Linear"),
    "fold": (lambda: _tied().eval(), lambda m: T.fold_norm(m), "Linear"),
}


@pytest.mark.parametrize("name", list(TIE_CASES))
def test_every_transform_keeps_a_shared_layer_shared(name):
    build, transform, kind = TIE_CASES[name]
    model = build()
    before = snapshot(model)
    x = _x(8)
    new, report = transform(model)
    assert type(new[0]).__name__ == kind and type(new[2]).__name__ == kind
    assert new[0] is new[2]
    _assert_ties_kept(model, new)
    assert_unchanged(model, before)
    assert model[0] is model[2]
    np.testing.assert_allclose(new(x), model(x), rtol=0, atol=report.max_abs_error + 1e-6)


def test_a_target_naming_any_path_of_a_tied_layer_selects_the_layer():
    model = _tied()
    new, report = T.quantize(model, targets="2")
    assert type(new[0]).__name__ == "QuantizedLinear" and new[0] is new[2]
    assert "'0', '2' (tied)" in report.changed[0]


def test_a_chain_used_twice_is_merged_and_folded_once_and_stays_shared():
    inner = lk.Sequential(lk.Linear(6, 6), lk.Linear(6, 6))
    model = lk.Sequential(inner, lk.ReLU(), inner)
    new, report = T.merge_linear(model, force=True)
    assert new[0] is new[2] and len(new[0]) == 1
    assert report.max_abs_error < 1e-5

    bn = lk.BatchNorm1d(6)
    bn.running_mean[...] = 0.5
    bn.running_var[...] = 2.0
    inner = lk.Sequential(lk.Linear(6, 6), bn)
    model = lk.Sequential(inner, lk.ReLU(), inner).eval()
    new, report = T.fold_norm(model)
    assert new[0] is new[2] and len(new[0]) == 1
    assert report.max_abs_error < 1e-5


def test_a_tied_layer_used_outside_a_merge_or_fold_is_left_with_why():
    a, b = lk.Linear(4, 4), lk.Linear(4, 4)
    model = lk.Sequential(a, b, lk.ReLU(), a)
    new, report = T.merge_linear(model, force=True)
    assert new[0] is new[3]
    assert report.changed == []
    assert any("'0' (Linear(4, 4)) is one layer used at '0', '3' (tied)" in line
               and "copy.deepcopy" in line for line in report.left)

    bn = lk.BatchNorm1d(4)
    bn.running_mean[...] = 0.25
    model = lk.Sequential(a, bn, lk.ReLU(), a).eval()
    new, report = T.fold_norm(model)
    assert new[0] is new[3] and isinstance(new[1], lk.BatchNorm1d)
    assert any("is one layer used at '0', '3' (tied)" in line for line in report.left)


def test_keep_batchnorm_does_not_shift_a_shared_batchnorm_twice():
    bn = lk.BatchNorm1d(4)
    bn.running_mean[...] = 0.25
    bn.running_var[...] = 1.5
    model = lk.Sequential(lk.Linear(4, 4), bn, lk.ReLU(), lk.Linear(4, 4), bn).eval()
    x = _x(4)
    new, report = T.fold_norm(model, keep_batchnorm=True)
    assert new[1] is new[4]
    np.testing.assert_allclose(new(x), model(x), rtol=1e-6, atol=1e-6)
    assert report.max_abs_error < 1e-6
    assert any("'1', '4' (tied)" in line for line in report.left)


def test_add_lora_refuses_a_tied_layer_saying_why_and_how():
    model = _tied()
    before = snapshot(model)
    with pytest.raises(ValueError) as info:
        T.add_lora(model, rank=2)
    text = str(info.value)
    assert "'0' (Linear(8, 8)) is one Linear used at '0', '2' (tied)" in text
    assert "untied" in text and "copy.deepcopy" in text and "at '2'" in text
    assert "targets=" in text
    assert_unchanged(model, before)
    # Doing what it says works, and leaves the other layers adaptable.
    model.add_module("2", copy.deepcopy(model[0]))
    adapted, _ = T.add_lora(model, rank=2)
    assert type(adapted[0]).__name__ == type(adapted[2]).__name__ == "LoRALinear"


def test_an_adapter_file_is_not_loaded_onto_one_use_of_a_tied_layer(tmp_path):
    tied = _tied()
    untied = copy.deepcopy(tied)
    untied.add_module("2", copy.deepcopy(untied[0]))
    adapted, _ = T.add_lora(untied, rank=2, targets=["0"])
    path = tmp_path / "adapter.safetensors"
    T.save_adapter(adapted, path)
    before = snapshot(tied)
    with pytest.raises(ValueError, match=r"load_adapter\(\): '0' \(Linear\(8, 8\)\) is one "
                                         r"Linear used at '0', '2' \(tied\).*copy.deepcopy"):
        T.load_adapter(tied, path)
    assert_unchanged(tied, before)
    new, _ = T.load_adapter(untied, path)
    assert type(new[0]).__name__ == "LoRALinear"


def test_a_linear_inside_a_shared_chain_gets_one_adapter_that_serves_both_uses():
    inner = lk.Sequential(lk.Linear(6, 6))
    model = lk.Sequential(inner, lk.ReLU(), inner)
    adapted, report = T.add_lora(model, rank=2)
    assert adapted[0] is adapted[2] and type(adapted[0][0]).__name__ == "LoRALinear"
    assert len(report.changed) == 1 and report.max_abs_error == 0.0


# ----------------------------------------------------------------------------- torch bfloat16
def _special_bf16(shape):
    """bfloat16 values with every awkward bit pattern: NaN, ±inf, -0.0, a subnormal."""
    values = np.random.default_rng(0).standard_normal(int(np.prod(shape))).astype(BF16)
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-40], np.float32).astype(BF16)
    values[:len(specials)] = specials
    return values.reshape(shape)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_to_torch_and_back_keep_16_bit_weights_bit_for_bit(dtype):
    model = lk.Sequential(lk.Linear(4, 6), lk.LayerNorm(6), lk.BatchNorm1d(6)).to(dtype)
    if dtype == "bfloat16":
        model[0].weight.data[...] = _special_bf16((6, 4))
    tm = lk.io.to_torch(model)
    want = torch.bfloat16 if dtype == "bfloat16" else torch.float16
    assert all(v.dtype == want for k, v in tm.state_dict().items()
               if not k.endswith("num_batches_tracked"))
    w = tm[0].weight.detach()
    if dtype == "bfloat16":
        assert _bits(w.view(torch.int16).numpy()) == _bits(model[0].weight.data)
    back = lk.io.from_torch(tm)
    for key, value in model.state_dict().items():
        got = back.state_dict()[key]
        assert np.asarray(got).dtype == np.asarray(value).dtype, key
        assert _bits(got) == _bits(value), key


def test_from_torch_of_a_bfloat16_module_computes_what_torch_computes():
    torch.manual_seed(0)
    tm = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.GELU(), torch.nn.Linear(7, 3))
    tm = tm.to(torch.bfloat16)
    model = lk.io.from_torch(tm)
    assert model[0].weight.dtype == BF16
    for name, t in tm.state_dict().items():
        assert _bits(t.view(torch.int16).numpy()) == _bits(model.state_dict()[name]), name
    # linearkit computes a bfloat16-stored model in float32 (activations too): exactly torch's
    # float32 arithmetic on the same (widened, exact) weights.
    wide = copy.deepcopy(tm).float()
    report = verify(model, wide, _x(5, 16))
    assert report.ok and report.max_abs_error < 1e-6, str(report)
    # One layer against torch's own bfloat16 layer (which rounds its output to bfloat16): a
    # bfloat16 probe of the layer's width, torch.testing's bfloat16 tolerances.
    report = verify(model[0], tm[0])
    assert report.ok, str(report)
    assert report.dtype == BF16 and (report.rtol, report.atol) == (1.6e-2, 1e-5)
    assert report.probe_shape == (16, 5)


# ----------------------------------------------------------------------------- verify's probe
def test_verify_draws_its_own_probe_from_the_input_width():
    torch.manual_seed(0)
    tm = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh())
    model = lk.io.from_torch(tm)
    report = verify(model, tm)
    assert report.ok, str(report)
    assert report.probe_shape == (16, 4) and report.dtype == np.float32
    seen = []
    verify(model, lambda x: seen.append(x.copy()) or model(x), seed=3)
    verify(model, lambda x: seen.append(x.copy()) or model(x), seed=3)
    np.testing.assert_array_equal(seen[0], seen[1])
    normed = lk.Sequential(lk.LayerNorm(5), lk.Linear(5, 2))
    assert verify(normed, normed).probe_shape == (16, 5)


def test_verify_asks_for_a_probe_where_the_width_is_unknown():
    model = lk.Sequential(lk.LazyLinear(3), lk.ReLU(), lk.Linear(3, 2))
    with pytest.raises(ValueError, match=r"'0' \(LazyLinear\) is not materialized.*probe"):
        verify(model, model)
    with pytest.raises(ValueError, match="not a linearkit Module.*probe"):
        verify(lambda x: x, lambda x: x)
    # A transform on such a model names the lazy layer instead of guessing a later width.
    with pytest.raises(ValueError, match=r"'0' \(LazyLinear\) is not materialized.*probe="):
        T.quantize(model)


# ----------------------------------------------------------------------------- hooks
def _hooked():
    model = lk.Sequential(lk.Linear(6, 6), lk.ReLU(), lk.Linear(6, 6), lk.BatchNorm1d(6),
                          lk.Linear(6, 4)).eval()
    fired = []
    for m in model.modules():
        m.register_forward_hook(lambda mod, args, y: fired.append(type(mod).__name__))
    model[0].register_forward_pre_hook(lambda mod, args: fired.append("pre"))
    return model, fired


HOOK_CASES = {
    "quantize": lambda m: T.quantize(m),
    "prune": lambda m: T.prune(m, 0.5),
    "to_sparse": lambda m: T.to_sparse(T.prune(m, 0.8)[0]),
    "factorize": lambda m: T.factorize(m, rank=1),  # timing runs the layers too
    "merge": lambda m: T.merge_linear(m, force=True),
    "fold": lambda m: T.fold_norm(m),
    "add_lora": lambda m: T.add_lora(m, rank=2),
    "merge_lora": lambda m: T.merge_lora(T.add_lora(m, rank=2)[0]),
    "rank_sweep": lambda m: (m, T.rank_sweep(m, (_x(6, 8), np.zeros(8, int)), ranks=[1],
                                             repeats=1)),
}


@pytest.mark.parametrize("name", list(HOOK_CASES))
def test_transforms_fire_none_of_the_users_hooks(name):
    model, fired = _hooked()
    before = snapshot(model)
    hooked = [m.has_hooks() for m in model.modules()]
    new, _ = HOOK_CASES[name](model)
    assert fired == [], f"{name} ran the user's hooks: {fired}"
    assert_unchanged(model, before)
    assert [m.has_hooks() for m in model.modules()] == hooked
    model(_x(6))
    assert "pre" in fired and fired.count("Linear") == 3  # the input's hooks still work
    if name in ("prune", "merge", "add_lora"):  # layers kept: the copy's hooks are back
        fired.clear()
        new(_x(6))
        assert "pre" in fired and fired.count("Sequential") == 1


def test_fuse_qkv_fires_no_hook_of_the_layers_it_fuses():
    q, k, v = lk.Linear(8, 8), lk.Linear(8, 4), lk.Linear(8, 4)
    fired = []
    q.register_forward_hook(lambda mod, args, y: fired.append("q"))
    T.fuse_qkv(q, k, v)
    assert fired == [] and q.has_hooks()
    q(_x(8))
    assert fired == ["q"]


# ----------------------------------------------------------------------------- bfloat16 models
def _bf16_model():
    return lk.Sequential(lk.Linear(16, 12), lk.ReLU(), lk.Linear(12, 4)).to("bfloat16")


@pytest.mark.parametrize("structured", [False, True])
def test_prune_a_bfloat16_model_as_torch_prunes_it(structured):
    import torch.nn.utils.prune as tprune

    model = _bf16_model()
    before = snapshot(model)
    new, report = T.prune(model, 0.5 if not structured else 3, structured=structured)
    assert_unchanged(model, before)
    assert new[0].weight.dtype == BF16
    for i in (0, 2):
        t = torch.nn.Linear(*model[i].weight.shape[::-1]).to(torch.bfloat16)
        with torch.no_grad():
            t.weight.copy_(torch.from_numpy(model[i].weight.data.astype(np.float32)))
        if structured:
            tprune.ln_structured(t, "weight", amount=3, n=2, dim=0)
        else:
            tprune.l1_unstructured(t, "weight", amount=0.5)
        np.testing.assert_array_equal(new[i].weight.data != 0, t.weight_mask.float().numpy() != 0)
        kept = new[i].weight.data != 0
        assert _bits(new[i].weight.data[kept]) == _bits(model[i].weight.data[kept])
    assert np.isfinite(report.max_abs_error)


def test_add_lora_on_a_bfloat16_model_keeps_the_base_bits_and_the_function():
    model = _bf16_model()
    before = snapshot(model)
    x = _x(16)
    adapted, report = T.add_lora(model, rank=4, rng=0)
    assert_unchanged(model, before)
    for i in (0, 2):
        lora = adapted[i]
        assert lora.lora_A.weight.dtype == lora.lora_B.weight.dtype == BF16
        assert _bits(lora.base_layer.weight.data) == _bits(model[i].weight.data)
        assert np.any(lora.lora_A.weight.data.astype(np.float32) != 0)
    np.testing.assert_array_equal(adapted(x), model(x))  # B = 0
    assert report.max_abs_error == 0.0
    merged, _ = T.merge_lora(adapted)
    assert merged[0].weight.dtype == BF16


def test_add_lora_on_float16_stays_float16():
    model = lk.Sequential(lk.Linear(8, 4)).to("float16")
    adapted, _ = T.add_lora(model, rank=2, rng=0)
    assert adapted[0].lora_A.weight.dtype == np.float16


# ----------------------------------------------------------------------------- accumulation
class _FailsOnSecondCall(lk.MSELoss):
    """An MSELoss whose second call raises, as a shape mistake in one micro-batch would."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def _run(self, pred, target):
        self.calls += 1
        if self.calls == 2:
            raise ShapeError("micro-batch 1 does not fit")
        return super()._run(pred, target)


def _acc_model():
    return lk.Sequential(lk.Linear(4, 5, rng=np.random.default_rng(1)), lk.Tanh(),
                         lk.Linear(5, 3, bias=False, rng=np.random.default_rng(2)))


def test_a_failed_micro_batch_restores_every_gradient():
    model = _acc_model()
    x, y = _x(4, 9), np.zeros((9, 3), np.float32)
    earlier = np.full((5, 4), 0.25, np.float32)
    model[0].weight.grad = earlier            # a gradient the caller accumulated on purpose
    assert model[0].bias.grad is None
    zeroed = np.zeros((3, 5), np.float32)
    model[2].weight.grad = zeroed
    opt = lk.optim.SGD(model.parameters(), lr=0.1)
    weights = [p.data.copy() for p in model.parameters()]
    with pytest.raises(ShapeError, match="micro-batch 1"):
        accumulated_step(model, _FailsOnSecondCall(), opt, x, y, micro_batches=3)
    assert model[0].weight.grad is earlier and np.all(earlier == 0.25)
    assert model[0].bias.grad is None
    assert model[2].weight.grad is zeroed and not zeroed.any()
    assert all(np.array_equal(p.data, w) for p, w in zip(model.parameters(), weights))

    with pytest.raises(ShapeError):
        accumulate(model, _FailsOnSecondCall(), x, y, micro_batches=2)
    assert model[0].weight.grad is earlier and np.all(earlier == 0.25)
    assert model[0].bias.grad is None


def test_after_a_failed_window_the_next_step_is_as_if_it_never_ran():
    x, y = _x(4, 9), np.random.default_rng(5).standard_normal((9, 3)).astype(np.float32)
    failed, fresh = _acc_model(), _acc_model()
    opt_failed = lk.optim.SGD(failed.parameters(), lr=0.1)
    opt_fresh = lk.optim.SGD(fresh.parameters(), lr=0.1)
    with pytest.raises(ShapeError):
        accumulated_step(failed, _FailsOnSecondCall(), opt_failed, x, y, micro_batches=3)
    a = accumulated_step(failed, lk.MSELoss(), opt_failed, x, y, micro_batches=3)
    b = accumulated_step(fresh, lk.MSELoss(), opt_fresh, x, y, micro_batches=3)
    assert a == b
    for p, q in zip(failed.parameters(), fresh.parameters()):
        np.testing.assert_array_equal(p.data, q.data)


# ----------------------------------------------------------------------------- 0-d losses
ZERO_D = {
    "BCEWithLogitsLoss": (lk.BCEWithLogitsLoss, torch.nn.BCEWithLogitsLoss,
                          np.array(0.3, np.float32), np.array(1.0, np.float32)),
    "MSELoss": (lk.MSELoss, torch.nn.MSELoss, np.array(0.3, np.float32),
                np.array(1.0, np.float32)),
    "L1Loss": (lk.L1Loss, torch.nn.L1Loss, np.array(0.3, np.float32), np.array(1.0, np.float32)),
    "CrossEntropyLoss": (lk.CrossEntropyLoss, torch.nn.CrossEntropyLoss,
                         np.array([0.1, 0.2, 0.3], np.float32), np.array(2)),
    "CrossEntropyLoss probs": (lk.CrossEntropyLoss, torch.nn.CrossEntropyLoss,
                               np.array([0.1, 0.2, 0.3], np.float32),
                               np.array([0.2, 0.3, 0.5], np.float32)),
}


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("name", list(ZERO_D))
def test_a_0d_loss_is_a_0d_ndarray_shaped_as_torchs(name, reduction):
    ours, theirs, pred, target = ZERO_D[name]
    loss = ours(reduction=reduction)(pred, target)
    ref = theirs(reduction=reduction)(torch.from_numpy(pred), torch.from_numpy(target))
    assert type(loss) is np.ndarray and loss.dtype == np.float32
    assert loss.shape == tuple(ref.shape) == ()
    np.testing.assert_allclose(loss, ref.numpy(), rtol=1e-6)


# ----------------------------------------------------------------------------- safetensors
def _file(tmp_path, header: bytes, data: bytes):
    header += b" " * (-len(header) % 8)
    path = tmp_path / "hostile.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


def test_what_the_reference_loader_lets_through_and_linearkit_refuses(tmp_path):
    """The README's sentence: the reference loader keeps the last of two entries of one name
    and ignores unknown entry fields; it refuses overlapping or gapped offsets itself."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    data = np.arange(4, dtype=np.float32).tobytes()
    entry = '{"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}'
    lax = {
        "a duplicate name": f'{{"a": {entry}, "a": {entry}}}'.encode(),
        "an unknown entry field": json.dumps(
            {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], "x": 1}}).encode(),
    }
    for why, header in lax.items():
        path = _file(tmp_path, header, data[:8])
        assert list(load_file(str(path))) == ["a"], why
        with pytest.raises(lk.FormatError):
            lk.load(path)
    strict = {
        "overlapping offsets": json.dumps({
            "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}).encode(),
        "a gap": json.dumps({
            "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
            "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}).encode(),
    }
    for why, header in strict.items():
        path = _file(tmp_path, header, data[:12] if why.startswith("over") else data)
        with pytest.raises(SafetensorError):
            load_file(str(path))
        with pytest.raises(lk.FormatError):
            lk.load(path)


def test_float16_overflow_warns_and_strict_finite_refuses(tmp_path):
    """A weight beyond float16's range becomes inf in a float16 model: to() and load() say so
    (naming the tensor), and load(strict_finite=True) refuses before touching the model."""
    import warnings

    model = lk.Sequential(lk.Linear(3, 2))
    model[0].weight.data[0, 0] = 1e6
    with pytest.warns(UserWarning, match=r"0\.weight held values beyond float16's range"):
        model.to("float16")
    assert np.isinf(model[0].weight.data[0, 0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lk.Linear(3, 2).to("float16")                       # in range: no warning
        lk.Linear(3, 2).to("bfloat16")
    big = lk.Linear(3, 2)
    big.weight.data[1, 2] = -7e4
    path = lk.save(big, tmp_path / "big.safetensors")
    target = lk.Linear(3, 2).to("float16")
    before = target.weight.data.copy()
    with pytest.raises(lk.FormatError, match="'weight' hold values beyond float16's range"):
        lk.load(path, target, strict_finite=True)
    assert np.array_equal(target.weight.data, before)     # a refused load changes nothing
    with pytest.warns(UserWarning, match="become inf"):
        lk.load(path, target)
    assert np.isinf(target.weight.data[1, 2])
