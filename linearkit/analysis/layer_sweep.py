"""``linearkit sweep``: throughput and latency of one ``Linear`` against batch size and width.

Two measurements, both on this machine and timed with
:func:`linearkit.analysis.timing.same_run_seconds` (medians of ``repeats`` samples, every
candidate timed once per round, so a change in the machine's load hits them all alike):

- :func:`batch_sweep` — ``Linear(in_features, out_features)`` at batch sizes ``1, 2, 4, …``:
  latency (ms per call) and throughput (samples/s), forward and optionally forward+backward, and
  the **knee**: the smallest batch whose throughput reaches ``KNEE_FRACTION`` (90%) of the best
  throughput in the sweep (:func:`find_knee`). Past the knee a bigger batch buys little more
  throughput and costs latency in proportion (the common advice: "sweep batch 1 to 64, find
  the knee of throughput against latency"; docs/sweep.md).
- :func:`dim_sweep` — square layers ``Linear(d, d)`` of the given widths at one batch size:
  the time per call and the arithmetic rate (GFLOP/s, ``2·batch·d²`` per forward), each width
  that is not a multiple of ``ALIGNMENT`` (64) beside its aligned neighbour, the nearest swept
  width that is (:func:`aligned_neighbour`: 250 -> 256, 1000 -> 1024, 4000 -> 4096), to check
  the claim that widths that are multiples of 8/16/64 run faster ("250 -> 256 runs faster").

Not imported by ``import linearkit``; the plot is :mod:`linearkit.analysis.layer_sweep_plot` (matplotlib).

Examples
--------
>>> from linearkit.analysis.layer_sweep import aligned_neighbour, find_knee
>>> find_knee([1, 2, 4, 8], [100.0, 190.0, 370.0, 400.0])  # 370 >= 0.9 * 400
4
>>> aligned_neighbour(1000, [250, 256, 1000, 1024])  # not the row before it (256)
1024
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from .render import text_table
from .timing import same_run_seconds

__all__ = ["ALIGNMENT", "KNEE_FRACTION", "SweepResult", "SweepRow", "SweepTooLarge",
           "aligned_neighbour", "batch_sweep", "dim_sweep", "find_knee", "memory_limit",
           "powers_of_two", "sweep_bytes"]

#: The knee is the smallest batch reaching this fraction of the sweep's best throughput.
KNEE_FRACTION = 0.9

#: The width sweep compares each width that is not a multiple of this with one that is: the
#: coarsest of the multiples GEMM kernels favour (8 for fp16 tensor cores, 16, 64 for the
#: blocked BLAS kernels), so 1000 (a multiple of 8) is compared with 1024 too.
ALIGNMENT = 64


def aligned_neighbour(width: int, widths: Sequence[int], alignment: int = ALIGNMENT
                      ) -> int | None:
    """The width among ``widths`` that ``width`` is compared with in a width sweep.

    For a ``width`` that is not a multiple of ``alignment``: the multiple of ``alignment`` in
    ``widths`` nearest to it by ratio (the wider on a tie), when one lies within a factor of 2
    (250 -> 256, 1000 -> 1024, 4000 -> 4096, whatever the order of ``widths``). None for a
    ``width`` that is itself a multiple, or when no multiple within a factor of 2 was swept.
    """
    if width % alignment == 0:
        return None
    near = [w for w in widths if w % alignment == 0 and max(w, width) < 2 * min(w, width)]
    if not near:
        return None
    return min(near, key=lambda w: (abs(np.log(w / width)), -w))


@dataclass
class SweepRow:
    """One measured point: ``batch`` rows through ``Linear(in_features, out_features)``.

    ``forward_ms`` / ``train_ms`` are medians of milliseconds per call (``train``: forward plus
    backward, with ``zero_grad`` as a training step does; None unless ``backward=True``);
    ``*_samples_s`` are ``batch`` divided by them; ``*_gflops`` count ``2·batch·in·out`` FLOPs
    per forward and three times that per forward+backward.
    """

    batch: int
    in_features: int
    out_features: int
    forward_ms: float
    forward_samples_s: float
    forward_gflops: float
    train_ms: float | None = None
    train_samples_s: float | None = None
    train_gflops: float | None = None


@dataclass
class SweepResult:
    """What :func:`batch_sweep` or :func:`dim_sweep` measured.

    Attributes
    ----------
    kind : str
        ``"batch"`` (rows differ in batch) or ``"dims"`` (rows differ in width, one batch).
    dtype : str
        The layer's and the input's dtype.
    backward : bool
        Whether forward+backward was timed too.
    threads : int or None
        BLAS threads used (None: linearkit's default policy, ``linearkit.backend.threads``).
    repeats : int
        Samples per point (the median is reported).
    rows : list of SweepRow
    knee : int or None
        ``kind == "batch"``: the forward knee batch (:func:`find_knee`); None for ``"dims"``.
    knee_backward : int or None
        The same for forward+backward, when measured.
    """

    kind: str
    dtype: str
    backward: bool
    threads: int | None
    repeats: int
    rows: list[SweepRow] = field(default_factory=list)
    knee: int | None = None
    knee_backward: int | None = None

    def to_dict(self) -> dict:
        """A JSON-ready dict (``rows`` as a list of dicts)."""
        record = asdict(self)
        record["knee_fraction"] = KNEE_FRACTION
        if self.kind == "dims":
            record["alignment"] = ALIGNMENT
            record["aligned_pairs"] = [list(pair) for pair in self.aligned_pairs()]
        return record

    def aligned_pairs(self) -> list[tuple[int, int]]:
        """``(width, aligned neighbour)`` of each width-sweep row that has one
        (:func:`aligned_neighbour`), in row order; ``[]`` for a batch sweep."""
        if self.kind != "dims":
            return []
        widths = [r.in_features for r in self.rows]
        pairs = [(w, aligned_neighbour(w, widths)) for w in widths]
        return [(w, n) for w, n in pairs if n is not None]

    def _aligned_note(self, r: SweepRow) -> str:
        """A width-sweep row's note: its aligned neighbour's work, time and GFLOP/s over its
        own, or what to sweep to get one."""
        d = r.in_features
        if d % ALIGNMENT == 0:
            return f"a multiple of {ALIGNMENT}"
        n = dict(self.aligned_pairs()).get(d)
        if n is None:
            padded = -(-d // ALIGNMENT) * ALIGNMENT
            return f"no multiple of {ALIGNMENT} swept near it: add {padded} to --dims"
        other = next(row for row in self.rows if row.in_features == n)
        return (f"-> {n}: work {(n / d) ** 2:.2f}x, time {other.forward_ms / r.forward_ms:.2f}x, "
                f"GFLOP/s {other.forward_gflops / r.forward_gflops:.2f}x")

    def table(self) -> str:
        """The rows as an aligned plain-text table, the knee (or each width's aligned
        neighbour) marked, and a one-line summary."""
        header = ["batch" if self.kind == "batch" else "width", "fwd ms", "fwd samples/s",
                  "fwd GFLOP/s"]
        if self.backward:
            header += ["fwd+bwd ms", "fwd+bwd samples/s"]
        header.append("note")
        lines = []
        for r in self.rows:
            cells = [str(r.batch if self.kind == "batch" else f"{r.in_features}x{r.out_features}"),
                     f"{r.forward_ms:.4f}", f"{r.forward_samples_s:,.0f}",
                     f"{r.forward_gflops:.1f}"]
            if self.backward:
                cells += [f"{r.train_ms:.4f}", f"{r.train_samples_s:,.0f}"]
            note = []
            if self.kind == "batch":
                if r.batch == self.knee:
                    note.append("<- knee (fwd)")
                if self.backward and r.batch == self.knee_backward:
                    note.append("<- knee (fwd+bwd)")
            else:
                note.append(self._aligned_note(r))
            cells.append("; ".join(note))
            lines.append(cells)
        out = text_table(header, lines, left={len(header) - 1})
        first = self.rows[0]
        if self.kind == "batch":
            where = f"Linear({first.in_features}, {first.out_features})"
            summary = (f"{where}, {self.dtype}, threads {self.threads or 'auto'}: knee = the "
                       f"smallest batch reaching {KNEE_FRACTION:.0%} of the best throughput: "
                       f"batch {self.knee} (forward)")
            if self.backward:
                summary += f", batch {self.knee_backward} (forward+backward)"
            if len(self.rows) > 1 and self.rows[-1].batch in (self.knee, self.knee_backward):
                summary += ("\nthe knee is the largest batch swept: throughput may still be "
                            "rising; sweep further (--max-batch)")
        else:
            summary = (f"square layers at batch {first.batch}, {self.dtype}, threads "
                       f"{self.threads or 'auto'}; each width that is not a multiple of "
                       f"{ALIGNMENT} beside the nearest swept one (-> w: that layer's work, time "
                       f"and GFLOP/s over this one's; time below 1: the aligned width is faster "
                       f"per call, below the work ratio: faster per FLOP)")
            if self.threads is None:
                from ..backend.threads import SMALL_GEMM_MACS

                summary += (f"\nunder the default thread policy a GEMM of >= {SMALL_GEMM_MACS:,} "
                            "multiply-adds may get more threads than a smaller one; --threads 1 "
                            "isolates the effect of the width")
        return "\n".join(out + [summary])


def find_knee(batches: Sequence[int], throughputs: Sequence[float],
              fraction: float = KNEE_FRACTION) -> int:
    """The smallest batch whose throughput is at least ``fraction`` of the best one.

    Parameters
    ----------
    batches : sequence of int
        Batch sizes, increasing.
    throughputs : sequence of float
        Samples/s measured at each batch (same length).
    fraction : float
        In (0, 1]; 0.9 by default.

    Returns
    -------
    int
        The knee batch (the best batch itself when ``fraction == 1``).
    """
    if len(batches) != len(throughputs) or not len(batches):
        raise ValueError(f"find_knee needs as many throughputs as batches (and at least one), "
                         f"got {len(batches)} batches and {len(throughputs)} throughputs")
    if not 0 < fraction <= 1:
        raise ValueError(f"find_knee: fraction must be in (0, 1], got {fraction}")
    best = max(throughputs)
    for b, t in zip(batches, throughputs):
        if t >= fraction * best:
            return int(b)
    raise AssertionError("unreachable: the best throughput reaches any fraction <= 1")


def powers_of_two(limit: int) -> list[int]:
    """``1, 2, 4, …`` up to ``limit`` inclusive, plus ``limit`` itself when it is no power."""
    if limit < 1:
        raise ValueError(f"powers_of_two: limit must be >= 1, got {limit}")
    out = [1]
    while out[-1] * 2 <= limit:
        out.append(out[-1] * 2)
    if out[-1] != limit:
        out.append(limit)
    return out


def _check_sizes(name: str, values: Sequence[int]) -> list[int]:
    values = list(values)
    if not values or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1
                         for v in values):
        raise ValueError(f"{name} must be a non-empty list of integers >= 1, got {values!r}")
    if len(set(values)) != len(values):
        raise ValueError(f"{name} must not repeat a value, got {values!r}")
    return [int(v) for v in values]


class SweepTooLarge(ValueError):
    """The sweep asked for would need more memory than this machine has: raised before any
    array is allocated (an allocation that size fails, or with overcommit gets the process
    killed). ``needed`` and ``limit`` are in bytes."""

    def __init__(self, message: str, needed: int, limit: int):
        super().__init__(message)
        self.needed, self.limit = needed, limit


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def memory_limit() -> int | None:
    """Bytes of memory this process can have: the machine's physical memory, or the container's
    cgroup limit when that is lower; None when neither can be read."""
    limits = []
    try:
        limits.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):  # pragma: no cover - not POSIX
        pass
    for name in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(name) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():  # "max": no limit
            limits.append(int(text))
    return min(limits) if limits else None


def sweep_bytes(shapes: Sequence[tuple[int, int, int]], itemsize: int, backward: bool) -> int:
    """Bytes a sweep holds at its peak, for ``shapes`` of ``(batch, in_features, out_features)``:
    each distinct layer's weight and bias, every input (all are made up front), the float64 draw
    they are cast from, and one call's output; with ``backward`` also the weight and bias
    gradients, every output gradient and one input gradient."""
    layers = {(i, o) for _, i, o in shapes}
    elements = sum(i * o + o for i, o in layers) * (2 if backward else 1)
    elements += sum(n * i for n, i, _ in shapes)                       # the inputs
    elements += max(n * o for n, _, o in shapes)                       # one output
    if backward:
        elements += sum(n * o for n, _, o in shapes)                   # the output gradients
        elements += max(n * i for n, i, _ in shapes)                   # one input gradient
    return elements * itemsize + 8 * max(n * i for n, i, _ in shapes)  # the float64 draw


def _check_fits(what: str, shapes, dtype, backward: bool) -> None:
    """Raise :class:`SweepTooLarge` when the sweep cannot fit in this machine's memory."""
    limit = memory_limit()
    if limit is None:
        return
    needed = sweep_bytes(shapes, np.dtype(dtype).itemsize, backward)
    if needed > limit:
        raise SweepTooLarge(f"{what} needs about {_gib(needed)} of memory for its weights, "
                            f"inputs and outputs, more than the {_gib(limit)} this machine has; "
                            "choose smaller sizes", needed, limit)


def _thread_context(threads: int | None):
    if threads is None:
        return contextlib.nullcontext()
    from ..backend.threads import num_threads

    return num_threads(threads)


def _measure(layers, inputs, backward: bool, repeats: int):
    """Median seconds per forward call (and per forward+backward) of each (layer, input)."""

    def forward(layer, x):
        return lambda: layer(x)

    def step(layer, x, dy):
        def run():
            layer.zero_grad()
            _, back = layer.vjp(x, input_grad=True)
            back(dy)
        return run

    fwd = same_run_seconds([forward(m, x) for m, x in zip(layers, inputs)], repeats)
    if not backward:
        return fwd, [None] * len(fwd)
    dys = [np.ones((x.shape[0], m.out_features), m(x[:1]).dtype) for m, x in zip(layers, inputs)]
    train = same_run_seconds([step(m, x, dy) for m, x, dy in zip(layers, inputs, dys)], repeats)
    return fwd, train


def _rows(layers, inputs, fwd, train) -> list[SweepRow]:
    rows = []
    for m, x, f, t in zip(layers, inputs, fwd, train):
        n = x.shape[0]
        flops = 2.0 * n * m.in_features * m.out_features
        row = SweepRow(n, m.in_features, m.out_features, f * 1e3, n / f, flops / f / 1e9)
        if t is not None:
            row.train_ms, row.train_samples_s, row.train_gflops = t * 1e3, n / t, 3 * flops / t / 1e9
        rows.append(row)
    return rows


def batch_sweep(in_features: int, out_features: int, batches: Sequence[int] | None = None, *,
                dtype=np.float32, backward: bool = False, repeats: int = 7,
                threads: int | None = None, rng: np.random.Generator | None = None
                ) -> SweepResult:
    """Latency and throughput of ``Linear(in_features, out_features)`` at each batch size.

    Parameters
    ----------
    in_features, out_features : int
        The layer's size.
    batches : sequence of int, optional
        Batch sizes, distinct, each >= 1 (sorted here); default ``1, 2, 4, …, 256``.
    dtype : dtype
        The layer's and the input's dtype (float32 by default).
    backward : bool
        Also time forward+backward (``zero_grad``, ``vjp``, the closure), as one training step.
    repeats : int
        Samples per point; the median is reported.
    threads : int, optional
        BLAS threads during the sweep (``linearkit.backend.threads.num_threads``); None: the default
        policy.
    rng : numpy.random.Generator, optional
        For the weights and inputs (default: seeded with 0).

    Returns
    -------
    SweepResult
        ``kind="batch"``, one row per batch, ``knee`` (and ``knee_backward``) set.

    Shape
    -----
    Each input is ``(batch, in_features)``.
    """
    from ..layers.linear import Linear

    batches = sorted(_check_sizes("batches", powers_of_two(256) if batches is None else batches))
    (in_features,) = _check_sizes("in_features", [in_features])
    (out_features,) = _check_sizes("out_features", [out_features])
    _check_fits(f"Linear({in_features}, {out_features}) in {np.dtype(dtype)} at batches up to "
                f"{batches[-1]}{' with backward' if backward else ''}",
                [(n, in_features, out_features) for n in batches], dtype, backward)
    repeats = max(1, int(repeats))
    rng = np.random.default_rng(0) if rng is None else rng
    layer = Linear(in_features, out_features, dtype=dtype, rng=rng)
    xs = [rng.standard_normal((n, in_features)).astype(layer.dtype) for n in batches]
    with _thread_context(threads):
        fwd, train = _measure([layer] * len(xs), xs, backward, repeats)
    rows = _rows([layer] * len(xs), xs, fwd, train)
    result = SweepResult("batch", str(layer.dtype), backward, threads, repeats, rows)
    result.knee = find_knee(batches, [r.forward_samples_s for r in rows])
    if backward:
        result.knee_backward = find_knee(batches, [r.train_samples_s for r in rows])
    return result


def dim_sweep(dims: Sequence[int], batch: int = 64, *, dtype=np.float32, backward: bool = False,
              repeats: int = 7, threads: int | None = None,
              rng: np.random.Generator | None = None) -> SweepResult:
    """Time per call and GFLOP/s of square layers ``Linear(d, d)`` for each ``d`` in ``dims``.

    The rows keep the given order; the table puts each width that is not a multiple of
    ``ALIGNMENT`` beside its aligned neighbour (:func:`aligned_neighbour`), so
    ``dims=[250, 256, 1000, 1024]`` reads as the pairs 250 -> 256 and 1000 -> 1024. Parameters
    as :func:`batch_sweep`; ``batch`` is the one batch size (64 by default).

    Returns
    -------
    SweepResult
        ``kind="dims"``, one row per width, ``knee`` None.
    """
    from ..layers.linear import Linear

    dims = _check_sizes("dims", dims)
    (batch,) = _check_sizes("batch", [batch])
    _check_fits(f"square layers up to Linear({max(dims)}, {max(dims)}) in {np.dtype(dtype)} at "
                f"batch {batch}{' with backward' if backward else ''}",
                [(batch, d, d) for d in dims], dtype, backward)
    repeats = max(1, int(repeats))
    rng = np.random.default_rng(0) if rng is None else rng
    layers = [Linear(d, d, dtype=dtype, rng=rng) for d in dims]
    xs = [rng.standard_normal((batch, d)).astype(m.dtype) for d, m in zip(dims, layers)]
    with _thread_context(threads):
        fwd, train = _measure(layers, xs, backward, repeats)
    return SweepResult("dims", str(layers[0].dtype), backward, threads, repeats,
                       _rows(layers, xs, fwd, train))
