"""Reproducible experiments behind the docs: each is a module with ``run(...)`` and ``main(argv)``.

``linearkit experiment NAME [options]`` dispatches here. Available:

- ``init-depth`` (:mod:`linearkit.experiments.init_depth`): a deep ReLU MLP (width 256, depth
  8 and 16) trained with constant-small, Xavier, Kaiming and PyTorch's default init on MNIST-1D
  and on a synthetic 128-dimensional task; writes ``init_experiment.md`` and its plots to
  ``runs/init-depth/`` (``--out-dir DIR``; ``--write-docs`` regenerates the repository's docs/).
- ``surgery`` (:mod:`linearkit.experiments.surgery`): every ``linearkit.transforms`` transform on
  MLPs trained on MNIST-1D and scikit-learn's digits, measured beside the articles' claims;
  writes ``surgery.md`` to ``runs/surgery/`` (``--write-docs``: the repository's docs/).
- ``precision`` (:mod:`linearkit.experiments.precision_exp`): the articles' half-precision claims
  measured — fp16 gradient underflow against loss scaling, float16 accumulation, 16-bit
  activation/gradient memory, accumulation that forgets to divide by k, checkpointing, the
  float16 init pitfall; writes ``precision.md`` to ``runs/precision/`` (``--write-docs``: docs/).

Experiment modules import matplotlib only when they draw, and are imported only when run.
"""

from __future__ import annotations

import importlib

__all__ = ["EXPERIMENTS", "get", "main"]

#: CLI name -> module under ``linearkit.experiments``.
EXPERIMENTS = {"init-depth": "init_depth", "surgery": "surgery", "precision": "precision_exp"}


def get(name: str):
    """The experiment module registered under ``name`` (e.g. ``"init-depth"``)."""
    try:
        module = EXPERIMENTS[name]
    except KeyError:
        raise ValueError(f"unknown experiment {name!r}; available: "
                         f"{', '.join(sorted(EXPERIMENTS))}") from None
    return importlib.import_module(f".{module}", __name__)


def main(argv: list[str] | None = None) -> int:
    """``NAME [options]``: run one experiment's ``main`` with the remaining arguments."""
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    usage = "usage: linearkit experiment {" + ",".join(sorted(EXPERIMENTS)) + "} [options]"
    if not argv or argv[0] in ("-h", "--help"):
        print(usage, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] not in EXPERIMENTS:
        print(f"linearkit experiment: error: unknown experiment {argv[0]!r}; available: "
              f"{', '.join(sorted(EXPERIMENTS))}", file=sys.stderr)
        return 2
    return get(argv[0]).main(argv[1:])
