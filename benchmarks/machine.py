"""The machine line: CPU model, cores, BLAS kernel and threads (threadpoolctl), library versions.

Run inside a worker, so it describes the environment the measurements actually ran in (the parent
removes ``OPENBLAS_CORETYPE`` and ``OPENBLAS_L2_SIZE`` from its children's environment).
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata

BLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def blas() -> list[dict]:
    """The BLAS libraries NumPy loaded, as threadpoolctl sees them (kernel, threads, version)."""
    import numpy  # noqa: F401  (loads its BLAS)

    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return [{"error": "threadpoolctl is not installed (pip install 'linearkit[bench]')"}]
    return [{k: lib.get(k) for k in ("internal_api", "architecture", "num_threads", "version",
                                     "threading_layer")}
            for lib in threadpool_info()]


def info() -> dict:
    cores = os.cpu_count()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = cores
    return {
        "cpu": cpu_model(),
        "cores": cores,
        "usable_cores": usable,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "versions": {name: version(name) for name in
                     ("linearkit", "numpy", "torch", "jax", "jaxlib", "threadpoolctl")},
        "blas": blas(),
        "blas_env": {k: os.environ.get(k) for k in BLAS_ENV},
    }


def summary(inf: dict) -> str:
    """One line: ``CPU (N cores) | OpenBLAS 0.3.x SkylakeX x2 threads | numpy .. torch ..``."""
    libs = []
    for lib in inf.get("blas", []):
        if "error" in lib:
            libs.append(lib["error"])
        else:
            libs.append(f"{lib.get('internal_api')} {lib.get('version')} kernel "
                        f"{lib.get('architecture')}, {lib.get('num_threads')} threads")
    versions = ", ".join(f"{k} {v}" for k, v in inf.get("versions", {}).items() if v)
    forced = ", ".join(f"{k}={v}" for k, v in inf.get("blas_env", {}).items() if v)
    return (f"{inf.get('cpu')} ({inf.get('usable_cores')} usable cores) | "
            f"{'; '.join(libs) or 'no BLAS found'}"
            f"{' [forced: ' + forced + ']' if forced else ''} | Python {inf.get('python')}, "
            f"{versions}")
