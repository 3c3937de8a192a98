"""Whether numba's on-disk cache already holds the kernels a run needs, told without numba.

numba keeps a compiled kernel in a cache folder (below: ``cache_dir``) and reloads it in the next
process, but the only way it offers to ask whether a kernel is there is to import numba (a slow
import) and look up the exact argument types. Instead the background compile
(``background.py``) writes a marker beside numba's files once a fresh process has run a job
(``key``, e.g. "train model=mlp precision=fp32 batch=100") loading every kernel from the cache
and compiling none. The marker is bound to a ``fingerprint``: the kernels' sources (every
``.py`` of this folder, hashed: numba also keys its cache on the source's hash), numba's
installed files and the Python version. A changed source, another numba, a missing index file
(the cache deleted or moved) or another ``NUMBA_CACHE_DIR`` makes the key cold again.

A check reads one small JSON file, hashes ~50 KB of source and stats a few files; it never
imports numba.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

__all__ = ["MARKER", "cache_dir", "fingerprint", "index_files", "record", "status"]

MARKER = "linearkit-kernels.json"
_HERE = os.path.dirname(os.path.abspath(__file__))


def cache_dir() -> str | None:
    """The folder numba caches this folder's kernels in, found as numba's locators find it
    (numba/core/caching.py, in their order): ``$NUMBA_CACHE_DIR/<folder>_<sha1 of its path>``
    when the variable is set, else the kernels' own ``__pycache__`` when it can be written,
    else the user-wide cache (``$XDG_CACHE_HOME/numba/...``, by default ``~/.cache/numba/...``).
    None when no candidate can be written (numba cannot cache there either)."""
    subpath = f"{os.path.basename(_HERE)}_{hashlib.sha1(_HERE.encode()).hexdigest()}"
    custom = os.environ.get("NUMBA_CACHE_DIR")
    if custom:
        candidates = [os.path.join(custom, subpath)]
    else:
        candidates = [os.path.join(_HERE, "__pycache__"), os.path.join(_user_cache(), subpath)]
    for path in candidates:
        if _writable(path):
            return path
    return None


def _user_cache() -> str:
    """numba's user-wide cache folder (appdirs' ``user_cache_dir("numba")``)."""
    if sys.platform == "darwin":
        return os.path.expanduser("~/Library/Caches/numba")
    if sys.platform == "win32":
        return os.path.join(os.environ.get("LOCALAPPDATA", os.path.expanduser("~")), "numba",
                            "numba", "Cache")
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                        "numba")


def _writable(path: str) -> bool:
    """Whether ``path`` is a writable folder, or could be made one (its nearest existing
    parent is writable)."""
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            return False
        path = parent
    return os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)


def fingerprint() -> dict | None:
    """What the cached kernels depend on: the hash of this folder's sources, numba's installed
    ``__init__.py`` (path, size, modification time: changed by any reinstall) and the Python
    version; None without numba."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("numba")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    stat = os.stat(spec.origin)
    sources = hashlib.sha256()
    for name in sorted(os.listdir(_HERE)):
        if name.endswith(".py"):
            with open(os.path.join(_HERE, name), "rb") as f:
                sources.update(name.encode() + b"\0" + f.read() + b"\0")
    return {"sources": sources.hexdigest(), "numba": [spec.origin, stat.st_size, stat.st_mtime_ns],
            "python": sys.version}


def index_files(where: str) -> list[str]:
    """numba's index files (``*.nbi``) in the cache folder ``where``, sorted."""
    try:
        return sorted(name for name in os.listdir(where) if name.endswith(".nbi"))
    except OSError:
        return []


def _read(where: str) -> dict:
    try:
        with open(os.path.join(where, MARKER), encoding="utf-8") as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return {}
    return marker if isinstance(marker, dict) else {}


def status(where: str, key: str, stamp: dict) -> str:
    """``"warm"``: a fresh process ran job ``key`` loading every kernel from the cache in
    ``where``, under this ``fingerprint()`` (``stamp``), and numba's index files it left are all
    still there; ``"failed"``: the background compile of ``key`` failed under this fingerprint
    (``record``'s reason says why); else ``"cold"``."""
    marker = _read(where)
    if marker.get("fingerprint") != stamp:
        return "cold"
    entry = marker.get("keys", {}).get(key)
    if not isinstance(entry, dict):
        return "cold"
    if entry.get("result") != "ok":
        return "failed"
    for name in entry.get("index_files", []):
        if not os.path.exists(os.path.join(where, name)):
            return "cold"
    return "warm"


def record(where: str, key: str, stamp: dict, result: str, index: list[str] = ()) -> None:
    """Write ``key``'s ``result`` (``"ok"`` or the reason it failed) and the index files it
    loaded into the marker in ``where``, keeping the other keys recorded under the same
    fingerprint (``stamp``); the file is replaced atomically (a reader sees the old marker or
    the new one)."""
    marker = _read(where)
    keys = marker.get("keys", {}) if marker.get("fingerprint") == stamp else {}
    if not isinstance(keys, dict):
        keys = {}
    keys[key] = {"result": result, "index_files": list(index)}
    text = json.dumps({"fingerprint": stamp, "keys": keys}, indent=1, sort_keys=True)
    path = os.path.join(where, MARKER)
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temporary, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(temporary, path)
    except OSError:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
