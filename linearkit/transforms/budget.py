"""Compress to a budget: search the lossy transforms and keep the smallest model that still works.

``compress(model, data=(x, y), max_drop=1.0)`` (and ``linearkit compress ... --max-drop 1.0
--data ...``) tries factorizing (energies 0.99 .. 0.5, or the ranks given), pruning (0.3 .. 0.9)
and int8 on and off, measures every candidate on the held-out ``(x, y)`` and keeps the SMALLEST
(state-dict bytes) whose score stays within ``max_drop`` of the original's:

* classification (``y`` integer labels, shape ``(N,)``): accuracy in percent; a candidate may
  lose at most ``max_drop`` percentage points;
* regression (``y`` float targets, shape ``(N, *out)``): the mean squared error; a candidate's
  MSE may rise by at most ``max_drop`` percent of the original's.

Without data the lossy transforms are checked only on probe inputs, and a step whose
``report.max_rel_error`` exceeds :data:`MAX_REL_ERROR` is refused (:class:`CostlyTransformError`)
unless forced: a probe error of 65% is rarely a model anyone wants, and nothing else would say so.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import numpy as np

from ..core.module import Module

__all__ = ["DEFAULT_ENERGIES", "DEFAULT_PRUNES", "MAX_REL_ERROR", "BudgetReport", "Candidate",
           "CostlyTransformError", "grid", "plot_tradeoff", "search"]

#: Without data, a lossy step whose max relative error on the probes exceeds this is refused.
MAX_REL_ERROR = 0.1
#: The spectral energies a budget search factorizes at when no rank or energy is given.
DEFAULT_ENERGIES = (0.99, 0.95, 0.9, 0.8, 0.7, 0.5)
#: The pruning amounts a budget search tries when none is given.
DEFAULT_PRUNES = (0.3, 0.5, 0.7, 0.9)
#: Seconds after which the search stops trying new candidates (it says so in the table).
DEFAULT_TIME_LIMIT = 15.0


class CostlyTransformError(ValueError):
    """A lossy step changed the outputs by more than :data:`MAX_REL_ERROR` and no data was given
    to measure what that costs. ``option``: the Python keyword (``'rank=8'``); ``flag``: the CLI
    flag (``'--rank 8'``); ``max_rel_error``: the step's measured error; ``probes``: what it was
    measured on."""

    def __init__(self, option: str, flag: str, max_rel_error: float, probes: str):
        self.option, self.flag, self.max_rel_error, self.probes = option, flag, max_rel_error, probes
        super().__init__(
            f"{option} changes the outputs by {max_rel_error:.0%} (max relative error "
            f"{max_rel_error:.3g} on {probes}; the limit without data is {MAX_REL_ERROR:g}); "
            f"pass data=(x, y) to measure accuracy (with max_drop= to search for the smallest "
            f"model that keeps it), or force=True to accept it anyway")

    def cli_message(self) -> str:
        """The one line ``linearkit compress`` prints (exit status 2)."""
        return (f"{self.flag} changes the outputs by {self.max_rel_error:.0%} (max relative "
                f"error {self.max_rel_error:.3g} on {self.probes}); give --data to measure "
                f"accuracy, or --force to write it anyway")


@dataclass
class Candidate:
    """One point of the trade-off: the options tried and what they measured.

    ``options``: the keywords given to ``pipeline.compress`` (``{'energy': 0.9, 'int8': True}``);
    ``score``: accuracy in percent (classification) or MSE (regression); ``drop``: accuracy
    points lost, or percent of MSE gained (negative: better than the original);
    ``seconds_1`` / ``seconds_100``: median seconds of one forward call at batch 1 and 100.
    """

    options: dict
    params: int
    bytes: int
    score: float
    drop: float
    seconds_1: float
    seconds_100: float
    within: bool
    model: Module | None = field(default=None, repr=False)
    reports: list = field(default_factory=list, repr=False)

    @property
    def label(self) -> str:
        """The CLI flags that make this candidate ('original' for none)."""
        return describe(self.options, cli=True)


class BudgetReport(list):
    """The chosen candidate's transform reports (a list, as ``compress`` always returns), plus
    the whole search: ``candidates`` (the original first), ``chosen``, ``task`` ('accuracy' or
    'loss'), ``max_drop``, ``stopped_early`` (the time limit cut the search), and ``table()``."""

    def __init__(self, chosen: Candidate, candidates: list, task: str, max_drop: float | None,
                 stopped_early: bool = False, seconds: float = 0.0):
        super().__init__(chosen.reports)
        self.chosen, self.candidates, self.task = chosen, candidates, task
        self.max_drop, self.stopped_early, self.seconds = max_drop, stopped_early, seconds

    @property
    def original(self) -> Candidate:
        return self.candidates[0]

    def table(self) -> str:
        """The explored trade-off, smallest first, the original on top; ``*`` marks the choice."""
        from ..analysis.ledger.report import human_bytes

        score = "accuracy" if self.task == "accuracy" else "MSE"
        drop = "drop (pts)" if self.task == "accuracy" else "rise (%)"
        rows = [("", "choice", "params", "bytes", score, drop, "batch 1", "batch 100", "")]
        others = sorted(self.candidates[1:], key=lambda c: (c.bytes, -_goodness(c, self.task)))
        for c in [self.original] + others:
            shown = f"{c.score:.1f}%" if self.task == "accuracy" else f"{c.score:.4g}"
            verdict = ("" if self.max_drop is None or c is self.original
                       else "ok" if c.within else "over budget")
            rows.append(("*" if c is self.chosen else "", c.label, f"{c.params:,}",
                         human_bytes(c.bytes), shown, f"{c.drop:+.1f}",
                         _human_seconds(c.seconds_1), _human_seconds(c.seconds_100), verdict))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(cell.ljust(w) if i < 2 or i == 8 else cell.rjust(w)
                           for i, (cell, w) in enumerate(zip(r, widths))).rstrip()
                 for r in rows]
        if self.stopped_early:
            lines.append(f"(the search stopped after {self.seconds:.1f} s, its time limit; "
                         f"{len(self.candidates) - 1} candidates tried)")
        return "\n".join(lines)

    def choice(self) -> str:
        """One line: what was kept and why."""
        c, o = self.chosen, self.original
        unit = (("point" if self.max_drop == 1 else "points") if self.task == "accuracy"
                else "% of the MSE")
        if self.max_drop is None:
            return f"measured: {c.label} ({_score(c, self.task)}, original {_score(o, self.task)})"
        if c is o:
            return (f"chose the original: no candidate stayed within {self.max_drop:g} {unit} "
                    f"of its {_score(o, self.task)} (fold/merge, if asked, still applied)")
        return (f"chose {c.label}: {c.bytes:,} bytes ({c.bytes / max(o.bytes, 1):.0%} of "
                f"{o.bytes:,}), {_score(c, self.task)} vs {_score(o, self.task)}, within "
                f"{self.max_drop:g} {unit}")


def describe(options: dict, cli: bool = False) -> str:
    """``{'rank': 8, 'int8': True}`` as ``'rank=8, int8=True'`` or (``cli``) ``'--rank 8 --int8'``."""
    parts = []
    for key in ("rank", "energy", "prune", "int8"):
        value = options.get(key)
        if value is None or value is False:
            continue
        if cli:
            parts.append(f"--{key}" if value is True else f"--{key} {value:g}")
        else:
            parts.append(f"{key}={value!r}")
    return (" " if cli else ", ").join(parts) or "original"


def _goodness(c: Candidate, task: str) -> float:
    return c.score if task == "accuracy" else -c.score


def _score(c: Candidate, task: str) -> str:
    return f"{c.score:.1f}% accuracy" if task == "accuracy" else f"MSE {c.score:.4g}"


def _human_seconds(s: float) -> str:
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def _check_data(model: Module, data) -> tuple[np.ndarray, np.ndarray, str]:
    """``data`` as ``(x (N, *in), y (N,) int or (N, *out) float, task)``; ValueError naming the
    fix for anything else."""
    if not (isinstance(data, (tuple, list)) and len(data) == 2):
        raise ValueError(f"data: expected a pair (x, y) of held-out arrays, x (N, *in) and y "
                         f"(N,) integer labels or (N, *out) float targets; got "
                         f"{type(data).__name__}; pass data=(x_test, y_test)")
    x, y = (np.asarray(a) for a in data)
    if x.ndim < 1 or y.ndim < 1 or len(x) != len(y) or len(x) == 0:
        raise ValueError(f"data: expected x (N, *in) and y (N, ...) with the same N >= 1; got "
                         f"x {x.shape} and y {y.shape}; pass rows and their labels together")
    if not np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float32)
    if np.issubdtype(y.dtype, np.integer):
        if y.ndim != 1:
            raise ValueError(f"data: integer labels must be y (N,); got y {y.shape}; pass class "
                             f"indices, or float targets for a regression")
        return x, y, "accuracy"
    if not np.issubdtype(y.dtype, np.floating):
        raise ValueError(f"data: y must hold integer labels (classification) or floats "
                         f"(regression); got dtype {y.dtype}; convert it with y.astype(...)")
    return x, y, "loss"


def _measure(model: Module, x: np.ndarray, y: np.ndarray, task: str) -> float:
    """Accuracy in percent (classification) or MSE (regression) of ``model`` on ``(x, y)``."""
    from ..losses import MSELoss
    from ..training.loop import evaluate

    if task == "accuracy":
        return 100.0 * evaluate(model, x, y)["accuracy"]
    return float(evaluate(model, x, y.astype(np.float32, copy=False), loss_fn=MSELoss())["loss"])


def _latency(model: Module, x: np.ndarray) -> tuple[float, float]:
    """Median seconds of one forward call at batch 1 and batch 100 (rows of ``x`` repeated when
    it has fewer), both timed round-robin so a change of load hits the two alike."""
    from ..analysis.timing import same_run_seconds
    from .transform_report import evaluating

    one = x[:1]
    hundred = x[np.arange(100) % len(x)]
    with evaluating(model):
        s1, s100 = same_run_seconds([lambda: model(one), lambda: model(hundred)], repeats=5,
                                    min_seconds=0.001)
    return s1, s100


def _choices(values, default) -> list:
    """A search axis: None (not searched: only 'off'), a value, or a sequence of values; the
    default grid where ``values`` is True."""
    if values is None:
        return [None]
    if values is True:
        values = default
    if isinstance(values, (int, float)):
        values = [values]
    return [None] + [v for v in values if v is not None]


def grid(*, rank=None, energy=None, prune=None, int8=None) -> list[dict]:
    """The candidates' options. Each of ``rank``/``energy``/``prune``: None (not tried), a value
    or a sequence of values; ``int8``: False (off), True (tried on and off). With none of the
    four given, the default grid: energies :data:`DEFAULT_ENERGIES`, prunes
    :data:`DEFAULT_PRUNES`, int8 on and off. Pruning and int8 never combine (they do not)."""
    if rank is None and energy is None and prune is None and not int8:
        energy, prune, int8 = True, True, True
    factor = ([("rank", r) for r in _choices(rank, ()) if r is not None]
              + [("energy", e) for e in _choices(energy, DEFAULT_ENERGIES) if e is not None])
    out = []
    for f, p, q in itertools.product([None] + factor, _choices(prune, DEFAULT_PRUNES),
                                     [False, True] if int8 else [False]):
        if p is not None and q:
            continue
        options = {} if f is None else {f[0]: f[1]}
        if p is not None:
            options["prune"] = p
        if q:
            options["int8"] = True
        out.append(options)
    return out


def search(model: Module, data, *, apply, max_drop: float | None, merge: bool = False,
           fold: bool = False, rank=None, energy=None, prune=None, int8=None, probe=None,
           time_limit: float = DEFAULT_TIME_LIMIT) -> tuple[Module, BudgetReport]:
    """Measure the candidates of :func:`grid` on ``data = (x, y)`` and keep the smallest within
    ``max_drop``; ``max_drop=None`` measures the one configuration asked for (no search) and
    keeps it. ``merge``/``fold`` (exact) are applied first to every candidate. ``apply``:
    ``pipeline.compress`` (passed in by it, so this module does not import the pipeline back).

    Returns ``(new_model, BudgetReport)``; ``model`` itself is never modified. The original
    (after fold/merge) is a candidate, so the result is never worse than ``max_drop``.
    """
    from .transform_report import state_size

    compress = apply
    x, y, task = _check_data(model, data)
    if max_drop is not None and not (np.isfinite(max_drop) and max_drop >= 0):
        raise ValueError(f"max_drop: expected a finite number >= 0 (accuracy points, or percent "
                         f"of the MSE); got {max_drop!r}; pass e.g. max_drop=1.0")
    start = time.perf_counter()
    base, base_reports = model, []
    if merge or fold:
        base, base_reports = compress(model, merge=merge, fold=fold, probe=probe, force=True)
    if max_drop is None:  # measure what was asked, as asked
        options = {k: v for k, v in (("rank", rank), ("energy", energy), ("prune", prune),
                                     ("int8", bool(int8))) if v not in (None, False)}
        tried = [options] if options else []
        if not tried and not (merge or fold):
            raise ValueError("nothing to do: with data but no max_drop, ask for at least one of "
                             "merge, fold, rank/energy, int8, prune (or give max_drop= to "
                             "search)")
    else:
        tried = [o for o in grid(rank=rank, energy=energy, prune=prune, int8=int8) if o]
    original_score = _measure(model, x, y, task)

    def candidate(new: Module, options: dict, reports: list) -> Candidate:
        score = _measure(new, x, y, task)
        if task == "accuracy":
            drop = original_score - score
        else:  # percent of the original MSE gained (an exact fit can only stay exact)
            drop = (100.0 * (score - original_score) / original_score if original_score > 0
                    else (0.0 if score <= 0 else float("inf")))
        params, nbytes = state_size(new)
        s1, s100 = _latency(new, x)
        within = max_drop is None or drop <= max_drop + 1e-9
        return Candidate(options, params, nbytes, score, drop, s1, s100, within, new, reports)

    original = candidate(base, {}, list(base_reports))
    original.drop = 0.0  # fold/merge are exact: their rounding is not a cost to the budget
    candidates, stopped = [original], False
    for options in tried:
        if time.perf_counter() - start > time_limit:
            stopped = True
            break
        new, reports = compress(base, probe=probe, force=True, **options)
        candidates.append(candidate(new, options, list(base_reports) + list(reports)))
    if max_drop is None:
        chosen = candidates[-1]
    else:
        fits = [c for c in candidates if c.within]
        chosen = min(fits, key=lambda c: (c.bytes, -_goodness(c, task)))
    report = BudgetReport(chosen, candidates, task, max_drop, stopped,
                          time.perf_counter() - start)
    return chosen.model, report


def plot_tradeoff(report: BudgetReport, path, title: str | None = None) -> None:
    """Write the explored trade-off (bytes against accuracy or MSE) as an image at ``path``;
    the original, the choice and the budget line are marked. Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    def kind(c: Candidate) -> str:  # the last step applied names the marker
        return "int8" if "int8" in c.options else "prune" if "prune" in c.options else "factor"

    for name, marker, label in (("factor", "o", "factorize"),
                                ("prune", "s", "prune (+/- factorize)"),
                                ("int8", "^", "int8 (+/- factorize)")):
        pts = [c for c in report.candidates[1:] if kind(c) == name]
        if pts:
            ax.scatter([c.bytes / 1024 for c in pts], [c.score for c in pts], marker=marker,
                       label=label, alpha=0.7)
    o, c = report.original, report.chosen
    ax.scatter([o.bytes / 1024], [o.score], marker="*", s=200, color="k", label="original")
    ax.scatter([c.bytes / 1024], [c.score], s=180, facecolors="none", edgecolors="r",
               linewidths=2, label=f"chosen: {c.label}")
    if report.max_drop is not None:
        line = (o.score - report.max_drop if report.task == "accuracy"
                else o.score * (1 + report.max_drop / 100))
        ax.axhline(line, color="r", linestyle="--", linewidth=1,
                   label=f"budget (max drop {report.max_drop:g})")
    ax.set_xlabel("state-dict size (KiB)")
    ax.set_ylabel("test accuracy (%)" if report.task == "accuracy" else "test MSE")
    ax.set_title(title or "compress: size against held-out score")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
