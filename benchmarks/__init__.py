"""linearkit's benchmark suite: ``python -m benchmarks --help``.

Every framework runs in its own child process (``python -m benchmarks.worker FRAMEWORK GROUP``),
which prints one JSON object on stdout; the parent (``benchmarks.run``) collects them, prints the
tables and the performance targets (MET/MISSED), and with ``--write-docs`` regenerates
``docs/performance.md`` and ``docs/sweep.md``.

Modules: ``cases`` (shapes, sizes, repeats, target limits), ``timing`` (medians after warm-up),
``impl_*`` (one per framework: the same cases written for each), ``e2e`` (the recipe end to end
in fresh processes, and its PyTorch/JAX scripts), ``sweep`` / ``sweep_report`` (batch and width
sweeps; docs/sweep.md), ``footprint``/``memcheck``/``profiling`` (the linearkit-only checks),
``report`` (tables and targets), ``run`` (the parent).
"""
