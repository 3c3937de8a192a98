"""The NumPy hot paths (issue 11, item 2) equal straightforward references.

Bias gradients run as a GEMV ``ones @ dy`` (within float32 rounding of ``dy.sum(0)``); a small
one-row dW is accumulated directly, a large one block by block (both bitwise ``out + dyᵀ x``).
"""

import numpy as np
import pytest

from linearkit import functional as F


@pytest.mark.parametrize("shape", [(16, 16), (64, 512), (200, 300), (300, 64)])
def test_one_row_weight_grad_accumulate_is_bitwise_outer(shape):
    out_features, in_features = shape
    rng = np.random.default_rng(out_features)
    dy = rng.standard_normal((1, out_features)).astype(np.float32)
    x = rng.standard_normal((1, in_features)).astype(np.float32)
    start = rng.standard_normal(shape).astype(np.float32)
    acc = start.copy()
    assert F.linear_weight_grad(dy, x, acc, accumulate=True) is acc
    np.testing.assert_array_equal(acc, start + dy.T * x)
