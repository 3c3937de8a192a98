"""Bare NumPy written the fastest way we know: the ceiling linearkit is measured against.

Leading dimensions flattened into one 2-D GEMM, the bias added in place, the batch-1 ``dW`` as
an outer product, and for training one flat parameter buffer (with per-layer views) so Adam is
a dozen in-place ufunc calls in total. Results go into preallocated ``out=`` buffers, except in
the large-layer group's ceiling: there NumPy returns fresh arrays (``y = x @ W.T; y += b``),
the contract of ``layer(x)``, of autograd's gradients and of PyTorch. Its ``:out`` cases, the
same GEMMs into preallocated buffers, show what the fresh pages cost (docs/performance.md).
"""

from __future__ import annotations

import math
import os
import time

import numpy as np

from . import cases, data
from .timing import loop

F32 = np.float32


def check() -> None:
    pass


def info() -> dict:
    return {"numpy": np.__version__}


# ----------------------------------------------------------------------------- one layer
def linear_case(x_shape, out_f: int, backward: bool, *, outer: bool = True,
                fresh: bool = False):
    """``fresh``: every output a new array (``x @ W.T + b``'s contract), else ``out=`` buffers."""
    gen = data.rng()
    in_f = x_shape[-1]
    w, b = data.linear_params(in_f, out_f, gen)
    x2 = data.uniform(x_shape, gen).reshape(-1, in_f)
    m = x2.shape[0]
    y2 = np.empty((m, out_f), F32)
    dy2 = data.uniform((m, out_f), gen)
    dx2 = np.empty_like(x2)
    dw = np.empty_like(w)
    db = np.empty_like(b)
    wt = w.T

    def forward():
        np.matmul(x2, wt, out=y2)
        np.add(y2, b, out=y2)

    def forward_backward():
        np.matmul(x2, wt, out=y2)
        np.add(y2, b, out=y2)
        np.matmul(dy2, w, out=dx2)
        if m == 1 and outer:
            np.multiply(dy2.T, x2, out=dw)
        else:
            np.matmul(dy2.T, x2, out=dw)
        np.sum(dy2, axis=0, out=db)

    def forward_fresh():
        y = x2 @ wt
        y += b
        return y

    def forward_backward_fresh():
        forward_fresh()
        return dy2 @ w, dy2.T @ x2, dy2.sum(axis=0)

    if fresh:
        step = forward_backward_fresh if backward else forward_fresh
    else:
        step = forward_backward if backward else forward
    return lambda n: loop(n, step)


def backward_case(in_f: int, out_f: int, outer: bool):
    """Backward only of a batch-1 layer: dx, dW (outer product or K=1 GEMM), db."""
    gen = data.rng()
    w, b = data.linear_params(in_f, out_f, gen)
    x = data.uniform((1, in_f), gen)
    dy = data.uniform((1, out_f), gen)
    dx, dw, db = np.empty_like(x), np.empty_like(w), np.empty_like(b)
    dyt = dy.T

    def step():
        np.matmul(dy, w, out=dx)
        if outer:
            np.multiply(dyt, x, out=dw)
        else:
            np.matmul(dyt, x, out=dw)
        np.copyto(db, dy[0])

    return lambda n: loop(n, step)


def large(rec) -> None:
    for x_shape, out_f in cases.LARGE:
        for kind in ("fwd", "fwdbwd"):
            case = cases.large_id(kind, x_shape, out_f)
            rec.time(case, linear_case, x_shape, out_f, kind == "fwdbwd", fresh=True)
            rec.time(f"{case}:out", linear_case, x_shape, out_f, kind == "fwdbwd")


def small(rec) -> None:
    x_shape, out_f = cases.SMALL
    rec.time("fwd", linear_case, x_shape, out_f, False)
    rec.time("fwdbwd", linear_case, x_shape, out_f, True)


def batch1(rec) -> None:
    for in_f, out_f in cases.BATCH1:
        rec.time(f"bwd:{in_f}->{out_f}", backward_case, in_f, out_f, True, variant="outer")
        rec.time(f"bwd-gemm:{in_f}->{out_f}", backward_case, in_f, out_f, False,
                 variant="dy.T @ x")


# ----------------------------------------------------------------------------- training
class FlatAdam:
    """PyTorch's Adam over one flat float32 buffer, with the bias correction folded in.

    ``p -= lr/bc1 · m / (sqrt(v)/sqrt(bc2) + eps)`` is computed as
    ``p -= (lr·sqrt(bc2)/bc1) · m / (sqrt(v) + eps·sqrt(bc2))`` (one pass fewer); the scalars are
    Python floats, so float32 stays float32.
    """

    def __init__(self, params: np.ndarray, grads: np.ndarray, lr: float,
                 betas=(0.9, 0.999), eps: float = 1e-8):
        self.p, self.g, self.lr, self.eps = params, grads, lr, eps
        self.b1, self.b2 = betas
        self.m = np.zeros_like(params)
        self.v = np.zeros_like(params)
        self.tmp = np.empty_like(params)
        self.t = 0

    def step(self) -> None:
        self.t += 1
        g, m, v, tmp = self.g, self.m, self.v, self.tmp
        m *= self.b1
        np.multiply(g, 1.0 - self.b1, out=tmp)
        m += tmp
        v *= self.b2
        np.multiply(g, g, out=tmp)
        tmp *= 1.0 - self.b2
        v += tmp
        sqrt_bc2 = math.sqrt(1.0 - self.b2 ** self.t)
        np.sqrt(v, out=tmp)
        tmp += self.eps * sqrt_bc2
        np.divide(m, tmp, out=tmp)
        tmp *= -self.lr * sqrt_bc2 / (1.0 - self.b1 ** self.t)
        self.p += tmp


def flat_layers(params):
    """One flat buffer for all weights and biases (and one for their grads), with views."""
    total = sum(w.size + b.size for w, b in params)
    flat, gflat = np.empty(total, F32), np.zeros(total, F32)
    views, gviews, i = [], [], 0
    for w, b in params:
        pair, gpair = [], []
        for a in (w, b):
            pair.append(flat[i:i + a.size].reshape(a.shape))
            gpair.append(gflat[i:i + a.size].reshape(a.shape))
            pair[-1][...] = a
            i += a.size
        views.append(tuple(pair))
        gviews.append(tuple(gpair))
    return flat, gflat, views, gviews


def cross_entropy_grad(z: np.ndarray, y: np.ndarray, dz: np.ndarray, rows: np.ndarray) -> float:
    """Mean cross-entropy of logits ``z`` against labels ``y``; writes ``dL/dz`` into ``dz``."""
    zmax = z.max(axis=1, keepdims=True)
    np.subtract(z, zmax, out=dz)
    np.exp(dz, out=dz)
    s = dz.sum(axis=1, keepdims=True)
    loss = float(np.mean(np.log(s[:, 0]) + zmax[:, 0] - z[rows, y]))
    dz /= s
    dz[rows, y] -= 1.0
    dz *= 1.0 / len(y)
    return loss


class MLP:
    """A hand-written 3-layer ReLU MLP + Adam, every array preallocated.

    ``h1 = relu(x W1ᵀ + b1)``, ``r = relu(h1 W2ᵀ + b2)``, ``h2 = r`` (or ``h1 + r`` with
    ``residual=True``: the recipe's residual block), ``z = h2 W3ᵀ + b3``.
    """

    def __init__(self, sizes, batch: int, lr: float, residual: bool = False, seed: int = 0):
        assert len(sizes) == 4 and (not residual or sizes[1] == sizes[2])
        params = data.mlp_params(sizes, data.rng(seed))
        self.flat, self.gflat, self.layers, self.grads = flat_layers(params)
        self.opt = FlatAdam(self.flat, self.gflat, lr)
        self.residual = residual
        self.rows = np.arange(batch)
        _, d1, d2, d3 = sizes
        self.h1, self.r, self.z = (np.empty((batch, d), F32) for d in (d1, d2, d3))
        self.h2 = np.empty((batch, d2), F32) if residual else self.r
        self.dh1, self.dh2, self.dr, self.dz = (np.empty((batch, d), F32)
                                                for d in (d1, d2, d2, d3))
        self.mask1, self.mask2 = np.empty((batch, d1), bool), np.empty((batch, d2), bool)

    def forward(self, x: np.ndarray) -> np.ndarray:
        (w1, b1), (w2, b2), (w3, b3) = self.layers
        np.matmul(x, w1.T, out=self.h1)
        self.h1 += b1
        np.maximum(self.h1, 0, out=self.h1)
        np.matmul(self.h1, w2.T, out=self.r)
        self.r += b2
        np.maximum(self.r, 0, out=self.r)
        if self.residual:
            np.add(self.h1, self.r, out=self.h2)
        np.matmul(self.h2, w3.T, out=self.z)
        self.z += b3
        return self.z

    def train_step(self, x: np.ndarray, y: np.ndarray) -> float:
        _, (w2, _), (w3, _) = self.layers
        (gw1, gb1), (gw2, gb2), (gw3, gb3) = self.grads
        z = self.forward(x)
        loss = cross_entropy_grad(z, y, self.dz, self.rows)
        np.matmul(self.dz.T, self.h2, out=gw3)
        np.sum(self.dz, axis=0, out=gb3)
        np.matmul(self.dz, w3, out=self.dh2)
        dr = self.dr if self.residual else self.dh2
        np.greater(self.r, 0, out=self.mask2)
        np.multiply(self.dh2, self.mask2, out=dr)
        np.matmul(dr.T, self.h1, out=gw2)
        np.sum(dr, axis=0, out=gb2)
        np.matmul(dr, w2, out=self.dh1)
        if self.residual:
            self.dh1 += self.dh2
        np.greater(self.h1, 0, out=self.mask1)
        np.multiply(self.dh1, self.mask1, out=self.dh1)
        np.matmul(self.dh1.T, x, out=gw1)
        np.sum(self.dh1, axis=0, out=gb1)
        self.opt.step()
        return loss


def gemms_case(sizes, batch: int):
    """Only the 8 GEMMs of one :class:`MLP` training step, back to back, into the step's own
    buffers: 3 forward, then dW3, dh2, dW2, dh1, dW1 (no dX for the first layer), on the inputs
    the step cycles through (``data.step_inputs``). The floor a NumPy step of this model cannot
    go under (the target: "the step within 15% of its GEMMs")."""
    net = MLP(sizes, batch, cases.MLP_LR)
    batches = data.classification_batches(batch, sizes[0], sizes[-1], data.rng(1))
    net.train_step(*batches[0])  # real values in every buffer (np.empty may hold NaNs or denormals)
    xs = [x for x, _ in batches]
    (w1, _), (w2, _), (w3, _) = net.layers
    (gw1, _), (gw2, _), (gw3, _) = net.grads
    h1, h2, z, dz, dh2, dh1 = net.h1, net.h2, net.z, net.dz, net.dh2, net.dh1
    state = {"i": 0}

    def step():
        x = xs[state["i"] % len(xs)]
        state["i"] += 1
        np.matmul(x, w1.T, out=h1)
        np.matmul(h1, w2.T, out=h2)
        np.matmul(h2, w3.T, out=z)
        np.matmul(dz.T, h2, out=gw3)
        np.matmul(dz, w3, out=dh2)
        np.matmul(dh2.T, h1, out=gw2)
        np.matmul(dh2, w2, out=dh1)
        np.matmul(dh1.T, x, out=gw1)

    return lambda n: loop(n, step)


def mlp(rec) -> None:
    sizes = cases.MLP_SIZES
    for batch in cases.MLP_TRAIN_BATCHES:
        rec.time(f"gemms:{batch}", gemms_case, sizes, batch, train=True, batch=batch,
                 gemms=len(cases.step_gemms(sizes, batch)))

        def build(batch=batch):
            net = MLP(sizes, batch, cases.MLP_LR)
            batches = data.classification_batches(batch, sizes[0], sizes[-1], data.rng(1))
            state = {"i": 0}

            def step():
                x, y = batches[state["i"] % len(batches)]
                state["i"] += 1
                net.train_step(x, y)

            return lambda n: loop(n, step)

        rec.time(f"train:{batch}", build, train=True, batch=batch)
    for batch in cases.MLP_INFER_BATCHES:
        def build_infer(batch=batch):
            net = MLP(sizes, batch, cases.MLP_LR)
            x = data.uniform((batch, sizes[0]), data.rng(2))
            return lambda n: loop(n, lambda: net.forward(x))

        rec.time(f"infer:{batch}", build_infer, batch=batch)


def recipe(rec) -> None:
    r = cases.RECIPE
    steps = rec.cfg["recipe_steps"]
    x_all, y_all = data.recipe_dataset(data.rng())
    order = data.recipe_batches(steps)

    def once() -> float:
        net = MLP(cases.RECIPE_SIZES, r["batch"], r["lr"], residual=True)
        start = time.perf_counter()
        for idx in order:
            net.train_step(x_all[idx], y_all[idx])
        return time.perf_counter() - start

    rec.time("gemms", gemms_case, cases.RECIPE_SIZES, r["batch"], train=True, batch=r["batch"],
             gemms=len(cases.step_gemms(cases.RECIPE_SIZES, r["batch"])))
    recipe_variants(rec, once)


def one_blas_thread():
    """A context in which NumPy's BLAS uses one thread (threadpoolctl), for the variant rows."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


def recipe_variants(rec, once, one_thread=None) -> None:
    """The recipe as is, then with the BLAS limited to one thread by ``one_thread()`` (default
    ``one_blas_thread``: a context manager, entered around each run; skipped without
    threadpoolctl, and when the run already limits threads with --threads 1)."""
    repeats, steps = rec.cfg["recipe_repeats"], rec.cfg["recipe_steps"]
    rec.runs("train", once, repeats, steps)
    if rec.cfg.get("quick") or os.environ.get("OPENBLAS_NUM_THREADS") == "1":
        return
    limit = one_thread or one_blas_thread
    try:
        with limit():
            pass
    except ImportError as err:
        rec.fail("train-1thread", err)
        return

    def once_on_one_thread() -> float:
        with limit():
            return once()

    rec.runs("train-1thread", once_on_one_thread, repeats, steps)


# ----------------------------------------------------------------------------- busy machine
def readme_batch():
    """The README's one batch: x (100, 40) standard normal (seed 0), target arange(100) % 10."""
    x = np.random.default_rng(0).standard_normal((100, 40)).astype(F32)
    return x, np.arange(100) % 10


def recipe_stream(steps: int = 400):
    """``next_batch()`` cycling over ``steps`` of the recipe's index batches, gathered each
    step from the 4,000-row set (as the recipe group does)."""
    x_all, y_all = data.recipe_dataset(data.rng())
    order = data.recipe_batches(steps)
    state = {"i": 0}

    def next_batch():
        idx = order[state["i"] % len(order)]
        state["i"] += 1
        return x_all[idx], y_all[idx]

    return next_batch


def busy_builds():
    """The busy group's three steps, as ``prepare`` builders (benchmarks.timing)."""
    r = cases.RECIPE
    recipe_sizes = (r["in"], r["hidden"], r["hidden"], r["classes"])

    def recipe():
        net = MLP(recipe_sizes, r["batch"], r["lr"], residual=True)
        next_batch = recipe_stream()
        return lambda n: loop(n, lambda: net.train_step(*next_batch()))

    def readme():
        net = MLP(recipe_sizes, r["batch"], r["lr"], residual=True)
        x, y = readme_batch()
        return lambda n: loop(n, lambda: net.train_step(x, y))

    def mlp128():
        sizes = cases.MLP_SIZES
        net = MLP(sizes, 128, cases.MLP_LR)
        batches = data.classification_batches(128, sizes[0], sizes[-1], data.rng(1))
        state = {"i": 0}

        def step():
            x, y = batches[state["i"] % len(batches)]
            state["i"] += 1
            net.train_step(x, y)

        return lambda n: loop(n, step)

    return {"recipe": recipe, "readme": readme, "mlp128": mlp128}


def busy(rec) -> None:
    from .busy import Plan

    plan = Plan(rec)
    for name, build in busy_builds().items():
        plan.add(f"{name}/default", build)
        plan.add(f"{name}/1thread", build, setting=one_blas_thread)
    plan.run()
