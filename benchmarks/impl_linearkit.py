"""linearkit, used the way its README and docs/custom_modules.md say: ``layer(x)``,
``layer.vjp(x)`` and the documented training step, through ``linearkit.training.loop.step`` (the
library's one copy of it)::

    pred, back = model.vjp(x, input_grad=False)
    loss, loss_back = loss_fn.vjp(pred, target)
    back(loss_back())
    opt.step(); opt.zero_grad(set_to_none=False)

The busy group's ``readme`` case runs the README's lines written out, as a user's own loop.
BLAS threads: the library's policy (``linearkit.backend.threads``) unless a case sets a count.
"""

from __future__ import annotations

import os
import time

from . import cases, data
from .impl_numpy import readme_batch, recipe_stream, recipe_variants
from .timing import loop

lk = None
# --serve (benchmarks/paired.py): before each repeat, run the case untimed for this long and this
# many calls at least. The other frameworks' turns look like load from other processes to the
# BLAS-thread policy, which backs off to one thread at its next look and comes back after
# UP_SAMPLES calm looks SAMPLE_S apart (0.46 s measured, benchmarks/busy.py), one look per
# GEMM at most: a case of one 0.3 s GEMM needs 3 calls. A repeat should see the policy as it is
# on an idle machine (the large group's 8192-row forward measured 49% of NumPy without this).
SERVE_WARM_S = 0.7
SERVE_WARM_CALLS = 3      # linearkit.backend.threads.UP_SAMPLES + 1
# Steps of a throwaway model before the recipe's timed runs: Adam's first step packs its flat
# state, the next ones run (and load) every compiled kernel of the step.
WARM_STEPS = 3


def check() -> None:
    global lk
    import linearkit as _lk

    lk = _lk


def info() -> dict:
    return {"linearkit": lk.__version__, "path": lk.__file__}


def policy_state() -> dict:
    """The BLAS-thread policy as --serve follows it around each case's timed repeats:
    ``backoffs``, how often it has taken threads away so far (the host or another process kept
    a core busy, and some GEMMs ran on fewer threads than NumPy's, which always use every
    core), and ``reduced``, whether a large GEMM would get fewer threads than on an idle
    machine as of its last look (a repeat starting so: its warm-up had not seen the machine
    idle again)."""
    info = lk.threads.info()
    return {"backoffs": info["backoffs"],
            "reduced": info["policy"] == "adaptive" and info["allowed_large"] < info["num_threads"]}


def layer(in_f: int, out_f: int):
    m = lk.Linear(in_f, out_f)
    w, b = data.linear_params(in_f, out_f, data.rng())
    m.weight.data[...] = w
    m.bias.data[...] = b
    return m


# ----------------------------------------------------------------------------- one layer
def linear_case(x_shape, out_f: int, backward: bool, zero_grad: bool = True):
    """Forward ``layer(x)``; forward+backward ``vjp`` + ``backward(dy)`` (+ ``zero_grad()``)."""
    gen = data.rng(1)
    m = layer(x_shape[-1], out_f)
    x = data.uniform(x_shape, gen)
    dy = data.uniform(x_shape[:-1] + (out_f,), gen)

    def forward_backward():
        _, back = m.vjp(x)
        back(dy)
        if zero_grad:
            m.zero_grad()

    step = forward_backward if backward else (lambda: m(x))
    return lambda n: loop(n, step)


def backward_case(in_f: int, out_f: int):
    """Backward only: ``n`` closures are built untimed, then called (gradients accumulate)."""
    gen = data.rng(1)
    m = layer(in_f, out_f)
    x = data.uniform((1, in_f), gen)
    dy = data.uniform((1, out_f), gen)

    def prepare(n):
        backs = [m.vjp(x)[1] for _ in range(n)]

        def run():
            for back in backs:
                back(dy)
        return run

    return prepare


def large(rec) -> None:
    for x_shape, out_f in cases.LARGE:
        for kind in ("fwd", "fwdbwd"):
            rec.time(cases.large_id(kind, x_shape, out_f), linear_case, x_shape, out_f,
                     kind == "fwdbwd")


def precision(rec) -> None:
    """16-bit-stored Linear vs float32, interleaved (``benchmarks/precision.py``)."""
    from .precision import run

    run(rec, lk)


def small(rec) -> None:
    x_shape, out_f = cases.SMALL
    rec.time("fwd", linear_case, x_shape, out_f, False)
    # As PyTorch's autograd does, gradients accumulate across calls (no zero_grad per call).
    rec.time("fwdbwd", linear_case, x_shape, out_f, True, False)


def batch1(rec) -> None:
    for in_f, out_f in cases.BATCH1:
        rec.time(f"bwd:{in_f}->{out_f}", backward_case, in_f, out_f)


# ----------------------------------------------------------------------------- models
def build_model(sizes, residual: bool = False):
    """The shared init, as a ``Sequential`` (with the recipe's ``Residual`` block if asked)."""
    d0, d1, d2, d3 = sizes
    layers = [layer(a, b) for a, b in ((d0, d1), (d1, d2), (d2, d3))]
    for m, (w, b) in zip(layers, data.mlp_params(sizes, data.rng())):
        m.weight.data[...] = w
        m.bias.data[...] = b
    hidden = lk.Sequential(layers[1], lk.ReLU())
    if residual:
        hidden = lk.Residual(hidden)
    return lk.Sequential(layers[0], lk.ReLU(), hidden, layers[2])


def trainer(model, lr: float):
    """The documented training step (``linearkit.training.loop.step``), as a function of one batch."""
    from linearkit.training.loop import step as train_step

    loss_fn = lk.CrossEntropyLoss()
    opt = lk.optim.Adam(model.parameters(), lr=lr)

    def step(x, y):
        # zero_grad(set_to_none=False), as README: reuse the gradient buffers
        return train_step(model, loss_fn, opt, x, y, set_to_none=False)

    return step


def cycling(step, batches):
    state = {"i": 0}

    def one():
        x, y = batches[state["i"] % len(batches)]
        state["i"] += 1
        step(x, y)

    return one


def gemms_case(sizes, batch: int):
    """Only the 8 GEMMs of one MLP training step, back to back, through the functions and the
    BLAS-thread policy the step itself uses (``linearkit.functional``): 3 forward, then dW3,
    dh2, dW2, dh1, dW1 (weight gradients written into kept buffers, as the step does), on the
    inputs the step cycles through (``data.step_inputs``)."""
    import numpy as np

    F = lk.functional
    (w1, _), (w2, _), (w3, _) = data.mlp_params(sizes, data.rng())
    xs = data.step_inputs(batch, sizes)
    dz = data.uniform((batch, sizes[-1]), data.rng(2), 1.0 / batch)
    gw1, gw2, gw3 = (np.empty_like(w) for w in (w1, w2, w3))
    state = {"i": 0}

    def step():
        x = xs[state["i"] % len(xs)]
        state["i"] += 1
        h1 = F.linear(x, w1)
        h2 = F.linear(h1, w2)
        F.linear(h2, w3)
        F.linear_weight_grad(dz, h2, out=gw3)
        dh2 = F.linear_input_grad(dz, w3)
        F.linear_weight_grad(dh2, h1, out=gw2)
        dh1 = F.linear_input_grad(dh2, w2)
        F.linear_weight_grad(dh1, x, out=gw1)

    return lambda n: loop(n, step)


def mlp(rec) -> None:
    sizes = cases.MLP_SIZES
    for batch in cases.MLP_TRAIN_BATCHES:
        rec.time(f"gemms:{batch}", gemms_case, sizes, batch, train=True, batch=batch,
                 gemms=len(cases.step_gemms(sizes, batch)))
        def build(batch=batch):
            step = trainer(build_model(sizes), cases.MLP_LR)
            batches = data.classification_batches(batch, sizes[0], sizes[-1], data.rng(1))
            one = cycling(step, batches)
            return lambda n: loop(n, one)

        rec.time(f"train:{batch}", build, train=True, batch=batch)
    for batch in cases.MLP_INFER_BATCHES:
        def build_infer(batch=batch, kernels=True):
            model = build_model(sizes).eval()
            x = data.uniform((batch, sizes[0]), data.rng(2))
            if kernels:
                return lambda n: loop(n, lambda: model(x))
            return lambda n: without_kernels(loop(n, lambda: model(x)))

        rec.time(f"infer:{batch}", build_infer, batch=batch)
        rec.time(f"infer-no-kernels:{batch}", build_infer, batch, False, batch=batch)


def without_kernels(run):
    """``run`` under ``LINEARKIT_FAST=0``: linearkit's NumPy path, which a process that never
    loaded the compiled kernels runs (inference alone never imports numba; or numba is absent),
    here in a process whose training cases loaded them. Set once per repeat, not per call."""
    def run_without_kernels():
        before = os.environ.get("LINEARKIT_FAST")
        os.environ["LINEARKIT_FAST"] = "0"
        try:
            run()
        finally:
            if before is None:
                del os.environ["LINEARKIT_FAST"]
            else:
                os.environ["LINEARKIT_FAST"] = before

    return run_without_kernels


def recipe_parts():
    r = cases.RECIPE
    sizes = (r["in"], r["hidden"], r["hidden"], r["classes"])
    return sizes, r


def recipe(rec) -> None:
    sizes, r = recipe_parts()
    steps = rec.cfg["recipe_steps"]
    x_all, y_all = data.recipe_dataset(data.rng())
    order = data.recipe_batches(steps)
    # untimed, as JAX compiles its step before its runs: numba's import and the kernels' load
    # from its cache (~0.6 s, once per process) would otherwise land in the first timed run,
    # whose 6,000 steps take ~0.6 s (the start-up is measured end to end: the e2e group)
    warm = trainer(build_model(sizes, residual=True), r["lr"])
    for idx in order[:WARM_STEPS]:
        warm(x_all[idx], y_all[idx])

    def once() -> float:
        step = trainer(build_model(sizes, residual=True), r["lr"])
        start = time.perf_counter()
        for idx in order:
            step(x_all[idx], y_all[idx])
        return time.perf_counter() - start

    rec.time("gemms", gemms_case, sizes, r["batch"], train=True, batch=r["batch"],
             gemms=len(cases.step_gemms(sizes, r["batch"])))
    recipe_variants(rec, once, lambda: lk.threads.num_threads(1))
    repeats = rec.cfg["recipe_repeats"]
    rec.runs("train-cli", cli_path(x_all, y_all, steps), repeats, steps)
    if rec.cfg.get("quick"):
        return
    rec.runs("train-parts", step_in_parts(once), repeats, steps)
    rec.runs("train-thin", without_compiled_chain(once), repeats, steps)
    rec.runs("train-flush", flushing_denormals(once), repeats, steps)


def step_in_parts(once):
    """``once`` with the one-call compiled step off (linearkit/runtime/compiled_step.py): the chain, the
    fused loss and Adam's flat kernel called one by one."""
    import linearkit as lk

    def run() -> float:
        with lk.runtime.disabled("compiled_step"):
            return once()
    return run


def without_compiled_chain(once):
    """``once`` with the compiled step and Sequential's compiled chain off (the thin path:
    runtime/thin_path.py)."""
    import linearkit as lk

    def run() -> float:
        with lk.runtime.disabled("compiled_step", "compiled_chain"):
            return once()
    return run


def flushing_denormals(once):
    """``once`` under ``lk.set_flush_denormal(True)`` (subnormals as zero, as JAX computes)."""
    from linearkit.backend.denormal import flush_denormal

    def run() -> float:
        with flush_denormal() as supported:
            if not supported:
                raise RuntimeError("set_flush_denormal is not supported on this platform")
            return once()
    return run


def cli_path(x_all, y_all, steps: int):
    """One run of ``linearkit.recipes.train_mnist1d.train`` (what ``linearkit train`` runs, subnormals flushed
    as its default) on the synthetic data, evaluation off; its own timer (the training loop
    only, loader included)."""
    from types import SimpleNamespace

    from linearkit.recipes.train_mnist1d import train

    dataset = SimpleNamespace(x_train=x_all, y_train=y_all, x_test=x_all[:1000],
                              y_test=y_all[:1000])

    def once() -> float:
        _, result = train("mlp", steps=steps, dataset=dataset, eval_every=0,
                          flush_denormal=True)     # as the command does by default
        return result.seconds

    return once


def e2e(rec) -> None:
    """``linearkit train`` in a fresh process, numba's kernel cache filled and empty
    (benchmarks/e2e.py)."""
    from .e2e import linearkit_command, run_cases

    rec.put("fast", {"numba": _has("numba"), "LINEARKIT_FAST": os.environ.get("LINEARKIT_FAST")})
    run_cases(rec, {"train": lambda data, out, steps: linearkit_command(out, steps)},
              cold_too=True)


def sweep(rec) -> None:
    """linearkit.analysis.layer_sweep's batch and width sweeps (benchmarks/sweep.py)."""
    from .sweep import linearkit_sweep

    linearkit_sweep(rec, lk)


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def footprint(rec) -> None:
    from .footprint import measure_imports

    rec.guarded("import", measure_imports, rec.cfg["import_repeats"])


def memory(rec) -> None:
    from .memcheck import training_memory

    rec.guarded("train:recipe", training_memory, lk, build_model, trainer,
                rec.cfg["memory_steps"])


def profile(rec) -> None:
    from .profiling import overheads, profile_training

    sizes, r = recipe_parts()
    steps = rec.cfg["profile_steps"]
    rec.guarded("recipe", profile_training, build_model(sizes, residual=True),
                trainer, r["batch"], r["lr"], steps)
    rec.guarded("mlp:128", profile_training, build_model(cases.MLP_SIZES), trainer, 128,
                cases.MLP_LR, max(steps // 4, 50))
    rec.guarded("overheads", overheads, lk, rec.cfg)


# ----------------------------------------------------------------------------- busy machine
def readme_model():
    """README's "A training step", verbatim: seed, model, loss, optimizer."""
    lk.manual_seed(0)
    model = lk.Sequential(lk.Linear(40, 100), lk.ReLU(),
                          lk.Residual(lk.Sequential(lk.Linear(100, 100), lk.ReLU())),
                          lk.Linear(100, 10))
    return model, lk.CrossEntropyLoss(), lk.optim.Adam(model.parameters(), lr=1e-2)


def busy_builds():
    """The busy group's three steps, as ``prepare`` builders (benchmarks.timing)."""
    r = cases.RECIPE
    recipe_sizes = (r["in"], r["hidden"], r["hidden"], r["classes"])

    def recipe():
        step = trainer(build_model(recipe_sizes, residual=True), r["lr"])
        next_batch = recipe_stream()
        return lambda n: loop(n, lambda: step(*next_batch()))

    def readme():
        model, loss_fn, opt = readme_model()
        x, target = readme_batch()

        def step():  # the README's lines, as a user writes them in their own loop
            pred, backward = model.vjp(x, input_grad=False)
            loss, loss_backward = loss_fn.vjp(pred, target)  # noqa: RUF059 (README's line)
            backward(loss_backward())
            opt.step()
            opt.zero_grad(set_to_none=False)

        return lambda n: loop(n, step)

    def mlp128():
        sizes = cases.MLP_SIZES
        step = trainer(build_model(sizes), cases.MLP_LR)
        one = cycling(step, data.classification_batches(128, sizes[0], sizes[-1], data.rng(1)))
        return lambda n: loop(n, one)

    return {"recipe": recipe, "readme": readme, "mlp128": mlp128}


def gemm_case(m: int, k: int, n: int):
    """A forward GEMM ``x (m, k) @ W.T`` through ``linearkit.functional.linear`` (no bias)."""
    gen = data.rng(3)
    x, w = data.uniform((m, k), gen), data.uniform((n, k), gen)
    return lambda reps: loop(reps, lambda: lk.functional.linear(x, w))


def busy(rec) -> None:
    from .busy import Plan

    plan = Plan(rec)
    fixed = lk.threads.num_threads
    rec.put("policy", lk.threads.info())
    for name, build in busy_builds().items():
        plan.add(f"{name}/default", build)
        plan.add(f"{name}/1thread", build, setting=lambda: fixed(1))
        plan.add(f"{name}/2threads", build, setting=lambda: fixed(2))
    for m, k, n in cases.BUSY_GEMMS:
        for t in (1, 2):
            plan.add(f"gemm:{m}x{k}x{n}/{t}t", gemm_case, m, k, n,
                     setting=lambda t=t: fixed(t), train=False, macs=m * k * n)
    plan.run()
