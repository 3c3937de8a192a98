"""Synthetic data of the right shapes (values do not matter for timing, only dtypes and sizes).

Every framework gets the same arrays, generated here with NumPy and converted at its edge.
"""

from __future__ import annotations

import itertools

import numpy as np

from . import cases


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def uniform(shape, gen: np.random.Generator, scale: float = 1.0) -> np.ndarray:
    return gen.uniform(-scale, scale, shape).astype(np.float32)


def linear_params(in_f: int, out_f: int, gen: np.random.Generator):
    """PyTorch's default init distribution: U(±1/sqrt(in)) for weight and bias."""
    bound = 1.0 / np.sqrt(in_f)
    return uniform((out_f, in_f), gen, bound), uniform((out_f,), gen, bound)


def mlp_params(sizes, gen: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray]]:
    return [linear_params(a, b, gen) for a, b in itertools.pairwise(sizes)]


def classification_batches(batch: int, n_in: int, n_classes: int, gen: np.random.Generator,
                           count: int = cases.N_BATCHES):
    """``count`` batches ``(x float32 (batch, n_in), y int64 (batch,))``."""
    return [(uniform((batch, n_in), gen), gen.integers(0, n_classes, batch).astype(np.int64))
            for _ in range(count)]


def step_inputs(batch: int, sizes) -> list[np.ndarray]:
    """The inputs ``x (batch, sizes[0])`` an MLP throughput case cycles through (the ``x`` of
    ``classification_batches`` drawn from ``rng(1)``, as the training cases draw them): the
    GEMMs-alone cases read the same ``N_BATCHES`` arrays, not one that stays in cache."""
    return [x for x, _ in classification_batches(batch, sizes[0], sizes[-1], rng(1))]


def recipe_dataset(gen: np.random.Generator):
    """MNIST-1D-shaped training set: 4,000 sequences of length 40, 10 classes."""
    r = cases.RECIPE
    x = gen.standard_normal((r["n_train"], r["in"])).astype(np.float32)
    y = gen.integers(0, r["classes"], r["n_train"]).astype(np.int64)
    return x, y


def recipe_batches(steps: int, seed: int = 1):
    """The index arrays of ``steps`` steps: reshuffled every epoch, incomplete batches dropped.

    Every framework consumes the same sequence (the index generation itself is not timed).
    """
    r = cases.RECIPE
    gen = np.random.default_rng(seed)
    per_epoch = r["n_train"] // r["batch"]
    out = []
    while len(out) < steps:
        perm = gen.permutation(r["n_train"])
        out.extend(perm[i * r["batch"]:(i + 1) * r["batch"]] for i in range(per_epoch))
    return out[:steps]
