"""``doctor(model, x, y)``: one report that answers what a model costs, whether it is healthy,
whether it is ready for 16-bit precision, whether its gradients are right and how it runs.

Sections, each built from the library's own tools (nothing is measured twice):

1. **The three questions** (``analysis.ledger``): per layer, by path, the input and output
   shape, parameters, memory (weights, gradients, optimizer state, saved activations) and
   forward/backward FLOPs; the ledger's redundancy findings with the transform call and the
   ``linearkit compress`` command that removes each, and what it saves.
2. **Health** (``analysis.stats`` on one batch: the user's, or a random probe): per-layer
   activation mean/std/max|y|, dead ReLU units, gradient norms and ``‖∇W‖/‖W‖``; the first layer
   outside the healthy bands (``BANDS``; docs/doctor.md explains them); a verdict in words and
   remedies in order of likelihood, each naming the linearkit call.
3. **Precision readiness** (``analysis.range_check``, with ``dtype=``): the first layer at
   risk, and whether loss scaling is needed.
4. **Correctness**: ``analysis.gradcheck`` of each distinct layer type on a small float64 copy;
   ``io.verify`` against ``reference=``.
5. **Runtime**: ``runtime.explain``'s route per module, and the BLAS threads.

The package, one job a file: ``subject`` (the model as linearkit pieces, the batch, the
targets), ``health``, ``sections`` (the other four), ``diagnosis`` (``doctor()`` and
``DoctorReport``: text and JSON), ``html`` (one self-contained page) and ``command``
(``run(args)`` for ``linearkit doctor``). ``import linearkit`` does not import this package; matplotlib and
torch load only when a plot is drawn or a torch model is given.
"""

from .command import DoctorUsageError, run
from .diagnosis import DoctorReport, doctor
from .health import BANDS, Health, LayerHealth, Remedy

__all__ = ["BANDS", "DoctorReport", "DoctorUsageError", "Health", "LayerHealth", "Remedy",
           "doctor", "run"]
