"""What every module-level transform returns beside the new model: a ``TransformReport``.

The report proves the transform on probe inputs — random ones, plus the user's batch
(``probe=``) — by running the old and the new model side by side, and counts what changed:

* ``max_abs_error`` = max |new(x) - old(x)| over every probe output element;
* ``max_rel_error`` = ``max_abs_error`` / max |old(x)| (a norm-wise relative error: an
  elementwise one is meaningless where an output is near zero);
* ``params_before/after``: values stored in the state dict (weights, biases, norm statistics;
  not BatchNorm's step counter) — what a model file holds, int8 weights included;
* ``bytes_before/after``: those values' bytes.

Both models run in eval mode for the probes (Dropout off, BatchNorm on running statistics) and
come back in the mode they were in; neither is otherwise touched. The probes fire none of the
modules' own call hooks (a user's forward hook on a layer is for the user's calls, not for a
transform's checks): the input model runs as a hook-free deep copy when it has any, the new
model with its hooks set aside for the probes and back in place afterwards. Hooks registered
for every module at once (``linearkit.hooks.register_module_forward_hook``) are process-wide
by design and still fire.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field

import numpy as np

from ..analysis.ledger.report import human_bytes
from ..core import hooks as _hooks
from ..core.module import Module
from ..errors import ShapeError
from ..rules import first_input

__all__ = ["TransformReport", "compare_models", "evaluating", "hooks_off", "probe_inputs",
           "state_size", "unhooked"]

#: Random probe rows drawn when the model's input width is known.
PROBE_ROWS = 64


@dataclass
class TransformReport:
    """The outcome of one transform (see the module docstring for each number).

    ``changed``: one line per edit ('0+2: Linear(3, 4) . Linear(4, 2) -> Linear(3, 2)');
    ``left``: one line per candidate left alone, with why; ``layers``: per-layer details (a dict
    per edited layer: its path and the transform's own figures, e.g. rank and energy kept).
    """

    transform: str
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    params_before: int = 0
    params_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    changed: list = field(default_factory=list)
    left: list = field(default_factory=list)
    layers: list = field(default_factory=list)

    def summary(self) -> str:
        """One line: what changed, the size change and the measured error."""
        edits = f"{len(self.changed)} change{'s' if len(self.changed) != 1 else ''}"
        if self.left:
            edits += f", {len(self.left)} left"
        return (f"{self.transform}: {edits}; params {self.params_before:,} -> "
                f"{self.params_after:,}, {human_bytes(self.bytes_before)} -> "
                f"{human_bytes(self.bytes_after)}; max abs error {self.max_abs_error:.3g}, "
                f"max rel error {self.max_rel_error:.3g}")

    def __str__(self) -> str:
        lines = [self.summary()]
        lines += [f"  changed {line}" for line in self.changed]
        lines += [f"  left    {line}" for line in self.left]
        return "\n".join(lines)


def state_size(model: Module) -> tuple[int, int]:
    """``(values, bytes)`` stored in ``model``'s state dict, BatchNorm's step counter excepted."""
    values = nbytes = 0
    for key, value in model.state_dict().items():
        if key.rsplit(".", 1)[-1] == "num_batches_tracked":
            continue
        array = np.asarray(value)
        values += array.size
        nbytes += array.nbytes
    return values, nbytes


@contextlib.contextmanager
def evaluating(*models: Module):
    """Put every module of ``models`` in eval mode for the block; restore each one's own mode."""
    saved = [(m, m.training) for model in models for m in model.modules()]
    try:
        for model in models:
            model.eval()
        yield
    finally:
        for m, mode in saved:
            m.training = mode


def hooked(*models: Module) -> bool:
    """Whether any module of ``models`` has a call hook of its own (``Module.has_hooks``)."""
    return any(m.has_hooks() for model in models for m in model.modules())


@contextlib.contextmanager
def hooks_off(*models: Module):
    """Set aside the call hooks of every module of ``models`` for the block, so that a
    transform's own runs (probes, timing, the inputs it records) fire none of them; each
    module gets back exactly its own hook set afterwards, even on an error.

    Only for models the transform owns (its copies): the caller's model is run through
    ``unhooked`` instead, never edited. Hooks the transform registers inside the block (to
    record a layer's inputs) live in a set of their own and are gone when the block ends.
    """
    with _hooks.suspended(*models):
        yield


def unhooked(model: Module) -> Module:
    """``model`` itself when none of its modules has a call hook of its own, else a deep copy
    to run instead under ``hooks_off`` (the caller's model, hooks included, is never edited:
    a deep copy keeps the hooks, as in PyTorch, so the copy needs ``hooks_off`` too)."""
    return copy.deepcopy(model) if hooked(model) else model


def input_width(model: Module) -> tuple | None:
    """The feature shape the model's first layer expects (``(in_features,)``), or None
    (``first_input``'s width: None too when an unmaterialized lazy layer comes first)."""
    return first_input(model)[2]


def probe_inputs(model: Module, probe=None, rows: int = PROBE_ROWS, seed: int = 0) -> list:
    """The inputs a transform is checked on: ``rows`` standard-normal rows, plus ``probe`` (the
    user's batch) if given. The random rows take the trailing shape of ``probe`` when there is
    one (so a model of 3-D inputs is checked as it is used), else the model's input width when
    it can be read off the model.

    Raises ValueError naming the fix when there is neither.
    """
    dtype = next((p.dtype for p in model.parameters()
                  if np.issubdtype(p.dtype, np.floating)), np.dtype(np.float32))
    if dtype.itemsize < 4:
        dtype = np.dtype(np.float32)
    out = []
    if probe is not None:
        probe = np.asarray(probe)
        if probe.ndim == 0:
            raise ValueError("probe= must be a batch of inputs (N, *in_shape), got a scalar")
        if np.issubdtype(probe.dtype, np.floating):
            dtype = probe.dtype
    width = tuple(probe.shape[1:]) if probe is not None else input_width(model)
    if width is not None:
        rng = np.random.default_rng(seed)
        out.append(rng.standard_normal((rows, *width)).astype(dtype))
    if probe is not None:
        out.append(probe)
    if not out:
        path, lazy, _ = first_input(model)
        why = (f": its first layer '{path}' ({type(lazy).__name__}) is not materialized"
               if lazy is not None else "")
        raise ValueError(f"cannot tell the input width of {type(model).__name__} to draw probe "
                         f"inputs{why}; pass a batch of real inputs as probe=")
    return out


def compare_models(old: Module, new: Module, probes: list) -> tuple[float, float]:
    """``(max_abs_error, max_rel_error)`` of ``new`` against ``old`` over ``probes``, both run in
    eval mode and without their modules' call hooks (``old``: the caller's, run as a hook-free
    copy when it has hooks; ``new``: the transform's own, its hooks set aside for the block);
    a non-finite difference counts as ``inf``."""
    max_abs = max_ref = 0.0
    old = unhooked(old)
    with evaluating(old, new), hooks_off(old, new):
        for x in probes:
            try:
                a = np.asarray(old(x), dtype=np.float64)
            except ShapeError as err:
                raise ValueError(f"the probe inputs do not fit the model ({err}); pass a batch "
                                 "of real inputs as probe=") from None
            b = np.asarray(new(x), dtype=np.float64)
            if a.shape != b.shape:
                raise AssertionError(f"the transformed model returns shape {b.shape}, the "
                                     f"original {a.shape}: this is a bug in the transform")
            if a.size == 0:
                continue
            diff = np.abs(a - b)
            if not np.all(np.isfinite(diff)):
                return float("inf"), float("inf")
            max_abs = max(max_abs, float(diff.max()))
            max_ref = max(max_ref, float(np.abs(a).max()))
    rel = max_abs / max_ref if max_ref > 0 else (0.0 if max_abs == 0 else float("inf"))
    return max_abs, rel
