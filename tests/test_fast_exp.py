"""The fused cross-entropy's own float64 ``exp`` (backend/fast/softmax_ce_kernel.py,
``_exp_nonpositive``) against libm's and against an 80-bit reference: within 1 ulp of both on
``[-746, 0]`` (subnormal results included), 0 for ``-inf`` and below ``-746``, NaN for NaN."""

from __future__ import annotations

import math

import numpy as np
import pytest

numba = pytest.importorskip("numba", reason="the kernels need numba (linearkit[fast])")


@pytest.fixture(scope="module")
def exp_all():
    from linearkit.backend.fast import softmax_ce_kernel as kernel

    @numba.njit
    def run(d, out):
        for k in range(d.size):
            out[k] = kernel._exp_nonpositive(d[k])

    def call(d):
        d = np.ascontiguousarray(d, np.float64)
        out = np.empty_like(d)
        run(d, out)
        return out
    return call


def _ulps(got, want):
    return np.abs(got - want) / np.spacing(np.abs(want))


@pytest.mark.parametrize("scale", [1e-12, 1e-3, 1.0, 30.0, 700.0])
def test_within_one_ulp_of_libm(exp_all, scale):
    d = -np.abs(np.random.default_rng(int(scale * 1e3) % 97).standard_normal(20000)) * scale
    d = d[d >= -746.0]
    want = np.array([math.exp(v) for v in d])
    assert _ulps(exp_all(d), want).max() <= 1.0


def test_within_one_ulp_of_an_80_bit_reference(exp_all):
    if np.finfo(np.longdouble).nmant < 60:
        pytest.skip("no 80-bit long double here")
    d = -np.random.default_rng(1).uniform(0.0, 708.0, 20000)
    want = np.exp(d.astype(np.longdouble))
    err = np.abs(exp_all(d).astype(np.longdouble) - want) / np.spacing(want.astype(np.float64))
    assert float(err.max()) < 1.0


def test_subnormal_results_and_specials(exp_all):
    d = np.concatenate([-np.random.default_rng(2).uniform(708.0, 746.0, 5000),
                        [-708.3964185322641, -745.1332191019411, -745.1332191019412]])
    want = np.array([math.exp(v) for v in d])
    got = exp_all(d)
    tiny = np.finfo(np.float64).smallest_subnormal
    assert np.all(np.abs(got - want) <= tiny)            # one subnormal step at most
    specials = exp_all(np.array([0.0, -0.0, -np.inf, -746.0, -1e308, np.nan, -5e-324]))
    assert specials[:5].tolist() == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert np.isnan(specials[5]) and specials[6] == 1.0
