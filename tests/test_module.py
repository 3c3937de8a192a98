"""Parameter and Module: the tree, state_dict (PyTorch's keys and reporting), repr, modes,
tied parameters, custom modules composing vjp closures, and detect_anomaly."""

import numpy as np
import pytest
import torch

import linearkit as lk


def lk_mlp():
    return lk.Sequential(lk.Linear(4, 8), lk.ReLU(),
                         lk.Residual(lk.Sequential(lk.Linear(8, 8), lk.ReLU())), lk.Linear(8, 3))


class TorchResidual(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return x + self.module(x)


def torch_mlp():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                               TorchResidual(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())),
                               torch.nn.Linear(8, 3))


def test_state_dict_keys_and_shapes_equal_torch_and_torch_weights_load():
    ours, theirs = lk_mlp(), torch_mlp()
    sd = ours.state_dict()
    assert list(sd) == list(theirs.state_dict())
    assert [v.shape for v in sd.values()] == [tuple(v.shape) for v in theirs.state_dict().values()]
    result = ours.load_state_dict(theirs.state_dict())  # torch tensors load unchanged
    assert result.missing_keys == [] and result.unexpected_keys == []
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    torch.testing.assert_close(torch.from_numpy(ours(x)), theirs(torch.from_numpy(x)).detach())


def test_load_state_dict_reporting_matches_torch():
    ours, theirs = lk_mlp(), torch_mlp()
    sd = {k: v.clone() for k, v in theirs.state_dict().items()}
    del sd["3.bias"]
    sd["extra.weight"] = torch.zeros(1)
    for strict in (True, False):
        try:
            theirs_result, theirs_error = theirs.load_state_dict(sd, strict=strict), None
        except RuntimeError as exc:
            theirs_result, theirs_error = None, str(exc)
        try:
            ours_result, ours_error = ours.load_state_dict(sd, strict=strict), None
        except RuntimeError as exc:
            ours_result, ours_error = None, str(exc)
        if theirs_error is None:
            assert ours_error is None
            assert ours_result.missing_keys == theirs_result.missing_keys
            assert ours_result.unexpected_keys == theirs_result.unexpected_keys
        else:
            assert ours_error == theirs_error.replace("torch.Size([", "(").replace("])", ")")


def test_size_mismatch_always_raises_and_names_the_key():
    ours = lk_mlp()
    sd = dict(ours.state_dict())
    sd["0.weight"] = np.zeros((4, 8))
    before = ours[0].weight.data.copy()
    with pytest.raises(RuntimeError, match=r"size mismatch for 0.weight: copying a param with shape "
                                           r"\(4, 8\) from checkpoint, the shape in current model is \(8, 4\)"):
        ours.load_state_dict(sd, strict=False)
    np.testing.assert_array_equal(ours[0].weight.data, before)


def test_repr_matches_torch_for_nested_models():
    ours, theirs = lk_mlp(), torch_mlp()
    assert repr(ours) == repr(theirs).replace("TorchResidual", "Residual")


def test_traversal_apply_modes_and_requires_grad():
    model = lk_mlp()
    names = [n for n, _ in model.named_modules()]
    assert names == ["", "0", "1", "2", "2.module", "2.module.0", "2.module.1", "3"]
    assert [n for n, _ in model.named_parameters()] == [
        "0.weight", "0.bias", "2.module.0.weight", "2.module.0.bias", "3.weight", "3.bias"]
    assert len(list(model.children())) == 4
    seen = []
    model.apply(lambda m: seen.append(type(m).__name__))
    assert seen[-1] == "Sequential" and seen[0] == "Linear"  # children first, as in torch
    model.eval()
    assert not any(m.training for m in model.modules())
    model.train()
    assert all(m.training for m in model.modules())
    model.requires_grad_(False)
    assert not any(p.requires_grad for p in model.parameters())


def test_apply_reinitializes_like_torch():
    model = lk_mlp()

    def init(m):
        if isinstance(m, lk.Linear):
            m.weight.data[...] = 0.5
            m.bias.data[...] = 0.0

    model.apply(init)
    assert all(np.all(m.weight.data == 0.5) for m in model.modules() if isinstance(m, lk.Linear))


def test_tied_parameters_yielded_once_but_saved_under_both_keys():
    shared = lk.Linear(3, 3)
    model = lk.Sequential(shared, lk.ReLU(), shared)
    assert len(list(model.parameters())) == 2
    assert list(model.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    t = torch.nn.Linear(3, 3)
    assert list(torch.nn.Sequential(t, torch.nn.ReLU(), t).state_dict()) == list(model.state_dict())
    encoder, decoder = lk.Linear(4, 2), lk.Linear(2, 4, bias=False)
    decoder.weight = encoder.weight  # tie a weight (shapes differ only by transpose elsewhere)
    assert sum(1 for _ in lk.Sequential(encoder, decoder).parameters()) == 2


def test_assignment_registers_and_none_placeholders():
    class Block(lk.Module):
        def __init__(self):
            super().__init__()
            self.fc = lk.Linear(2, 2)
            self.scale = lk.Parameter(np.ones(2, np.float32))
            self.register_buffer("count", np.zeros((), np.int64))
            self.note = "plain attribute"

    block = Block()
    assert list(block.state_dict()) == ["scale", "count", "fc.weight", "fc.bias"]
    with pytest.raises(TypeError, match="Parameter or None"):
        block.scale = np.ones(2)
    block.scale = None
    assert "scale" not in block.state_dict()

    class Broken(lk.Module):
        def __init__(self):
            self.fc = lk.Linear(2, 2)

    with pytest.raises(AttributeError, match=r"super\(\).__init__\(\)"):
        Broken()


def test_parameter_basics():
    p = lk.Parameter(np.zeros((2, 3), np.float32))
    assert p.shape == (2, 3) and p.dtype == np.float32 and p.numel() == 6
    assert np.asarray(p) is p.data
    with pytest.raises(TypeError, match="floating-point"):
        lk.Parameter(np.zeros(3, np.int64))


def test_to_dtype_converts_parameters():
    model = lk_mlp().to(np.float64)
    assert all(p.dtype == np.float64 for p in model.parameters())
    assert model(np.ones((1, 4))).dtype == np.float64


# ------------------------------------------------------------- custom modules (docs example)
class ResidualMLPBlock(lk.Module):
    """A residual MLP block ``x + fc2(gelu(fc1(x)))``, written by composing vjp closures."""

    def __init__(self, d, hidden, dtype=np.float32, rng=None):
        super().__init__()
        self.fc1 = lk.Linear(d, hidden, dtype=dtype, rng=rng)
        self.act = lk.GELU()
        self.fc2 = lk.Linear(hidden, d, dtype=dtype, rng=rng)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(x)))

    def vjp(self, x, input_grad=True):
        h, back1 = self.fc1.vjp(x, input_grad=input_grad)
        a, back_act = self.act.vjp(h)
        y, back2 = self.fc2.vjp(a)

        def backward(dy):
            dx = back1(back_act(back2(dy)))
            return dy + dx if input_grad else None

        return x + y, backward


def test_custom_module_composing_closures_matches_torch():
    rng = np.random.default_rng(0)
    block = ResidualMLPBlock(6, 12, dtype=np.float64, rng=rng)

    class TorchBlock(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.act, self.fc2 = torch.nn.Linear(6, 12), torch.nn.GELU(), torch.nn.Linear(12, 6)

        def forward(self, x):
            return x + self.fc2(self.act(self.fc1(x)))

    twin = TorchBlock().double()
    twin.load_state_dict({k: torch.from_numpy(v) for k, v in block.state_dict().items()})
    x = rng.standard_normal((3, 5, 6))
    dy = rng.standard_normal((3, 5, 6))
    y, backward = block.vjp(x)
    dx = backward(dy)
    xt = torch.from_numpy(x).requires_grad_()
    yt = twin(xt)
    yt.backward(torch.from_numpy(dy))
    torch.testing.assert_close(torch.from_numpy(y), yt.detach())
    torch.testing.assert_close(torch.from_numpy(dx), xt.grad)
    for name, p in block.named_parameters():
        torch.testing.assert_close(torch.from_numpy(p.grad), dict(twin.named_parameters())[name].grad)
    np.testing.assert_allclose(block(x), y)
    # The protocol checks apply to custom modules too.
    with pytest.raises(lk.BackwardError):
        backward(dy)
    with pytest.raises(lk.ShapeError, match="'fc1'"):
        block.vjp(np.ones((2, 7)))


def test_module_without_vjp_says_how_to_write_one():
    class NoVjp(lk.Module):
        def forward(self, x):
            return x

    with pytest.raises(NotImplementedError, match="compose your submodules' vjp closures"):
        NoVjp().vjp(np.ones(2))


# --------------------------------------------------------------------------------- anomaly
def test_detect_anomaly_names_first_module_forward_and_backward():
    model = lk.Sequential(lk.Linear(2, 2, dtype=np.float64), lk.ReLU(),
                          lk.Linear(2, 2, dtype=np.float64))
    model[2].weight.data[0, 0] = np.inf
    x = np.ones((1, 2))
    assert not np.isfinite(model(x)).all()  # off by default: IEEE propagation
    with lk.detect_anomaly():
        with pytest.raises(lk.AnomalyError, match=r"'2'.*forward"):
            model(x)
        with pytest.raises(lk.AnomalyError, match=r"'2'.*forward"):
            model.vjp(x)
    model[2].weight.data[0, 0] = 1.0
    with lk.detect_anomaly():
        _, backward = model.vjp(x)
        with pytest.raises(lk.AnomalyError, match=r"'2'.*backward"):
            backward(np.array([[np.nan, 0.0]]))
    assert not lk.anomaly.enabled
