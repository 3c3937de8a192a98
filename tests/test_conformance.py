"""The conformance harness: one table of module cases, generic tests run over every entry.

Each case builds a linearkit module and its independent reference (the PyTorch module, into
which the linearkit weights and buffers are copied). The generic tests check, per case:
forward vs torch (float32 and float64), gradients vs torch, float64 gradcheck, output and dx
shape/dtype (and vjp's y equal to forward's), parameter count, repr, state_dict keys and round
trip (ours and torch's), batched vs unbatched, and reuse of one module twice in a graph.

To cover a new module, add one ``Case`` to ``CASES``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

import linearkit as lk
from linearkit.analysis.gradcheck import gradcheck

torch = pytest.importorskip("torch")
tnn = torch.nn


class Residual(tnn.Module):
    """The torch reference for ``lk.Residual`` (torch has none); same name, so reprs compare."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return x + self.module(x)


@dataclass(frozen=True)
class Case:
    id: str
    make: Callable  # (dtype, rng) -> linearkit Module
    ref: Callable  # () -> torch.nn.Module with the same structure (weights are copied in)
    shape: tuple  # a batched input shape
    train: bool = True  # the mode both modules run in
    unbatched: bool = True  # x[0] (one sample, batch dim dropped) is a valid input


def _lin(i, o, bias=True):
    return lambda dt, rng: lk.Linear(i, o, bias, dtype=dt, rng=rng)


def _plain(cls, *args, **kwargs):
    """A module without parameters or dtype (activations, Flatten, Identity)."""
    return lambda dt, rng: cls(*args, **kwargs)


CASES = [
    Case("Linear", _lin(4, 3), lambda: tnn.Linear(4, 3), (5, 4)),
    Case("Linear-nobias", _lin(4, 3, False), lambda: tnn.Linear(4, 3, bias=False), (5, 4)),
    Case("Linear-3d", _lin(4, 3), lambda: tnn.Linear(4, 3), (2, 3, 4)),
    Case("LazyLinear", lambda dt, rng: lk.LazyLinear(3, dtype=dt, rng=rng),
         lambda: tnn.LazyLinear(3), (5, 4)),
    Case("Identity", _plain(lk.Identity), tnn.Identity, (5, 4)),
    Case("ReLU", _plain(lk.ReLU), tnn.ReLU, (5, 4)),
    Case("LeakyReLU", _plain(lk.LeakyReLU), tnn.LeakyReLU, (5, 4)),
    Case("LeakyReLU-0.2", _plain(lk.LeakyReLU, 0.2), lambda: tnn.LeakyReLU(0.2), (5, 4)),
    Case("GELU", _plain(lk.GELU), tnn.GELU, (5, 4)),
    Case("GELU-tanh", _plain(lk.GELU, "tanh"), lambda: tnn.GELU("tanh"), (5, 4)),
    Case("Tanh", _plain(lk.Tanh), tnn.Tanh, (5, 4)),
    Case("Sigmoid", _plain(lk.Sigmoid), tnn.Sigmoid, (5, 4)),
    Case("SiLU", _plain(lk.SiLU), tnn.SiLU, (5, 4)),
    Case("Softmax", _plain(lk.Softmax, dim=-1), lambda: tnn.Softmax(dim=-1), (5, 4)),
    Case("Softmax-dim1", _plain(lk.Softmax, dim=1), lambda: tnn.Softmax(dim=1), (2, 3, 4),
         unbatched=False),
    Case("LogSoftmax", _plain(lk.LogSoftmax, dim=-1), lambda: tnn.LogSoftmax(dim=-1), (5, 4)),
    Case("Dropout-p0-train", _plain(lk.Dropout, 0.0), lambda: tnn.Dropout(0.0), (5, 4)),
    Case("Dropout-eval", _plain(lk.Dropout, 0.5), lambda: tnn.Dropout(0.5), (5, 4),
         train=False),
    Case("LayerNorm", lambda dt, rng: lk.LayerNorm(4, dtype=dt), lambda: tnn.LayerNorm(4),
         (5, 4)),
    Case("LayerNorm-2d-noaffine",
         lambda dt, rng: lk.LayerNorm((3, 4), eps=1e-3, elementwise_affine=False, dtype=dt),
         lambda: tnn.LayerNorm((3, 4), eps=1e-3, elementwise_affine=False), (2, 3, 4)),
    Case("BatchNorm1d-NC-train", lambda dt, rng: lk.BatchNorm1d(4, dtype=dt),
         lambda: tnn.BatchNorm1d(4), (6, 4), unbatched=False),
    Case("BatchNorm1d-NC-eval", lambda dt, rng: lk.BatchNorm1d(4, dtype=dt),
         lambda: tnn.BatchNorm1d(4), (6, 4), train=False, unbatched=False),
    Case("BatchNorm1d-NCL-train", lambda dt, rng: lk.BatchNorm1d(3, momentum=None, dtype=dt),
         lambda: tnn.BatchNorm1d(3, momentum=None), (4, 3, 5), unbatched=False),
    Case("BatchNorm1d-NCL-eval", lambda dt, rng: lk.BatchNorm1d(3, dtype=dt),
         lambda: tnn.BatchNorm1d(3), (4, 3, 5), train=False, unbatched=False),
    Case("Flatten", _plain(lk.Flatten), tnn.Flatten, (2, 3, 4), unbatched=False),
    Case("Sequential",
         lambda dt, rng: lk.Sequential(lk.Linear(4, 8, dtype=dt, rng=rng), lk.ReLU(),
                                       lk.Linear(8, 3, dtype=dt, rng=rng)),
         lambda: tnn.Sequential(tnn.Linear(4, 8), tnn.ReLU(), tnn.Linear(8, 3)), (5, 4)),
    Case("Sequential-flatten",
         lambda dt, rng: lk.Sequential(lk.Flatten(), lk.Linear(6, 3, dtype=dt, rng=rng),
                                       lk.Tanh()),
         lambda: tnn.Sequential(tnn.Flatten(), tnn.Linear(6, 3), tnn.Tanh()), (4, 2, 3),
         unbatched=False),
    Case("Residual", lambda dt, rng: lk.Residual(lk.Linear(4, 4, dtype=dt, rng=rng)),
         lambda: Residual(tnn.Linear(4, 4)), (5, 4)),
    Case("Residual-block",
         lambda dt, rng: lk.Residual(lk.Sequential(
             lk.LayerNorm(4, dtype=dt), lk.Linear(4, 6, dtype=dt, rng=rng), lk.GELU(),
             lk.Dropout(0.0), lk.Linear(6, 4, dtype=dt, rng=rng))),
         lambda: Residual(tnn.Sequential(tnn.LayerNorm(4), tnn.Linear(4, 6), tnn.GELU(),
                                         tnn.Dropout(0.0), tnn.Linear(6, 4))), (5, 4)),
]

@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """The tensors here are tiny: torch's thread pool only adds wake-up latency (0.15 s per
    BatchNorm backward on a busy machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


TORCH_DTYPE = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}
both_dtypes = pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
each_case = pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])


# ----------------------------------------------------------------------------- helpers
def _x(case, dtype, seed=0):
    return np.random.default_rng(seed).standard_normal(case.shape).astype(dtype)


def build(case, dtype=np.float64, seed=0):
    """(module, x): the module in the case's mode, materialized by one call, with random
    parameters and float buffers (so default ones/zeros init cannot hide a bug)."""
    rng = np.random.default_rng(seed)
    module = case.make(np.dtype(dtype), rng).train(case.train)
    x = _x(case, dtype)
    module(x)
    for p in module.parameters():
        p.data[...] = rng.uniform(-1.0, 1.0, p.shape)
    for _, b in module.named_buffers():
        if b.dtype.kind == "f":
            b[...] = rng.uniform(0.5, 1.5, b.shape)
    return module, x


def pair(case, dtype, seed=0):
    """(module, ref, x): ``build``'s module and the torch reference of ``case`` in the same
    mode and dtype, materialized by the same call, holding the module's weights and buffers."""
    module, x = build(case, dtype, seed)
    ref = case.ref().to(TORCH_DTYPE[np.dtype(dtype)]).train(case.train)
    with torch.no_grad():
        ref(_t(x))
    ref.load_state_dict({k: _t(v) for k, v in module.state_dict().items()})
    return module, ref, x


def _t(a):
    return torch.from_numpy(np.array(a))


def assert_state_equal(module, ref):
    ours, theirs = module.state_dict(), ref.state_dict()
    assert list(ours) == list(theirs)
    for key in ours:
        torch.testing.assert_close(_t(ours[key]), theirs[key], msg=key)


def assert_grads_equal(module, ref, **tol):
    theirs = dict(ref.named_parameters())
    for name, p in module.named_parameters():
        assert p.grad is not None, f"{name} got no gradient"
        torch.testing.assert_close(_t(p.grad), theirs[name].grad, msg=name, **tol)


class Twice(lk.Module):
    """``m(x1) + m(x2)``: one module used twice in a graph, through two vjp closures."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x1, x2):
        return self.m(x1) + self.m(x2)

    def vjp(self, x1, x2, input_grad=True):
        y1, back1 = self.m.vjp(x1, input_grad=input_grad)
        y2, back2 = self.m.vjp(x2, input_grad=input_grad)
        return y1 + y2, lambda dy: (back1(dy), back2(dy))


# ----------------------------------------------------------------------------- generic tests
@each_case
@both_dtypes
def test_forward_matches_torch(case, dtype):
    module, ref, x = pair(case, dtype)
    y = module(x)
    torch.testing.assert_close(_t(y), ref(_t(x)))
    assert_state_equal(module, ref)  # running statistics updated alike


@each_case
@both_dtypes
def test_backward_matches_torch(case, dtype):
    module, ref, x = pair(case, dtype)
    y, backward = module.vjp(x)
    dy = np.random.default_rng(1).standard_normal(y.shape).astype(dtype)
    dx = backward(dy)
    xt = _t(x).requires_grad_(True)
    ref(xt).backward(_t(dy))
    torch.testing.assert_close(_t(dx), xt.grad)
    assert_grads_equal(module, ref)


@each_case
def test_gradcheck_float64(case):
    module, x = build(case, np.float64)
    gradcheck(module, x, raise_on_failure=True)


@each_case
@both_dtypes
def test_output_and_grad_shapes_and_dtypes(case, dtype):
    module, ref, x = pair(case, dtype)
    expected = tuple(ref(_t(x)).shape)
    y = module(x)
    y_vjp, backward = module.vjp(x)
    np.testing.assert_array_equal(y_vjp, y)  # vjp's forward is the forward
    assert y_vjp.shape == expected and y_vjp.dtype == dtype
    dx = backward(np.ones_like(y_vjp))
    assert dx.shape == x.shape and dx.dtype == dtype
    for name, p in module.named_parameters():
        assert p.grad.shape == p.shape and p.grad.dtype == p.dtype == dtype, name
    _, backward = module.vjp(x, input_grad=False)
    assert backward(np.ones_like(y_vjp)) is None


@each_case
def test_parameter_count_matches_torch(case):
    module, ref, _ = pair(case, np.float32)
    assert sum(p.size for p in module.parameters()) == sum(p.numel() for p in ref.parameters())
    assert [n for n, _ in module.named_parameters()] == [n for n, _ in ref.named_parameters()]


@each_case
def test_repr_matches_torch(case):
    module, ref, _ = pair(case, np.float32)
    assert repr(module) == repr(ref)


@each_case
def test_state_dict_keys_and_round_trip(case):
    module, ref, x = pair(case, np.float64)
    assert list(module.state_dict()) == list(case.ref().state_dict())
    for source in (module.state_dict(), ref.state_dict()):  # ours, and torch's tensors
        fresh = case.make(np.dtype(np.float64), np.random.default_rng(99))
        result = fresh.load_state_dict(source)
        assert list(result.missing_keys) == [] and list(result.unexpected_keys) == []
        module.eval()
        fresh.eval()
        np.testing.assert_array_equal(fresh(x), module(x))
        for key, value in fresh.state_dict().items():
            np.testing.assert_array_equal(np.asarray(value), np.asarray(source[key]), err_msg=key)


@pytest.mark.parametrize("case", [c for c in CASES if c.unbatched],
                         ids=[c.id for c in CASES if c.unbatched])
def test_batched_vs_unbatched(case):
    module, x = build(case, np.float64)
    dy = np.random.default_rng(1).standard_normal(module(x).shape)
    y, backward = module.vjp(x)
    full = np.zeros_like(dy)
    full[0] = dy[0]
    dx = backward(full)
    batched = {n: p.grad.copy() for n, p in module.named_parameters()}
    module.zero_grad()
    y0, backward0 = module.vjp(x[0])
    np.testing.assert_allclose(y0, y[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(backward0(dy[0]), dx[0], rtol=1e-12, atol=1e-12)
    for name, p in module.named_parameters():
        np.testing.assert_allclose(p.grad, batched[name], rtol=1e-12, atol=1e-12, err_msg=name)


@each_case
@both_dtypes
def test_reuse_twice_sums_gradients(case, dtype):
    module, ref, x1 = pair(case, dtype)
    x2 = _x(case, dtype, seed=2)
    y, backward = Twice(module).vjp(x1, x2)
    dy = np.random.default_rng(3).standard_normal(y.shape).astype(dtype)
    dx1, dx2 = backward(dy)
    t1, t2 = _t(x1).requires_grad_(True), _t(x2).requires_grad_(True)
    yt = ref(t1) + ref(t2)
    yt.backward(_t(dy))
    torch.testing.assert_close(_t(y), yt.detach())
    torch.testing.assert_close(_t(dx1), t1.grad)
    torch.testing.assert_close(_t(dx2), t2.grad)
    assert_grads_equal(module, ref)
    assert_state_equal(module, ref)


def test_every_shipped_module_has_a_case():
    """A new layer in linearkit.layers must come with a conformance entry."""
    from linearkit import layers

    covered = set()
    for case in CASES:
        module = case.make(np.dtype(np.float64), np.random.default_rng(0))
        covered.update(type(m).__name__ for m in module.modules())
    covered.update(c.id for c in CASES)
    assert set(layers.__all__) <= covered, set(layers.__all__) - covered
