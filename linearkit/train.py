"""The main job: train the MNIST-1D baselines of Greydanus (2020), "Scaling Down Deep Learning".

Recipe (the paper's MLP baseline): 40 -> 100 ReLU -> residual (100 -> 100 ReLU) -> 10,
Adam lr 1e-2, batch 100, 6,000 steps, seed 42; ``--model linear`` is the logistic-regression
baseline (40 -> 10). The paper reports 32% (logistic regression) and 68% (MLP) test accuracy.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass

import numpy as np

from .layers import Linear, ReLU, Residual, Sequential
from .losses import CrossEntropyLoss
from .module import Module

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
    """Fraction of rows of ``x (N, in)`` whose argmax logit equals ``y (N,)``."""
    correct = 0
    for start in range(0, len(x), batch):
        correct += int((model(x[start:start + batch]).argmax(axis=-1) == y[start:start + batch]).sum())
    return correct / max(len(x), 1)


# Below this many multiply-adds per GEMM, BLAS threads cost more in hand-offs than they save;
# on a 2-core machine with anything else running, a threaded 100x100x100 GEMM is 10-30x slower.
SMALL_GEMM_MACS = 1 << 22


def blas_threads(limit: int | None):
    """Context manager limiting BLAS to ``limit`` threads (needs threadpoolctl; else a no-op)."""
    if limit is None:
        return contextlib.nullcontext()
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # the cli extra brings it; without it BLAS keeps its default
        return contextlib.nullcontext()
    return threadpool_limits(limits=limit, user_api="blas")


def auto_threads(model: Module, batch_size: int) -> int | None:
    """1 when every Linear GEMM of a training step is small (see SMALL_GEMM_MACS), else None."""
    from .layers import Linear

    largest = max((m.in_features * m.out_features for m in model.modules()
                   if isinstance(m, Linear) and m.in_features is not None), default=0)
    return 1 if largest * batch_size < SMALL_GEMM_MACS else None


def train(model_kind: str = "mlp", *, hidden: int = 100, steps: int = 6000, lr: float = 1e-2,
          batch_size: int = 100, seed: int = 42, eval_every: int = 500, dataset=None,
          progress=None, threads: int | str | None = "auto") -> tuple[Module, TrainResult]:
    """Train on MNIST-1D and return ``(model, TrainResult)``.

    ``progress(step, loss, test_accuracy_or_None)`` is called after every step (for a bar).
    Batches are drawn by a seeded shuffling loader, reshuffled every epoch, drop_last.
    ``threads``: BLAS threads while training — ``"auto"`` (one thread for small models, see
    ``auto_threads``), an int, or None to leave BLAS as it is.
    """
    from .data import DataLoader, mnist1d
    from .optim import Adam

    data = dataset if dataset is not None else mnist1d()
    rng = np.random.default_rng(seed)
    model = build_model(model_kind, hidden, in_features=data.x_train.shape[1], rng=rng)
    loss_fn = CrossEntropyLoss()
    optimizer = Adam(model.parameters(), lr=lr)
    loader = DataLoader(data.x_train, data.y_train, batch_size=batch_size, shuffle=True,
                        drop_last=True, seed=seed)
    if threads == "auto":
        threads = auto_threads(model, batch_size)
    with blas_threads(threads):
        return model, _loop(model, data, loss_fn, optimizer, loader, model_kind, steps,
                            eval_every, progress)


def _loop(model, data, loss_fn, optimizer, loader, model_kind, steps, eval_every, progress
          ) -> TrainResult:
    history = []
    loss = np.nan
    step = 0
    started = time.perf_counter()
    model.train()
    while step < steps:
        for xb, yb in loader:
            pred, backward = model.vjp(xb, input_grad=False)
            loss, loss_backward = loss_fn.vjp(pred, yb)
            backward(loss_backward())
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)  # reuse the gradient buffers
            step += 1
            test_acc = None
            if eval_every and (step % eval_every == 0 or step == steps):
                test_acc = accuracy(model, data.x_test, data.y_test)
                history.append({"step": step, "loss": float(loss), "test_accuracy": test_acc})
            if progress is not None:
                progress(step, float(loss), test_acc)
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
    )
