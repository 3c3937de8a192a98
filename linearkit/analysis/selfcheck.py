"""``linearkit gradcheck``: the installed library checks its own gradients.

Every entry of the conformance case table (``analysis.cases``: each shipped layer, container
and loss) is built in float64 and its analytic backward compared with central differences.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .cases import LOSS_CASES, MODULE_CASES, build
from .gradcheck import gradcheck

__all__ = ["self_check"]


def self_check(report: Callable[[str], None] = print) -> tuple[int, int]:
    """Gradcheck every module and loss case; ``report`` gets one line per case and a summary.

    Returns ``(passed, failed)``.

    Examples
    --------
    >>> lines = []
    >>> passed, failed = self_check(lines.append)
    >>> failed, lines[-1] == f"{passed} passed, 0 failed"
    (0, True)
    """
    checks: list[tuple[str, Callable[[], object]]] = []
    for case in MODULE_CASES:
        checks.append((case.id, lambda case=case: gradcheck(*build(case, np.float64))))
    for case in LOSS_CASES:
        def check(case=case):
            rng = np.random.default_rng(0)
            pred = case.pred(rng) if case.pred is not None else rng.standard_normal(case.shape)
            target = case.target(rng)
            loss = case.make()
            return gradcheck(lambda p: loss.vjp(p, target), pred)
        checks.append((case.id, check))
    failed = 0
    for name, run in checks:
        result = run()
        failed += not result.ok
        report(f"{'ok  ' if result.ok else 'FAIL'} {name:<28} max abs error "
               f"{result.max_abs_error:.2e}  max rel error {result.max_rel_error:.2e}")
    report(f"{len(checks) - failed} passed, {failed} failed")
    return len(checks) - failed, failed
