"""Activation checkpointing (linearkit.training.checkpointing): exact gradients, replayed randomness,
BatchNorm counted once, hooks, checkpoint_sequential, the ledger's rule, tracemalloc, torch."""

from __future__ import annotations

import numpy as np
import pytest

import linearkit as lk
from linearkit.analysis import ledger
from linearkit.core import random as lk_random
from linearkit.errors import BackwardError
from linearkit.training.checkpointing import (
    Checkpoint,
    checkpoint,
    checkpoint_sequential,
    recomputing,
)


def make_model(seed=0):
    """An MLP with every layer whose state or randomness matters: Dropout drawing from the
    library's generator and from its own, BatchNorm1d in training, LayerNorm, Residual."""
    rng = np.random.default_rng(seed)
    return lk.Sequential(
        lk.Linear(6, 16, rng=rng), lk.BatchNorm1d(16), lk.ReLU(), lk.Dropout(0.3),
        lk.Residual(lk.Sequential(lk.LayerNorm(16), lk.Linear(16, 16, rng=rng), lk.GELU(),
                                  lk.Dropout(0.25, rng=7))),
        lk.BatchNorm1d(16, momentum=None), lk.Dropout(0.5, rng=11), lk.Linear(16, 3, rng=rng))


X = np.random.default_rng(1).standard_normal((12, 6)).astype(np.float32)
DY = np.random.default_rng(2).standard_normal((12, 3)).astype(np.float32)


def own_generators(model):
    return [m._rng.bit_generator.state for m in model.modules()
            if isinstance(m, lk.Dropout) and m._rng is not None]


def kept_arrays(fn):
    """The arrays a closure keeps alive, through the closures and containers it holds."""
    found, seen, stack = [], set(), [fn]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (lk.Module, lk.Parameter)):
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            found.append(obj)
        elif callable(obj) and getattr(obj, "__closure__", None):
            stack.extend(c.cell_contents for c in obj.__closure__ if c.cell_contents is not None)
        elif isinstance(obj, (list, tuple, dict)):
            stack.extend(obj.values() if isinstance(obj, dict) else obj)
    return found


def one_step(model, wrapped=None, input_grad=True):
    """vjp + backward of ``wrapped`` (default: model itself) from a fixed library seed; returns
    everything a step changes or produces."""
    lk.manual_seed(3)
    y, backward = (wrapped or model).vjp(X, input_grad=input_grad)
    dx = backward(DY)
    return {"y": y, "dx": dx,
            "grads": {n: p.grad for n, p in model.named_parameters()},
            "buffers": {n: b.copy() for n, b in model.named_buffers()},
            "library": lk_random.default_generator().bit_generator.state,
            "own": own_generators(model)}


def assert_same_step(a, b):
    assert np.array_equal(a["y"], b["y"])
    assert (a["dx"] is None and b["dx"] is None) or np.array_equal(a["dx"], b["dx"])
    assert a["grads"].keys() == b["grads"].keys()
    for name in a["grads"]:
        assert np.array_equal(a["grads"][name], b["grads"][name]), name
    for name in a["buffers"]:
        assert np.array_equal(a["buffers"][name], b["buffers"][name]), name
    assert a["library"] == b["library"]
    assert a["own"] == b["own"]


WRAPS = {
    "whole": checkpoint,
    "nested": lambda m: checkpoint(lk.Sequential(checkpoint(m[:4]), checkpoint(m[4:7]), m[7])),
    "segments=2": lambda m: checkpoint_sequential(m, 2),
    "segments=4": lambda m: checkpoint_sequential(m, 4),
    "per layer": lambda m: lk.Sequential(*[checkpoint(layer) for layer in m]),
}


@pytest.mark.parametrize("wrap", WRAPS.values(), ids=WRAPS.keys())
@pytest.mark.parametrize("input_grad", [True, False])
def test_a_checkpointed_step_equals_the_plain_step_bit_for_bit(wrap, input_grad):
    """Output, input gradient, every parameter gradient, BatchNorm's running statistics and
    num_batches_tracked, and the state of every random generator after the step."""
    plain = one_step(make_model(), input_grad=input_grad)
    model = make_model()
    checked = one_step(model, wrap(model), input_grad=input_grad)
    assert_same_step(plain, checked)
    assert all(int(m.num_batches_tracked) == 1 for m in model.modules()
               if isinstance(m, lk.BatchNorm1d))
    assert (checked["dx"] is None) == (not input_grad)


@pytest.mark.parametrize("dtype", ["float64", "float16", "bfloat16"])
def test_a_checkpointed_step_is_exact_in_every_storage_dtype(dtype):
    """16-bit storage computes in float32 (the precision policy): the recompute is the same."""
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    x = X.astype(np.float64 if dtype == "float64" else np.float32)
    steps = []
    for wrap in (lambda m: m, lambda m: checkpoint_sequential(m, 3)):
        model = make_model().to(dtype)
        lk.manual_seed(3)
        y, backward = wrap(model).vjp(x)
        dx = backward(np.ones_like(y))
        steps.append([y, dx, *(p.grad for p in model.parameters()), *model.buffers()])
    for a, b in zip(*steps):
        assert a.dtype == b.dtype and np.array_equal(a.astype(np.float64), b.astype(np.float64))


def test_training_with_checkpointing_is_bitwise_identical():
    """Five SGD steps, Dropout masks from the library's stream and the layers' own."""
    runs = []
    for wrap in (lambda m: m, lambda m: checkpoint_sequential(m, 3)):
        model = make_model()
        net = wrap(model)
        opt = lk.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        lk.manual_seed(5)
        for _ in range(5):
            y, backward = net.vjp(X, input_grad=False)
            backward(y[:, :3] - DY)
            opt.step()
            opt.zero_grad()
        runs.append((model.state_dict(), lk_random.default_generator().bit_generator.state))
    (a, ga), (b, gb) = runs
    assert ga == gb
    for key in a:
        assert np.array_equal(a[key], b[key]), key


def test_the_recompute_replays_the_masks_even_after_manual_seed_between():
    def run(wrap):
        model = make_model()
        lk.manual_seed(3)
        _y, backward = wrap(model).vjp(X)
        lk.manual_seed(99)  # the library's generator is a new object now
        dx = backward(DY)
        return dx, lk_random.default_generator().bit_generator.state

    (dx, state), (dx_c, state_c) = run(lambda m: m), run(checkpoint)
    assert np.array_equal(dx, dx_c) and state == state_c


def test_the_recompute_runs_in_the_backward_and_the_forward_keeps_only_the_input():
    seq = lk.Sequential(lk.Linear(6, 8), lk.ReLU(), lk.Linear(8, 3))
    calls = []
    seq[0].register_forward_hook(lambda m, args, y: calls.append(recomputing()))
    wrapped = checkpoint(seq)
    _y, backward = wrapped.vjp(X)
    assert calls == [False]
    arrays = kept_arrays(backward)
    assert len(arrays) == 1 and arrays[0] is X  # x, nothing else
    backward(DY)
    assert calls == [False, True] and not recomputing()
    assert len(kept_arrays(seq.vjp(X)[1])) == 2  # without checkpointing: x and relu(h)


def test_hooks_forward_fires_twice_as_in_torch_backward_once():
    seq = lk.Sequential(lk.Linear(6, 8), lk.Tanh(), lk.Linear(8, 3))
    seen = []
    seq[1].register_forward_hook(lambda m, a, k, y: seen.append(("fwd", "input_grad" in k)),
                                 with_kwargs=True)
    seq[1].register_full_backward_hook(lambda m, gi, go: seen.append(("bwd", recomputing())))
    wrapper = checkpoint(seq)
    wrapper.register_forward_hook(lambda m, a, y: seen.append(("wrapper", None)))
    _y, backward = wrapper.vjp(X)
    backward(DY)
    assert seen == [("fwd", False), ("wrapper", None), ("fwd", True), ("bwd", False)]


def test_backward_twice_is_refused_like_every_closure():
    _y, backward = checkpoint(lk.Linear(6, 3)).vjp(X)
    backward(DY)
    with pytest.raises(BackwardError, match="already called"):
        backward(DY)


def test_a_frozen_segment_without_input_gradient_keeps_and_recomputes_nothing():
    first = lk.Sequential(lk.Linear(6, 8), lk.ReLU()).requires_grad_(False)
    calls = []
    first[0].register_forward_hook(lambda m, a, y: calls.append(1))
    model = lk.Sequential(checkpoint(first), lk.Linear(8, 3))
    y, backward = model.vjp(X, input_grad=False)
    assert backward(DY) is None
    assert calls == [1] and first[0].weight.grad is None and model[1].weight.grad is not None
    y, backward = checkpoint(first).vjp(X, input_grad=False)  # called directly, e.g. by a Residual
    assert kept_arrays(backward) == []
    assert backward(np.ones_like(y)) is None and calls == [1, 1]  # no recompute
    row = ledger(model, X.shape, optimizer="sgd")["0"]
    assert row.saved_bytes == 0
    assert row.backward_flops == 0


def test_checkpoint_refuses_what_is_not_a_module():
    with pytest.raises(TypeError, match="wraps a linearkit Module, got function"):
        checkpoint(lambda x: x)


# ------------------------------------------------------------------ checkpoint_sequential
def test_checkpoint_sequential_splits_as_torch_and_shares_the_layers():
    seq = lk.Sequential(*[lk.Linear(4, 4) for _ in range(7)]).eval()
    keys = list(seq.state_dict())
    model = checkpoint_sequential(seq, 3)
    # torch: segment size 7 // 3 = 2; the first two runs are checkpointed, the rest runs plain
    assert [type(m).__name__ for m in model] == ["Checkpoint", "Checkpoint", "Sequential"]
    assert [len(model[0].module), len(model[1].module), len(model[2])] == [2, 2, 3]
    assert list(model[2].state_dict()) == [f"{i}.{p}" for i in (4, 5, 6) for p in ("weight", "bias")]
    assert model[1].module[0] is seq[2]
    assert list(seq.state_dict()) == keys and all(type(m) is lk.Linear for m in seq)
    assert not any(m.training for m in model.modules())
    x = np.ones((2, 4), np.float32)
    assert np.array_equal(model(x), seq(x))
    assert [type(m).__name__ for m in checkpoint_sequential(seq, 1)] == ["Sequential"]


@pytest.mark.parametrize("bad,match", [(0, "from 1 to len"), (8, "from 1 to len"),
                                       (2.0, "from 1 to len"), (True, "from 1 to len")])
def test_checkpoint_sequential_refuses_a_bad_segment_count(bad, match):
    with pytest.raises(ValueError, match=match):
        checkpoint_sequential(lk.Sequential(*[lk.ReLU() for _ in range(7)]), bad)


def test_checkpoint_sequential_takes_a_sequential():
    with pytest.raises(TypeError, match="takes a Sequential, got Linear"):
        checkpoint_sequential(lk.Linear(2, 2), 1)


# ------------------------------------------------------------------ the ledger's rule
def blocks(n, d=16, h=64):
    rng = np.random.default_rng(0)
    return lk.Sequential(*[lk.Sequential(lk.Linear(d, h, rng=rng), lk.ReLU(),
                                         lk.Linear(h, d, rng=rng)) for _ in range(n)])


def test_the_ledger_counts_a_segment_as_its_input_plus_one_recompute():
    b, d, h, f4 = 8, 16, 64, 4
    seq = blocks(4, d, h)
    plain = ledger(seq, (b, d), optimizer="sgd")
    ckpt = ledger(checkpoint_sequential(seq, 4), (b, d), optimizer="sgd")
    # plain: each block keeps its input (b*d) and its ReLU output (b*h)
    assert plain.memory["activations"] == 4 * (b * d + b * h) * f4
    # checkpointed: three segment inputs, the plain last block, and one block's recompute
    # (its ReLU output; its input is the one the checkpoint holds)
    held = 3 * b * d + (b * d + b * h)
    assert ckpt.memory["activations"] == (held + b * h) * f4
    assert plain.memory["activations"] - ckpt.memory["activations"] == 2 * b * h * f4
    assert ckpt["0"].saved_bytes == b * d * f4  # the row: what the segment holds
    assert ckpt["0.module.0.1"].saved_bytes == b * h * f4  # its child: during the recompute
    assert ckpt[""].kind == "sequential" and ckpt["0"].kind == "checkpoint"
    assert any("checkpointing" in note for note in ckpt.notes)
    # the recompute: one more forward of each checkpointed segment, in the backward
    assert ckpt["0"].backward_flops == ckpt["0.module"].backward_flops + ckpt["0"].flops
    assert ckpt.totals["flops"] == plain.totals["flops"]
    assert ckpt.totals["backward_flops"] == plain.totals["backward_flops"] + 3 * ckpt["0"].flops


def test_the_ledger_takes_the_largest_recompute_once_and_nests():
    b, d, h, f4 = 8, 16, 64, 4
    seq = blocks(5, d, h)
    model = lk.Sequential(checkpoint(seq[:3]), checkpoint(seq[3:4]), seq[4])
    # held: 2 segment inputs + the last block; peak: the 3-block segment's recompute
    # (3 ReLU outputs, 2 block inputs inside it)
    expected = 2 * b * d + (b * d + b * h) + (3 * b * h + 2 * b * d)
    assert ledger(model, (b, d), optimizer="sgd").memory["activations"] == expected * f4
    nested = lk.Sequential(checkpoint(lk.Sequential(checkpoint(seq[0]), seq[1], seq[2])),
                           seq[3], seq[4])
    # outer recompute: its inner checkpoint's input (the outer's own, not again), blocks 1, 2
    # kept in full, plus the inner segment's recompute (one ReLU output) inside it
    expected = b * d + 2 * (b * d + b * h) + (2 * (b * d + b * h) + b * h)
    assert ledger(nested, (b, d), optimizer="sgd").memory["activations"] == expected * f4


def test_checkpointing_a_linear_relu_stack_per_block_saves_nothing():
    """Each Linear+ReLU block keeps only its input (its ReLU output is the next block's input):
    recomputing it cannot save memory, and the ledger says so."""
    seq = lk.Sequential(*[lk.Sequential(lk.Linear(8, 8), lk.ReLU()) for _ in range(6)])
    plain = ledger(seq, (4, 8), optimizer="sgd").memory["activations"]
    assert ledger(checkpoint_sequential(seq, 6), (4, 8), optimizer="sgd"
                  ).memory["activations"] >= plain


# ------------------------------------------------------------------ files and ONNX
def test_a_checkpointed_model_round_trips_through_a_model_file(tmp_path):
    model = checkpoint_sequential(blocks(3), 3)
    path = lk.save(model, tmp_path / "m.safetensors")
    loaded = lk.load_model(path)
    assert [type(m).__name__ for m in loaded] == ["Checkpoint", "Checkpoint", "Sequential"]
    x = np.ones((2, 16), np.float32)
    assert np.array_equal(loaded(x), model(x))


def test_onnx_export_sees_through_the_wrapper(tmp_path):
    pytest.importorskip("onnx")
    from onnx.reference import ReferenceEvaluator

    from linearkit.io.onnx_export import export_onnx

    model = checkpoint_sequential(blocks(3), 2).eval()
    path = export_onnx(model, tmp_path / "m.onnx", (2, 16))
    x = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)
    (y,) = ReferenceEvaluator(str(path)).run(None, {"input": x})
    np.testing.assert_allclose(y, model(x), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ against torch
def test_gradients_match_torch_checkpoint_float64():
    """torch.utils.checkpoint gives torch's plain gradients; ours give ours; ours and torch's
    agree (float64). BatchNorm in training, LayerNorm, GELU, a residual block."""
    torch = pytest.importorskip("torch")
    from torch.utils.checkpoint import checkpoint_sequential as torch_ckpt_seq

    rng = np.random.default_rng(0)
    ours = lk.Sequential(lk.Linear(6, 16, rng=rng), lk.BatchNorm1d(16), lk.GELU(),
                         lk.Residual(lk.Sequential(lk.LayerNorm(16), lk.Linear(16, 16, rng=rng))),
                         lk.Tanh(), lk.Linear(16, 3, rng=rng)).to(np.float64)
    ref = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.BatchNorm1d(16), torch.nn.GELU(),
                              _TorchResidual(torch.nn.Sequential(torch.nn.LayerNorm(16),
                                                                 torch.nn.Linear(16, 16))),
                              torch.nn.Tanh(), torch.nn.Linear(16, 3)).double()
    with torch.no_grad():
        for key, value in ref.state_dict().items():
            if value.dtype.is_floating_point:
                value.copy_(torch.from_numpy(ours.state_dict()[key]))
    x, dy = X.astype(np.float64), DY.astype(np.float64)

    def torch_grads(checkpointed):
        ref.zero_grad()
        xt = torch.tensor(x, requires_grad=True)
        y = (torch_ckpt_seq(ref, 3, xt, use_reentrant=False) if checkpointed else ref(xt))
        y.backward(torch.from_numpy(dy))
        return [xt.grad] + [p.grad.clone() for p in ref.parameters()]

    plain_t, ckpt_t = torch_grads(False), torch_grads(True)
    for a, b in zip(plain_t, ckpt_t):
        assert torch.equal(a, b)
    _y, backward = checkpoint_sequential(ours, 3).vjp(x)
    dx = backward(dy)
    for ours_grad, torch_grad in zip([dx] + [p.grad for p in ours.parameters()], ckpt_t):
        torch.testing.assert_close(torch.from_numpy(ours_grad), torch_grad)


class _TorchResidual:
    """Built lazily as a torch.nn.Module subclass (torch is imported only in its test)."""

    def __new__(cls, module):
        import torch

        class Residual(torch.nn.Module):
            def __init__(self, module):
                super().__init__()
                self.module = module

            def forward(self, x):
                return x + self.module(x)

        return Residual(module)


def test_a_checkpoint_is_a_module_with_the_segment_as_child_module():
    seq = lk.Sequential(lk.Linear(2, 2))
    wrapper = Checkpoint(seq)
    assert list(wrapper.state_dict()) == ["module.0.weight", "module.0.bias"]
    assert repr(wrapper).startswith("Checkpoint(\n  (module): Sequential(")


def test_torch_checkpoint_counts_batchnorm_twice_ours_once():
    """What the docstring claims of torch (2.13): its recompute runs BatchNorm's update again."""
    torch = pytest.importorskip("torch")
    from torch.utils.checkpoint import checkpoint as torch_checkpoint

    bn = torch.nn.BatchNorm1d(6)
    torch_checkpoint(bn, torch.tensor(X, requires_grad=True), use_reentrant=False).sum().backward()
    ours = lk.BatchNorm1d(6)
    y, backward = checkpoint(ours).vjp(X)
    backward(np.ones_like(y))
    assert int(bn.num_batches_tracked) == 2 and int(ours.num_batches_tracked) == 1
