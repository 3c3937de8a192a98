"""The compiled fast path (linearkit/backend/fast/): same bits as the NumPy path, loaded lazily, optional.

The kernel tests need numba (the ``linearkit[fast]`` extra) and skip without it; the import and
``LINEARKIT_FAST=0`` fallback tests run everywhere and pin that the NumPy path gives the numbers.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from fresh_process import imports

import linearkit as lk
from linearkit import optim
from linearkit.backend import fast

SHAPES = [(40, 33), (33,), (7, 9)]

# one training run, printed as the hex of every parameter and state array (for subprocesses)
SCRIPT = """
import json, sys, numpy as np, linearkit as lk
from linearkit import optim
before = 'numba' in sys.modules
rng = np.random.default_rng(3)
params = [lk.Parameter(rng.standard_normal(s).astype(np.float32)) for s in {shapes}]
opt = optim.{name}(params, lr=0.03, **{kwargs})
for step in range(12):
    for i, p in enumerate(params):
        p.grad = (np.cos(2.0 * p.data) + 0.1 * step * (i + 1)).astype(np.float32)
    opt.step()
arrays = [p.data for p in params] + [opt.state[p][k] for p in params for k in sorted(opt.state[p])
                                     if k != 'step']
print(json.dumps({{'before': before, 'after': 'numba' in sys.modules,
                  'arrays': [a.tobytes().hex() for a in arrays]}}))
"""


def _subprocess(env_fast: str | None, name: str = "Adam", kwargs: dict | None = None) -> dict:
    import os
    env = dict(os.environ)
    env.pop("LINEARKIT_FAST", None)
    if env_fast is not None:
        env["LINEARKIT_FAST"] = env_fast
    code = SCRIPT.format(shapes=SHAPES, name=name, kwargs=kwargs or {})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _train(name, dtype, kwargs, steps=12, specials=False):
    """Steps of one flat group (three parameters); returns every parameter and state array."""
    rng = np.random.default_rng(3)
    params = [lk.Parameter(rng.standard_normal(s).astype(dtype)) for s in SHAPES]
    opt = getattr(optim, name)(params, **{"lr": 0.03, **kwargs})
    for step in range(steps):
        for i, p in enumerate(params):
            p.grad = (np.cos(2.0 * p.data) + 0.1 * step * (i + 1)).astype(dtype)
            p.grad.reshape(-1)[step % 5] = 0.0
            if specials and step == steps - 2:
                p.grad.reshape(-1)[:3] = [np.inf, -np.inf, np.nan]
        opt.step()
    assert id(opt.param_groups[0]) in opt._flat       # the flat path ran
    return [p.data.copy() for p in params] + [
        opt.state[p][k].copy() for p in params for k in sorted(opt.state[p]) if k != "step"]


def test_import_linearkit_does_not_import_numba():
    assert not imports("import linearkit", "numba")


def test_linearkit_fast_0_gives_the_same_numbers_without_numba():
    """LINEARKIT_FAST=0 in a fresh process (NumPy path, numba never imported) == this process."""
    for name, kwargs in [("Adam", {"weight_decay": 0.1}), ("AdamW", {"amsgrad": True})]:
        off = _subprocess("0", name, kwargs)
        assert off["before"] is False and off["after"] is False
        here = _subprocess(None, name, kwargs)             # the fast path when numba is there
        assert here["before"] is False
        assert off["arrays"] == here["arrays"]


def test_enabled_reads_the_environment(monkeypatch):
    monkeypatch.setenv("LINEARKIT_FAST", "0")
    assert not fast.enabled() and not fast.available() and fast.kernels() is None
    monkeypatch.delenv("LINEARKIT_FAST")
    assert fast.enabled()


class _Spy:
    def __init__(self, monkeypatch):
        kernels = fast.kernels()
        self.calls = 0
        real = kernels.adam_flat

        def spy(*args, **kwargs):
            self.calls += 1
            return real(*args, **kwargs)
        monkeypatch.setattr(kernels, "adam_flat", spy)


OPTIONS = [{}, {"weight_decay": 0.1}, {"amsgrad": True},
           {"amsgrad": True, "maximize": True, "weight_decay": 0.05},
           {"maximize": True}, {"betas": (0.3, 0.9)}, {"eps": 0.0}, {"eps": 0.0, "lr": 0.0}]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kwargs", OPTIONS)
@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_fused_adam_is_bitwise_the_numpy_path(monkeypatch, name, kwargs, dtype):
    pytest.importorskip("numba", reason="the fused kernels need numba (linearkit[fast])")
    monkeypatch.setenv("LINEARKIT_FAST", "0")
    with np.errstate(invalid="ignore", divide="ignore"):
        plain = _train(name, dtype, kwargs)
        monkeypatch.delenv("LINEARKIT_FAST")
        spy = _Spy(monkeypatch)
        fused = _train(name, dtype, kwargs)
    assert spy.calls == 12
    for a, b in zip(plain, fused):
        assert a.dtype == b.dtype == dtype
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("amsgrad", [False, True])
def test_fused_adam_handles_inf_and_nan_as_numpy_does(monkeypatch, amsgrad):
    pytest.importorskip("numba", reason="the fused kernels need numba (linearkit[fast])")
    monkeypatch.setenv("LINEARKIT_FAST", "0")
    with np.errstate(invalid="ignore"):
        plain = _train("Adam", np.float32, {"amsgrad": amsgrad}, specials=True)
        monkeypatch.delenv("LINEARKIT_FAST")
        fused = _train("Adam", np.float32, {"amsgrad": amsgrad}, specials=True)
    assert any(np.isnan(a).any() for a in plain)
    for a, b in zip(plain, fused):
        np.testing.assert_array_equal(a, b)            # nan where nan, every other bit equal


def test_fused_adam_declines_mixed_groups(monkeypatch):
    """A group with a 16-bit parameter (float32 masters) keeps the NumPy path."""
    pytest.importorskip("numba", reason="the fused kernels need numba (linearkit[fast])")
    spy = _Spy(monkeypatch)
    params = [lk.Parameter(np.ones((3, 2), np.float16)), lk.Parameter(np.ones(2, np.float32))]
    opt = optim.Adam(params, lr=0.1)
    for p in params:
        p.grad = np.full(p.shape, 0.5, np.float32)
    opt.step()
    assert opt._flat[id(opt.param_groups[0])].mixed and spy.calls == 0
    assert params[0].data.dtype == np.float16 and np.all(params[0].data < 1)


def test_numba_is_imported_on_the_first_step():
    pytest.importorskip("numba", reason="the fused kernels need numba (linearkit[fast])")
    out = _subprocess(None)
    assert out["before"] is False and out["after"] is True


SGD_OPTIONS = [{"momentum": 0.9}, {"momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01},
               {"momentum": 0.8, "nesterov": True, "weight_decay": 0.1},
               {"momentum": 0.5, "maximize": True}]


def _train_sgd(dtype, kwargs, steps=12):
    rng = np.random.default_rng(5)
    params = [lk.Parameter(rng.standard_normal(s).astype(dtype)) for s in SHAPES]
    opt = optim.SGD(params, lr=0.05, **kwargs)
    for step in range(steps):
        for i, p in enumerate(params):
            p.grad = (np.sin(3.0 * p.data) + 0.05 * step * (i + 1)).astype(dtype)
        opt.step()
    return [p.data.copy() for p in params] + [opt.state[p]["momentum_buffer"].copy()
                                              for p in params]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kwargs", SGD_OPTIONS)
def test_fused_sgd_momentum_is_bitwise_the_numpy_path(monkeypatch, kwargs, dtype):
    pytest.importorskip("numba", reason="the fused kernels need numba (linearkit[fast])")
    monkeypatch.setenv("LINEARKIT_FAST", "0")
    plain = _train_sgd(dtype, kwargs)
    monkeypatch.delenv("LINEARKIT_FAST")
    kernels = fast.kernels()
    calls = []
    real = kernels.sgd_momentum
    monkeypatch.setattr(kernels, "sgd_momentum", lambda *a, **k: calls.append(1) or real(*a, **k))
    fused = _train_sgd(dtype, kwargs)
    assert len(calls) == 11 * len(SHAPES)          # every step after the buffer's first
    for a, b in zip(plain, fused):
        assert a.dtype == b.dtype == dtype
        assert a.tobytes() == b.tobytes()


def test_sgd_linearkit_fast_0_in_a_subprocess_gives_the_same_numbers():
    off = _subprocess("0", "SGD", {"momentum": 0.9, "nesterov": True, "weight_decay": 0.1})
    here = _subprocess(None, "SGD", {"momentum": 0.9, "nesterov": True, "weight_decay": 0.1})
    assert off["after"] is False and off["arrays"] == here["arrays"]
