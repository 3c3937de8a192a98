"""Verification and diagnosis: gradcheck, the ledger (params / memory / FLOPs / findings), stats.

The submodules import only NumPy and the library (matplotlib and torch load inside the functions
that need them), so they are imported eagerly: that keeps ``analysis.gradcheck`` and
``analysis.ledger`` the functions, never the submodules of the same name.
"""

from .gradcheck import GradcheckError, GradcheckResult, gradcheck
from .ledger import Ledger, ledger, preset
from .range_check import RangeReport, range_check
from .stats import StatsReport, record_stats

__all__ = [
           "GradcheckError",
           "GradcheckResult",
           "Ledger",
           "RangeReport",
           "StatsReport",
           "gradcheck",
           "ledger",
           "preset",
           "range_check",
           "record_stats",
]
