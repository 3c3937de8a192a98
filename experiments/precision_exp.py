"""The precision experiment: popular half-precision claims, measured here — the numbers
behind docs/precision.md.

``python -m experiments precision [--quick] [--out-dir DIR | --write-docs | --no-write]``.
On the MNIST-1D recipe (bundled) and on synthetic arrays it measures: how many float16 gradients
underflow to zero without loss scaling and whether training stalls, against the GradScaler; a
long dot product accumulated in float16 against float32 ("累加溢出"); the memory of the
article's ``Linear(1024, 4096)`` on ``[64, 128, 1024]`` with 16-bit storage, activations and
gradients; gradient accumulation that forgets to divide by k against
``linearkit.training.accumulation``; activation checkpointing's memory against its time; and
the initialization that is fine in float32 and breaks a float16 run, found by ``range_check``
and ``detect_anomaly``. Every number on the page comes from one
``run`` (the module is named ``precision_exp`` so as not to read as ``linearkit.precision``).
"""

from __future__ import annotations

import gc
import itertools
import os
import time
import tracemalloc
import warnings
from dataclasses import dataclass, field

import numpy as np

from .pages import machine_info, measure_sections

__all__ = ["Config", "main", "run"]

DEFAULT_OUT_DIR = os.path.join("runs", "precision")
F16_TINY = 2.0 ** -24    # float16's smallest subnormal (~6e-8); |g| <= 2**-25 rounds to 0
F16_NORMAL = 2.0 ** -14  # float16's smallest normal (~6.1e-5)


@dataclass(frozen=True)
class Config:
    """Sizes and lengths of one run; ``Config.quick()`` is the seconds-long smoke version."""

    seed: int = 42                 # the MNIST-1D recipe's seed (weights and batch order)
    steps: int = 6000              # recipe training (Adam lr 1e-2, batch 100)
    probe_every: int = 1000        # float16 gradient underflow measured every this many steps
    loss_weights: tuple = (2.0 ** -16, 2.0 ** -20, 2.0 ** -24)  # the small-gradient case
    sgd_steps: int = 2000
    sgd_lr: float = 0.05           # divided by the loss weight (float32 training unchanged)
    dot_lengths: tuple = (256, 1024, 4096, 16384, 65536)
    memory_shape: tuple = (64, 128, 1024)   # the article's [batch, seq_len, in_features]
    memory_out: int = 4096
    accum_k: int = 8
    accum_lrs: tuple = (0.05, 0.5)  # SGD (momentum 0.9) on batches of k x 100 rows
    accum_steps: int = 500
    exact_steps: int = 300          # float64 runs: helper vs big batch, bitwise-level
    ckpt: tuple = (("depth", 8), ("width", 1024), ("batch", 256), ("repeats", 5))
    pitfall_std: float = 3000.0     # the first layer's init std in the init pitfall
    pitfall_steps: int = 2000
    pitfall_plain_steps: int = 5
    threads: int = 1                # BLAS threads for the whole run
    quick_run: bool = False

    @classmethod
    def quick(cls, seed: int = 42) -> Config:
        return cls(seed=seed, steps=40, probe_every=20, sgd_steps=20, dot_lengths=(256, 4096),
                   memory_shape=(2, 16, 1024), accum_lrs=(0.05,), accum_steps=10,
                   exact_steps=5, ckpt=(("depth", 4), ("width", 64), ("batch", 32),
                                        ("repeats", 1)),
                   pitfall_steps=20, pitfall_plain_steps=3, quick_run=True)


@dataclass
class Result:
    config: Config
    machine: dict
    sections: dict = field(default_factory=dict)


# ---------------------------------------------------------------- shared pieces
def _recipe(seed: int, dtype=np.float32):
    """The MNIST-1D recipe's MLP (40 -> 100 -> residual 100 -> 10), stored in ``dtype``."""
    from linearkit.recipes.train_mnist1d import build_model

    model = build_model("mlp", 100, rng=np.random.default_rng(seed))
    return model if np.dtype(dtype) == np.float32 else model.to(dtype)


def _batches(x, y, seed: int, batch: int = 100):
    """Endless shuffled batches, as ``train`` draws them (drop_last, reshuffled per epoch)."""
    from linearkit.data import DataLoader

    loader = DataLoader(x, y, batch_size=batch, shuffle=True, drop_last=True, seed=seed)
    return itertools.chain.from_iterable(iter(loader) for _ in itertools.count())


def _accuracy(model, x, y) -> float:
    from linearkit.recipes.train_mnist1d import accuracy

    return accuracy(model, x, y)


def _train_loss(model, x, y) -> float:
    """Mean cross-entropy of the whole training set (eval mode, no backward state)."""
    from linearkit import CrossEntropyLoss
    from linearkit.training.loop import evaluate

    with np.errstate(all="ignore"):
        return float(evaluate(model, x, y, loss_fn=CrossEntropyLoss())["loss"])


def _flat_grads(model) -> np.ndarray:
    return np.concatenate([p.grad.astype(np.float64).ravel() for p in model.parameters()])


def _grads(model, x, y, grads: str, dy: float) -> tuple[float, np.ndarray]:
    """The mean cross-entropy on ``(x, y)`` and every parameter's gradient of ``dy`` x it,
    stored as the policy ``grads`` says, as one float64 vector; gradients are left None."""
    from linearkit import CrossEntropyLoss, precision

    model.zero_grad(set_to_none=True)
    with precision.policy(grads=grads), np.errstate(over="ignore"):
        pred, back = model.vjp(x, input_grad=False)
        loss, loss_back = CrossEntropyLoss().vjp(pred, y)
        back(loss_back(dy))
    out = _flat_grads(model)
    model.zero_grad(set_to_none=True)
    return float(loss), out


def probe_underflow(model, x, y, scale: float = 1.0, weight: float = 1.0) -> dict:
    """float16 gradients against float32 ones for the same (16-bit) weights and batch.

    The float32 gradient ``g`` (policy ``grads='float32'``) and the float16 one of
    ``scale * g`` (``grads='storage'``: what a backward without or with loss scaling stores)
    are compared entry by entry: ``flushed`` is the fraction of entries nonzero in float32 that
    are 0 in float16 (underflow), ``nonfinite`` those that overflowed; ``subnormal`` is the
    fraction of nonzero ``|scale * g|`` below float16's smallest normal (they keep fewer bits),
    ``median`` the median nonzero ``|g|`` and ``loss`` the batch's (unweighted) loss.
    """
    loss, g32 = _grads(model, x, y, "float32", weight)
    _, g16 = _grads(model, x, y, "storage", weight * scale)
    nonzero = g32 != 0
    scaled = np.abs(g32[nonzero]) * scale
    return {"loss": loss, "flushed": float(np.mean(g16[nonzero] == 0)),
            "nonfinite": float(np.mean(~np.isfinite(g16))),
            "subnormal": float(np.mean(scaled < F16_NORMAL)),
            "median": float(np.median(np.abs(g32[nonzero]))),
            "entries": int(g32.size)}


def train_fp16_grads(data, cfg: Config, *, scaler: bool, steps: int, optimizer: str = "adam",
                     weight: float = 1.0, grads: str = "storage", probe_every: int = 0) -> dict:
    """The recipe's model stored in float16 and trained with ``.grad`` in float16 (policy
    ``grads='storage'``), the loss multiplied by ``weight``; with ``scaler`` through
    ``GradScaler`` (scale the backward, unscale, skip non-finite steps, update).

    ``optimizer='adam'``: Adam lr 1e-2 (the recipe); ``'sgd'``: SGD momentum 0.9 with
    ``lr = cfg.sgd_lr / weight``, so that in exact arithmetic the weight cancels.
    """
    from linearkit import CrossEntropyLoss, optim, precision
    from linearkit.training.amp import GradScaler

    model = _recipe(cfg.seed, np.float16)
    opt = (optim.Adam(model.parameters(), lr=1e-2) if optimizer == "adam"
           else optim.SGD(model.parameters(), lr=cfg.sgd_lr / weight, momentum=0.9))
    amp = GradScaler() if scaler else None
    loss_fn = CrossEntropyLoss()
    batches = _batches(data.x_train, data.y_train, cfg.seed)
    probe_x, probe_y = data.x_train[:100], data.y_train[:100]
    probes, skipped = [], 0
    start = time.perf_counter()
    for step in range(steps + 1):
        if step in (0, steps) or (probe_every and step % probe_every == 0):
            probes.append({"step": step, "scale": amp.get_scale() if amp else 1.0,
                           **probe_underflow(model, probe_x, probe_y,
                                             amp.get_scale() if amp else 1.0, weight)})
        if step == steps:
            break
        xb, yb = next(batches)
        with precision.policy(grads=grads), np.errstate(over="ignore"):
            pred, back = model.vjp(xb, input_grad=False)
            _, loss_back = loss_fn.vjp(pred, yb)
            back(loss_back(weight if amp is None else amp.scale(weight)))
            if amp is None:
                opt.step()
            else:
                before = amp.get_scale()
                amp.step(opt)
                amp.update()
                skipped += amp.get_scale() < before
            opt.zero_grad(set_to_none=False)
    seconds = time.perf_counter() - start
    model.eval()
    return {"accuracy": _accuracy(model, data.x_test, data.y_test),
            "train_loss": _train_loss(model, data.x_train, data.y_train),
            "skipped": int(skipped), "final_scale": amp.get_scale() if amp else None,
            "probes": probes, "seconds": seconds, "model": model}


# ---------------------------------------------------------------- 1. loss scaling
def loss_scaling(data, cfg: Config) -> dict:
    """The claim: float16 gradients underflow to 0; loss scaling is the cure."""
    from linearkit.recipes.train_mnist1d import train

    out = {"adam": {}, "recipes": {}, "sgd": []}
    for scaled in (False, True):
        run_ = train_fp16_grads(data, cfg, scaler=scaled, steps=cfg.steps,
                                probe_every=cfg.probe_every)
        run_.pop("model")
        out["adam"]["scaler" if scaled else "plain"] = run_
    for precision in ("fp32", "bf16", "fp16"):
        model, result = train(precision=precision, steps=cfg.steps, seed=cfg.seed,
                              eval_every=0, dataset=data, threads=cfg.threads)
        out["recipes"][precision] = {"accuracy": result.test_accuracy,
                                     "train_loss": _train_loss(model, data.x_train,
                                                               data.y_train),
                                     "skipped": result.skipped_steps,
                                     "seconds": result.seconds}
    smallest = min(cfg.loss_weights)
    base = train_fp16_grads(data, cfg, scaler=False, steps=cfg.sgd_steps, optimizer="sgd",
                            weight=smallest, grads="float32")
    out["sgd_float32"] = {"weight": smallest, "accuracy": base["accuracy"],
                          "train_loss": base["train_loss"]}
    for weight in cfg.loss_weights:
        row = {"weight": weight}
        for scaled in (False, True):
            r = train_fp16_grads(data, cfg, scaler=scaled, steps=cfg.sgd_steps,
                                 optimizer="sgd", weight=weight)
            row["scaler" if scaled else "plain"] = {
                "accuracy": r["accuracy"], "train_loss": r["train_loss"],
                "flushed_first": r["probes"][0]["flushed"],
                "flushed_last": r["probes"][-1]["flushed"],
                "skipped": r["skipped"], "final_scale": r["final_scale"]}
        out["sgd"].append(row)
    return out


# ---------------------------------------------------------------- 2. accumulation in float16
def _dot_data(kind: str, n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    if kind == "normal":
        a, b = rng.standard_normal(n), rng.standard_normal(n)
    elif kind == "positive":
        a, b = rng.uniform(0, 2, n), rng.uniform(0, 2, n)
    else:  # "large"
        a, b = rng.uniform(0, 16, n), rng.uniform(0, 16, n)
    return a.astype(np.float16), b.astype(np.float16)


DOT_KINDS = {"normal": "N(0,1) x N(0,1): zero-mean products",
             "positive": "U(0,2) x U(0,2): positive products, mean 1",
             "large": "U(0,16) x U(0,16): positive products, mean 64"}


def dot_accumulation(cfg: Config) -> dict:
    """The claim: "乘法用半精度、累加用单精度" (multiply in half, accumulate in single).

    Each row: float16 vectors ``a, b (n,)``; their dot product summed sequentially in float16
    (``np.add.accumulate(a * b, dtype=float16)``), in float32, by NumPy's float16 ``np.dot``,
    and by a float16-stored ``Linear(n, 1)`` (weight ``a``, input ``b``: float32 GEMM), each
    against the float64 sum of the same values."""
    from linearkit import Linear

    rng = np.random.default_rng(cfg.seed)
    rows = []
    for kind in DOT_KINDS:
        for n in cfg.dot_lengths:
            a, b = _dot_data(kind, n, rng)
            ref = float(np.dot(a.astype(np.float64), b.astype(np.float64)))
            with np.errstate(over="ignore", invalid="ignore"):
                prefix16 = np.add.accumulate(a * b, dtype=np.float16)
                npdot = np.dot(a, b)  # NumPy's float16 dot: a float16 result
            prefix32 = np.add.accumulate(a.astype(np.float32) * b.astype(np.float32),
                                         dtype=np.float32)
            layer = Linear(n, 1, bias=False).to(np.float16)
            layer.weight.data[0] = a
            linear = float(layer(b.astype(np.float32)[None])[0, 0])
            bad = np.flatnonzero(~np.isfinite(prefix16))

            def rel(v, ref=ref):
                return abs(float(v) - ref) / abs(ref) if np.isfinite(v) else None

            rows.append({"kind": kind, "n": n, "ref": ref, "sum16": float(prefix16[-1]),
                         "err16": rel(prefix16[-1]), "err32": rel(prefix32[-1]),
                         "err_npdot16": rel(npdot), "err_linear": rel(linear),
                         "overflow_at": int(bad[0]) + 1 if bad.size else None})
    ones = np.add.accumulate(np.ones(4096, np.float16), dtype=np.float16)
    return {"rows": rows, "ones_4096": float(ones[-1]),
            "ones_stall": int(np.argmax(ones == ones[-1])) + 1,
            "f16_max": float(np.finfo(np.float16).max)}


# ---------------------------------------------------------------- 3. memory of 16-bit training
MEMORY_CASES = (("float32", None, "float32"), ("bfloat16", None, "float32"),
                ("bfloat16", "float16", "storage"), ("float16", "float16", "storage"))


def _memory_case(storage: str, activations, grads: str, cfg: Config) -> dict:
    """One Adam training step of ``Linear(in, out)`` on ``x (*memory_shape)`` (loss = mean of
    the output), traced by tracemalloc: the persistent state (weights, gradients, master copy,
    Adam's moments, after a first step), what the backward holds after the forward beyond the
    output (the saved activations; the input is made inside the step as a previous layer's
    output would be, and dropped by the caller), the output's bytes, and the step's peak."""
    from linearkit import Linear, precision
    from linearkit.analysis import ledger
    from linearkit.optim import Adam

    rng = np.random.default_rng(cfg.seed)
    shape = tuple(cfg.memory_shape)
    source = rng.standard_normal(shape).astype(np.float32)
    gc.collect()
    tracemalloc.start()
    try:
        base0 = tracemalloc.get_traced_memory()[0]
        model = Linear(shape[-1], cfg.memory_out, rng=rng).to(storage)
        opt = Adam(model.parameters(), lr=1e-3)
        with precision.policy(activations=activations, grads=grads):
            def forward():
                x = source.copy()   # a previous layer's output: only the backward keeps it
                return model.vjp(x, input_grad=False)

            def finish(box):    # box = [pred, back]: the only references, dropped early
                pred = box.pop(0)
                dy = np.full_like(pred, 1.0 / pred.size)
                del pred
                box.pop(0)(dy)
                del dy
                opt.step()
                opt.zero_grad(set_to_none=False)

            finish(list(forward()))  # allocates the gradients, master copy and Adam's state
            gc.collect()
            state = tracemalloc.get_traced_memory()[0] - base0
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            box = list(forward())
            output = box[0].nbytes
            held = tracemalloc.get_traced_memory()[0] - base - output
            finish(box)
            peak = tracemalloc.get_traced_memory()[1] - base
            memory = ledger(model, shape, optimizer="adam", rank_check=False).memory
    finally:
        tracemalloc.stop()
    return {"storage": storage, "activations": activations, "grads": grads,
            "state": state, "saved": held, "output": output, "peak": peak,
            "ledger": dict(memory)}


def memory(cfg: Config) -> list[dict]:
    """The claim: "把激活值和梯度的精度降到fp16，显存直接砍半" (16-bit activations and
    gradients halve the memory)."""
    return [_memory_case(*case, cfg) for case in MEMORY_CASES]


# ---------------------------------------------------------------- 4. gradient accumulation
def _forgetful_backward(model, loss_fn, x, y, k: int) -> None:
    """The pitfall: k micro-batches, each mean loss backpropagated from dy = 1 (no 1/k)."""
    from linearkit.training.accumulation import micro_batch_slices

    for rows in micro_batch_slices(len(x), k):
        pred, back = model.vjp(x[rows], input_grad=False)
        _, loss_back = loss_fn.vjp(pred, y[rows])
        back(loss_back())


def _forgetful_step(model, loss_fn, opt, x, y, k: int) -> None:
    _forgetful_backward(model, loss_fn, x, y, k)
    opt.step()
    opt.zero_grad(set_to_none=False)


def _accum_train(data, cfg: Config, mode: str, lr: float, steps: int, dtype=np.float32):
    """SGD (momentum 0.9) on batches of ``k x 100`` rows: ``mode`` 'big' (one batch), 'helper'
    (``accumulated_step``, k micro-batches) or 'forgetful' (k micro-batches, no division)."""
    from linearkit import CrossEntropyLoss
    from linearkit.optim import SGD
    from linearkit.training.accumulation import accumulated_step
    from linearkit.training.loop import step as loop_step

    model = _recipe(cfg.seed, dtype)
    opt = SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = CrossEntropyLoss()
    k = cfg.accum_k
    batches = _batches(data.x_train.astype(dtype), data.y_train, cfg.seed, batch=100 * k)
    with np.errstate(all="ignore"):
        for _ in range(steps):
            x, y = next(batches)
            if mode == "big":
                loop_step(model, loss_fn, opt, x, y)
            elif mode == "helper":
                accumulated_step(model, loss_fn, opt, x, y, micro_batches=k)
            else:
                _forgetful_step(model, loss_fn, opt, x, y, k)
    return model.eval()


def _max_dw(a, b) -> float:
    with np.errstate(invalid="ignore"):
        return float(max(np.abs(p.data.astype(np.float64) - q.data.astype(np.float64)).max()
                         for p, q in zip(a.parameters(), b.parameters())))


def accumulation(data, cfg: Config) -> dict:
    """The claim: accumulate k micro-batches, and divide by k — or the learning rate is k x."""
    from linearkit import BatchNorm1d, CrossEntropyLoss, Linear, ReLU, Sequential
    from linearkit.optim import SGD
    from linearkit.training.accumulation import accumulate

    k, loss_fn = cfg.accum_k, CrossEntropyLoss()
    x, y = data.x_train[:100 * k], data.y_train[:100 * k]
    norms = {}
    for dtype in (np.float32, np.float64):
        model = _recipe(cfg.seed, dtype)
        accumulate(model, loss_fn, x.astype(dtype), y, micro_batches=k)
        right = np.linalg.norm(_flat_grads(model))
        model.zero_grad(set_to_none=True)
        _forgetful_backward(model, loss_fn, x.astype(dtype), y, k)
        norms[np.dtype(dtype).name] = float(np.linalg.norm(_flat_grads(model)) / right)
    rows = []
    for lr in cfg.accum_lrs:
        row = {"lr": lr}
        for mode in ("big", "helper", "forgetful"):
            model = _accum_train(data, cfg, mode, lr, cfg.accum_steps)
            row[mode] = {"accuracy": _accuracy(model, data.x_test, data.y_test),
                         "train_loss": _train_loss(model, data.x_train, data.y_train),
                         "model": model}
        row["dw_float32"] = _max_dw(row["big"]["model"], row["helper"]["model"])
        for mode in ("big", "helper", "forgetful"):
            row[mode].pop("model")
        rows.append(row)
    lr = cfg.accum_lrs[0]
    big = _accum_train(data, cfg, "big", lr, cfg.exact_steps, np.float64)
    helper = _accum_train(data, cfg, "helper", lr, cfg.exact_steps, np.float64)
    forgetful = _accum_train(data, cfg, "forgetful", lr, cfg.exact_steps, np.float64)
    big_k = _accum_train(data, cfg, "big", lr * k, cfg.exact_steps, np.float64)
    # BatchNorm: one window of k micro-batches against one step on the full batch
    stats = {}
    for mode in ("big", "helper"):
        rng = np.random.default_rng(cfg.seed)
        model = Sequential(Linear(40, 100, rng=rng), BatchNorm1d(100), ReLU(),
                           Linear(100, 10, rng=rng)).train()
        opt = SGD(model.parameters(), lr=lr)
        if mode == "big":
            from linearkit.training.loop import step as loop_step

            loop_step(model, loss_fn, opt, x, y)
        else:
            from linearkit.training.accumulation import accumulated_step

            accumulated_step(model, loss_fn, opt, x, y, micro_batches=k)
        stats[mode] = model
    bn_big, bn_acc = stats["big"][1], stats["helper"][1]
    mean_diff = np.abs(bn_acc.running_mean - bn_big.running_mean).max()
    return {"k": k, "norm_ratio": norms, "rows": rows, "steps": cfg.accum_steps,
            "exact_steps": cfg.exact_steps, "exact_lr": lr,
            "dw_helper_big_f64": _max_dw(big, helper),
            "dw_forgetful_bigk_f64": _max_dw(forgetful, big_k),
            "bn": {"tracked_big": int(bn_big.num_batches_tracked),
                   "tracked_acc": int(bn_acc.num_batches_tracked),
                   "mean_diff": float(mean_diff),
                   "mean_scale": float(np.abs(bn_big.running_mean).max()),
                   "momentum": float(bn_big.momentum),
                   "weight_dw": _max_dw(stats["big"], stats["helper"])}}


# ---------------------------------------------------------------- 5. checkpointing
def checkpointing(cfg: Config) -> dict:
    """The claim: "牺牲一些计算时间来换显存" (trade compute time for memory) —
    ``measure_checkpointing`` on a deep MLP."""
    from .checkpoint_measure import measure_checkpointing

    params = dict(cfg.ckpt)
    return {**params, **measure_checkpointing(**params)}


# ---------------------------------------------------------------- 6. the init pitfall
def pitfall_model(std: float | None, seed: int):
    """``40 -> 256 ReLU -> 256 BatchNorm1d ReLU -> 10``; the first Linear's weight drawn
    N(0, std²) (None: the default init). The BatchNorm after the second Linear makes the
    first layer's scale irrelevant in float32 — not the range of what is stored in float16."""
    from linearkit import BatchNorm1d, Linear, ReLU, Sequential

    rng = np.random.default_rng(seed)
    model = Sequential(Linear(40, 256, rng=rng), ReLU(), Linear(256, 256, rng=rng),
                       BatchNorm1d(256), ReLU(), Linear(256, 10, rng=rng))
    if std is not None:
        first = model[0].weight
        first.data[:] = rng.standard_normal(first.shape) * std
    return model


def init_pitfall(data, cfg: Config) -> dict:
    """The claim: the float32 init that breaks a float16 run, the error at a later layer; the
    cure: one forward, each layer's range (``range_check``), and ``detect_anomaly``."""
    from linearkit import AnomalyError, CrossEntropyLoss, detect_anomaly, precision
    from linearkit.analysis import range_check
    from linearkit.optim import Adam
    from linearkit.recipes.train_mnist1d import train

    std, seed = cfg.pitfall_std, cfg.seed
    probe_x, probe_y = data.x_train[:100], data.y_train[:100]
    out = {"std": std, "steps": cfg.pitfall_steps}

    def fit(model, precision_name, activations=None):
        with precision.policy(activations=activations), np.errstate(all="ignore"):
            model, result = train(model=model, precision=precision_name, dataset=data,
                                  steps=cfg.pitfall_steps, seed=seed, eval_every=0,
                                  threads=cfg.threads)
        return model, {"accuracy": result.test_accuracy,
                       "train_accuracy": result.train_accuracy,
                       "final_loss": result.final_loss, "skipped": result.skipped_steps}

    model, out["float32"] = fit(pitfall_model(std, seed), "fp32")
    out["float32"]["running_var_max"] = float(np.abs(model[3].running_var).max())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        report = range_check(pitfall_model(std, seed), probe_x, np.float16)
    out["range_table"] = report.to_markdown()
    problem = report.first_problem
    out["first_problem"] = None if problem is None else {
        "path": problem.path, "type": problem.type, "flag": problem.flag,
        "max_abs": problem.max_abs}
    out["flags"] = {r.path: r.flag for r in report.rows if r.flag}
    out["norm_flags"] = [r.path for r in report.rows
                         if r.type.startswith("BatchNorm") and r.flag == "overflow"]
    # the plain float16 run: weights and saved activations in float16, no loss scaling
    model = pitfall_model(std, seed).to(np.float16)
    opt, loss_fn = Adam(model.parameters(), lr=1e-2), CrossEntropyLoss()
    steps, batches = [], _batches(data.x_train, data.y_train, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for _ in range(cfg.pitfall_plain_steps):
            xb, yb = next(batches)
            with precision.policy(activations=np.float16), np.errstate(all="ignore"):
                pred, back = model.vjp(xb, input_grad=False)
                loss, loss_back = loss_fn.vjp(pred, yb)
                back(loss_back())
            bad_grads = [n for n, p in model.named_parameters()
                         if not np.isfinite(p.grad.astype(np.float32)).all()]
            with np.errstate(all="ignore"):
                opt.step()
            opt.zero_grad(set_to_none=False)
            bad_weights = [n for n, p in model.named_parameters()
                           if not np.isfinite(p.data.astype(np.float32)).all()]
            steps.append({"loss": float(loss), "finite": bool(np.isfinite(loss)),
                          "bad_grads": bad_grads, "bad_weights": bad_weights})
    out["plain"] = steps
    # the same first step under detect_anomaly
    model = pitfall_model(std, seed).to(np.float16)
    out["anomaly"] = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            with detect_anomaly(), precision.policy(activations=np.float16), \
                    np.errstate(all="ignore"):
                pred, back = model.vjp(probe_x, input_grad=False)
                _, loss_back = loss_fn.vjp(pred, probe_y)
                back(loss_back())
        except AnomalyError as exc:
            out["anomaly"] = {"path": exc.path, "message": str(exc).splitlines()[0]}
    # what else was tried: bfloat16's range, float32 activations, the init range_check names
    model, out["bf16"] = fit(pitfall_model(std, seed).to("bfloat16"), "bf16", "bfloat16")
    model, out["fp16_f32_act"] = fit(pitfall_model(std, seed).to(np.float16), "fp16")
    var = model[3].running_var.astype(np.float32)
    out["fp16_f32_act"]["running_var_finite"] = float(np.mean(np.isfinite(var)))
    out["fp16_f32_act"]["running_var_max"] = float(np.abs(var[np.isfinite(var)]).max()) \
        if np.isfinite(var).any() else None
    _, out["fp16_fixed"] = fit(pitfall_model(None, seed).to(np.float16), "fp16", np.float16)
    return out


# ---------------------------------------------------------------- the run
def run(out_dir=DEFAULT_OUT_DIR, *, quick: bool = False, seed: int = 42,
        config: Config | None = None, write: bool = True, log=print) -> Result:
    """Measure every section and write the page (unless ``write`` is False); returns the
    :class:`Result`."""
    from .pages import page_command, run_page
    from .precision_page import render_page

    cfg = config or (Config.quick(seed) if quick else Config(seed=seed))
    command = page_command("precision", out_dir, quick=cfg.quick_run, seed=cfg.seed,
                           default_seed=42, default_out_dir=DEFAULT_OUT_DIR)
    return run_page(cfg, _measure, render_page, "precision.md", out_dir, write, log, command)


def _measure(cfg: Config, log) -> Result:
    from linearkit.data import mnist1d

    result = Result(cfg, machine_info())
    data = mnist1d()
    steps = [("loss_scaling", lambda: loss_scaling(data, cfg)),
             ("dot", lambda: dot_accumulation(cfg)),
             ("memory", lambda: memory(cfg)),
             ("accumulation", lambda: accumulation(data, cfg)),
             ("checkpointing", lambda: checkpointing(cfg)),
             ("pitfall", lambda: init_pitfall(data, cfg))]
    measure_sections(steps, result.sections, log)
    result.machine["load_after"] = os.getloadavg()[0]
    return result


def main(argv: list[str] | None = None) -> int:
    """``python -m experiments precision [--quick] [--out-dir DIR | --write-docs | --no-write]
    [--seed N]``; a mistake is one line on stderr and exit status 2."""
    from .pages import parse_page_args

    args, out_dir = parse_page_args(
        "precision", "Measure popular half-precision claims on MNIST-1D and synthetic "
        "arrays (fp16 gradient underflow and loss scaling, float16 accumulation, 16-bit memory, "
        "gradient accumulation, checkpointing, the float16 init pitfall); write the page.",
        "precision.md", DEFAULT_OUT_DIR, 42, argv, needs=[("ml_dtypes", "cli")])
    run(out_dir, quick=args.quick, seed=args.seed, write=not args.no_write)
    return 0


if __name__ == "__main__":  # python -m experiments.precision_exp
    raise SystemExit(main())
