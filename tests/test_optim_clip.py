"""clip_grad_norm_ and clip_grad_value_ against torch.nn.utils, float32 and float64."""

from __future__ import annotations

import numpy as np
import pytest

import linearkit as lk
from linearkit import optim

torch = pytest.importorskip("torch")
from torch.testing import assert_close


def _clip_pair(dtype, seed=0):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s).astype(dtype) * 3 for s in [(4, 3), (5,), (2, 2)]]
    ours = [lk.Parameter(np.zeros_like(a)) for a in arrays]
    theirs = [torch.nn.Parameter(torch.zeros(a.shape, dtype=torch.from_numpy(a).dtype))
              for a in arrays]
    for p, q, a in zip(ours, theirs, arrays):
        p.grad, q.grad = a.copy(), torch.from_numpy(a.copy())
    extra = lk.Parameter(np.zeros(3, dtype))          # no gradient: ignored by both
    textra = torch.nn.Parameter(torch.zeros(3, dtype=theirs[0].dtype))
    return ours + [extra], theirs + [textra]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.5, float("inf")])
@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_clip_grad_norm_matches_torch(max_norm, norm_type, dtype):
    ours, theirs = _clip_pair(dtype)
    total = optim.clip_grad_norm_(ours, max_norm, norm_type)
    ttotal = torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type)
    assert isinstance(total, np.ndarray) and total.shape == () and total.dtype == dtype
    assert_close(torch.from_numpy(total), ttotal)
    for p, q in zip(ours, theirs):
        if q.grad is None:
            assert p.grad is None
        else:
            assert p.grad.dtype == dtype
            assert_close(torch.from_numpy(p.grad), q.grad)


def test_clip_grad_norm_edge_cases():
    p = lk.Parameter(np.ones(3))
    p.grad = np.array([1.0, np.inf, 0.0])
    with pytest.raises(RuntimeError, match="non-finite"):
        optim.clip_grad_norm_([p], 1.0, error_if_nonfinite=True)
    assert np.isinf(optim.clip_grad_norm_([p], 1.0))
    total = optim.clip_grad_norm_([lk.Parameter(np.ones(2))], 1.0)   # no gradients at all
    assert total == 0.0
    single = lk.Parameter(np.ones(2))
    single.grad = np.array([3.0, 4.0])
    assert optim.clip_grad_norm_(single, 1.0) == 5.0                # a bare Parameter works
    np.testing.assert_allclose(single.grad, np.array([3.0, 4.0]) / (5.0 + 1e-6))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_clip_grad_value_matches_torch(dtype):
    ours, theirs = _clip_pair(dtype, seed=1)
    assert optim.clip_grad_value_(ours, 1.5) is None
    torch.nn.utils.clip_grad_value_(theirs, 1.5)
    for p, q in zip(ours, theirs):
        if q.grad is not None:
            assert p.grad.dtype == dtype
            assert_close(torch.from_numpy(p.grad), q.grad)
