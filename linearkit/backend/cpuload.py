"""How busy *other* processes keep the cores this process may run on (Linux ``/proc/stat``).

Used by ``linearkit.backend.threads`` to decide whether a large GEMM may use more than one BLAS thread.
A ``LoadMeter`` compares two looks: the busy time of the allowed CPUs (``/proc/stat``: user,
nice, system, irq, softirq, steal) minus this process's own CPU time (``time.process_time``,
every thread), over the wall time between them, in cores. A look reads one file (its cost is
in docs/threads.md, "What it costs").
"""

from __future__ import annotations

import os
import time

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_ids() -> tuple:
    """The CPUs this process may run on (its affinity mask), else 0..cpu_count-1."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return tuple(range(os.cpu_count() or 1))


class LoadMeter:
    """``others()`` -> cores other processes kept busy since the previous call (None on the
    first call, or without ``/proc/stat``)."""

    def __init__(self):
        self.cpus = cpu_ids()
        self._prefixes = tuple(f"cpu{i} ".encode() for i in self.cpus)
        self._last: tuple | None = None
        self.available = os.path.exists("/proc/stat")

    def _busy_seconds(self) -> float | None:
        try:
            with open("/proc/stat", "rb") as f:
                text = f.read()
        except OSError:
            self.available = False
            return None
        busy = 0
        for line in text.split(b"\n"):
            if line.startswith(self._prefixes):
                v = line.split()
                # user nice system [idle iowait] irq softirq steal; guest is inside user
                busy += int(v[1]) + int(v[2]) + int(v[3]) + int(v[6]) + int(v[7]) + int(v[8])
        return busy / _TICK

    def others(self) -> float | None:
        now, busy, mine = time.monotonic(), self._busy_seconds(), time.process_time()
        if busy is None:
            return None
        last, self._last = self._last, (now, busy, mine)
        if last is None or now <= last[0]:
            return None
        return max(0.0, (busy - last[1]) - (mine - last[2])) / (now - last[0])
