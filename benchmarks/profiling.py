"""Where linearkit's training step spends its time.

``profile_training``: cProfile over many steps; the functions with the most own time, per step,
split into linearkit's Python code and the rest (NumPy C calls made from Python are attributed to
their caller unless they are builtins). ``overheads``: direct timings (no profiler) of the
protocol's layers around the same arithmetic — raw ``functional`` calls, the unwrapped ``vjp``,
the guarded ``vjp`` — and of each phase of the documented training step.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import time

import numpy as np

from . import cases, data
from .timing import loop, measure

_ROOT = os.path.dirname(os.path.abspath(__file__))


def _where(filename: str) -> str:
    norm = filename.replace(os.sep, "/")
    if "/linearkit/" in norm:
        return "linearkit/" + norm.rsplit("/linearkit/", 1)[1]
    if norm.startswith(_ROOT.replace(os.sep, "/")):
        return "benchmarks/" + os.path.basename(norm)
    if filename == "~":
        return "~"
    return os.path.basename(norm)


def profile_training(model, trainer, batch: int, lr: float, steps: int, top: int = 14) -> dict:
    step = trainer(model, lr)
    first = next(iter(model.parameters()))
    n_in = first.shape[1]
    n_out = list(model.parameters())[-1].shape[0]
    batches = data.classification_batches(batch, n_in, n_out, data.rng(1))

    def run(n: int, offset: int = 0) -> None:
        for i in range(n):
            x, y = batches[(offset + i) % len(batches)]
            step(x, y)

    run(20)
    start = time.perf_counter()
    run(steps)
    plain = (time.perf_counter() - start) / steps
    prof = cProfile.Profile()
    prof.enable()
    run(steps)
    prof.disable()
    stats = pstats.Stats(prof).stats
    total_tt = sum(v[2] for v in stats.values())
    rows, own = [], 0.0
    for (filename, line, func), (cc, nc, tt, ct, _callers) in stats.items():
        where = _where(filename)
        if where.startswith("linearkit/"):
            own += tt
        rows.append({"function": f"{where}:{line}({func})" if line else func,
                     "calls_per_step": nc / steps, "own_us": 1e6 * tt / steps,
                     "cum_us": 1e6 * ct / steps, "linearkit": where.startswith("linearkit/")})
    rows.sort(key=lambda r: -r["own_us"])
    by_cum = sorted((r for r in rows if r["linearkit"]), key=lambda r: -r["cum_us"])
    return {"steps": steps, "batch": batch, "step_us": 1e6 * plain,
            "profiled_step_us": 1e6 * total_tt / steps,
            "linearkit_own_us": 1e6 * own / steps,
            "top_own": rows[:top], "top_cumulative_linearkit": by_cum[:top]}


def overheads(lk, cfg: dict) -> dict:
    """µs per call of each layer of the protocol, on arrays so small that the arithmetic is
    nearly free (Linear(16, 16), x (1, 16)): the differences between rows are Python overhead.
    Then the optimizer and the loss on the recipe's sizes, beside a flat-buffer Adam and a
    fused cross-entropy written in bare NumPy (what a fast path could reach)."""
    F = lk.functional
    timing = {"repeats": max(3, cfg["repeats"]), "min_time": cfg["min_time"] / 2}
    gen = data.rng(3)
    lin, relu = lk.Linear(16, 16), lk.ReLU()
    x, dy = data.uniform((1, 16), gen), data.uniform((1, 16), gen)
    w, b = lin.weight.data, lin.bias.data
    out: dict[str, object] = {}

    def put(name, step):
        try:
            m = measure(lambda n: loop(n, step), **timing)
            out[name] = {"median_us": 1e6 * m["median_s"], "min_us": 1e6 * m["min_s"]}
        except Exception as err:  # noqa: BLE001 - an internal that changed: report, go on
            out[name] = f"{type(err).__name__}: {err}"

    put("Linear(16,16) x(1,16): F.linear + F.linear_backward",
        lambda: (F.linear(x, w, b), F.linear_backward(dy, x, w, True, True, True)))
    raw = getattr(type(lin).vjp, "__wrapped_vjp__", None)
    if raw is not None:
        put("Linear(16,16): vjp without the _guarded_vjp wrapper + backward",
            lambda: raw(lin, x)[1](dy))
    put("Linear(16,16): vjp (guarded) + backward", lambda: lin.vjp(x)[1](dy))
    put("Linear(16,16): F.linear", lambda: F.linear(x, w, b))
    put("Linear(16,16): layer.forward(x)", lambda: lin.forward(x))
    put("Linear(16,16): layer(x) (Module.__call__)", lambda: lin(x))
    put("ReLU (1,16): F.relu + F.relu_backward", lambda: F.relu_backward(dy, F.relu(x)))
    raw = next((getattr(c.__dict__.get("vjp"), "__wrapped_vjp__", None)
                for c in type(relu).__mro__ if "vjp" in c.__dict__), None)
    if raw is not None:
        put("ReLU (1,16): vjp without the wrapper + backward", lambda: raw(relu, x)[1](dy))
    put("ReLU (1,16): vjp (guarded) + backward", lambda: relu.vjp(x)[1](dy))
    seq = lk.Sequential(lin, relu)

    def by_hand():
        y, b1 = lin.vjp(x)
        y, b2 = relu.vjp(y)
        b1(b2(dy))

    put("Linear+ReLU: both vjps chained by hand", by_hand)
    put("Linear+ReLU: Sequential(Linear, ReLU).vjp + backward", lambda: seq.vjp(x)[1](dy))
    block = lk.Residual(lk.Sequential(lk.Linear(16, 16), lk.ReLU()))
    put("Residual(Sequential(Linear, ReLU)).vjp + backward", lambda: block.vjp(x)[1](dy))
    try:
        from linearkit.layers import container

        if hasattr(container, "_trains"):
            put("container._trains(Linear)", lambda: container._trains(lin))
            put("container._trains(Residual block)", lambda: container._trains(block))
    except ImportError:
        pass
    lin.zero_grad()
    _optimizer_and_loss(lk, put)
    _phases(lk, put)
    return out


def _optimizer_and_loss(lk, put) -> None:
    """Adam and cross-entropy at the recipe's sizes vs the bare-NumPy fast versions."""
    from .impl_linearkit import build_model
    from .impl_numpy import FlatAdam, cross_entropy_grad, flat_layers

    r = cases.RECIPE
    sizes = (r["in"], r["hidden"], r["hidden"], r["classes"])
    model = build_model(sizes, residual=True)
    params = list(model.parameters())
    gen = data.rng(4)
    for p in params:
        p.grad = data.uniform(p.shape, gen, 1e-2)
    opt = lk.optim.Adam(params, lr=r["lr"])
    put(f"Adam.step(): {len(params)} parameters, {sum(p.size for p in params):,} floats",
        opt.step)
    flat, gflat, _, _ = flat_layers(data.mlp_params(sizes, data.rng()))
    gflat[...] = data.uniform(gflat.shape, gen, 1e-2)
    put("bare NumPy: Adam over one flat buffer, same floats", FlatAdam(flat, gflat, r["lr"]).step)
    loss_fn = lk.CrossEntropyLoss()
    z = data.uniform((r["batch"], r["classes"]), gen, 3.0)
    y = gen.integers(0, r["classes"], r["batch"])
    put(f"CrossEntropyLoss: vjp + backward, logits {z.shape}", lambda: loss_fn.vjp(z, y)[1]())
    dz, rows = np.empty_like(z), np.arange(len(y))
    put("bare NumPy: fused cross-entropy + gradient, same logits",
        lambda: cross_entropy_grad(z, y, dz, rows))


def _phases(lk, put) -> None:
    """The recipe's training step split into its five calls, each timed on its own."""
    from .impl_linearkit import build_model

    r = cases.RECIPE
    sizes = (r["in"], r["hidden"], r["hidden"], r["classes"])
    model = build_model(sizes, residual=True)
    loss_fn = lk.CrossEntropyLoss()
    opt = lk.optim.Adam(model.parameters(), lr=r["lr"])
    x, y = data.classification_batches(r["batch"], sizes[0], sizes[-1], data.rng(1))[0]
    pred, back = model.vjp(x, input_grad=False)
    _loss, loss_back = loss_fn.vjp(pred, y)
    back(loss_back())
    opt.step()  # creates the optimizer state

    def fwd():
        model.vjp(x, input_grad=False)

    def fwd_loss():
        p, _ = model.vjp(x, input_grad=False)
        loss_fn.vjp(p, y)[1]()

    def fwd_loss_bwd():
        p, bk = model.vjp(x, input_grad=False)
        bk(loss_fn.vjp(p, y)[1]())

    for name, fn in (("recipe step: model.vjp (forward)", fwd),
                     ("recipe step: + loss vjp and its backward", fwd_loss),
                     ("recipe step: + model backward", fwd_loss_bwd),
                     ("recipe step: opt.step() alone", opt.step),
                     ("recipe step: opt.zero_grad() alone", opt.zero_grad),
                     ("recipe model: model(x) inference", lambda: model(x))):
        if name == "recipe step: opt.zero_grad() alone":
            for p in model.parameters():
                p.grad = np.zeros_like(p.data)
        put(name, fn)
