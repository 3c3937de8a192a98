"""JAX with ``jax.jit`` on CPU: whole training steps compiled (Adam written out, buffers donated);
every timed call waits for its result (``block_until_ready``)."""

from __future__ import annotations

import time
from functools import partial

from . import cases, data
from .timing import loop

jax = jnp = None


def check() -> None:
    global jax, jnp
    import jax as _jax
    import jax.numpy as _jnp

    jax, jnp = _jax, _jnp


def info() -> dict:
    import jaxlib

    return {"jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "devices": [str(d) for d in jax.devices()]}


def _linear(x, w, b):
    return x @ w.T + b


# ----------------------------------------------------------------------------- one layer
def linear_case(x_shape, out_f: int, backward: bool):
    gen = data.rng(1)
    w, b = (jnp.asarray(a) for a in data.linear_params(x_shape[-1], out_f, data.rng()))
    x = jnp.asarray(data.uniform(x_shape, gen))
    dy = jnp.asarray(data.uniform(x_shape[:-1] + (out_f,), gen))

    fwd = jax.jit(_linear)

    @jax.jit
    def fwd_bwd(x, w, b, dy):
        y, vjp = jax.vjp(_linear, x, w, b)
        return (y, *vjp(dy))

    if backward:
        return lambda n: loop(n, lambda: jax.block_until_ready(fwd_bwd(x, w, b, dy)))
    return lambda n: loop(n, lambda: fwd(x, w, b).block_until_ready())


def large(rec) -> None:
    for x_shape, out_f in cases.LARGE:
        for kind in ("fwd", "fwdbwd"):
            rec.time(cases.large_id(kind, x_shape, out_f), linear_case, x_shape, out_f,
                     kind == "fwdbwd")


def small(rec) -> None:
    x_shape, out_f = cases.SMALL
    rec.time("fwd", linear_case, x_shape, out_f, False)
    rec.time("fwdbwd", linear_case, x_shape, out_f, True)


# ----------------------------------------------------------------------------- models
def init(sizes):
    return [(jnp.asarray(w), jnp.asarray(b)) for w, b in data.mlp_params(sizes, data.rng())]


def forward(params, x, residual: bool = False):
    (w1, b1), (w2, b2), (w3, b3) = params
    h1 = jax.nn.relu(_linear(x, w1, b1))
    r = jax.nn.relu(_linear(h1, w2, b2))
    h2 = h1 + r if residual else r
    return _linear(h2, w3, b3)


def loss_fn(params, x, y, residual: bool = False):
    logp = jax.nn.log_softmax(forward(params, x, residual))
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


def make_step(lr: float, residual: bool = False, betas=(0.9, 0.999), eps: float = 1e-8):
    """One jitted Adam step (PyTorch's update rule), parameters and state donated."""
    b1, b2 = betas

    @partial(jax.jit, donate_argnums=(0, 1))
    def step(params, state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y, residual)
        m, v, t = state
        t = t + 1
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
        bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
        params = jax.tree.map(
            lambda p, m, v: p - (lr / bc1) * m / (jnp.sqrt(v) / jnp.sqrt(bc2) + eps),
            params, m, v)
        return params, (m, v, t), loss

    return step


def adam_state(params):
    zeros = jax.tree.map(jnp.zeros_like, params)
    return (zeros, jax.tree.map(jnp.zeros_like, params), jnp.zeros((), jnp.float32))


def gemm_products(x, weights, dz) -> list:
    """The GEMMs of one training step of the chain ``weights`` (``cases.step_gemms``), in its
    order: ``h_i = h_{i-1} @ W_i.T``, then from the last layer down ``dW_i = dy_i.T @ h_{i-1}``
    and ``dy_{i-1} = dy_i @ W_i`` (not for the first layer), ``dy`` of the last being ``dz``."""
    hs = [x]
    for w in weights:
        hs.append(hs[-1] @ w.T)
    products, dy = hs[1:], dz
    for i in range(len(weights) - 1, -1, -1):
        products.append(dy.T @ hs[i])
        if i:
            dy = dy @ weights[i]
            products.append(dy)
    return products


def gemms_case(sizes, batch: int):
    """Only the GEMMs of one training step, as one jitted call, back to back on the inputs the
    MLP steps cycle through (``data.step_inputs``). ``dz`` is donated and handed back
    unchanged, so each call waits for the one before (as the step's donated parameters make it)
    without a wait in Python; the run waits for the last call. (Donating the weights instead
    costs a copy of them per call.)"""
    @partial(jax.jit, donate_argnums=(2,))
    def products(x, weights, dz):
        return gemm_products(x, weights, dz), dz

    weights = [jnp.asarray(w) for w, _ in data.mlp_params(sizes, data.rng())]
    xs = [jnp.asarray(x) for x in data.step_inputs(batch, sizes)]
    box = {"dz": jnp.asarray(data.uniform((batch, sizes[-1]), data.rng(2), 1.0 / batch)),
           "i": 0}

    def one():
        x = xs[box["i"] % len(xs)]
        box["i"] += 1
        box["out"], box["dz"] = products(x, weights, box["dz"])

    def prepare(n):
        inner = loop(n, one)

        def run():
            inner()
            jax.block_until_ready(box["out"])
        return run

    return prepare


def mlp(rec) -> None:
    sizes = cases.MLP_SIZES
    for batch in cases.MLP_TRAIN_BATCHES:
        rec.time(f"gemms:{batch}", gemms_case, sizes, batch, train=True, batch=batch,
                 gemms=len(cases.step_gemms(sizes, batch)))
        def build(batch=batch):
            step = make_step(cases.MLP_LR)
            box = {"p": init(sizes), "i": 0}
            box["s"] = adam_state(box["p"])
            batches = [(jnp.asarray(x), jnp.asarray(y)) for x, y in
                       data.classification_batches(batch, sizes[0], sizes[-1], data.rng(1))]

            def one():
                x, y = batches[box["i"] % len(batches)]
                box["i"] += 1
                box["p"], box["s"], _ = step(box["p"], box["s"], x, y)

            def prepare(n):
                inner = loop(n, one)

                def run():
                    inner()
                    jax.block_until_ready(box["p"])
                return run

            return prepare

        rec.time(f"train:{batch}", build, train=True, batch=batch)
    for batch in cases.MLP_INFER_BATCHES:
        def build_infer(batch=batch):
            params = init(sizes)
            fwd = jax.jit(forward)
            x = jnp.asarray(data.uniform((batch, sizes[0]), data.rng(2)))
            return lambda n: loop(n, lambda: fwd(params, x).block_until_ready())

        rec.time(f"infer:{batch}", build_infer, batch=batch)


def recipe(rec) -> None:
    r = cases.RECIPE
    steps = rec.cfg["recipe_steps"]
    x_all, y_all = data.recipe_dataset(data.rng())
    order = data.recipe_batches(steps)
    sizes = cases.RECIPE_SIZES
    step = make_step(r["lr"], residual=True)
    warm = init(sizes)  # compile once, untimed (as the other frameworks' first call is)
    step(warm, adam_state(warm), x_all[order[0]], y_all[order[0]])

    def once() -> float:
        params = init(sizes)
        state = adam_state(params)
        jax.block_until_ready(state)
        start = time.perf_counter()
        for idx in order:
            params, state, _ = step(params, state, x_all[idx], y_all[idx])
        jax.block_until_ready(params)
        return time.perf_counter() - start

    rec.runs("train", once, rec.cfg["recipe_repeats"], steps)
    rec.time("gemms", gemms_case, sizes, r["batch"], train=True, batch=r["batch"],
             gemms=len(cases.step_gemms(sizes, r["batch"])))


def e2e(rec) -> None:
    """The recipe as a JAX script in a fresh process, compilation included (benchmarks/e2e.py)."""
    from .e2e import run_cases, script_command

    run_cases(rec, {"train": lambda data, out, steps: script_command("jax", data, out, steps)},
              needs_data=True)
