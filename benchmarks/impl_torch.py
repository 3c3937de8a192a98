"""PyTorch eager on CPU: ``F.linear`` and autograd, ``nn.Sequential`` models, ``torch.optim.Adam``
in its default (per-parameter for-loop on CPU) and fused (``fused=True``) implementations."""

from __future__ import annotations

import time

from . import cases, data
from .timing import loop

torch = None


def check() -> None:
    global torch
    import torch as _torch

    torch = _torch
    torch.manual_seed(0)


def info() -> dict:
    return {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "interop_threads": torch.get_num_interop_threads(), "blas": blas_name()}


def blas_name() -> str | None:
    """The BLAS torch was built with, as its build settings say (``BLAS_INFO=mkl``)."""
    import re

    found = re.search(r"\bBLAS_INFO=([^,\s]+)", torch.__config__.show())
    return found.group(1) if found else None


def on_threads(threads: int | None, prepare):
    """``prepare`` whose runs happen under ``torch.set_num_threads(threads)`` (the count before
    restored after each run); ``prepare`` itself when ``threads`` is None."""
    if threads is None:
        return prepare

    def prepare_on_threads(n):
        run = prepare(n)

        def run_on_threads():
            before = torch.get_num_threads()
            torch.set_num_threads(threads)
            try:
                run()
            finally:
                torch.set_num_threads(before)
        return run_on_threads

    return prepare_on_threads


def tensor(a):
    return torch.from_numpy(a)


def params(in_f: int, out_f: int, grad: bool):
    w, b = data.linear_params(in_f, out_f, data.rng())
    return tensor(w).requires_grad_(grad), tensor(b).requires_grad_(grad)


# ----------------------------------------------------------------------------- one layer
def linear_case(x_shape, out_f: int, backward: bool):
    import torch.nn.functional as F

    gen = data.rng(1)
    w, b = params(x_shape[-1], out_f, backward)
    x = tensor(data.uniform(x_shape, gen)).requires_grad_(backward)
    dy = tensor(data.uniform(x_shape[:-1] + (out_f,), gen))

    def forward():
        with torch.no_grad():
            F.linear(x, w, b)

    def forward_backward():
        F.linear(x, w, b).backward(dy)
        x.grad = w.grad = b.grad = None

    step = forward_backward if backward else forward
    return lambda n: loop(n, step)


def backward_case(in_f: int, out_f: int):
    """Backward only: ``n`` graphs are built untimed, then their backward passes are timed."""
    import torch.nn.functional as F

    gen = data.rng(1)
    w, b = params(in_f, out_f, True)
    x = tensor(data.uniform((1, in_f), gen)).requires_grad_(True)
    dy = tensor(data.uniform((1, out_f), gen))

    def prepare(n):
        ys = [F.linear(x, w, b) for _ in range(n)]

        def run():
            for y in ys:
                y.backward(dy)
        return run

    return prepare


def large(rec) -> None:
    for x_shape, out_f in cases.LARGE:
        for kind in ("fwd", "fwdbwd"):
            rec.time(cases.large_id(kind, x_shape, out_f), linear_case, x_shape, out_f,
                     kind == "fwdbwd")


def small(rec) -> None:
    x_shape, out_f = cases.SMALL
    rec.time("fwd", linear_case, x_shape, out_f, False)
    rec.time("fwdbwd", linear_case, x_shape, out_f, True)


def batch1(rec) -> None:
    for in_f, out_f in cases.BATCH1:
        rec.time(f"bwd:{in_f}->{out_f}", backward_case, in_f, out_f)


# ----------------------------------------------------------------------------- models
def _residual_class():
    class Residual(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return x + self.inner(x)

    return Residual


def build_model(sizes, residual: bool = False):
    """Same init as the other frameworks (copied from the shared NumPy arrays)."""
    nn = torch.nn
    d0, d1, d2, d3 = sizes
    layers = [nn.Linear(d0, d1), nn.Linear(d1, d2), nn.Linear(d2, d3)]
    with torch.no_grad():
        for layer, (w, b) in zip(layers, data.mlp_params(sizes, data.rng())):
            layer.weight.copy_(tensor(w))
            layer.bias.copy_(tensor(b))
    hidden = nn.Sequential(layers[1], nn.ReLU())
    if residual:
        hidden = _residual_class()(hidden)
    return nn.Sequential(layers[0], nn.ReLU(), hidden, layers[2])


def trainer(model, lr: float, fused: bool):
    import torch.nn.functional as F

    opt = torch.optim.Adam(model.parameters(), lr=lr, fused=fused or None)

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def gemm_products(x, weights, dz, out=None) -> list:
    """The GEMMs of one training step of the chain ``weights`` (``cases.step_gemms``), in its
    order: ``h_i = h_{i-1} @ W_i.T``, then from the last layer down ``dW_i = dy_i.T @ h_{i-1}``
    and ``dy_{i-1} = dy_i @ W_i`` (not for the first layer), ``dy`` of the last being ``dz``.
    ``out``: the tensors to write them into (a previous call's results)."""
    slots = iter(out or [None] * (3 * len(weights) - 1))

    def mm(a, b):
        return torch.mm(a, b, out=next(slots))

    hs = [x]
    for w in weights:
        hs.append(mm(hs[-1], w.t()))
    products, dy = hs[1:], dz
    for i in range(len(weights) - 1, -1, -1):
        products.append(mm(dy.t(), hs[i]))
        if i:
            dy = mm(dy, weights[i])
            products.append(dy)
    return products


def gemms_case(sizes, batch: int, threads: int | None = None):
    """Only the GEMMs of one training step, back to back, into kept tensors (``torch.mm(...,
    out=)``: torch's BLAS with no allocation), on the inputs the MLP steps cycle through
    (``data.step_inputs``), under ``torch.set_num_threads(threads)`` when given."""
    weights = [tensor(w) for w, _ in data.mlp_params(sizes, data.rng())]
    xs = [tensor(x) for x in data.step_inputs(batch, sizes)]
    dz = tensor(data.uniform((batch, sizes[-1]), data.rng(2), 1.0 / batch))
    out = gemm_products(xs[0], weights, dz)
    state = {"i": 0}

    def one():
        x = xs[state["i"] % len(xs)]
        state["i"] += 1
        gemm_products(x, weights, dz, out)

    return on_threads(threads, lambda n: loop(n, one))


def fused_variants() -> list[tuple[str, str, int | None]]:
    """``(step case, GEMMs case, threads)`` of ``cases.TORCH_FUSED``: fused Adam at the default
    thread count, and on one thread unless that is the default."""
    (default, default_gemms), (single, single_gemms) = cases.TORCH_FUSED
    out = [(default, default_gemms, None)]
    if torch.get_num_threads() > 1:
        out.append((single, single_gemms, 1))
    return out


def mlp(rec) -> None:
    sizes = cases.MLP_SIZES
    variants = [("train", None, False, None)] + [(case, gemms, True, threads)
                                                 for case, gemms, threads in fused_variants()]
    for name, gemms, fused, threads in variants:
        for batch in cases.MLP_TRAIN_BATCHES:
            def build(batch=batch, fused=fused, threads=threads):
                step = trainer(build_model(sizes), cases.MLP_LR, fused)
                batches = [(tensor(x), tensor(y)) for x, y in
                           data.classification_batches(batch, sizes[0], sizes[-1], data.rng(1))]
                state = {"i": 0}

                def one():
                    x, y = batches[state["i"] % len(batches)]
                    state["i"] += 1
                    step(x, y)

                return on_threads(threads, lambda n: loop(n, one))

            rec.time(f"{name}:{batch}", build, train=True, batch=batch)
            if gemms:
                rec.time(f"{gemms}:{batch}", gemms_case, sizes, batch, threads, train=True,
                         batch=batch, gemms=len(cases.step_gemms(sizes, batch)),
                         threads=threads or torch.get_num_threads())
    for batch in cases.MLP_INFER_BATCHES:
        def build_infer(batch=batch):
            model = build_model(sizes).eval()
            x = tensor(data.uniform((batch, sizes[0]), data.rng(2)))

            def one():
                with torch.inference_mode():
                    model(x)

            return lambda n: loop(n, one)

        rec.time(f"infer:{batch}", build_infer, batch=batch)


def recipe(rec) -> None:
    r = cases.RECIPE
    steps = rec.cfg["recipe_steps"]
    x_np, y_np = data.recipe_dataset(data.rng())
    x_all, y_all = tensor(x_np), tensor(y_np)
    order = [torch.from_numpy(idx) for idx in data.recipe_batches(steps)]
    sizes = cases.RECIPE_SIZES

    def once(fused: bool) -> float:
        step = trainer(build_model(sizes, residual=True), r["lr"], fused)
        start = time.perf_counter()
        for idx in order:
            step(x_all[idx], y_all[idx])
        return time.perf_counter() - start

    def on_one_thread(fused: bool) -> float:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return once(fused)
        finally:
            torch.set_num_threads(threads)

    repeats = rec.cfg["recipe_repeats"]
    rec.runs("train", lambda: once(False), repeats, steps)
    # fused Adam at both thread counts, each beside the step's GEMMs at that count: the host's
    # part of the ratio (docs/performance.md, 4c)
    for case, gemms, threads in fused_variants():
        rec.runs(case, lambda threads=threads: (on_one_thread if threads else once)(True),
                 repeats, steps)
        rec.time(gemms, gemms_case, sizes, r["batch"], threads, train=True, batch=r["batch"],
                 gemms=len(cases.step_gemms(sizes, r["batch"])),
                 threads=threads or torch.get_num_threads())
    if rec.cfg.get("quick") or torch.get_num_threads() == 1:
        return
    rec.runs("train-1thread", lambda: on_one_thread(False), repeats, steps)


def e2e(rec) -> None:
    """The recipe as a PyTorch script in a fresh process, default and fused Adam
    (benchmarks/e2e.py)."""
    from .e2e import run_cases, script_command

    run_cases(rec, {
        "train": lambda data, out, steps: script_command("torch", data, out, steps),
        "train-fused": lambda data, out, steps: script_command("torch", data, out, steps,
                                                               "--fused"),
    }, needs_data=True)


def sweep(rec) -> None:
    """The sweep group's batch and width sweeps with nn.Linear (benchmarks/sweep.py)."""
    from .sweep import torch_sweep

    torch_sweep(rec, torch)


# ----------------------------------------------------------------------------- busy machine
def one_thread():
    """``torch.set_num_threads(1)`` inside the block, the previous count restored after."""
    import contextlib

    @contextlib.contextmanager
    def limit():
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    return limit()


def busy(rec) -> None:
    from .busy import Plan

    plan = Plan(rec)
    from .impl_numpy import readme_batch, recipe_stream

    r = cases.RECIPE
    recipe_sizes = (r["in"], r["hidden"], r["hidden"], r["classes"])

    def recipe():
        step = trainer(build_model(recipe_sizes, residual=True), r["lr"], False)
        next_batch = recipe_stream()

        def one():
            x, y = next_batch()
            step(tensor(x), tensor(y))

        return lambda n: loop(n, one)

    def readme():
        step = trainer(build_model(recipe_sizes, residual=True), r["lr"], False)
        x, y = (tensor(a) for a in readme_batch())
        return lambda n: loop(n, lambda: step(x, y))

    def mlp128():
        sizes = cases.MLP_SIZES
        step = trainer(build_model(sizes), cases.MLP_LR, False)
        batches = [(tensor(x), tensor(y)) for x, y in
                   data.classification_batches(128, sizes[0], sizes[-1], data.rng(1))]
        state = {"i": 0}

        def one():
            x, y = batches[state["i"] % len(batches)]
            state["i"] += 1
            step(x, y)

        return lambda n: loop(n, one)

    for name, build in (("recipe", recipe), ("readme", readme), ("mlp128", mlp128)):
        plan.add(f"{name}/default", build)
        plan.add(f"{name}/1thread", build, setting=one_thread)
    plan.run()
