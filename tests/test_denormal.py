"""``set_flush_denormal``: PyTorch's switch, same effect on the same operations (torch is the
oracle), restored afterwards; and the compiled Adam under it still equals the NumPy path."""

from __future__ import annotations

import numpy as np
import pytest

import linearkit as lk

TINY32 = np.float32(1e-39)          # float32 subnormals
TINY64 = np.float64(1e-310)


@pytest.fixture
def flushing():
    if not lk.set_flush_denormal(True):
        pytest.skip("this platform has no flush-denormal mode here (Linux glibc x86-64/AArch64)")
    try:
        yield
    finally:
        assert lk.set_flush_denormal(False)


def test_off_by_default_and_subnormals_are_exact():
    assert TINY32 * np.float32(1) == TINY32 and TINY64 * 1.0 == TINY64


def test_flushing_zeroes_subnormal_inputs_and_results_and_switches_back(flushing):
    assert TINY32 * np.float32(1) == 0 and TINY64 * 1.0 == 0            # input as zero
    assert np.float32(1e-30) * np.float32(1e-10) == 0                    # result flushed
    assert np.float32(1e-30) * np.float32(1e3) == np.float32(1e-27)      # normal: untouched
    lk.set_flush_denormal(False)
    assert TINY32 * np.float32(1) == TINY32
    lk.set_flush_denormal(True)


def test_same_results_as_torch_set_flush_denormal():
    torch = pytest.importorskip("torch")
    values = np.array([1e-39, -3e-42, 1e-30, 2.5, 1e-45, 0.0], np.float32)
    scale = np.array([1.0, 1.0, 1e-10, 1.0, 4.0, 1.0], np.float32)
    for mode in (True, False):
        ours_ok = lk.set_flush_denormal(mode)
        ours = values * scale
        lk.set_flush_denormal(False)
        theirs_ok = torch.set_flush_denormal(mode)
        theirs = (torch.from_numpy(values) * torch.from_numpy(scale)).numpy()
        torch.set_flush_denormal(False)
        assert ours_ok == theirs_ok
        assert ours.tobytes() == theirs.tobytes()


def test_compiled_adam_equals_the_numpy_path_while_flushing(monkeypatch, flushing):
    """Dead units' moments decay into the subnormal range: both paths flush them alike."""
    pytest.importorskip("numba", reason="the fused kernels need numba (linearkit[fast])")
    runs = []
    for env in ("0", "1"):
        monkeypatch.setenv("LINEARKIT_FAST", env)
        rng = np.random.default_rng(0)
        params = [lk.Parameter(rng.standard_normal(s).astype(np.float32)) for s in [(30, 7), (30,)]]
        opt = lk.optim.Adam(params, lr=1e-2)
        for step in range(900):          # 0.9**step reaches float32's subnormals near step 800
            for p in params:
                p.grad = np.zeros_like(p.data) if step else np.ones_like(p.data)
            opt.step()
        runs.append([a.copy() for p in params for a in (p.data, *opt.state[p].values())
                     if isinstance(a, np.ndarray)])
    for a, b in zip(*runs):
        assert a.tobytes() == b.tobytes()
    exp_avg = runs[1][1]                 # FTZ: m * 0.1 flushes, so m stops at a normal ~1e-37
    tiny = np.finfo(np.float32).tiny
    assert np.all(np.abs(exp_avg) >= tiny) and np.all(exp_avg < 1e-36)


def test_without_flushing_a_dead_units_first_moment_sticks_in_the_subnormals():
    """What the docs measure: 0 gradients decay Adam's exp_avg to k * 2**-149 and it stays."""
    p = lk.Parameter(np.ones(8, np.float32))
    opt = lk.optim.Adam([p], lr=1e-2)
    for step in range(1100):
        p.grad = np.zeros(8, np.float32) if step else np.ones(8, np.float32)
        opt.step()
    m = opt.state[p]["exp_avg"]
    assert np.all((m > 0) & (m < np.finfo(np.float32).tiny))
