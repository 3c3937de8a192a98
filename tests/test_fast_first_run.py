"""The first run on a cold numba cache (linearkit/backend/fast/background.py, cache_marker.py):
``linearkit train`` trains on the NumPy path while a background process compiles the kernels,
and the next process loads them from the cache; the progress bar's ETA (cli/progress.py).

The end-to-end test gives numba an empty cache folder (``NUMBA_CACHE_DIR``), so the package's
own cache stays as it is.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import linearkit as lk
from linearkit.backend import fast
from linearkit.backend.fast import background, cache_marker

numba = pytest.importorskip("numba", reason="the kernels need numba (linearkit[fast])")

STEPS = 300
KEY = "linearkit train model=mlp precision=fp32 batch=100"


def _train_cli(out, env, *extra):
    """``linearkit train`` for STEPS steps in a fresh process: its --json record."""
    run = subprocess.run(
        [sys.executable, "-m", "linearkit.cli", "train", "--steps", str(STEPS), "--eval-every",
         "0", "--json", "--out", str(out), *extra],
        env=env, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def _listing(folder):
    return sorted((entry.name, entry.stat().st_mtime_ns) for entry in os.scandir(folder))


def test_a_cold_cache_trains_on_the_numpy_path_and_the_next_run_loads_the_kernels(
        tmp_path, monkeypatch):
    """Cold: the run holds the kernels (the LINEARKIT_FAST=0 run's bits) and a background
    process fills the empty cache; warm: the next run takes the compiled path (a warm run's
    bits) and compiles nothing (numba's cache folder is left as it was)."""
    assert fast.kernels() is not None   # this process's numba keeps the package's own cache
    cache = tmp_path / "numba-cache"
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), LINEARKIT_BACKGROUND_COMPILE="1")
    env.pop("LINEARKIT_FAST", None)
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(cache))      # cache_marker looks where numba does

    from linearkit.recipes.train_mnist1d import train

    cold = _train_cli(tmp_path / "cold.safetensors", env)
    assert cold["kernels_compiling_in_background"] is True
    with monkeypatch.context() as m:                  # the NumPy path, here, meanwhile
        m.setenv("LINEARKIT_FAST", "0")
        numpy_model, _ = train(steps=STEPS, eval_every=0, flush_denormal=True)
    saved = lk.load(tmp_path / "cold.safetensors")
    for name, weight in numpy_model.state_dict().items():
        assert saved[name].tobytes() == np.asarray(weight).tobytes(), name

    where = cache_marker.cache_dir()
    assert where.startswith(str(cache))
    stamp = cache_marker.fingerprint()
    deadline = time.monotonic() + 180
    while cache_marker.status(where, KEY, stamp) == "cold" and time.monotonic() < deadline:
        if cache_marker.fingerprint() != stamp:   # the background process records nothing then
            pytest.skip("the kernel sources changed while the background compile ran")
        time.sleep(0.5)
    assert cache_marker.status(where, KEY, stamp) == "warm", _read_marker(where)
    assert not os.path.exists(os.path.join(where, background.LOCK))   # released

    before = _listing(where)
    warm = _train_cli(tmp_path / "warm.safetensors", env)
    assert warm["kernels_compiling_in_background"] is False
    assert _listing(where) == before                  # loaded, nothing compiled or saved

    model, _ = train(steps=STEPS, eval_every=0, flush_denormal=True)   # the compiled path, here
    assert fast.loaded() is not None
    saved = lk.load(tmp_path / "warm.safetensors")
    for name, weight in model.state_dict().items():
        assert saved[name].tobytes() == np.asarray(weight).tobytes(), name


def _read_marker(where):
    try:
        with open(os.path.join(where, cache_marker.MARKER)) as f:
            return f.read()
    except OSError as err:
        return f"no marker: {err}"


# ------------------------------------------------------------------------ held(), in a process
HELD = """
import sys
from linearkit.backend import fast
with fast.held():
    with fast.held():
        pass
    print(fast.kernels() is None, fast.available(), 'numba' in sys.modules)
print(fast.kernels() is not None, fast.available())
"""


def test_held_keeps_the_kernels_unloaded_and_numba_unimported_until_the_block_ends():
    run = subprocess.run([sys.executable, "-c", HELD], capture_output=True, text=True,
                         timeout=120, check=True)
    assert run.stdout.split() == ["True", "False", "False", "True", "True"]


def test_held_leaves_kernels_loaded_before_it():
    kernels = fast.kernels()
    with fast.held():
        assert fast.kernels() is kernels and fast.available()


EXIT_PATHS = """
import os, sys
from linearkit.backend.fast import background, cache_marker
def job():
    pass
where = cache_marker.cache_dir()
try:                                            # an error in the block: no compile started
    with background.compile_in_background("k", job) as compiling:
        assert compiling and cache_marker.status(where, "k", cache_marker.fingerprint()) == "cold"
        raise KeyError("stop")
except KeyError:
    pass
print(os.path.exists(os.path.join(where, background.LOCK)), len(background._children))
sys.executable = os.path.join(where, "no-such-python")   # the background process cannot start
with background.compile_in_background("k", job) as compiling:
    pass
print(compiling, cache_marker.status(where, "k", cache_marker.fingerprint()))
with background.compile_in_background("k", job) as compiling:   # that run compiles in place
    pass
print(compiling)
"""


def test_an_error_starts_no_compile_and_a_failed_start_is_not_retried(tmp_path):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), LINEARKIT_BACKGROUND_COMPILE="1")
    env.pop("LINEARKIT_FAST", None)
    run = subprocess.run([sys.executable, "-c", EXIT_PATHS], env=env, capture_output=True,
                         text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "0", "True", "failed", "False"]


# --------------------------------------------------------------------------------- the marker
def test_cache_dir_is_where_numba_caches_the_kernels(monkeypatch):
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    if numba.config.CACHE_DIR:
        pytest.skip("this process's numba was started with NUMBA_CACHE_DIR")
    step = fast.kernels().train_step
    assert os.path.samefile(cache_marker.cache_dir(), step.stats.cache_path)


def test_cache_dir_follows_numba_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    where = cache_marker.cache_dir()
    assert os.path.dirname(where) == str(tmp_path)
    assert os.path.basename(where).startswith("fast_")    # numba's <folder>_<sha1 of its path>


def _stamp():
    return {"sources": "abc", "numba": ["numba/__init__.py", 1, 2], "python": sys.version}


def test_a_key_is_warm_only_under_its_fingerprint_and_with_its_index_files(tmp_path):
    where = str(tmp_path)
    (tmp_path / "k.nbi").write_bytes(b"")
    assert cache_marker.status(where, "k", _stamp()) == "cold"          # no marker yet
    cache_marker.record(where, "k", _stamp(), "ok", ["k.nbi"])
    cache_marker.record(where, "other", _stamp(), "ok", [])
    assert cache_marker.status(where, "k", _stamp()) == "warm"
    assert cache_marker.status(where, "other", _stamp()) == "warm"     # both kept
    assert cache_marker.status(where, "third", _stamp()) == "cold"
    assert cache_marker.status(where, "k", dict(_stamp(), sources="changed")) == "cold"
    (tmp_path / "k.nbi").unlink()                                      # numba's cache deleted
    assert cache_marker.status(where, "k", _stamp()) == "cold"
    cache_marker.record(where, "k", _stamp(), "the job raised OSError: disk full")
    assert cache_marker.status(where, "k", _stamp()) == "failed"
    cache_marker.record(where, "k", dict(_stamp(), sources="new"), "ok")  # a new fingerprint
    assert cache_marker.status(where, "other", dict(_stamp(), sources="new")) == "cold"
    (tmp_path / cache_marker.MARKER).write_text("{not json")
    assert cache_marker.status(where, "k", _stamp()) == "cold"


def test_the_fingerprint_changes_with_the_kernel_sources(tmp_path, monkeypatch):
    stamp = cache_marker.fingerprint()
    assert stamp == cache_marker.fingerprint() and stamp["python"] == sys.version
    monkeypatch.setattr(cache_marker, "_HERE", str(tmp_path))
    (tmp_path / "a_kernel.py").write_text("x = 1\n")
    first = cache_marker.fingerprint()["sources"]
    (tmp_path / "a_kernel.py").write_text("x = 2\n")
    assert cache_marker.fingerprint()["sources"] != first


# ----------------------------------------------------------------------- when nothing happens
def _job():
    raise AssertionError("the job runs in the background process only")


@pytest.mark.parametrize("env", [{"LINEARKIT_BACKGROUND_COMPILE": "0"}, {"LINEARKIT_FAST": "0"}])
def test_switched_off_nothing_is_held_or_started(tmp_path, monkeypatch, env):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("LINEARKIT_BACKGROUND_COMPILE", "1")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with background.compile_in_background("k", _job) as compiling:
        assert compiling is False
    assert not any(tmp_path.rglob("*"))                # no lock, no marker, no folder


def test_a_live_background_compile_is_not_started_twice(tmp_path):
    where = str(tmp_path)
    lock = background._take_lock(where)
    assert lock is not None and background._take_lock(where) is None  # this process is alive
    started = list(background._children)
    assert background._start(where, b"a job") is True                 # nothing started
    assert background._children == started
    background._release(lock, None)
    assert not os.path.exists(lock)


def test_a_stale_lock_is_replaced(tmp_path):
    path = tmp_path / background.LOCK
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    path.write_text(f"{gone} {time.time()}")          # its process has ended
    assert background._take_lock(str(tmp_path)) == str(path)
    path.write_text(f"{os.getpid()} {time.time() - background.STALE_SECONDS - 1}")  # too old
    assert background._take_lock(str(tmp_path)) == str(path)


# --------------------------------------------------------------------------- the progress bar
def _etas(text):
    """The ETAs (seconds) of every bar tqdm printed into ``text`` ('?' left out)."""
    import re

    etas = []
    for remaining in re.findall(r"<([0-9:]+|\?)", text):
        if remaining != "?":
            parts = [int(p) for p in remaining.split(":")]
            etas.append(sum(p * 60 ** i for i, p in enumerate(reversed(parts))))
    return etas


def test_slow_first_steps_do_not_make_the_eta_hours():
    """The first step takes 0.6 s (an import, a compile), the second 0.4 s (another compile),
    the next ones ~2 ms: every ETA the bar shows comes from the ~2 ms steps (without the
    restarts, the bar printed after the first step showed 0.6 s for each of the 999 steps left:
    10 minutes)."""
    pytest.importorskip("tqdm")
    from linearkit.cli.progress import step_bar

    total, shown = 1000, io.StringIO()
    bar, progress = step_bar(total, file=shown)
    started = bar.start_t
    time.sleep(0.6)
    progress(1, 2.3, None)
    time.sleep(0.4)
    progress(2, 2.3, None)
    for step in range(3, 300):
        time.sleep(0.002)
        progress(step, 2.3, None)
    elapsed = bar.format_dict["elapsed"]
    bar.close()
    etas = _etas(shown.getvalue())
    assert etas and max(etas) < 30, shown.getvalue()   # ~700 steps of 2-4 ms left at most
    assert elapsed >= 1.0 and bar.start_t == started        # the elapsed time still counts them
