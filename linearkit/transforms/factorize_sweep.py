"""``rank_sweep``: accuracy, size and forward time of a model factorized at each rank.

Each row factorizes a copy of the model (``factorize``; the SVD of each layer is computed once
for the whole sweep), measures its accuracy and loss on ``data``, its parameters and bytes, and
its forward time on ``data``'s inputs — every model timed in turn with the original, so that the
speed-ups are same-run ratios. Optionally each factorized copy, and a copy of the original for a
fair baseline, is fine-tuned for a few Adam steps and measured again.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import numpy as np

from ..analysis.ledger.report import human_bytes
from ..analysis.timing import same_run_seconds
from ..core.module import Module
from ..losses import CrossEntropyLoss
from ..optim import Adam
from ..training.loop import evaluate, step
from .factorization import NAME, check_choice, factorize_with
from .transform_report import evaluating, hooks_off, state_size, unhooked
from .walk import copy_model, select_linears

__all__ = ["RankSweep", "default_ranks", "rank_sweep"]

#: Rows of ``data`` the factorized models are also checked on (beside random probes).
PROBE_ROWS = 256

_FINETUNE_KEYS = {"x", "y", "steps", "lr", "batch_size", "seed"}


@dataclass
class RankSweep:
    """The result of ``rank_sweep``: ``rows``, one dict per model, row 0 the original.

    Each row: ``rank`` (None for the original, and for a sweep by energy), ``energy`` (the
    target of a sweep by energy, else None), ``ranks`` (path -> rank of each factorized layer),
    ``layers`` (how many were factorized), ``energy_kept`` (the least of them; None if none),
    ``params``, ``bytes``, ``accuracy``, ``loss`` (cross-entropy on ``data``),
    ``output_error`` (the report's ``max_rel_error`` against the original on the probes),
    ``forward_ms`` (median forward time on ``data``'s inputs) and ``speedup`` (the original's
    time over this one's). With fine-tuning also ``accuracy_tuned``, ``loss_tuned`` (on
    ``data``) and ``tune_loss_before`` / ``tune_loss_after`` (on the fine-tuning set).
    """

    rows: list = field(default_factory=list)

    def _table(self) -> tuple[list, list]:
        by_energy = any(r["energy"] is not None for r in self.rows)
        tuned = any("accuracy_tuned" in r for r in self.rows)
        cols = [("energy", lambda r: "-" if r["energy"] is None else f"{r['energy']:.1%}")
                ] if by_energy else []
        cols += [
            ("rank", _rank_cell),
            ("layers", lambda r: str(r["layers"])),
            ("energy kept", lambda r: "-" if r["energy_kept"] is None
             else f"{r['energy_kept']:.1%}"),
            ("params", lambda r: f"{r['params']:,}"),
            ("size", lambda r: human_bytes(r["bytes"])),
            ("accuracy", lambda r: f"{r['accuracy']:.1%}"),
            ("loss", lambda r: f"{r['loss']:.4f}"),
            ("output error", lambda r: f"{r['output_error']:.2g}"),
            ("forward ms", lambda r: f"{r['forward_ms']:.3f}"),
            ("speed-up", lambda r: f"{r['speedup']:.2f}x"),
        ]
        if tuned:
            cols += [("tuned accuracy", lambda r: f"{r['accuracy_tuned']:.1%}"),
                     ("tuning loss", lambda r: f"{r['tune_loss_before']:.4f} -> "
                                               f"{r['tune_loss_after']:.4f}")]
        return [c for c, _ in cols], [[cell(r) for _, cell in cols] for r in self.rows]

    def __str__(self) -> str:
        """A fixed-width table, one line per row."""
        head, body = self._table()
        widths = [max(len(h), *(len(line[i]) for line in body)) for i, h in enumerate(head)]
        lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths))]
        lines += ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in body]
        return "\n".join(lines)

    def to_markdown(self) -> str:
        """The table as GitHub-flavoured Markdown (numbers right-aligned)."""
        head, body = self._table()
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" for _ in head) + "|"]
        lines += ["| " + " | ".join(line) + " |" for line in body]
        return "\n".join(lines)


def _rank_cell(row: dict) -> str:
    if row["rank"] is None and row["energy"] is None:
        return "original"
    if row["rank"] is not None:
        return str(row["rank"])
    return "/".join(str(r) for r in row["ranks"].values()) or "-"


def default_ranks(model: Module, targets=None) -> list[int]:
    """1, 2, 4, ... below the largest rank that saves in some targeted layer, then that rank:
    ``max over layers of the largest r with r·(in + out) < in·out``.

    Raises ValueError when no targeted layer is large enough to save at any rank.
    """
    chosen = select_linears(model, targets, NAME)
    useful = max(((m.in_features * m.out_features - 1) // (m.in_features + m.out_features)
                  for _, m in chosen if min(m.in_features, m.out_features) > 0), default=0)
    if useful < 1:
        sizes = ", ".join(f"'{p}' ({m.in_features}->{m.out_features})" for p, m in chosen)
        raise ValueError(f"rank_sweep(): no targeted Linear saves at any rank (r·(in + out) >= "
                         f"in·out already at r = 1): {sizes or 'there are none'}")
    ladder = [1 << k for k in range(useful.bit_length()) if (1 << k) < useful]
    return [*ladder, useful]


def _finetune_args(finetune) -> dict | None:
    if finetune is None:
        return None
    if not isinstance(finetune, dict):
        raise TypeError(f"rank_sweep(): finetune is a dict(x=..., y=..., steps=..., lr=..., "
                        f"batch_size=...), got {type(finetune).__name__}")
    unknown = set(finetune) - _FINETUNE_KEYS
    missing = {"x", "y", "steps"} - set(finetune)
    if unknown or missing:
        raise ValueError(f"rank_sweep(): finetune takes the keys {sorted(_FINETUNE_KEYS)}, "
                         f"x, y and steps required; got unknown {sorted(unknown)}, missing "
                         f"{sorted(missing)}")
    args = {"lr": 1e-3, "batch_size": 64, "seed": 0, **finetune}
    args["x"], args["y"] = np.asarray(args["x"]), np.asarray(args["y"])
    if len(args["x"]) != len(args["y"]) or len(args["x"]) == 0:
        raise ValueError(f"rank_sweep(): finetune x and y need the same, non-zero number of "
                         f"rows; got {len(args['x'])} and {len(args['y'])}")
    for key in ("steps", "batch_size"):
        value = args[key]
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"rank_sweep(): finetune {key} must be an int >= 1, got {value!r}")
    if isinstance(args["lr"], bool) or not isinstance(args["lr"], numbers.Real) \
            or not args["lr"] > 0:
        raise ValueError(f"rank_sweep(): finetune lr must be > 0, got {args['lr']!r}")
    return args


def _finetune(model: Module, tune: dict, x, y) -> dict:
    """Fine-tune ``model`` (a copy the sweep owns) in place: ``steps`` Adam steps on batches of
    the fine-tuning set (reshuffled each epoch), every trainable parameter, cross-entropy."""
    fx, fy, loss_fn = tune["x"], tune["y"], CrossEntropyLoss()
    before = evaluate(model, fx, fy, loss_fn=loss_fn)["loss"]
    optimizer = Adam([p for p in model.parameters() if p.requires_grad], lr=tune["lr"])
    rng = np.random.default_rng(tune["seed"])
    size = min(int(tune["batch_size"]), len(fx))
    order, at = rng.permutation(len(fx)), 0
    modes = [(m, m.training) for m in model.modules()]
    model.train()
    try:
        for _ in range(int(tune["steps"])):
            if at + size > len(order):
                order, at = rng.permutation(len(fx)), 0
            batch = order[at:at + size]
            at += size
            step(model, loss_fn, optimizer, fx[batch], fy[batch])
    finally:
        for m, mode in modes:
            m.training = mode
    after = evaluate(model, fx, fy, loss_fn=loss_fn)["loss"]
    tuned = evaluate(model, x, y, loss_fn=loss_fn)
    return {"accuracy_tuned": tuned["accuracy"], "loss_tuned": tuned["loss"],
            "tune_loss_before": before, "tune_loss_after": after}


def _choices(ranks, energy) -> list[tuple]:
    if ranks is not None and energy is not None:
        raise ValueError("rank_sweep(): sweep by ranks= or by energy=, not both")
    if energy is not None:
        energies = [energy] if isinstance(energy, numbers.Real) else list(energy)
        for e in energies:
            check_choice(None, e, "rank_sweep()")
        return [(None, float(e)) for e in energies]
    ranks = [ranks] if isinstance(ranks, (int, np.integer)) else list(ranks)
    for r in ranks:
        check_choice(r, None, "rank_sweep()")
    return [(int(r), None) for r in ranks]


def rank_sweep(model: Module, data, ranks=None, *, energy=None, targets=None, finetune=None,
               repeats: int = 5) -> RankSweep:
    """Factorize ``model`` at each rank and measure accuracy, size and forward time.

    Parameters
    ----------
    model : Module
        A classifier: ``model(x)`` gives scores ``(N, C)``. Never modified.
    data : tuple ``(x (N, *in), y (N,))``
        Inputs and integer class labels: accuracy is the argmax of the output against ``y``,
        loss the cross-entropy; the forward time is of the whole model on ``x``.
    ranks : int or list of int, optional
        The ranks of the rows (each >= 1; a layer where a rank would not save keeps its
        weight). Default ``default_ranks(model, targets)``: 1, 2, 4, ... up to the largest
        rank that saves in some layer.
    energy : float or list of float, optional
        Sweep by the fraction of spectral energy kept instead (each layer its own rank).
    targets : str or list of str, optional
        Which Linear layers to factorize (as in ``factorize``); default all.
    finetune : dict, optional
        ``dict(x=..., y=..., steps=..., lr=1e-3, batch_size=64, seed=0)``: fine-tune each
        factorized model, and a copy of the original as the baseline, for ``steps`` Adam steps
        (every trainable parameter, cross-entropy, ``linearkit.training.loop.step``) on ``(x, y)``, then
        measure accuracy on ``data`` again.
    repeats : int
        Timed samples per model (the median is reported), the models timed in turn.

    Returns
    -------
    RankSweep
        ``.rows`` (row 0 the original; see ``RankSweep``), printable as a table, and
        ``.to_markdown()``.
    """
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise TypeError("rank_sweep(): data is a pair (x, y) of inputs and integer labels")
    x, y = np.asarray(data[0]), np.asarray(data[1])
    if y.dtype.kind not in "iu":
        raise ValueError(f"rank_sweep(): y must hold integer class labels (the sweep measures "
                         f"classification accuracy), got dtype {y.dtype}")
    copy_model(model, "rank_sweep")  # the same TypeError as every transform for a non-Module
    choices = _choices(default_ranks(model, targets) if ranks is None and energy is None
                       else ranks, energy)
    tune = _finetune_args(finetune)
    # Every run below (accuracy, fine-tuning, timing) is the sweep's own: on a hook-free copy of
    # a model with call hooks, whose factorized copies then carry none either.
    quiet = unhooked(model)
    with hooks_off(quiet):
        return _sweep(quiet, x, y, choices, tune, targets, repeats)


def _sweep(model: Module, x, y, choices, tune, targets, repeats) -> RankSweep:
    loss_fn = CrossEntropyLoss()
    probe = x[:PROBE_ROWS]

    params, nbytes = state_size(model)
    rows = [{"rank": None, "energy": None, "ranks": {}, "layers": 0, "energy_kept": None,
             "params": params, "bytes": nbytes, **evaluate(model, x, y, loss_fn=loss_fn),
             "output_error": 0.0}]
    if tune:
        rows[0].update(_finetune(copy_model(model, "rank_sweep"), tune, x, y))
    models, svds = [model], {}
    for rank, target in choices:
        new, report, layers = factorize_with(model, rank, target, targets, probe=probe,
                                             timing=False, svds=svds)
        params, nbytes = state_size(new)
        row = {"rank": rank, "energy": target, "ranks": {e["path"]: e["rank"] for e in layers},
               "layers": len(layers),
               "energy_kept": min((e["energy_kept"] for e in layers), default=None),
               "params": params, "bytes": nbytes, **evaluate(new, x, y, loss_fn=loss_fn),
               "output_error": report.max_rel_error}
        if tune:  # in place: the architecture, hence the forward time, stays
            row.update(_finetune(new, tune, x, y))
        rows.append(row)
        models.append(new)
    with evaluating(*models):
        seconds = same_run_seconds([lambda m=m: m(x) for m in models], repeats)
    for row, t in zip(rows, seconds):
        row["forward_ms"] = t * 1e3
        row["speedup"] = seconds[0] / t
    return RankSweep(rows)
