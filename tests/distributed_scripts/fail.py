"""A rank that fails, run under ``mpirun -n 2`` by tests/test_distributed.py: the job must end
with that rank's message, never hang.

``python fail.py raise``: rank 1 raises inside ``abort_on_error`` while rank 0 waits in an
all-reduce -> "rank 1: ValueError: ..." and MPI_Abort.
``python fail.py hang``: rank 1 sleeps while rank 0 waits in the gradient all-reduce ->
rank 0's collective times out (LINEARKIT_MPI_TIMEOUT) -> "rank 0: ... did not complete".
"""

import sys
import time

import numpy as np

import linearkit as lk
from linearkit import distributed as D


def main(mode):
    model = lk.Linear(4, 2, rng=np.random.default_rng(0))
    reducer = D.GradientReducer(model)
    pred, back = model.vjp(np.ones((3, 4), np.float32), input_grad=False)
    back(np.ones_like(pred))
    if D.rank() == 1:
        if mode == "raise":
            raise ValueError("rank 1 broke on purpose before the all-reduce")
        time.sleep(120)  # stuck: never reaches the collective
    reducer.synchronize()
    print("unreachable: the all-reduce completed", flush=True)


if __name__ == "__main__":
    with D.abort_on_error():
        main(sys.argv[1])
