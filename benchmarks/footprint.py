"""``import linearkit`` in a fresh interpreter: wall time, peak RSS, what else got imported.

Each measurement is its own ``python -c`` process. Bytecode is cached (in a temporary
``PYTHONPYCACHEPREFIX``, so nothing is written into the source tree) by one untimed run first, as
an installed package has it; the cold figure (no cache) is reported beside it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

# Optional dependencies that must not load on a bare `import linearkit`.
HEAVY = ("torch", "scipy", "matplotlib", "safetensors", "tqdm", "onnx", "onnxruntime",
         "ml_dtypes", "jax", "threadpoolctl", "pandas", "numba", "mpi4py")

_CODE = """
import time
t = time.perf_counter()
import {module}
t = time.perf_counter() - t
import json, sys
# VmHWM, not ru_maxrss: after fork+exec, ru_maxrss also counts the parent's RSS at the fork.
hwm = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
print(json.dumps({{"s": t, "maxrss_kib": hwm,
                  "heavy": sorted(m for m in {heavy!r} if m in sys.modules),
                  "modules": len(sys.modules)}}))
"""


def _env(cache: str | None) -> dict:
    """With ``cache``: bytecode read from and written to that folder. Without: nothing written,
    so linearkit's sources are compiled on every import unless its tree already has bytecode
    (installed packages such as NumPy keep theirs)."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("PYTHONPYCACHEPREFIX", None)
    if cache is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env["PYTHONPYCACHEPREFIX"] = cache
    return env


def _once(module: str, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", _CODE.format(module=module, heavy=HEAVY)],
                         env=env, capture_output=True, text=True, check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _series(module: str, env: dict, repeats: int) -> dict:
    runs = [_once(module, env) for _ in range(repeats)]
    return {"median_s": statistics.median(r["s"] for r in runs),
            "min_s": min(r["s"] for r in runs),
            "peak_rss_mib": statistics.median(r["maxrss_kib"] for r in runs) / 1024,  # VmHWM
            "heavy": runs[-1]["heavy"], "modules": runs[-1]["modules"]}


def _import_profile(env: dict, top: int = 8) -> list[dict]:
    """The costliest imports (cumulative µs) under ``linearkit`` from ``python -X importtime``."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import linearkit"],
                         env=env, capture_output=True, text=True, check=True, timeout=120)
    rows = []
    for line in out.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        parts = [p.strip() for p in line[len("import time:"):].split("|")]
        if not parts[0].isdigit():
            continue
        rows.append({"self_us": int(parts[0]), "cumulative_us": int(parts[1]),
                     "module": parts[2]})
    rows.sort(key=lambda r: -r["cumulative_us"])
    return rows[:top]


def measure_imports(repeats: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="lk-pycache-") as cache:
        warm = _env(cache)
        _once("linearkit", warm)  # compiles and caches the bytecode, untimed
        result = {
            "python": _series("sys", warm, repeats),
            "numpy": _series("numpy", warm, repeats),
            "linearkit": _series("linearkit", warm, repeats),
            "linearkit_cold": _series("linearkit", _env(None), max(1, repeats // 2)),
            "importtime_top": _import_profile(warm),
        }
    return result
