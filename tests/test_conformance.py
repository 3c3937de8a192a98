"""The conformance harness: one table of module cases, generic tests run over every entry.

Each case builds a linearkit module and its independent reference (the PyTorch module, into
which the linearkit weights and buffers are copied). The generic tests check, per case:
forward vs torch (float32 and float64), gradients vs torch, float64 gradcheck, output and dx
shape/dtype (and vjp's y equal to forward's), parameter count, repr, state_dict keys and round
trip (ours and torch's), batched vs unbatched, and reuse of one module twice in a graph.

To cover a new module, add one ``ModuleCase`` to ``linearkit.analysis.cases.MODULE_CASES``
(``linearkit gradcheck`` runs over the same table).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import linearkit as lk
from linearkit.analysis.cases import MODULE_CASES, build, inputs
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


class LoRALinear(tnn.Module):
    """The torch reference for ``lk.LoRALinear``, written out (peft's formula and names):
    ``base_layer(x) + (alpha / r) * lora_B(lora_A(lora_dropout(x)))``."""

    def __init__(self, n_in, n_out, rank, alpha):
        super().__init__()
        self.rank, self.alpha, self.scaling = rank, alpha, alpha / rank
        self.base_layer = tnn.Linear(n_in, n_out)
        self.lora_dropout = tnn.Identity()
        self.lora_A = tnn.Linear(n_in, rank, bias=False)
        self.lora_B = tnn.Linear(rank, n_out, bias=False)

    def forward(self, x):
        return self.base_layer(x) + self.scaling * self.lora_B(self.lora_A(self.lora_dropout(x)))

    def extra_repr(self):
        return f"rank={self.rank}, alpha={self.alpha}, scaling={self.scaling:g}"


class SparseLinear(tnn.Module):
    """The torch reference for ``lk.SparseLinear``: the CSR weight scattered into a dense one
    (``index_put``, differentiable in the stored values), then ``F.linear``."""

    def __init__(self, n_in, n_out, nnz):
        super().__init__()
        self.in_features, self.out_features, self.nnz = n_in, n_out, nnz
        self.weight_values = tnn.Parameter(torch.zeros(nnz))
        self.bias = tnn.Parameter(torch.zeros(n_out))
        # a valid placeholder pattern (everything in row 0) until the state dict is loaded
        self.register_buffer("weight_indices", torch.arange(nnz, dtype=torch.int32) % n_in)
        indptr = torch.full((n_out + 1,), nnz, dtype=torch.int32)
        indptr[0] = 0
        self.register_buffer("weight_indptr", indptr)

    def forward(self, x):
        counts = torch.diff(self.weight_indptr.long())
        rows = torch.repeat_interleave(torch.arange(self.out_features), counts)
        dense = torch.zeros(self.out_features, self.in_features, dtype=self.weight_values.dtype)
        dense = dense.index_put((rows, self.weight_indices.long()), self.weight_values)
        return tnn.functional.linear(x, dense, self.bias)

    def extra_repr(self):
        density = self.nnz / (self.in_features * self.out_features)
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"nnz={self.nnz}, density={density:.3g}, bias=True")


class LoopList(tnn.Module):
    """The torch reference for ``linearkit.analysis.case_modules.LoopList``: ``tanh(layer(x))``
    for each layer of an ``nn.ModuleList``, in order."""

    def __init__(self, widths=(4, 6, 3)):
        super().__init__()
        self.layers = tnn.ModuleList([tnn.Linear(a, b) for a, b in itertools.pairwise(widths)])
        self.act = tnn.Tanh()

    def forward(self, x):
        for layer in self.layers:
            x = self.act(layer(x))
        return x


class HeadsDict(tnn.Module):
    """The torch reference for ``linearkit.analysis.case_modules.HeadsDict``: each head of an
    ``nn.ModuleDict`` on the input, concatenated in key order."""

    def __init__(self, in_features=4, outs=(("mean", 2), ("scale", 3))):
        super().__init__()
        self.heads = tnn.ModuleDict({name: tnn.Linear(in_features, n) for name, n in outs})

    def forward(self, x):
        return torch.cat([head(x) for head in self.heads.values()], dim=-1)


class _TorchNamespace:
    """``torch.nn`` plus the references torch lacks (``Residual``, ``LoRALinear`` written out,
    ``SparseLinear`` densified, the users' modules around a ModuleList / ModuleDict), for the
    case table's ``ref(nn)``."""

    Residual = Residual
    LoRALinear = LoRALinear
    SparseLinear = SparseLinear
    LoopList = LoopList
    HeadsDict = HeadsDict

    def __getattr__(self, name):
        return getattr(tnn, name)


TNN = _TorchNamespace()
CASES = MODULE_CASES


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
def pair(case, dtype, seed=0):
    """(module, ref, xs): ``build``'s module and the torch reference of ``case`` in the same
    mode and dtype, materialized by the same call, holding the module's weights and buffers;
    ``xs`` the tuple of inputs (one array, or two for Bilinear)."""
    module, *xs = build(case, dtype, seed)
    ref = case.ref(TNN).to(TORCH_DTYPE[np.dtype(dtype)]).train(case.train)
    with torch.no_grad():
        ref(*_ts(xs))
    ref.load_state_dict({k: _t(v) for k, v in module.state_dict().items()})
    return module, ref, tuple(xs)


def _t(a):
    return torch.from_numpy(np.array(a))


def _ts(xs, grad=False) -> tuple:
    """The inputs as torch tensors (leaves that require grad, with ``grad``)."""
    return tuple(_t(x).requires_grad_(grad) for x in xs)


def _grads(dx) -> tuple:
    """A backward's input gradients as a tuple: a module of several inputs returns a tuple,
    a one-input module its one array."""
    return dx if isinstance(dx, tuple) else (dx,)


def assert_input_grads_equal(dxs, ts):
    assert len(dxs) == len(ts)
    for i, (dx, t) in enumerate(zip(dxs, ts)):
        torch.testing.assert_close(_t(dx), t.grad, msg=f"input {i}")


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
    """``m(*a) + m(*b)``: one module used twice in a graph, through two vjp closures; the
    first ``n`` inputs are the first call's, the rest the second's. The backward returns every
    input's gradient, in order."""

    def __init__(self, m, n=1):
        super().__init__()
        self.m, self.n = m, n

    def forward(self, *xs):
        return self.m(*xs[:self.n]) + self.m(*xs[self.n:])

    def vjp(self, *xs, input_grad=True):
        y1, back1 = self.m.vjp(*xs[:self.n], input_grad=input_grad)
        y2, back2 = self.m.vjp(*xs[self.n:], input_grad=input_grad)
        return y1 + y2, lambda dy: (*_grads(back1(dy)), *_grads(back2(dy)))


# ----------------------------------------------------------------------------- generic tests
@each_case
@both_dtypes
def test_forward_matches_torch(case, dtype):
    module, ref, xs = pair(case, dtype)
    y = module(*xs)
    torch.testing.assert_close(_t(y), ref(*_ts(xs)))
    assert_state_equal(module, ref)  # running statistics updated alike


@each_case
@both_dtypes
def test_backward_matches_torch(case, dtype):
    module, ref, xs = pair(case, dtype)
    y, backward = module.vjp(*xs)
    dy = np.random.default_rng(1).standard_normal(y.shape).astype(dtype)
    dxs = _grads(backward(dy))
    ts = _ts(xs, grad=True)
    ref(*ts).backward(_t(dy))
    assert_input_grads_equal(dxs, ts)
    assert_grads_equal(module, ref)


@each_case
def test_gradcheck_float64(case):
    module, *xs = build(case, np.float64)
    gradcheck(module, *xs, raise_on_failure=True)


@each_case
@both_dtypes
def test_output_and_grad_shapes_and_dtypes(case, dtype):
    module, ref, xs = pair(case, dtype)
    expected = tuple(ref(*_ts(xs)).shape)
    y = module(*xs)
    y_vjp, backward = module.vjp(*xs)
    np.testing.assert_array_equal(y_vjp, y)  # vjp's forward is the forward
    assert y_vjp.shape == expected and y_vjp.dtype == dtype
    dxs = _grads(backward(np.ones_like(y_vjp)))
    assert [dx.shape for dx in dxs] == [x.shape for x in xs]
    assert all(dx.dtype == dtype for dx in dxs)
    for name, p in module.named_parameters():
        assert p.grad.shape == p.shape and p.grad.dtype == p.dtype == dtype, name
    _, backward = module.vjp(*xs, input_grad=False)
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
    module, ref, xs = pair(case, np.float64)
    assert list(module.state_dict()) == list(case.ref(TNN).state_dict())
    for source in (module.state_dict(), ref.state_dict()):  # ours, and torch's tensors
        fresh = case.make(np.dtype(np.float64), np.random.default_rng(99))
        result = fresh.load_state_dict(source)
        assert list(result.missing_keys) == [] and list(result.unexpected_keys) == []
        module.eval()
        fresh.eval()
        np.testing.assert_array_equal(fresh(*xs), module(*xs))
        for key, value in fresh.state_dict().items():
            np.testing.assert_array_equal(np.asarray(value), np.asarray(source[key]), err_msg=key)


@pytest.mark.parametrize("case", [c for c in CASES if c.unbatched],
                         ids=[c.id for c in CASES if c.unbatched])
def test_batched_vs_unbatched(case):
    module, *xs = build(case, np.float64)
    dy = np.random.default_rng(1).standard_normal(module(*xs).shape)
    y, backward = module.vjp(*xs)
    full = np.zeros_like(dy)
    full[0] = dy[0]
    dxs = _grads(backward(full))
    batched = {n: p.grad.copy() for n, p in module.named_parameters()}
    module.zero_grad()
    y0, backward0 = module.vjp(*(x[0] for x in xs))
    np.testing.assert_allclose(y0, y[0], rtol=1e-12, atol=1e-12)
    for dx0, dx in zip(_grads(backward0(dy[0])), dxs, strict=True):
        np.testing.assert_allclose(dx0, dx[0], rtol=1e-12, atol=1e-12)
    for name, p in module.named_parameters():
        np.testing.assert_allclose(p.grad, batched[name], rtol=1e-12, atol=1e-12, err_msg=name)


@each_case
@both_dtypes
def test_reuse_twice_sums_gradients(case, dtype):
    module, ref, xs1 = pair(case, dtype)
    xs2 = inputs(case, dtype, seed=2)
    y, backward = Twice(module, len(xs1)).vjp(*xs1, *xs2)
    dy = np.random.default_rng(3).standard_normal(y.shape).astype(dtype)
    dxs = backward(dy)
    t1, t2 = _ts(xs1, grad=True), _ts(xs2, grad=True)
    yt = ref(*t1) + ref(*t2)
    yt.backward(_t(dy))
    torch.testing.assert_close(_t(y), yt.detach())
    assert_input_grads_equal(dxs, t1 + t2)
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
    # QuantizedLinear has no backward (int8 storage, inference only: its vjp refuses, and
    # tests/test_transforms_quantize.py checks it against torch's quantization). ModuleList
    # and ModuleDict have no forward, as in torch: their cases wrap them in a user's module.
    shipped = {name for name in layers.__all__ if isinstance(getattr(layers, name), type)
               and issubclass(getattr(layers, name), lk.Module)} - {"QuantizedLinear"}
    assert shipped <= covered, shipped - covered


# ----------------------------------------------------------------------------- freezing
WITH_PARAMS = [c for c in CASES if any(True for _ in build(c)[0].parameters())]
each_case_with_params = pytest.mark.parametrize("case", WITH_PARAMS,
                                                ids=[c.id for c in WITH_PARAMS])


class _GemmShapes:
    """The output shapes of every np.matmul linearkit.functional runs while installed."""

    def __init__(self, monkeypatch):
        from linearkit import functional as F

        self.shapes, real = [], np.matmul

        def counted(*args, **kwargs):
            out = real(*args, **kwargs)
            self.shapes.append(out.shape)
            return out

        monkeypatch.setattr(F.np, "matmul", counted)


@each_case_with_params
def test_a_frozen_parameter_gets_no_gradient_and_costs_no_gemm(case, monkeypatch):
    names = [n for n, _ in build(case)[0].named_parameters()]
    for frozen in names:
        module, ref, xs = pair(case, np.float64)
        dict(module.named_parameters())[frozen].requires_grad = False
        dict(ref.named_parameters())[frozen].requires_grad_(False)
        y, backward = module.vjp(*xs)
        dy = np.random.default_rng(1).standard_normal(y.shape)
        gemms = _GemmShapes(monkeypatch)
        dxs = _grads(backward(dy))
        monkeypatch.undo()
        ts = _ts(xs, grad=True)
        ref(*ts).backward(_t(dy))
        assert_input_grads_equal(dxs, ts)
        for name, p in module.named_parameters():
            if name == frozen:
                assert p.grad is None, f"frozen {name} got a gradient"
                if p.ndim == 2:  # a Linear weight: its dW GEMM must not run
                    assert p.shape not in gemms.shapes, f"dW GEMM of frozen {name} ran"
            else:
                torch.testing.assert_close(_t(p.grad), dict(ref.named_parameters())[name].grad)


@each_case_with_params
def test_what_to_differentiate_is_fixed_when_the_forward_runs(case):
    module, *xs = build(case)
    y, backward = module.vjp(*xs)
    dy = np.random.default_rng(1).standard_normal(y.shape)
    module.requires_grad_(False)  # frozen between vjp and backward: this backward still writes
    backward(dy)
    expected = {n: p.grad.copy() for n, p in module.named_parameters()}
    assert all(g is not None for g in expected.values())
    module.zero_grad()
    module.requires_grad_(True)
    _, backward = module.vjp(*xs)
    backward(dy)
    for name, p in module.named_parameters():
        np.testing.assert_array_equal(p.grad, expected[name], err_msg=name)
    module.zero_grad()
    module.requires_grad_(False)
    _, backward = module.vjp(*xs)
    module.requires_grad_(True)  # unfrozen after the forward: this backward writes nothing
    backward(dy)
    assert all(p.grad is None for p in module.parameters())


@each_case
def test_a_backward_closure_runs_once(case):
    module, *xs = build(case)
    y, backward = module.vjp(*xs)
    backward(np.ones_like(y))
    with pytest.raises(lk.BackwardError, match="already called"):
        backward(np.ones_like(y))
