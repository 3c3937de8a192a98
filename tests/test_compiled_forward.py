"""A plain forward (``model(x)``) through the compiled chain once the kernels are loaded
(runtime/compiled_chain.py ``chain_forward``), one row included: the thin path's bits.

Each model runs the same input twice, through the kernel and with it switched off (the thin
path, itself bitwise the guarded children: tests/test_fused_chain.py), for 1 row (the GEMV
``np.dot`` calls), the few-row sizes ``functional.linear`` computes the other way round, and
more. A forward before anything loaded the kernels never imports numba; anything the kernel
does not take falls back and raises as before.
"""

from __future__ import annotations

import numpy as np
import pytest
from fresh_process import imports
from kernel_spies import KernelCalls

import linearkit as lk
from linearkit.errors import ShapeError
from linearkit.runtime import compiled_chain as compiled

pytest.importorskip("numba", reason="the compiled chain needs numba (linearkit[fast])")


def _models(dtype, rng):
    def lin(a, b, bias=True):
        return lk.Linear(a, b, bias=bias, dtype=dtype, rng=rng)

    return {
        "mlp": lk.Sequential(lin(64, 256), lk.ReLU(), lk.Sequential(lin(256, 128), lk.ReLU()),
                             lin(128, 10)),
        "recipe": lk.Sequential(lin(64, 32), lk.ReLU(),
                                lk.Residual(lk.Sequential(lin(32, 32), lk.ReLU())), lin(32, 5)),
        "no-bias": lk.Sequential(lin(64, 16, bias=False), lk.ReLU(), lin(16, 5, bias=False)),
        "ends-in-residual": lk.Sequential(lin(64, 16), lk.ReLU(),
                                          lk.Residual(lk.Sequential(lin(16, 16), lk.ReLU()))),
    }


def _Count(monkeypatch):
    return KernelCalls(monkeypatch, "chain.chain_forward")


def _thin(model, x, monkeypatch):
    with lk.runtime.disabled("compiled_chain"):
        return model(x)


@pytest.mark.parametrize("rows", [1, 2, 3, 7, 33, 100])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_forward_is_bitwise_the_thin_path(rows, dtype, monkeypatch):
    rng = np.random.default_rng(rows)
    count = _Count(monkeypatch)
    for name, model in _models(dtype, rng).items():
        model.eval()
        x = rng.standard_normal((rows, 64)).astype(dtype)
        before = count.calls
        y = model(x)
        assert count.calls == before + 1, name
        want = _thin(model, x, monkeypatch)
        assert y.dtype == want.dtype and y.shape == want.shape
        assert y.tobytes() == want.tobytes(), name


def test_forward_before_the_kernels_load_imports_no_numba():
    assert not imports("import numpy as np, linearkit as lk\n"
                       "m = lk.Sequential(lk.Linear(8, 4), lk.ReLU(), lk.Linear(4, 2))\n"
                       "m(np.ones((1, 8), np.float32)); m(np.ones((5, 8), np.float32))",
                       "numba")


def test_what_the_kernel_does_not_take_falls_back(monkeypatch):
    import tracemalloc

    rng = np.random.default_rng(0)
    model = _models(np.float32, rng)["no-bias"]
    count = _Count(monkeypatch)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    seen = []
    handle = model[2].register_forward_hook(lambda module, args, out: seen.append(1))
    assert model(x).tobytes() == _thin(model, x, monkeypatch).tobytes()
    handle.remove()
    assert count.calls == 0 and seen == [1, 1]
    read_only = x.copy()
    read_only.flags.writeable = False
    for value in (x[None], read_only, x[:, ::-1].copy()[:, ::-1]):    # 3-D, read-only, strided
        y = model(value)
        assert y.tobytes() == _thin(model, value, monkeypatch).tobytes()
    assert count.calls == 0
    with pytest.raises(lk.DTypeError, match="expected a float32 input"):
        model(x.astype(np.float64))
    tracemalloc.start()
    try:
        model(x)
    finally:
        tracemalloc.stop()
    assert count.calls == 0
    model(x)
    assert count.calls == 1


def test_a_wrong_width_still_names_the_child():
    lk.fast.kernels()
    model = lk.Sequential(lk.Linear(8, 4), lk.ReLU(), lk.Linear(5, 2))
    with pytest.raises(ShapeError, match=r"module '2' .*expected input of shape \(\*, 5\)"):
        model(np.ones((1, 8), np.float32))
