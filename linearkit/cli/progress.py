"""The progress bar of ``linearkit train``: steps done, loss and test accuracy, and an ETA that
the first steps do not distort.

The first steps can take far longer than the others: the first imports numba and loads the
kernels from its cache, or compiles them, and the second compiles the whole-step kernel when
that is not cached either (docs/fast.md, "The first run"). tqdm estimates its rate from the
steps it has seen, so after a first step of seconds it predicted hours. So during the first
``START_STEPS`` steps, a step longer than ``START_SECONDS`` restarts the bar's rate (tqdm's
``unpause``): the ETA comes from the steps after it. A run whose every step is that slow only
has its rate measured from its 10th step on. The elapsed time still counts from the start.
"""

from __future__ import annotations

import time

__all__ = ["START_SECONDS", "START_STEPS", "restart_rate", "step_bar"]

START_STEPS = 10         # the steps that may hold a one-off start-up
START_SECONDS = 0.1      # a recipe step takes well under a millisecond


def step_bar(total: int, file=None):
    """``(bar, progress)``: a tqdm bar over ``total`` steps and the ``progress(step, loss,
    test_acc)`` callback that ``recipes.train_mnist1d.train`` calls after every step (the loss
    and the last test accuracy shown every 50 steps and at each evaluation); ``(None, None)``
    without tqdm (the cli extra brings it). ``file``: where the bar is drawn (default stderr)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None, None
    bar = tqdm(total=total, unit="step", dynamic_ncols=True, mininterval=0.25, file=file)
    last = {"test": float("nan"), "time": time.perf_counter()}

    def progress(step, loss, test_acc):
        now = time.perf_counter()
        if step <= START_STEPS and now - last["time"] > START_SECONDS:
            restart_rate(bar)            # before the update: this step stays out of the rate
        last["time"] = now
        if test_acc is not None:
            last["test"] = test_acc
        bar.update(1)
        if step % 50 == 0 or test_acc is not None:
            bar.set_postfix(loss=f"{loss:.3f}", test_acc=f"{last['test']:.1%}",
                            refresh=False)

    return bar, progress


def restart_rate(bar) -> None:
    """Measure ``bar``'s rate (and so its ETA) from now on, keeping its elapsed time."""
    started = bar.start_t
    bar.unpause()               # tqdm's clock restarts at the last print: now
    bar.start_t = started       # ...but elapsed still counts from the bar's start
