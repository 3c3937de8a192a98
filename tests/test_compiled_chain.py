"""Sequential's compiled path (runtime/compiled_chain.py, backend/fast/chain_kernel.py) gives the thin path's bits.

Each model runs the same forward and backward twice: through the two compiled kernels and with
them switched off (the thin path, itself bitwise the guarded chain: tests/test_fused_chain.py).
Outputs, input gradients and every parameter gradient must be bitwise equal, for each way a
``.grad`` can be found (absent, zeroed in place, holding a contribution, not contiguous) and for
frozen layers. Chains or inputs the kernels do not take must fall back, and the protocol's errors
still name the child.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import pytest
from kernel_spies import KernelCalls

import linearkit as lk
from linearkit.backend import gemm
from linearkit.runtime import compiled_chain as compiled

pytest.importorskip("numba", reason="the compiled chain needs numba (linearkit[fast])")

DTYPES = [np.float32, np.float64]


def _lin(a, b, dtype, rng, bias=True):
    return lk.Linear(a, b, bias=bias, dtype=dtype, rng=rng)


def _models(dtype, rng):
    def lin(a, b, bias=True):
        return _lin(a, b, dtype, rng, bias)

    return {
        "mlp": lk.Sequential(lin(12, 16), lk.ReLU(), lin(16, 16), lk.ReLU(), lin(16, 3)),
        "recipe": lk.Sequential(lin(12, 16), lk.ReLU(),
                                lk.Residual(lk.Sequential(lin(16, 16), lk.ReLU())), lin(16, 3)),
        "no-bias": lk.Sequential(lin(12, 16, bias=False), lk.ReLU(), lin(16, 5, bias=False)),
        "nested+residuals": lk.Sequential(
            lk.Sequential(lin(12, 16), lk.ReLU()), lk.Residual(lk.Sequential(lin(16, 16),
                                                                            lk.ReLU())),
            lk.Residual(lk.Sequential(lin(16, 8), lk.ReLU(), lin(8, 16), lk.ReLU())),
            lin(16, 4), lk.ReLU()),
        "ends-in-residual": lk.Sequential(lin(12, 16), lk.ReLU(),
                                          lk.Residual(lk.Sequential(lin(16, 16), lk.ReLU()))),
    }


def _Count(monkeypatch):
    """Counts the compiled forwards (the kernel itself, so a silent fallback is noticed)."""
    return KernelCalls(monkeypatch, "chain.chain_forward")


def _run(model, x, dy, input_grad, use_kernels, monkeypatch, prepare=None):
    with nullcontext() if use_kernels else lk.runtime.disabled("compiled_chain"):
        if prepare is not None:
            prepare(model)
        y, backward = model.vjp(x, input_grad=input_grad)
        dx = backward(dy)
        grads = [None if p.grad is None else p.grad.copy() for p in model.parameters()]
    return y.copy(), dx, grads


def _same(a, b):
    assert (a is None) == (b is None)
    if a is not None:
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()


def _fresh(model):
    model.zero_grad()                      # set_to_none: .grad is None


def _zeroed(model):
    for p in model.parameters():
        p.grad = np.full_like(p.data, 7.0)
        p.zero_grad(set_to_none=False)     # zeroed in place: overwritten


def _holding(model):
    for i, p in enumerate(model.parameters()):
        p.grad = np.full_like(p.data, 0.25 * (i + 1))   # a contribution to add to


def _strided(model):
    for p in model.parameters():
        p.grad = np.asfortranarray(np.full_like(p.data, 0.5)) if p.ndim == 2 else \
            np.full(p.shape[0] * 2, 0.5, p.dtype)[::2]      # not C-contiguous: added apart


def _frozen_prefix(model):
    model.zero_grad()
    first = next(m for m in model.modules() if type(m) is lk.Linear)
    first.requires_grad_(False)
    last = [m for m in model.modules() if type(m) is lk.Linear][-1]
    if last.bias is not None:
        last.bias.requires_grad = False


GRADS = {"fresh": _fresh, "zeroed": _zeroed, "holding": _holding, "strided": _strided,
         "frozen-prefix": _frozen_prefix}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["mlp", "recipe", "no-bias", "nested+residuals",
                                  "ends-in-residual"])
@pytest.mark.parametrize("grads", list(GRADS))
@pytest.mark.parametrize("input_grad", [True, False])
def test_compiled_chain_is_bitwise_the_thin_path(monkeypatch, dtype, name, grads, input_grad):
    rng = np.random.default_rng(0)
    model = _models(dtype, rng)[name]
    x = rng.standard_normal((9, 12)).astype(dtype)
    out = model(x).shape[-1]
    dy = rng.standard_normal((9, out)).astype(dtype)
    count = _Count(monkeypatch)
    fast = _run(model, x, dy, input_grad, True, monkeypatch, GRADS[grads])
    assert count.calls == 1
    plain = _run(model, x, dy, input_grad, False, monkeypatch, GRADS[grads])
    assert count.calls == 1
    for a, b in zip(fast[:2], plain[:2]):
        _same(a, b)
    for a, b in zip(fast[2], plain[2]):
        _same(a, b)


@pytest.mark.parametrize("rows", [5, 17, 32, 48, 49])
@pytest.mark.parametrize("grads", ["fresh", "holding"])
def test_weight_first_gemms_keep_the_thin_paths_bits(monkeypatch, rows, grads):
    """Few rows through wide layers: the layers functional.linear computes as (W @ x.T).T get
    WEIGHT_FIRST in the kernel too (with and without bias and ReLU, inside a Residual)."""
    from linearkit import functional as F
    from linearkit.backend.fast import chain_flags

    rng = np.random.default_rng(rows)
    model = lk.Sequential(_lin(40, 256, np.float32, rng), lk.ReLU(),
                          lk.Residual(lk.Sequential(_lin(256, 256, np.float32, rng), lk.ReLU())),
                          _lin(256, 128, np.float32, rng), _lin(128, 10, np.float32, rng))
    x = rng.standard_normal((rows, 40)).astype(np.float32)
    dy = rng.standard_normal((rows, 10)).astype(np.float32)
    count = _Count(monkeypatch)
    fast = _run(model, x, dy, True, True, monkeypatch, GRADS[grads])
    plain = _run(model, x, dy, True, False, monkeypatch, GRADS[grads])
    assert count.calls == 1
    for a, b in zip(fast[:2] + tuple(fast[2]), plain[:2] + tuple(plain[2])):
        _same(a, b)
    flags = model._compiled_plan.plan.flags_for(rows)
    picked = [bool(f & chain_flags.WEIGHT_FIRST) for f in flags]
    assert picked == [gemm.weight_first(rows, w.shape[1], w.shape[0], w.dtype, w.dtype)
                      for w in model._compiled_plan.plan.weights]
    if rows == 32 and gemm.weight_first(32, 40, 256, x.dtype, x.dtype):
        assert picked == [True, True, True, False]      # the path under test is taken


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("grads", ["fresh", "holding"])
def test_bias_first_gemms_keep_the_thin_paths_bits(monkeypatch, dtype, grads):
    """A large output (1024 rows x 256): the layers whose GEMM functional.linear makes add the
    bias get BIAS_FIRST in the kernel too (with ReLU after, inside a Residual, and the last
    layer without ReLU); K = 1024 makes the order show in the bits."""
    from linearkit import functional as F
    from linearkit.backend.fast import chain_flags

    rng = np.random.default_rng(11)
    model = lk.Sequential(_lin(1024, 256, dtype, rng), lk.ReLU(),
                          lk.Residual(lk.Sequential(_lin(256, 256, dtype, rng), lk.ReLU())),
                          _lin(256, 256, dtype, rng), _lin(256, 10, dtype, rng))
    x = rng.standard_normal((1024, 1024)).astype(dtype)
    dy = rng.standard_normal((1024, 10)).astype(dtype)
    count = _Count(monkeypatch)
    # One fixed BLAS thread count: the chain sets one count for all its GEMMs (its largest's),
    # the thin path one per GEMM, and OpenBLAS's bits depend on it (docs/threads.md)
    with lk.threads.num_threads(1):
        fast = _run(model, x, dy, True, True, monkeypatch, GRADS[grads])
        plain = _run(model, x, dy, True, False, monkeypatch, GRADS[grads])
    assert count.calls == 1
    for a, b in zip(fast[:2] + tuple(fast[2]), plain[:2] + tuple(plain[2])):
        _same(a, b)
    flags = model._compiled_plan.plan.flags_for(1024)
    assert [bool(f & chain_flags.BIAS_FIRST) for f in flags] == [True, True, True, False]
    first = model[0]
    assert gemm.forward_layout(1024, 1024, 256, x.dtype, first.weight.data,
                               first.bias.data) is gemm.BIAS_FIRST
    assert not np.array_equal(first(x), np.dot(x, first.weight.data.T) + first.bias.data)


def test_training_steps_match_the_thin_path_bitwise(monkeypatch):
    """Twenty Adam steps of the recipe's shape (zero_grad in place, as the README's loop)."""
    results = []
    for use_kernels in (True, False):
        rng = np.random.default_rng(4)
        model = _models(np.float32, rng)["recipe"]
        opt = lk.optim.Adam(model.parameters(), lr=1e-2)
        loss_fn = lk.CrossEntropyLoss()
        with nullcontext() if use_kernels else lk.runtime.disabled("compiled_chain"):
            for step in range(20):
                x = rng.standard_normal((32, 12)).astype(np.float32)
                y = rng.integers(0, 3, 32)
                lk.loop.step(model, loss_fn, opt, x, y)
        results.append([p.data.copy() for p in model.parameters()])
    for a, b in zip(*results):
        _same(a, b)


@pytest.mark.parametrize("case", ["one-row", "3-d", "width-1", "shared", "hook", "f-order",
                                  "lazy", "dropout", "relu-first", "residual-without-relu",
                                  "frozen-middle-without-relu", "read-only-weight",
                                  "read-only-input", "unaligned-input"])
def test_what_the_kernels_do_not_take_falls_back_with_the_same_values(monkeypatch, case):
    rng = np.random.default_rng(1)
    lin = _lin(12, 16, np.float32, rng)
    x = rng.standard_normal((9, 12)).astype(np.float32)
    if case == "one-row":
        model, x = lk.Sequential(lin, lk.ReLU(), _lin(16, 3, np.float32, rng)), x[:1]
    elif case == "3-d":
        model, x = lk.Sequential(lin, _lin(16, 3, np.float32, rng)), x.reshape(3, 3, 12)
    elif case == "width-1":
        model = lk.Sequential(lin, lk.ReLU(), _lin(16, 1, np.float32, rng))
    elif case == "shared":
        square = _lin(16, 16, np.float32, rng)
        model = lk.Sequential(lin, square, lk.ReLU(), square)
    elif case == "hook":
        model = lk.Sequential(lin, lk.ReLU(), _lin(16, 3, np.float32, rng))
        model[1].register_forward_hook(lambda *args: None)
    elif case == "f-order":
        model, x = lk.Sequential(lin, _lin(16, 3, np.float32, rng)), np.asfortranarray(x)
    elif case == "lazy":
        model = lk.Sequential(lin, lk.LazyLinear(3))
    elif case == "dropout":
        model = lk.Sequential(lin, lk.Dropout(0.0), _lin(16, 3, np.float32, rng))
    elif case == "residual-without-relu":       # its inner output: kept by no closure
        model = lk.Sequential(lin, lk.Residual(_lin(16, 16, np.float32, rng)),
                              _lin(16, 3, np.float32, rng))
    elif case == "frozen-middle-without-relu":  # layer 0's output: no mask, no frozen dW
        model = lk.Sequential(lin, _lin(16, 16, np.float32, rng), _lin(16, 3, np.float32, rng))
        model[1].requires_grad_(False)
        model[0].requires_grad_(False)
    elif case == "read-only-weight":            # numba: no tuple of mixed array kinds
        model = lk.Sequential(lin, lk.ReLU(), _lin(16, 3, np.float32, rng))
        lin.weight.data.flags.writeable = False
    elif case in ("read-only-input", "unaligned-input"):   # another compiled version: no
        model = lk.Sequential(lin, lk.ReLU(), _lin(16, 3, np.float32, rng))
        if case == "read-only-input":
            x = x.copy()
            x.flags.writeable = False
        else:
            raw = np.zeros(x.nbytes + 1, np.uint8)
            x = np.frombuffer(raw[1:].data, np.float32).reshape(x.shape)
            x[...] = rng.standard_normal(x.shape)
    else:
        model = lk.Sequential(lk.ReLU(), lin)
    count = _Count(monkeypatch)
    width = {"width-1": 1, "shared": 16, "relu-first": 16}.get(case, 3)
    dy = np.ones(x.shape[:-1] + (width,), np.float32)
    fast = _run(model, x, dy, True, True, monkeypatch, _fresh)   # (a LazyLinear materializes)
    assert count.calls == 0
    plain = _run(model, x, dy, True, False, monkeypatch, _fresh)
    for a, b in zip(fast[:2], plain[:2]):
        _same(a, b)
    for a, b in zip(fast[2], plain[2]):
        _same(a, b)


def test_a_residual_that_changes_the_shape_still_raises_naming_it():
    rng = np.random.default_rng(2)
    model = lk.Sequential(_lin(12, 16, np.float32, rng),
                          lk.Residual(lk.Sequential(_lin(16, 8, np.float32, rng))))
    with pytest.raises(lk.ShapeError, match=r"residual") as err:
        model.vjp(np.ones((4, 12), np.float32))
    assert "1" in str(err.value)


def _compiled_vjp(monkeypatch, name: str, seed: int):
    """``(model, x, y, backward)``: one vjp of a float32 model, checked to be compiled."""
    rng = np.random.default_rng(seed)
    model = _models(np.float32, rng)[name]
    x = rng.standard_normal((9, 12)).astype(np.float32)
    count = _Count(monkeypatch)
    y, backward = model.vjp(x)
    assert count.calls == 1
    return model, x, y, backward


def test_protocol_errors_hold_on_the_compiled_path(monkeypatch):
    model, x, y, backward = _compiled_vjp(monkeypatch, "recipe", 3)
    with pytest.raises(lk.ShapeError, match="dy of shape"):
        backward(np.ones((9, 4), np.float32))
    y, backward = model.vjp(x)
    backward(np.ones_like(y))
    with pytest.raises(lk.BackwardError):
        backward(np.ones_like(y))


def test_anomaly_switched_on_after_the_forward_is_still_checked(monkeypatch):
    _, _, y, backward = _compiled_vjp(monkeypatch, "mlp", 5)
    dy = np.ones_like(y)
    dy[0, 0] = np.inf
    with lk.detect_anomaly(), pytest.raises(lk.AnomalyError, match="gradient of"):
        backward(dy)


def test_the_plan_skips_what_the_thin_path_skips():
    """No dX for the first layer without input_grad; nothing at all for a frozen prefix (the
    backward kernel stops there); no dW/db for frozen parameters."""
    from linearkit.backend.fast import chain_flags as K
    from linearkit.layers.container import trains

    rng = np.random.default_rng(6)
    model = lk.Sequential(_lin(5, 4, np.float32, rng), lk.ReLU(), _lin(4, 3, np.float32, rng))
    x = np.ones((3, 5), np.float32)
    for input_grad in (False, True):
        units = []
        assert compiled._units(list(model), units, False) is None
        flags = compiled._plan(units, x, input_grad, trains).flags
        assert bool(flags[0] & K.NEED_DX) == input_grad and flags[1] & K.NEED_DX
        assert all(f & K.NEED_DW and f & K.NEED_DB for f in flags)
    model[0].requires_grad_(False)
    model[2].bias.requires_grad = False
    units = []
    compiled._units(list(model), units, False)
    flags = compiled._plan(units, x, False, trains).flags
    assert flags[0] & (K.NEED_DW | K.NEED_DB | K.NEED_DX) == 0
    assert flags[1] & K.NEED_DW and not flags[1] & K.NEED_DB and not flags[1] & K.NEED_DX


@pytest.mark.parametrize("change", ["freeze", "new-data", "new-module", "fewer-rows", "hook",
                                    "input-grad", "read-only-weight", "writeable-again",
                                    "nested-new-module", "nested-hook", "new-parameter",
                                    "bias-removed", "deleted-and-appended", "new-class",
                                    "deepcopy", "pickle"])
def test_the_kept_plan_follows_every_change_to_the_model(monkeypatch, change):
    """Sequential keeps its plan between calls; whatever the plan was made from may change,
    deep inside the model too (the kept plan is reused without a walk while the structure
    token holds: these cases must each invalidate it)."""
    import copy
    import pickle

    rng = np.random.default_rng(7)
    model = _models(np.float32, rng)["recipe"]
    x = rng.standard_normal((9, 12)).astype(np.float32)
    dy = rng.standard_normal((9, 3)).astype(np.float32)
    # made before the plan is kept: swapping them in must invalidate it by itself
    spare_hidden, spare_last = _lin(16, 16, np.float32, rng), _lin(16, 3, np.float32, rng)
    _run(model, x, dy, True, True, monkeypatch, _fresh)          # the plan is kept now
    input_grad = True
    if change == "freeze":
        model[2].module[0].weight.requires_grad = False
    elif change == "new-data":
        model[0].weight.data = rng.standard_normal((16, 12)).astype(np.float32)
    elif change == "new-module":
        model[3] = spare_last
    elif change == "fewer-rows":
        x, dy = x[:4], dy[:4]
    elif change == "hook":
        model[1].register_forward_hook(lambda *args: None)
    elif change == "read-only-weight":
        model[3].weight.data.flags.writeable = False
    elif change == "writeable-again":
        model[3].weight.data.flags.writeable = False
        _run(model, x, dy, True, True, monkeypatch, _fresh)     # kept: no plan (read-only)
        model[3].weight.data.flags.writeable = True
    elif change == "nested-new-module":
        model[2].module[0] = spare_hidden
    elif change == "nested-hook":
        calls = []
        model[2].module[1].register_forward_hook(lambda *args: calls.append(1))
    elif change == "new-parameter":
        model[2].module[0].weight = lk.Parameter(rng.standard_normal((16, 16)).astype(np.float32))
    elif change == "bias-removed":
        model[2].module[0].bias = None
    elif change == "deleted-and-appended":
        last = model[3]
        del model[3]
        model.append(spare_last)
        assert model[3] is not last
    elif change == "new-class":
        class Doubled(lk.Linear):
            def vjp(self, x, input_grad=True):
                y, backward = super().vjp(x, input_grad)
                return 2 * y, lambda dy: backward(2 * dy)

        model[2].module[0].__class__ = Doubled
    elif change == "deepcopy":
        model = copy.deepcopy(model)
        model[0].weight.data = rng.standard_normal((16, 12)).astype(np.float32)
    elif change == "pickle":
        model = pickle.loads(pickle.dumps(model))
        model[2].module[0].weight.data[...] = 0.5
    else:
        input_grad = False
    chain, widths = lk.fast.kernels().chain, []
    real = chain.chain_forward
    monkeypatch.setattr(chain, "chain_forward",          # the width of each compiled output
                        lambda *args: (widths.append(args[-1].shape[1]), real(*args))[1])
    fast = _run(model, x, dy, input_grad, True, monkeypatch, _fresh)
    # the whole model (3 outputs, not the Residual's 16 alone) still runs compiled after every
    # change but those the kernels do not take
    assert (3 in widths) == (change not in ("hook", "nested-hook", "read-only-weight",
                                            "new-class")), widths
    plain = _run(model, x, dy, input_grad, False, monkeypatch, _fresh)
    for a, b in zip(fast[:2], plain[:2]):
        _same(a, b)
    for a, b in zip(fast[2], plain[2]):
        _same(a, b)
    if change == "nested-hook":
        assert len(calls) == 2          # the hook fired on both runs: neither was compiled


def test_training_steps_keep_the_structure_token():
    """Nothing in a training or eval step changes a model's structure, BatchNorm's in-place
    ``num_batches_tracked += 1`` (the same array assigned back) included: the kept plans stay
    valid. Assigning another object, even an equal one, still replaces the token."""
    from linearkit.core import structure as _structure

    rng = np.random.default_rng(9)
    model = lk.Sequential(lk.Sequential(_lin(8, 16, np.float32, rng), lk.ReLU()),
                          lk.BatchNorm1d(16), _lin(16, 3, np.float32, rng))
    opt, loss_fn = lk.optim.Adam(model.parameters(), lr=1e-2), lk.CrossEntropyLoss()
    x = rng.standard_normal((32, 8)).astype(np.float32)
    y = rng.integers(0, 3, 32)
    lk.loop.step(model, loss_fn, opt, x, y)
    token = _structure.token          # (building any module replaces it: all built by now)
    for _ in range(3):
        lk.loop.step(model, loss_fn, opt, x, y)
    model.eval()
    model(x)
    model.train()
    assert _structure.token is token
    assert int(model[1].num_batches_tracked) == 4          # the steps did count
    model[1].num_batches_tracked = np.array(4, np.int64)   # equal, but another array
    assert _structure.token is not token


def test_a_kernel_numba_cannot_type_falls_back_to_the_thin_path(monkeypatch):
    from numba.core.errors import TypingError

    def untypable(*args):
        raise TypingError("simulated: no version for these array kinds")

    monkeypatch.setattr(lk.fast.kernels().chain, "chain_forward", untypable)
    rng = np.random.default_rng(8)
    model = _models(np.float32, rng)["recipe"]
    x = rng.standard_normal((9, 12)).astype(np.float32)
    dy = rng.standard_normal((9, 3)).astype(np.float32)
    for _ in range(2):                       # the second call reuses the kept (empty) plan
        fast = _run(model, x, dy, True, True, monkeypatch, _fresh)
        plain = _run(model, x, dy, True, False, monkeypatch, _fresh)
        for a, b in zip(fast[:2] + tuple(fast[2]), plain[:2] + tuple(plain[2])):
            _same(a, b)


_SECOND_PROCESS = """
import numpy as np, linearkit as lk
model = lk.Sequential(lk.Linear(12, 16, rng=np.random.default_rng(0)), lk.ReLU(),
                      lk.Linear(16, 3, rng=np.random.default_rng(1)))
x = np.linspace(-1, 1, 48, dtype=np.float32).reshape(4, 12)
y, backward = model.vjp(x)
dx = backward(np.ones((4, 3), np.float32))
chain = lk.fast.kernels().chain
stats = [chain.chain_forward.stats, chain.chain_backward.stats]
print(sum(s.cache_hits.get(k, 0) for s in stats for k in s.cache_hits),
      sum(s.cache_misses.get(k, 0) for s in stats for k in s.cache_misses),
      (y.tobytes() + dx.tobytes() + model[0].weight.grad.tobytes()).hex())
"""


def test_a_second_process_loads_the_chain_from_numbas_cache(tmp_path, monkeypatch):
    """The kernels call NumPy's BLAS by symbol (linked anew in each process): a second process
    must load them from the on-disk cache, not compile them again, and get the thin path's bits."""
    import os
    import subprocess
    import sys

    model = lk.Sequential(lk.Linear(12, 16, rng=np.random.default_rng(0)), lk.ReLU(),
                          lk.Linear(16, 3, rng=np.random.default_rng(1)))  # as the script
    x = np.linspace(-1, 1, 48, dtype=np.float32).reshape(4, 12)
    with lk.runtime.disabled("compiled_chain"):                        # the thin path, here
        y, backward = model.vjp(x)
        dx = backward(np.ones((4, 3), np.float32))
    want = (y.tobytes() + dx.tobytes() + model[0].weight.grad.tobytes()).hex()

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    env.pop("LINEARKIT_FAST", None)
    runs = [subprocess.run([sys.executable, "-c", _SECOND_PROCESS], env=env, text=True,
                           capture_output=True, timeout=300, check=False) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
    first, second = (run.stdout.split() for run in runs)
    assert int(first[1]) == 2                          # compiled (forward, backward), saved
    assert (int(second[0]), int(second[1])) == (2, 0)  # loaded, nothing compiled
    assert first[2] == second[2] == want               # the BLAS linked right, both times
