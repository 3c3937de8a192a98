"""``linearkit train`` where numba has not compiled the kernels yet: train on the NumPy path
while a background process compiles them (``backend/fast/background.py``; docs/fast.md, "The
first run").

The background process runs this very recipe for three steps on a few rows of the same data
(``job``), which makes numba compile exactly the kernels the run would use. The ``key`` holds
what changes which kernels run: the model (its depth), the precision (the dtypes) and the batch
size (the compiled step and the fused loss have row limits); the width, the rate, the seed and
the schedule do not.
"""

from __future__ import annotations

import functools

__all__ = ["compiled_in_background", "job_key"]


def job_key(args) -> str:
    """The name of the kernels ``linearkit train ARGS`` uses (``cache_marker``'s key)."""
    return f"linearkit train model={args.model} precision={args.precision} batch={args.batch_size}"


def compiled_in_background(args, data):
    """The context ``linearkit train`` trains in: ``fast.background.compile_in_background``
    with this run's key and a three-step job (it yields whether the run is on the NumPy path
    because the kernels are being compiled)."""
    from ..backend.fast import background
    from ..recipes.train_mnist1d import Dataset, train

    rows = min(len(data.x_train), 3 * args.batch_size)
    few = Dataset(data.x_train[:rows], data.y_train[:rows], data.x_test[:200],
                  data.y_test[:200])
    job = functools.partial(train, args.model, hidden=args.hidden, steps=3,
                            batch_size=args.batch_size, eval_every=0, dataset=few,
                            threads=args.threads, precision=args.precision)
    return background.compile_in_background(job_key(args), job)
