"""Block-by-block fills give the values of one whole float64 draw, rounded once into the array.

So a seed gives the weights it always gave, in every dtype, and the generator is left where one
whole draw leaves it; the float64 temporary is a block, not the array.
"""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest

import linearkit as lk
from linearkit import init
from linearkit.core.random import BLOCK, block_size, fill_normal, fill_uniform

DTYPES = [np.float32, np.float64, np.float16, "bfloat16"]
GENERATORS = [np.random.PCG64, np.random.MT19937, np.random.Philox, np.random.SFC64]


def storage(dtype):
    if dtype == "bfloat16":
        return np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    return np.dtype(dtype)


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


@pytest.mark.parametrize("bit_generator", GENERATORS)
@pytest.mark.parametrize("n", [1, 4096, 4097, 3 * BLOCK + 17, 70 * BLOCK + 5])
def test_fills_equal_one_whole_draw_and_leave_the_generator_alike(bit_generator, n):
    ours, whole = (np.random.Generator(bit_generator(5)) for _ in range(2))
    a = fill_uniform(np.empty(n, np.float32), -0.25, 0.75, ours)
    np.testing.assert_array_equal(bits(a), bits(whole.uniform(-0.25, 0.75, n).astype(np.float32)))
    b = fill_normal(np.empty(n), 1.0, 3.0, ours)
    np.testing.assert_array_equal(b, whole.normal(1.0, 3.0, n))
    assert ours.random() == whole.random()


def test_blocks_are_small_beside_the_array():
    assert block_size(10) == 10 and block_size(4096) == 4096
    assert block_size(10**6) == 10**6 >> 6 and block_size(10**9) == BLOCK
    for n in (2**18, 10**6, 10**8):
        assert 8 * block_size(n) <= 2 * n / 8  # an eighth of a 16-bit array at most


def test_a_non_contiguous_array_is_drawn_whole_with_the_same_values():
    base = np.zeros((300, 400), np.float32)
    view = base[::2, 1::3]
    fill_uniform(view, 0.0, 1.0, np.random.default_rng(3))
    expected = np.random.default_rng(3).uniform(0.0, 1.0, view.shape).astype(np.float32)
    np.testing.assert_array_equal(view, expected)
    assert not base[1::2].any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_keeps_its_seeded_weights(dtype):
    """Linear's default init is one float64 draw rounded into the storage dtype: weight, then
    bias, from the generator given — drawn here in blocks, with the same values."""
    dt = storage(dtype)
    n_in, n_out = 3000, 700  # 2.1M weights: many blocks
    layer = lk.Linear(n_in, n_out, dtype=dtype, rng=np.random.default_rng(11))
    rng = np.random.default_rng(11)
    k = 1 / math.sqrt(n_in)
    np.testing.assert_array_equal(bits(layer.weight.data),
                                  bits(rng.uniform(-k, k, (n_out, n_in)).astype(dt)))
    np.testing.assert_array_equal(bits(layer.bias.data), bits(rng.uniform(-k, k, n_out).astype(dt)))


SHAPE = (1500, 900)  # fan_in 900, fan_out 1500
XAVIER = math.sqrt(6.0 / (900 + 1500))  # gain 1
KAIMING = math.sqrt(3.0) * math.sqrt(2.0) / math.sqrt(900)  # leaky_relu with a=0: gain sqrt(2)


@pytest.mark.parametrize("name, whole", [
    ("uniform_", lambda rng: rng.uniform(0.0, 1.0, SHAPE)),
    ("normal_", lambda rng: rng.normal(0.0, 1.0, SHAPE)),
    ("xavier_uniform_", lambda rng: rng.uniform(-XAVIER, XAVIER, SHAPE)),
    ("xavier_normal_", lambda rng: rng.normal(0.0, math.sqrt(2.0 / (900 + 1500)), SHAPE)),
    ("kaiming_uniform_", lambda rng: rng.uniform(-KAIMING, KAIMING, SHAPE)),
    ("kaiming_normal_", lambda rng: rng.normal(0.0, math.sqrt(2.0) / math.sqrt(900), SHAPE)),
])
def test_init_functions_keep_their_seeded_values(name, whole):
    ours = getattr(init, name)(np.empty(SHAPE, np.float32), rng=np.random.default_rng(2))
    expected = whole(np.random.default_rng(2)).astype(np.float32)
    np.testing.assert_array_equal(bits(ours), bits(expected))


@pytest.mark.parametrize("name", ["uniform_", "normal_", "xavier_uniform_", "xavier_normal_",
                                  "kaiming_uniform_", "kaiming_normal_"])
def test_init_functions_hold_only_a_block_beside_the_array(name):
    a = np.empty((2000, 2000), np.float16)  # 8 MB; a whole float64 draw would be 32 MB
    tracemalloc.start()
    try:
        getattr(init, name)(a, rng=0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= 0.1 * a.nbytes, peak
