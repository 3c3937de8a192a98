"""The main job: train the MNIST-1D baselines of Greydanus (2020), "Scaling Down Deep Learning".

Recipe (the paper's MLP baseline): 40 -> 100 ReLU -> residual (100 -> 100 ReLU) -> 10,
Adam lr 1e-2, batch 100, 6,000 steps, seed 42; ``--model linear`` is the logistic-regression
baseline (40 -> 10). The paper reports 32% (logistic regression) and 68% (MLP) test accuracy.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np

from ..core.module import Module
from ..layers import Linear, ReLU, Residual, Sequential
from ..losses import CrossEntropyLoss
from ..training.loop import evaluate
from ..training.loop import step as loop_step

__all__ = ["train", "TrainResult", "Dataset", "build_model", "build_schedule", "accuracy"]

PAPER_ACCURACY = {"linear": 0.32, "mlp": 0.68}


@dataclass
class TrainResult:
    """What a run measured. Accuracies are fractions in [0, 1]."""

    model: str
    test_accuracy: float
    train_accuracy: float
    steps: int
    seconds: float
    params: int
    final_loss: float
    history: list
    precision: str = "fp32"
    skipped_steps: int = 0  # fp16: steps the loss scaler skipped (a non-finite gradient)
    ranks: int = 1  # data-parallel MPI ranks (train(distributed=True))
    schedule: str = "constant"  # the learning-rate schedule (train(schedule=))
    warmup: int = 0  # its warm-up steps

    def to_dict(self) -> dict:
        return asdict(self)


def build_model(kind: str = "mlp", hidden: int = 100, *, in_features: int = 40,
                classes: int = 10, rng: np.random.Generator | None = None) -> Module:
    """The paper's baselines: ``'mlp'`` (residual MLP) or ``'linear'`` (logistic regression)."""
    if kind == "linear":
        return Sequential(Linear(in_features, classes, rng=rng))
    if kind == "mlp":
        return Sequential(
            Linear(in_features, hidden, rng=rng),
            ReLU(),
            Residual(Sequential(Linear(hidden, hidden, rng=rng), ReLU())),
            Linear(hidden, classes, rng=rng),
        )
    raise ValueError(f"unknown model {kind!r}; choose 'mlp' or 'linear'")


def accuracy(model: Module, x: np.ndarray, y: np.ndarray, batch: int = 1000) -> float:
    """Fraction of rows of ``x (N, in)`` whose argmax logit equals ``y (N,)`` (eval mode)."""
    return evaluate(model, x, y, batch_size=batch)["accuracy"]


@dataclass(frozen=True)
class Dataset:
    """The arrays ``train()`` uses: ``x_train (N, in)``, ``y_train (N,)`` integer labels,
    ``x_test (M, in)``, ``y_test (M,)``. ``linearkit.data.mnist1d()`` returns an object with the
    same four attributes, which ``train`` accepts as well, and so does a 4-tuple."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def as_dataset(data) -> Dataset:
    """``data`` (None: MNIST-1D; an object with ``x_train``/``y_train``/``x_test``/``y_test``;
    or a tuple of those four arrays) as a checked :class:`Dataset`."""
    if data is None:
        from ..data import mnist1d

        data = mnist1d()
    if isinstance(data, (tuple, list)):
        if len(data) != 4:
            raise ValueError(f"train: dataset as a tuple must be (x_train, y_train, x_test, "
                             f"y_test); got a {type(data).__name__} of {len(data)} items")
        data = Dataset(*data)
    try:
        arrays = [np.asarray(getattr(data, k)) for k in ("x_train", "y_train", "x_test", "y_test")]
    except AttributeError as exc:
        raise TypeError(f"train: dataset must have x_train, y_train, x_test and y_test (or be a "
                        f"4-tuple of them); {exc}") from None
    x_train, y_train, x_test, y_test = arrays
    for split, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        if x.ndim < 2 or y.ndim < 1 or len(x) != len(y) or len(x) == 0:
            raise ValueError(f"train: the {split} split needs x (N, in) and y (N,) with the "
                             f"same N >= 1; got x.shape={x.shape}, y.shape={y.shape}")
    return Dataset(x_train, y_train, x_test, y_test)


def check_batch_size(batch_size, rows: int) -> int:
    """``batch_size`` as an int in ``[1, rows]`` (train drops the last, incomplete batch, so a
    larger one would give epochs without a batch); else a ValueError naming the fix."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
        raise TypeError(f"batch_size must be an int, got {batch_size!r}")
    if not 1 <= batch_size <= rows:
        raise ValueError(
            f"batch_size={batch_size} must be between 1 and the {rows:,} training rows "
            f"(batches drop the incomplete last one, so a larger batch never comes); "
            f"use batch_size <= {rows}")
    return int(batch_size)


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_lr(lr) -> float:
    """``lr`` as a float, finite and > 0; else a ValueError/TypeError saying so."""
    if isinstance(lr, bool) or not isinstance(lr, (int, float, np.integer, np.floating)):
        raise TypeError(f"lr must be a number, got {lr!r}")
    if not (np.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be finite and > 0 (e.g. 1e-2), got {lr!r}")
    return float(lr)


def thread_setting(threads):
    """``train(threads=...)`` as a context: ``"auto"`` or None leave the BLAS threads to
    linearkit's policy (``linearkit.backend.threads``: one thread for small GEMMs and on a busy machine)
    or to the count set with ``set_num_threads``; an int ``n >= 1`` uses ``n`` threads during
    training and restores the previous setting afterwards."""
    import contextlib

    from ..backend import threads as blas

    if threads is None or threads == "auto":
        return contextlib.nullcontext()
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise ValueError(f"train: threads must be 'auto', None or an int >= 1 (BLAS threads), "
                         f"got {threads!r}")
    return blas.num_threads(int(threads))


def train(model_kind: str | None = None, *, hidden: int | None = None, steps: int = 6000,
          lr: float | None = None, batch_size: int = 100, seed: int = 42, eval_every: int = 500,
          dataset=None, progress=None, threads: int | str | None = "auto",
          model: Module | None = None, optimizer=None, loss_fn: Module | None = None,
          precision: str = "fp32", distributed: bool = False,
          flush_denormal: bool = False, schedule: str = "constant",
          warmup: int | None = None) -> tuple[Module, TrainResult]:
    """Train a classifier (by default the MNIST-1D recipe) and return ``(model, TrainResult)``.

    Parameters
    ----------
    model_kind : 'mlp' | 'linear', optional
        The recipe's model to build (default ``'mlp'``); with ``model=`` only a label for the
        result (default ``'custom'``).
    hidden : int, optional
        Hidden width of the built MLP (default 100). Not with ``model=``.
    steps : int
        Optimizer steps (>= 1).
    lr : float, optional
        Adam's learning rate (default 1e-2), finite and > 0. Not with ``optimizer=``.
    batch_size : int
        Rows per step, in ``[1, N_train]``: batches are drawn by a seeded shuffling loader,
        reshuffled every epoch, and the last incomplete batch is dropped.
    seed : int
        Seeds the built model's weights and the batch order.
    eval_every : int
        Test accuracy every this many steps (and after the last) into ``history``; 0: never.
    dataset : None, MNIST1D-like object, :class:`Dataset` or tuple
        ``x_train (N, in)``, ``y_train (N,)``, ``x_test (M, in)``, ``y_test (M,)``; default
        ``linearkit.data.mnist1d()``.
    progress : callable, optional
        ``progress(step, loss, test_accuracy_or_None)`` after every step (for a bar).
    threads : 'auto' | int | None
        BLAS threads while training: an int ``n >= 1`` for exactly ``n`` (restored afterwards);
        ``"auto"`` or None for linearkit's thread policy (:mod:`linearkit.backend.threads`) or the
        count you set with ``linearkit.set_num_threads``.
    model : Module, optional
        Your own model, mapping ``x (B, in)`` to logits ``(B, C)``; trained in place.
    optimizer : Optimizer, optional
        Your own optimizer over (some of) the model's parameters; default
        ``Adam(model.parameters(), lr)``. Needs ``model=`` too.
    loss_fn : Module, optional
        Default ``CrossEntropyLoss()``.
    precision : 'fp32' | 'bf16' | 'fp16'
        How the parameters are stored (:mod:`linearkit.precision`): the recipe's model is built
        in float32 and rounded to bfloat16/float16; the GEMMs compute in float32 and the
        optimizer steps a float32 master copy. ``'fp16'`` also scales the loss
        (:class:`linearkit.training.amp.GradScaler`: a step with a non-finite gradient is skipped and
        counted in ``skipped_steps``). With ``model=``, the model must already be stored so
        (``model.to("bfloat16")``).
    distributed : bool
        Data-parallel over the ranks of the MPI job this process runs in (every rank calls
        ``train`` with the same arguments; :mod:`linearkit.distributed`): ``batch_size`` is the
        global batch, a multiple of the ranks; every rank draws the same global batch and
        trains on its rows ``rank::ranks``, the gradients are averaged, so the run is the
        single-process run up to float rounding. Rank 0's parameters are broadcast first.
    flush_denormal : bool
        Train with subnormal floats flushed to zero (:func:`linearkit.set_flush_denormal`,
        restored afterwards): as JAX computes by default, not PyTorch. The recipe's dead ReLU
        units leave Adam's first moments subnormal, where every operation on them takes a
        microcode assist; flushing makes the recipe's training loop faster with the same test
        accuracy and final loss (docs/fast.md, "Subnormal floats"). ``linearkit train`` turns it on
        (``--no-flush-denormal`` to keep them).
    schedule : 'constant' | 'cosine' | 'onecycle'
        How the learning rate moves over the ``steps`` (:func:`build_schedule`, made of
        :mod:`linearkit.optim.lr_scheduler`'s schedulers, stepped after every optimizer step).
    warmup : int, optional
        Warm-up steps, in ``[0, steps)``: 'constant' and 'cosine' rise linearly to the rate
        first (default 0); 'onecycle' rises for this many steps (default 30% of the steps,
        ``OneCycleLR``'s ``pct_start=0.3``).

    Notes
    -----
    Every argument is checked before the first step (ValueError/TypeError naming the fix).
    Each step is :func:`linearkit.training.loop.step`; accuracies come from
    :func:`linearkit.training.loop.evaluate` (eval mode).
    """
    from ..data import DataLoader
    from ..optim import Adam

    storage = _check_precision(precision)
    steps = _check_int("steps", steps, 1)
    warmup = _check_schedule(schedule, warmup, steps)
    eval_every = _check_int("eval_every", eval_every, 0)
    data = as_dataset(dataset)
    batch_size = check_batch_size(batch_size, len(data.x_train))
    ranks = _check_ranks(batch_size) if distributed else 1
    if model is None:
        if optimizer is not None:
            raise ValueError("train: optimizer= needs model= too (an optimizer steps the "
                             "parameters of a model you built)")
        model_kind = "mlp" if model_kind is None else model_kind
        rng = np.random.default_rng(seed)
        model = build_model(model_kind, 100 if hidden is None else hidden,
                            in_features=data.x_train.shape[1], rng=rng)
        if storage != np.float32:
            model.to(storage)
    else:
        if not isinstance(model, Module):
            raise TypeError(f"train: model must be a linearkit Module, got "
                            f"{type(model).__name__}")
        if hidden is not None:
            raise ValueError("train: hidden= builds the recipe's MLP; it cannot apply to your "
                             "model= (drop hidden=)")
        model_kind = "custom" if model_kind is None else model_kind
        stored = {p.dtype for p in model.parameters()}
        if stored and stored != {storage}:
            raise ValueError(f"train: precision={precision!r} trains parameters stored as "
                             f"{storage.name}, but the model's are "
                             f"{', '.join(sorted(d.name for d in stored))}; convert it first: "
                             f"model.to({storage.name!r})")
    if optimizer is None:
        lr = 1e-2 if lr is None else check_lr(lr)
        optimizer = Adam(model.parameters(), lr=lr)
    else:
        if lr is not None:
            raise ValueError("train: lr= sets the default Adam's rate; with optimizer= set it "
                             "on your optimizer (drop lr=)")
        _check_optimizer(optimizer, model)
    loss_fn = CrossEntropyLoss() if loss_fn is None else loss_fn
    threads = thread_setting(threads)
    scheduler = build_schedule(optimizer, schedule, steps, warmup)
    loader = DataLoader(data.x_train, data.y_train, batch_size=batch_size, shuffle=True,
                        drop_last=True, seed=seed)
    dp_step = _data_parallel_step(model) if distributed else None
    with threads, _flush_denormal(flush_denormal):
        result = _loop(model, data, loss_fn, optimizer, loader, model_kind, steps, eval_every,
                       progress, precision == "fp16", dp_step, scheduler)
    result.precision = precision
    result.ranks = ranks
    result.schedule, result.warmup = schedule, warmup
    return model, result


#: the schedules ``train(schedule=)`` and ``linearkit train --schedule`` know
SCHEDULES = ("constant", "cosine", "onecycle")


def _check_schedule(schedule, warmup, steps: int) -> int:
    """``warmup`` as an int in ``[0, steps)`` (its default for ``schedule`` when None)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"train: schedule must be one of {', '.join(SCHEDULES)}, got "
                         f"{schedule!r}")
    if warmup is None:
        return round(0.3 * steps) if schedule == "onecycle" else 0
    warmup = _check_int("warmup", warmup, 0)
    if warmup >= steps:
        raise ValueError(f"train: warmup={warmup} must be fewer than steps={steps} (the "
                         f"schedule needs steps after the warm-up); lower --warmup or raise "
                         f"--steps")
    return warmup


def build_schedule(optimizer, schedule: str, steps: int, warmup: int = 0):
    """The learning-rate scheduler for a run of ``steps`` optimizer steps, or None.

    - ``'constant'``: the optimizer's rate; with ``warmup`` first
      ``LinearLR(start_factor=1/warmup, total_iters=warmup)``.
    - ``'cosine'``: ``CosineAnnealingLR(T_max=steps - warmup)`` down to 0, after that warm-up
      (``SequentialLR`` joins them at ``milestones=[warmup]``).
    - ``'onecycle'``: ``OneCycleLR(max_lr=<the rate>, total_steps=steps,
      pct_start=warmup / steps)`` (its own warm-up from a 25th of the rate; Adam's beta1
      cycles too, as torch's does).

    The same schedulers in ``torch.optim.lr_scheduler`` give the same rates step by step.
    """
    from ..optim import lr_scheduler as sched

    if schedule == "onecycle":
        max_lr = [group["lr"] for group in optimizer.param_groups]
        return sched.OneCycleLR(optimizer, max_lr=max_lr, total_steps=steps,
                                pct_start=warmup / steps)
    decay = (sched.CosineAnnealingLR(optimizer, T_max=steps - warmup)
             if schedule == "cosine" else None)
    if not warmup:
        return decay
    rise = sched.LinearLR(optimizer, start_factor=1 / warmup, total_iters=warmup)
    return rise if decay is None else sched.SequentialLR(optimizer, [rise, decay],
                                                         milestones=[warmup])


def _flush_denormal(mode: bool):
    """``denormal.flush_denormal()`` when asked, else a context that changes nothing."""
    from contextlib import nullcontext

    from ..backend.denormal import flush_denormal

    return flush_denormal(True) if mode else nullcontext()


def _check_ranks(batch_size: int) -> int:
    """The MPI job's size; ``batch_size`` (the global batch) must split evenly over it."""
    from ..distributed import world_size

    ranks = world_size()
    if batch_size % ranks:
        below, above = batch_size - batch_size % ranks, batch_size + ranks - batch_size % ranks
        raise ValueError(f"train: batch_size={batch_size} is the global batch and must split "
                         f"evenly over the {ranks} ranks; use a multiple of {ranks}, e.g. "
                         f"{below or above} or {above}")
    return ranks


def _data_parallel_step(model: Module):
    """``dp_step(xb, yb, scaler) -> loss``: this rank's rows of the global batch, gradients
    averaged over the ranks (``linearkit.distributed.step``), after rank 0's weights are
    broadcast."""
    from .. import distributed as dist

    dist.broadcast_parameters(model)
    reducer = dist.GradientReducer(model)

    def dp_step(model, loss_fn, optimizer, xb, yb, scaler):
        xs, ys = dist.shard_batch(xb, yb)
        return dist.step(model, loss_fn, optimizer, xs, ys, reducer=reducer, scaler=scaler)

    return dp_step


#: ``precision=`` -> the storage dtype's name
PRECISIONS = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _check_precision(precision) -> np.dtype:
    from ..precision import storage_dtype

    if precision not in PRECISIONS:
        raise ValueError(f"train: precision must be one of {', '.join(PRECISIONS)}, got "
                         f"{precision!r}")
    return storage_dtype(PRECISIONS[precision])


def _check_optimizer(optimizer, model: Module) -> None:
    """The optimizer must step parameters of ``model`` (not of another model)."""
    groups = getattr(optimizer, "param_groups", None)
    if groups is None or not hasattr(optimizer, "step") or not hasattr(optimizer, "zero_grad"):
        raise TypeError(f"train: optimizer must be a linearkit optimizer (param_groups, step, "
                        f"zero_grad), got {type(optimizer).__name__}")
    own = {id(p) for p in model.parameters()}
    theirs = [p for group in groups for p in group["params"]]
    if not theirs or any(id(p) not in own for p in theirs):
        raise ValueError("train: the optimizer steps parameters that are not the model's; "
                         "build it from this model: Adam(model.parameters(), lr=...)")


def _loop(model, data, loss_fn, optimizer, loader, model_kind, steps, eval_every, progress,
          scale_loss: bool = False, dp_step=None, scheduler=None) -> TrainResult:
    history = []
    loss = np.nan
    step = skipped = 0
    scaler = None
    if scale_loss:
        from ..training.accumulation import accumulated_step
        from ..training.amp import GradScaler

        scaler = GradScaler()
    started = time.perf_counter()
    model.train()
    while step < steps:
        for xb, yb in loader:  # never empty: batch_size <= rows (checked) and the loader raises
            if dp_step is not None:  # this rank's rows, averaged gradients (and scaler)
                before = None if scaler is None else scaler.get_scale()
                loss = dp_step(model, loss_fn, optimizer, xb, yb, scaler)
                skipped += scaler is not None and scaler.get_scale() < before
            elif scaler is None:
                loss = loop_step(model, loss_fn, optimizer, xb, yb, set_to_none=False)
            else:  # scaled loss, unscale, skip the step on inf/NaN, update the scale
                before = scaler.get_scale()
                loss = accumulated_step(model, loss_fn, optimizer, xb, yb, scaler=scaler,
                                        set_to_none=False)
                skipped += scaler.get_scale() < before
            if scheduler is not None:
                scheduler.step()
            step += 1
            test_acc = None
            if eval_every and (step % eval_every == 0 or step == steps):
                test_acc = accuracy(model, data.x_test, data.y_test)
                history.append({"step": step, "loss": loss, "test_accuracy": test_acc})
            if progress is not None:
                progress(step, loss, test_acc)
            if step >= steps:
                break
    seconds = time.perf_counter() - started
    model.eval()
    return TrainResult(
        model=model_kind,
        test_accuracy=accuracy(model, data.x_test, data.y_test),
        train_accuracy=accuracy(model, data.x_train, data.y_train),
        steps=step,
        seconds=seconds,
        params=sum(p.size for p in model.parameters()),
        final_loss=float(loss),
        history=history,
        skipped_steps=int(skipped),
    )
