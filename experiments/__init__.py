"""Reproducible experiments behind the docs: ``python -m experiments NAME [options]``.

Repository tooling, not part of the installed package (as ``benchmarks/``): each experiment
trains and times models, then writes a docs page whose numbers are its measurements. Run from
a source checkout. Each is a module with ``run(...)`` and ``main(argv)``. Available:

- ``init-depth`` (:mod:`experiments.init_depth`): a deep ReLU MLP (width 256, depth 8 and 16)
  trained with constant-small, Xavier, Kaiming and PyTorch's default init on MNIST-1D and on a
  synthetic 128-dimensional task; writes ``init_experiment.md`` and its plots to
  ``runs/init-depth/`` (``--out-dir DIR``; ``--write-docs`` regenerates the repository's docs/).
- ``surgery`` (:mod:`experiments.surgery`): every ``linearkit.transforms`` transform on MLPs
  trained on MNIST-1D and scikit-learn's digits, measured beside popular claims; writes
  ``surgery.md`` to ``runs/surgery/`` (``--write-docs``: the repository's docs/).
- ``precision`` (:mod:`experiments.precision_exp`): popular half-precision claims measured —
  fp16 gradient underflow against loss scaling, float16 accumulation, 16-bit activation/gradient
  memory, accumulation that forgets to divide by k, checkpointing, the float16 init pitfall;
  writes ``precision.md`` to ``runs/precision/`` (``--write-docs``: docs/).

The measurements they share live beside them: ``checkpoint_measure`` (checkpointing's memory and
time), ``sparse_timing`` (CSR against dense), ``factorize_claims`` (a rank-64 factorization of a
100 MB layer), ``qkv_timing`` (one fused QKV GEMM against three); so does ``provenance``, the
header line every generated page starts with (``benchmarks`` and ``docs/gen_ledger.py`` use it
too). Experiment modules import
matplotlib only when they draw, and are imported only when run.
"""

from __future__ import annotations

import importlib

__all__ = ["ABOUT", "EXPERIMENTS", "get", "main"]

#: Command-line name -> module under ``experiments``.
EXPERIMENTS = {"init-depth": "init_depth", "surgery": "surgery", "precision": "precision_exp"}

#: Command-line name -> what it measures and which docs page it writes (``--help``).
ABOUT = {
    "init-depth": "does init decide whether a deep MLP trains? (docs/init_experiment.md)",
    "surgery": "every transform on trained MLPs, beside popular claims (docs/surgery.md)",
    "precision": "16-bit storage, loss scaling, accumulation, checkpointing (docs/precision.md)",
}

PROG = "python -m experiments"


def get(name: str):
    """The experiment module registered under ``name`` (e.g. ``"init-depth"``)."""
    try:
        module = EXPERIMENTS[name]
    except KeyError:
        raise ValueError(f"unknown experiment {name!r}; available: "
                         f"{', '.join(sorted(EXPERIMENTS))}") from None
    return importlib.import_module(f".{module}", __name__)


def _help() -> str:
    lines = [f"usage: {PROG} {{{','.join(sorted(EXPERIMENTS))}}} [options]", "",
             "Reproduce an experiment and write its docs page; "
             f"`{PROG} NAME --help` for its options.", "", "experiments:"]
    width = max(map(len, EXPERIMENTS))
    lines += [f"  {name:<{width}}  {ABOUT[name]}" for name in sorted(EXPERIMENTS)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``NAME [options]``: run one experiment's ``main`` with the remaining arguments.

    No arguments: the usage line on stderr, status 2; ``-h``/``--help``: the list on stdout,
    status 0; an unknown name: one line on stderr, status 2.
    """
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(_help().splitlines()[0], file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help"):
        print(_help())
        return 0
    if argv[0] not in EXPERIMENTS:
        print(f"{PROG}: error: unknown experiment {argv[0]!r}; available: "
              f"{', '.join(sorted(EXPERIMENTS))}", file=sys.stderr)
        return 2
    return get(argv[0]).main(argv[1:]) or 0
