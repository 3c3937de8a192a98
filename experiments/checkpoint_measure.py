"""What activation checkpointing saves and costs on this machine: tracemalloc against the ledger.

``measure_checkpointing()`` builds a deep MLP, checkpoints it with ``checkpoint_sequential`` and
measures one training step (``vjp`` + ``backward``) of each model: the peak of the memory NumPy
allocates during the step (``tracemalloc`` traces NumPy's allocations; the weights and gradient
buffers exist before the step and are not in it), the activations the ledger says are saved, and
the median step time. The docs page's script calls it; timing is a measurement, not a test.
"""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np

from linearkit import Linear, Module, ReLU, Sequential, checkpoint_sequential

__all__ = ["deep_mlp", "measure_checkpointing", "step_peak_bytes"]


def deep_mlp(depth: int, width: int, block: str = "mlp", rng=0) -> Sequential:
    """``depth`` blocks of width ``width``, float32, as a Sequential of Sequentials.

    ``block='mlp'``: ``Linear(width, 4*width), ReLU, Linear(4*width, width)`` (a transformer's MLP
    block: its backward keeps its input and the 4x wider ReLU output). ``block='linear_relu'``:
    ``Linear(width, width), ReLU`` — whose only saved activation is its input (the ReLU output is
    the next block's input), so checkpointing it saves next to nothing: the ledger says so too.
    """
    if block not in ("mlp", "linear_relu"):
        raise ValueError(f"block must be 'mlp' or 'linear_relu', got {block!r}")
    rng = np.random.default_rng(rng)

    def make() -> Sequential:
        if block == "linear_relu":
            return Sequential(Linear(width, width, rng=rng), ReLU())
        return Sequential(Linear(width, 4 * width, rng=rng), ReLU(),
                          Linear(4 * width, width, rng=rng))

    return Sequential(*[make() for _ in range(depth)])


def _step(model: Module, x: np.ndarray) -> None:
    """One training step's gradient: loss = mean(y); the output is dropped once dy is made, as a
    loss that keeps only what its own backward needs would."""
    y, backward = model.vjp(x, input_grad=False)
    dy = np.full_like(y, 1.0 / y.size)
    del y
    backward(dy)


def step_peak_bytes(model: Module, x: np.ndarray) -> int:
    """Peak bytes allocated (tracemalloc) during one ``vjp`` + ``backward`` of ``model`` on ``x``,
    above what was allocated before it. The gradient buffers are allocated (and zeroed in place)
    by a step run first, so the peak is the step's activations and temporaries."""
    _step(model, x)
    model.zero_grad(set_to_none=False)
    gc.collect()
    started = tracemalloc.is_tracing()
    if not started:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        _step(model, x)
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        if not started:
            tracemalloc.stop()
        model.zero_grad()


def measure_checkpointing(depth: int = 8, width: int = 1024, batch: int = 256,
                          segments: int | None = None, repeats: int = 5,
                          block: str = "mlp") -> dict:
    """Peak memory and time of a training step, with and without checkpointing.

    Parameters
    ----------
    depth, width, block : the MLP (``deep_mlp``); input ``(batch, width)`` float32.
    segments : int, optional
        ``checkpoint_sequential``'s segments (default ``depth``: each block but the last one
        checkpointed; the last is never recomputed).
    repeats : int
        Steps timed per model, interleaved; the medians are reported (0: no timing).

    Returns
    -------
    dict
        ``peak_plain``, ``peak_ckpt`` (tracemalloc bytes), ``ledger_plain``, ``ledger_ckpt`` (the
        ledger's ``memory['activations']``), ``time_plain``, ``time_ckpt`` (median seconds per
        step; None without repeats), and ``saved_measured`` = peak_plain - peak_ckpt,
        ``saved_ledger`` = ledger_plain - ledger_ckpt, ``time_ratio`` = time_ckpt / time_plain.
    """
    from linearkit.analysis import ledger
    from linearkit.analysis.timing import same_run_seconds

    plain = deep_mlp(depth, width, block)
    ckpt = checkpoint_sequential(plain, depth if segments is None else segments)
    x = np.random.default_rng(1).standard_normal((batch, width)).astype(np.float32)
    out = {"peak_plain": step_peak_bytes(plain, x), "peak_ckpt": step_peak_bytes(ckpt, x)}
    for name, model in (("plain", plain), ("ckpt", ckpt)):
        out[f"ledger_{name}"] = ledger(model, x.shape, optimizer="sgd",
                                       rank_check=False).memory["activations"]
    if repeats:  # one step each per round, interleaved (timing.same_run_seconds)
        out["time_plain"], out["time_ckpt"] = same_run_seconds(
            [lambda: _step(plain, x), lambda: _step(ckpt, x)], repeats=repeats, min_seconds=0)
        plain.zero_grad()
        ckpt.zero_grad()
    else:
        out["time_plain"] = out["time_ckpt"] = None
    out["saved_measured"] = out["peak_plain"] - out["peak_ckpt"]
    out["saved_ledger"] = out["ledger_plain"] - out["ledger_ckpt"]
    out["time_ratio"] = out["time_ckpt"] / out["time_plain"] if repeats else None
    return out
