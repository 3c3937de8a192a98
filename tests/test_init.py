"""linearkit.init against torch.nn.init: distributions (two-sample KS), formulas, errors.

Every random test uses fixed seeds for both libraries, so a pass is deterministic. A KS test
"passes" when it does not reject equality of distributions at p = 1e-3.
"""

import math
import warnings

import numpy as np
import pytest
import torch
from scipy import stats
from torch.nn import init as tinit

import linearkit as lk
from linearkit import init

P_MIN = 1e-3
N = 20_000  # samples per side for a KS test

SHAPES = [(64, 32), (17, 300), (300, 17), (32, 16, 3, 3), (8, 4, 5)]  # 2-D, non-square, conv
SHAPES_2D = [s for s in SHAPES if len(s) == 2]


def draw_ours(fn, shape, n=N, seed=0, **kw):
    """Flattened samples of ``fn`` on float32 arrays of ``shape``, at least ``n`` of them."""
    rng = np.random.default_rng(seed)
    out = []
    while sum(a.size for a in out) < n:
        out.append(fn(np.empty(shape, np.float32), rng=rng, **kw).ravel())
    return np.concatenate(out)


def draw_torch(fn, shape, n=N, seed=0, **kw):
    gen = torch.Generator().manual_seed(seed)
    out = []
    while sum(a.size for a in out) < n:
        out.append(fn(torch.empty(shape), generator=gen, **kw).numpy().ravel())
    return np.concatenate(out)


def assert_same_distribution(x, y):
    p = stats.ks_2samp(x, y).pvalue
    assert p > P_MIN, f"KS test rejects: p = {p:.2e} (ours n={x.size}, torch n={y.size})"


def fans(shape):
    """Independent restatement of PyTorch's fan rule, for the formula checks."""
    rf = math.prod(shape[2:])
    return shape[1] * rf, shape[0] * rf


# ------------------------------------------------------------------------ distributions vs torch
UNIFORM_LIKE = [  # (ours, torch's, kwargs, bound as a function of shape)
    (init.uniform_, tinit.uniform_, {}, None),
    (init.uniform_, tinit.uniform_, {"a": -0.3, "b": 0.7}, None),
    (init.xavier_uniform_, tinit.xavier_uniform_, {},
     lambda s: math.sqrt(6 / sum(fans(s)))),
    (init.xavier_uniform_, tinit.xavier_uniform_, {"gain": 5 / 3},
     lambda s: 5 / 3 * math.sqrt(6 / sum(fans(s)))),
    (init.kaiming_uniform_, tinit.kaiming_uniform_, {},  # a=0: leaky_relu's gain is sqrt(2)
     lambda s: math.sqrt(2) * math.sqrt(3 / fans(s)[0])),
    (init.kaiming_uniform_, tinit.kaiming_uniform_, {"a": math.sqrt(5)},
     lambda s: 1 / math.sqrt(fans(s)[0])),
    (init.kaiming_uniform_, tinit.kaiming_uniform_, {"mode": "fan_out", "nonlinearity": "relu"},
     lambda s: math.sqrt(2) * math.sqrt(3 / fans(s)[1])),
    (init.kaiming_uniform_, tinit.kaiming_uniform_, {"nonlinearity": "tanh"},
     lambda s: 5 / 3 * math.sqrt(3 / fans(s)[0])),
]

NORMAL_LIKE = [  # (ours, torch's, kwargs, std as a function of shape)
    (init.normal_, tinit.normal_, {}, lambda s: 1.0),
    (init.normal_, tinit.normal_, {"mean": 0.5, "std": 0.02}, lambda s: 0.02),
    (init.xavier_normal_, tinit.xavier_normal_, {}, lambda s: math.sqrt(2 / sum(fans(s)))),
    (init.xavier_normal_, tinit.xavier_normal_, {"gain": math.sqrt(2)},
     lambda s: math.sqrt(2) * math.sqrt(2 / sum(fans(s)))),
    (init.kaiming_normal_, tinit.kaiming_normal_, {"nonlinearity": "relu"},
     lambda s: math.sqrt(2) / math.sqrt(fans(s)[0])),
    (init.kaiming_normal_, tinit.kaiming_normal_,
     {"a": 0.2, "mode": "fan_out", "nonlinearity": "leaky_relu"},
     lambda s: math.sqrt(2 / 1.04) / math.sqrt(fans(s)[1])),
    (init.kaiming_normal_, tinit.kaiming_normal_, {"nonlinearity": "selu"},
     lambda s: 0.75 / math.sqrt(fans(s)[0])),
]


def _id(case):
    return f"{case[0].__name__}{case[2] or ''}"


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("case", UNIFORM_LIKE, ids=_id)
def test_uniform_family_matches_torch_and_formula(case, shape):
    ours, theirs, kw, bound_of = case
    x = draw_ours(ours, shape, **kw)
    assert_same_distribution(x, draw_torch(theirs, shape, **kw))
    lo, hi = (kw.get("a", 0.0), kw.get("b", 1.0)) if bound_of is None else (
        -bound_of(shape), bound_of(shape))
    assert x.min() >= np.float32(lo) and x.max() <= np.float32(hi)
    width = hi - lo  # the extremes come close to the bounds, the spread is the uniform's
    assert x.min() < lo + 0.01 * width and x.max() > hi - 0.01 * width
    assert x.std() == pytest.approx(width / math.sqrt(12), rel=0.03)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("case", NORMAL_LIKE, ids=_id)
def test_normal_family_matches_torch_and_formula(case, shape):
    ours, theirs, kw, std_of = case
    x = draw_ours(ours, shape, **kw)
    assert_same_distribution(x, draw_torch(theirs, shape, **kw))
    std = std_of(shape)
    assert x.std() == pytest.approx(std, rel=0.03)
    assert abs(x.mean() - kw.get("mean", 0.0)) < 5 * std / math.sqrt(x.size)


@pytest.mark.parametrize("shape", [(64, 32), (32, 16, 3, 3)])
@pytest.mark.parametrize("kw", [{}, {"mean": 0.0, "std": 0.02}, {"mean": 1.0, "std": 2.0},
                                {"mean": 0.0, "std": 1.0, "a": -0.5, "b": 3.0},
                                {"mean": 0.0, "std": 1.0, "a": 0.5, "b": 2.5}], ids=str)
def test_trunc_normal_matches_torch_and_stays_in_bounds(kw, shape):
    x = draw_ours(init.trunc_normal_, shape, **kw)
    assert_same_distribution(x, draw_torch(tinit.trunc_normal_, shape, **kw))
    a, b = kw.get("a", -2.0), kw.get("b", 2.0)
    assert x.min() >= a and x.max() <= b
    mean, std = kw.get("mean", 0.0), kw.get("std", 1.0)
    ref = stats.truncnorm((a - mean) / std, (b - mean) / std, loc=mean, scale=std)
    assert x.std() == pytest.approx(ref.std(), rel=0.03)


@pytest.mark.parametrize("a, b", [(3.0, 4.0), (5.0, math.inf), (-math.inf, -6.0), (40.0, 40.5),
                                  (-0.01, 0.02), (0.6, 9.0), (-3.0, -2.99), (30.0, 30.01),
                                  (-1e-7, 1e-7)])
def test_trunc_normal_is_exact_in_far_tails(a, b):
    # Where torch's float32 inverse CDF degrades (and it warns), ours is still exact: one-sample
    # KS against scipy's truncated normal, float64 so rounding cannot hide a bias.
    x = init.trunc_normal_(np.empty(N), a=a, b=b, rng=3)
    assert x.min() >= a and x.max() <= b
    p = stats.kstest(x, stats.truncnorm(a, b).cdf).pvalue
    assert p > P_MIN


@pytest.mark.parametrize("shape", [(64, 32), (20, 50), (8, 4, 3, 3), (5, 5)])
def test_orthogonal_matches_torch_distribution(shape):
    x = draw_ours(init.orthogonal_, shape, n=10_000, gain=1.5)
    assert_same_distribution(x, draw_torch(tinit.orthogonal_, shape, n=10_000, gain=1.5))


@pytest.mark.parametrize("gain", [1.0, 2.5])
@pytest.mark.parametrize("shape", [(64, 32), (32, 64), (7, 7), (8, 4, 3, 3), (40, 2, 3)])
def test_orthogonal_is_gain_times_orthogonal(shape, gain):
    w = init.orthogonal_(np.empty(shape), gain=gain, rng=0)
    m = w.reshape(shape[0], -1)
    gram = m.T @ m if m.shape[0] >= m.shape[1] else m @ m.T
    np.testing.assert_allclose(gram, gain**2 * np.eye(len(gram)), atol=1e-10)
    w32 = init.orthogonal_(np.empty(shape, np.float32), gain=gain, rng=0)
    np.testing.assert_allclose(w32, w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("sparsity", [0.0, 0.1, 0.33, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("shape", [(10, 40), (7, 3), (1, 5)])
def test_sparse_zeros_per_column_match_torch(shape, sparsity):
    ours = init.sparse_(np.empty(shape, np.float32), sparsity, rng=0)
    theirs = tinit.sparse_(torch.empty(shape), sparsity, generator=torch.Generator().manual_seed(0))
    np.testing.assert_array_equal((ours == 0).sum(0), (theirs.numpy() == 0).sum(0))
    assert ((ours == 0).sum(0) == math.ceil(sparsity * shape[0])).all()


def test_sparse_zeros_are_spread_and_nonzeros_match_torch():
    shape, sparsity, std = (50, 40), 0.3, 0.05
    x = draw_ours(init.sparse_, shape, sparsity=sparsity, std=std)
    y = draw_torch(tinit.sparse_, shape, sparsity=sparsity, std=std)
    assert_same_distribution(x[x != 0], y[y != 0])
    assert x[x != 0].std() == pytest.approx(std, rel=0.03)
    # every row gets zeroed about equally often: independent random rows per column
    zeros_per_row = (init.sparse_(np.empty((10, 5000)), 0.3, rng=1) == 0).sum(1)
    assert zeros_per_row.min() > 0.25 * 5000 and zeros_per_row.max() < 0.35 * 5000


def test_sparse_stays_dense():
    w = np.empty((100, 100), np.float32)
    out = init.sparse_(w, 0.9, rng=0)
    assert out is w and type(out) is np.ndarray and out.nbytes == 100 * 100 * 4
    doc = " ".join(init.sparse_.__doc__.split())
    assert "still a **dense** ndarray" in doc and "no memory or compute is saved" in doc


# ---------------------------------------------------------------------------- deterministic fills
@pytest.mark.parametrize("shape", [(3, 3), (3, 5), (5, 3), (1, 4), (0, 3)])
def test_eye_matches_torch(shape):
    ours = init.eye_(np.full(shape, 7.0, np.float32))
    np.testing.assert_array_equal(ours, tinit.eye_(torch.full(shape, 7.0)).numpy())
    p = lk.Parameter(np.full(shape, 7.0))
    assert init.eye_(p) is p
    np.testing.assert_array_equal(p.data, np.eye(*shape))


def test_eye_on_a_strided_view_writes_through():
    base = np.full((6, 8), 5.0)
    init.eye_(base[::2, 1::2])
    np.testing.assert_array_equal(base[::2, 1::2], np.eye(3, 4))
    assert (base[1::2] == 5).all()


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 4), (5,)])
def test_constant_zeros_ones_match_torch(shape):
    for ours, theirs, args in [(init.constant_, tinit.constant_, (0.25,)),
                               (init.zeros_, tinit.zeros_, ()), (init.ones_, tinit.ones_, ())]:
        a = ours(np.full(shape, 9.0, np.float32), *args)
        np.testing.assert_array_equal(a, theirs(torch.full(shape, 9.0), *args).numpy())


# ---------------------------------------------------------------------------- gain and fans
NONLINEARITIES = ["linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
                  "conv_transpose2d", "conv_transpose3d", "sigmoid", "tanh", "relu",
                  "leaky_relu", "selu"]


@pytest.mark.parametrize("nonlinearity", NONLINEARITIES)
def test_calculate_gain_matches_torch(nonlinearity):
    assert init.calculate_gain(nonlinearity) == tinit.calculate_gain(nonlinearity)


@pytest.mark.parametrize("param", [None, 0, 0.01, 0.2, 1, 3, -0.5, math.sqrt(5)])
def test_calculate_gain_leaky_relu_param_matches_torch(param):
    got = init.calculate_gain("leaky_relu", param)
    assert got == pytest.approx(tinit.calculate_gain("leaky_relu", param), rel=1e-15)
    slope = 0.01 if param is None else param
    assert got == pytest.approx(math.sqrt(2 / (1 + slope**2)), rel=1e-15)


def test_calculate_gain_errors():
    with pytest.raises(ValueError, match=r"Unsupported nonlinearity 'gelu'.*'relu'"):
        init.calculate_gain("gelu")
    with pytest.raises(ValueError):
        tinit.calculate_gain("gelu")
    for bad in [True, "0.1", [0.1]]:
        with pytest.raises(ValueError, match="negative_slope .* not a valid number"):
            init.calculate_gain("leaky_relu", bad)
        with pytest.raises(ValueError):
            tinit.calculate_gain("leaky_relu", bad)


@pytest.mark.parametrize("shape", [(3, 4), (4, 3), (16, 8, 3, 3), (2, 3, 4), (0, 3), (5, 0, 2),
                                   (2, 3, 4, 5, 6), (1, 1)])
def test_fan_in_and_fan_out_matches_torch(shape):
    expected = tinit._calculate_fan_in_and_fan_out(torch.empty(shape))
    assert init.fan_in_and_fan_out(np.empty(shape)) == expected
    assert init.fan_in_and_fan_out(shape) == expected
    assert init.fan_in_and_fan_out(list(shape)) == expected
    assert init.fan_in_and_fan_out(lk.Parameter(np.empty(shape))) == expected
    assert init.fan_in_and_fan_out(torch.empty(shape)) == expected
    assert init.fan_in_and_fan_out(shape) == fans(shape)


def test_fan_in_and_fan_out_linear_weight():
    assert init.fan_in_and_fan_out(lk.Linear(7, 3).weight) == (7, 3)


@pytest.mark.parametrize("shape", [(3,), (), 5])
def test_fan_needs_two_dimensions(shape):
    with pytest.raises(ValueError, match="fewer than 2 dimensions"):
        init.fan_in_and_fan_out(shape)
    with pytest.raises(ValueError, match="fewer than 2 dimensions"):
        tinit._calculate_fan_in_and_fan_out(torch.empty(shape))


# ---------------------------------------------------------------------------- contract
RANDOM_FNS = {  # name -> (call on an array with an rng)
    "uniform_": lambda t, rng: init.uniform_(t, -1, 2, rng=rng),
    "normal_": lambda t, rng: init.normal_(t, 1, 3, rng=rng),
    "trunc_normal_": lambda t, rng: init.trunc_normal_(t, std=0.5, rng=rng),
    "xavier_uniform_": lambda t, rng: init.xavier_uniform_(t, rng=rng),
    "xavier_normal_": lambda t, rng: init.xavier_normal_(t, rng=rng),
    "kaiming_uniform_": lambda t, rng: init.kaiming_uniform_(t, rng=rng),
    "kaiming_normal_": lambda t, rng: init.kaiming_normal_(t, rng=rng),
    "orthogonal_": lambda t, rng: init.orthogonal_(t, rng=rng),
    "sparse_": lambda t, rng: init.sparse_(t, 0.5, rng=rng),
}
ALL_FNS = dict(RANDOM_FNS, constant_=lambda t, rng: init.constant_(t, 0.5),
               zeros_=lambda t, rng: init.zeros_(t), ones_=lambda t, rng: init.ones_(t),
               eye_=lambda t, rng: init.eye_(t))


def test_every_public_function_is_tested_and_named_like_torch():
    assert set(ALL_FNS) | {"calculate_gain", "fan_in_and_fan_out"} == set(init.__all__)
    for name in ALL_FNS:
        assert hasattr(tinit, name), name


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("name", list(ALL_FNS))
def test_in_place_returns_input_and_keeps_dtype(name, dtype):
    fn = ALL_FNS[name]
    a = np.full((6, 4), np.nan, dtype)
    assert fn(a, 0) is a and a.dtype == dtype and np.isfinite(a).all()
    p = lk.Parameter(np.full((6, 4), np.nan, dtype))
    buffer = p.data
    assert fn(p, 0) is p and p.data is buffer and p.dtype == dtype
    np.testing.assert_array_equal(p.data, a)  # same rng seed -> same values


@pytest.mark.parametrize("name", list(RANDOM_FNS))
def test_same_seed_same_values_and_global_numpy_untouched(name):
    fn = RANDOM_FNS[name]
    state = np.random.get_state()[1].copy()
    a = fn(np.empty((8, 5)), np.random.default_rng(7))
    b = fn(np.empty((8, 5)), np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, fn(np.empty((8, 5)), np.random.default_rng(8)))
    lk.manual_seed(11)
    c = fn(np.empty((8, 5)), None)
    lk.manual_seed(11)
    np.testing.assert_array_equal(c, fn(np.empty((8, 5)), None))
    np.testing.assert_array_equal(np.random.get_state()[1], state)


@pytest.mark.parametrize("name", list(RANDOM_FNS))
def test_random_init_refuses_integer_arrays_and_non_arrays(name):
    with pytest.raises(TypeError, match="floating-point"):
        RANDOM_FNS[name](np.zeros((4, 3), np.int64), 0)
    with pytest.raises(TypeError, match="Parameter or a numpy.ndarray"):
        RANDOM_FNS[name]([[0.0, 0.0], [0.0, 0.0]], 0)


@pytest.mark.parametrize("name", ["xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
                                  "kaiming_normal_"])
@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (2, 0, 3)])
def test_zero_element_is_a_no_op_with_warning(name, shape):
    with pytest.warns(UserWarning, match="zero-element"):
        a = RANDOM_FNS[name](np.empty(shape), 0)
    assert a.shape == shape


@pytest.mark.parametrize("name", ["xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
                                  "kaiming_normal_", "orthogonal_"])
def test_fan_based_init_needs_two_dimensions(name):
    with pytest.raises(ValueError, match="2 .*dimensions"):
        RANDOM_FNS[name](np.empty(5), 0)
    with pytest.raises(ValueError):
        getattr(tinit, name)(torch.empty(5))


def test_orthogonal_empty_is_silent_no_op():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert init.orthogonal_(np.empty((0, 4)), rng=0).shape == (0, 4)


@pytest.mark.parametrize("fn", [init.kaiming_uniform_, init.kaiming_normal_])
def test_kaiming_errors(fn):
    with pytest.raises(ValueError, match=r"Mode fan_avg not supported.*'fan_in', 'fan_out'"):
        fn(np.empty((3, 4)), mode="fan_avg", rng=0)
    with pytest.raises(ValueError):
        getattr(tinit, fn.__name__)(torch.empty(3, 4), mode="fan_avg")
    with pytest.raises(ValueError, match="Unsupported nonlinearity"):
        fn(np.empty((3, 4)), nonlinearity="swish", rng=0)
    w = fn(np.empty((300, 400)), mode="FAN_OUT", nonlinearity="relu", rng=0)  # case-insensitive
    assert w.std() == pytest.approx(math.sqrt(2 / 300), rel=0.03)


@pytest.mark.parametrize("fn", [init.eye_, lambda t: init.sparse_(t, 0.5, rng=0)])
@pytest.mark.parametrize("shape", [(3,), (2, 3, 4)])
def test_eye_and_sparse_are_2d_only(fn, shape):
    with pytest.raises(ValueError, match=r"only 2-D arrays .*got an array of shape"):
        fn(np.empty(shape))


def test_argument_errors():
    with pytest.raises(ValueError, match="a <= b"):
        init.uniform_(np.empty(3), 1, 0, rng=0)
    with pytest.raises(RuntimeError):
        tinit.uniform_(torch.empty(3), 1, 0)
    with pytest.raises(ValueError, match="std >= 0"):
        init.normal_(np.empty(3), 0, -1, rng=0)
    with pytest.raises(RuntimeError):
        tinit.normal_(torch.empty(3), 0, -1)
    with pytest.raises(ValueError, match="a <= b"):
        init.trunc_normal_(np.empty(3), a=2, b=-2, rng=0)
    with pytest.raises(ValueError, match="std > 0"):
        init.trunc_normal_(np.empty(3), std=0, rng=0)
    for sparsity in [-0.1, 1.5, math.nan]:
        with pytest.raises(ValueError, match=r"sparsity in \[0, 1\]"):
            init.sparse_(np.empty((3, 4)), sparsity, rng=0)
    with pytest.raises(TypeError, match="rng must be"):
        init.normal_(np.empty(3), rng="seed")
    # a degenerate interval is a constant, as in torch
    np.testing.assert_array_equal(init.trunc_normal_(np.empty(3), a=0.5, b=0.5, rng=0), 0.5)


# ---------------------------------------------------------------------------- Linear and apply
@pytest.mark.parametrize("in_features", [100, 7])
def test_linear_default_init_matches_torch(in_features):
    out_features = 40_000 // in_features
    torch.manual_seed(0)
    twin = torch.nn.Linear(in_features, out_features)
    layer = lk.Linear(in_features, out_features, rng=np.random.default_rng(0))
    w, b = layer.weight.data, layer.bias.data
    assert_same_distribution(w.ravel(), twin.weight.detach().numpy().ravel())
    assert_same_distribution(b, twin.bias.detach().numpy())
    bound = 1 / math.sqrt(in_features)  # weight AND bias: U(-1/sqrt(in), 1/sqrt(in))
    for v in (w, b):
        assert np.abs(v).max() <= np.float32(bound) and np.abs(v).max() > 0.98 * bound
        assert v.std() == pytest.approx(bound / math.sqrt(3), rel=0.05)


def test_kaiming_uniform_sqrt5_is_linears_default_weight():
    layer = lk.Linear(30, 20, rng=np.random.default_rng(5))
    w = init.kaiming_uniform_(np.empty((20, 30), np.float32), a=math.sqrt(5),
                              rng=np.random.default_rng(5))
    np.testing.assert_allclose(w, layer.weight.data, rtol=1e-6)


def _lk_model():
    return lk.Sequential(lk.Linear(200, 300), lk.ReLU(),
                         lk.Sequential(lk.Linear(300, 100), lk.Tanh()), lk.Linear(100, 10))


def _torch_model():
    nn = torch.nn
    return nn.Sequential(nn.Linear(200, 300), nn.ReLU(),
                         nn.Sequential(nn.Linear(300, 100), nn.Tanh()), nn.Linear(100, 10))


def _linears(model, kind):
    return [m for m in model.modules() if isinstance(m, kind)]


@pytest.mark.parametrize("scheme", ["xavier_uniform", "kaiming_normal"])
def test_apply_reinitializes_every_linear_like_torch(scheme):
    lk.manual_seed(0)
    torch.manual_seed(0)

    def ours(m):
        if isinstance(m, lk.Linear):
            if scheme == "xavier_uniform":
                init.xavier_uniform_(m.weight)
                init.constant_(m.bias, 0.01)
            else:
                init.kaiming_normal_(m.weight, nonlinearity="relu")
                init.zeros_(m.bias)

    def theirs(m):
        if isinstance(m, torch.nn.Linear):
            if scheme == "xavier_uniform":
                tinit.xavier_uniform_(m.weight)
                m.bias.data.fill_(0.01)
            else:
                tinit.kaiming_normal_(m.weight, nonlinearity="relu")
                tinit.zeros_(m.bias)

    model, twin = _lk_model(), _torch_model()
    before = [lin.weight.data.copy() for lin in _linears(model, lk.Linear)]
    assert model.apply(ours) is model
    twin.apply(theirs)
    pairs = list(zip(_linears(model, lk.Linear), _linears(twin, torch.nn.Linear)))
    assert len(pairs) == 3
    for (lin, tlin), old in zip(pairs, before):
        assert not np.array_equal(lin.weight.data, old)  # really re-initialized
        assert lin.weight.dtype == np.float32
        np.testing.assert_array_equal(lin.bias.data, tlin.bias.detach().numpy())
        w = lin.weight.data.ravel()
        if w.size >= 1000:
            assert_same_distribution(w, tlin.weight.detach().numpy().ravel())
        fan_in, fan_out = lin.in_features, lin.out_features
        if scheme == "xavier_uniform":
            assert np.abs(w).max() <= np.float32(math.sqrt(6 / (fan_in + fan_out)))
        else:
            assert w.std() == pytest.approx(math.sqrt(2 / fan_in), rel=0.1)
