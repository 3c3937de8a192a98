"""linearkit.backend.threads: set/get as in PyTorch, every loaded BLAS reached, the adaptive policy's
decisions (driven through fake load samples, never by timing), the no-threadpoolctl fallback."""

import json
import subprocess
import sys

import numpy as np
import pytest

import linearkit as lk
from linearkit.backend import threads as T

threadpoolctl = pytest.importorskip("threadpoolctl")

STATE = ("_user", "_current", "_allowed", "_calm", "_others", "_next_sample", "_backoffs",
         "_meter", "_blas_default")


@pytest.fixture(autouse=True)
def policy_restored():
    """Each test leaves the process on the default policy, as it found it."""
    saved = {name: getattr(T, name) for name in STATE}
    yield
    for name, value in saved.items():
        setattr(T, name, value)
    T.reset_num_threads()


def blas_counts() -> dict:
    return {lib["filepath"]: lib["num_threads"] for lib in threadpoolctl.threadpool_info()
            if lib["user_api"] == "blas"}


def small_gemm():
    lk.functional.linear(np.ones((4, 8), np.float32), np.ones((3, 8), np.float32))


def large_gemm():
    lk.functional.linear(np.ones((128, 256), np.float32), np.ones((256, 256), np.float32))


# ---------------------------------------------------------------------------- the public API
def test_set_get_round_trip_and_reset():
    assert lk.set_num_threads is T.set_num_threads and lk.get_num_threads is T.get_num_threads
    lk.set_num_threads(1)
    assert lk.get_num_threads() == 1 and T.get_policy() == "fixed"
    lk.set_num_threads(2)
    assert lk.get_num_threads() == 2
    lk.set_num_threads(np.int64(1))
    assert lk.get_num_threads() == 1 and type(lk.get_num_threads()) is int
    T.reset_num_threads()
    assert T.get_policy() == "adaptive"
    assert lk.get_num_threads() == T._blas_default >= 1


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-2, ValueError), (1.5, TypeError),
                                        ("2", TypeError), (True, TypeError), (None, TypeError)])
def test_bad_counts_are_refused_with_what_was_expected(bad, error):
    lk.set_num_threads(1)
    with pytest.raises(error, match=r"expects an int >= 1 .* got"):
        lk.set_num_threads(bad)
    assert lk.get_num_threads() == 1  # unchanged
    if bad is not None:  # num_threads(None) means the default policy
        with pytest.raises(error, match="num_threads expects"):
            with T.num_threads(bad):
                pass


def test_num_threads_context_restores_even_on_error():
    lk.set_num_threads(2)
    with pytest.raises(RuntimeError):
        with T.num_threads(1):
            assert lk.get_num_threads() == 1
            raise RuntimeError("inside")
    assert lk.get_num_threads() == 2 and T.get_policy() == "fixed"
    T.reset_num_threads()
    with T.num_threads(1):
        assert T.get_policy() == "fixed"
    assert T.get_policy() == "adaptive"


# ------------------------------------------------------------------ every BLAS is reached
def test_set_num_threads_reaches_every_loaded_blas_including_scipys():
    pytest.importorskip("scipy.linalg")  # SciPy ships its own OpenBLAS
    lk.set_num_threads(2)
    assert set(T.info()["libraries"]) == set(blas_counts())  # SciPy's found after NumPy's
    assert set(blas_counts().values()) == {2}, blas_counts()
    lk.set_num_threads(1)
    assert set(blas_counts().values()) == {1}, blas_counts()


def test_default_policy_runs_small_gemms_on_one_thread_everywhere():
    pytest.importorskip("scipy.linalg")
    lk.set_num_threads(2)
    T.reset_num_threads()
    small_gemm()
    assert set(blas_counts().values()) == {1}, blas_counts()
    assert T.switch_macs == T.SMALL_GEMM_MACS  # nothing to switch for the next small GEMM


def test_a_fresh_process_sets_every_blas_to_one_thread_on_its_first_gemm():
    pytest.importorskip("scipy.linalg")
    proc = _python(
        "import json, numpy as np, scipy.linalg, linearkit as lk\n"
        "from threadpoolctl import threadpool_info\n"
        "def counts():\n"
        "    return {p['filepath']: p['num_threads'] for p in threadpool_info()\n"
        "            if p['user_api'] == 'blas'}\n"
        "before = counts()\n"
        "lk.Linear(8, 4)(np.ones((2, 8), np.float32))\n"
        "print(json.dumps([before, counts(), lk.threads.info()['libraries']]))\n")
    assert proc.returncode == 0, proc.stderr
    before, after, found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(found) == set(before) == set(after)
    assert set(after.values()) == {1}, (before, after)


def test_a_large_gemm_uses_more_threads_only_while_allowed_and_the_next_small_one_goes_back():
    T.reset_num_threads()
    T._blas_default = 2
    T._next_sample = float("inf")  # no load sample during this test: the state decides
    T._allowed = 1
    large_gemm()
    assert set(blas_counts().values()) == {1}
    T._allowed = 2
    large_gemm()
    assert set(blas_counts().values()) == {2} and T.switch_macs == 0
    small_gemm()
    assert set(blas_counts().values()) == {1} and T.switch_macs == T.SMALL_GEMM_MACS


def test_results_agree_whatever_the_thread_count():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((128, 784)).astype(np.float32)
    w = rng.standard_normal((256, 784)).astype(np.float32)
    dy = rng.standard_normal((128, 256)).astype(np.float32)
    f = lk.functional
    out = {}
    for n in (1, 2):
        with T.num_threads(n):
            out[n] = (f.linear(x, w), f.linear_input_grad(dy, w), f.linear_weight_grad(dy, x))
    for one, two in zip(out[1], out[2]):
        # OpenBLAS may split the work differently: equal up to float32 rounding, not bitwise.
        np.testing.assert_allclose(one, two, rtol=1e-5, atol=1e-4)


# ------------------------------------------------------- the adaptive decisions, no timing
class FakeMeter:
    """Stands in for the /proc/stat sampler: returns the scripted other-process loads."""

    def __init__(self, loads, cpus=(0, 1)):
        self.loads, self.cpus, self.available = list(loads), cpus, True

    def others(self):
        return self.loads.pop(0)


def test_sampling_backs_off_at_once_and_comes_back_after_calm_samples():
    T.reset_num_threads()
    T._blas_default, T._allowed, T._calm, T._backoffs = 2, 1, 0, 0
    T._meter = FakeMeter([0.0, 0.02, 1.0, 0.0, 0.0, 0.5, 0.05])
    T._sample()
    assert T._allowed == 1  # one calm sample is not enough
    T._sample()
    assert T._allowed == 2  # two in a row
    T._sample()
    assert T._allowed == 1  # one busy core: down at once
    T._sample()
    T._sample()
    assert T._allowed == 2
    T._sample()
    assert T._allowed == 1 and T._backoffs == 2  # half a core taken by others is contention


def test_the_ceiling_is_the_blas_own_count():
    T._blas_default, T._allowed, T._calm = 1, 1, 0
    T._meter = FakeMeter([0.0, 0.0, 0.0], cpus=(0, 1, 2, 3))
    for _ in range(3):
        T._sample()
    assert T._allowed == 1
    T._blas_default = 3
    T._meter = FakeMeter([0.0, 0.0])
    T._sample()
    T._sample()
    assert T._allowed == 2  # two cores here, though the BLAS would take three


def test_info_describes_the_policy():
    small_gemm()
    report = T.info()
    assert report["policy"] == "adaptive" and report["current"] == 1
    assert report["libraries"] and report["unavailable"] is None


# ---------------------------------------------------------------- import cost, and fallback
def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)


def test_import_does_not_load_threadpoolctl_the_first_gemm_does():
    proc = _python(
        "import sys, numpy as np, linearkit as lk\n"
        "assert 'threadpoolctl' not in sys.modules, 'imported at import time'\n"
        "lk.Linear(3, 2)(np.ones((1, 3), np.float32))\n"
        "assert 'threadpoolctl' in sys.modules\n"
        "print(lk.threads.get_policy())\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "adaptive"


def test_without_threadpoolctl_blas_keeps_its_default_and_set_num_threads_says_why():
    proc = _python(
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'threadpoolctl':\n"
        "            raise ImportError('blocked for the test')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import numpy as np, linearkit as lk\n"
        "y = lk.functional.linear(np.ones((2, 3), np.float32), np.ones((4, 3), np.float32))\n"
        "assert (y == 3).all()\n"
        "print(lk.threads.get_policy(), lk.threads.switch_macs, lk.get_num_threads() >= 1)\n"
        "try:\n"
        "    lk.set_num_threads(1)\n"
        "except ImportError as err:\n"
        "    print('ImportError:', err)\n")
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.strip().splitlines()
    assert first == "blas-default inf True"
    assert second.startswith("ImportError:") and "pip install threadpoolctl" in second


def test_docs_state_the_policy_constants_the_code_uses():
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "threads.md").read_text()
    for fragment in (f"`lk.threads.SMALL_GEMM_MACS` multiply-adds ({T.SMALL_GEMM_MACS:,}",
                     f"`SAMPLE_S` ({T.SAMPLE_S:g})", f"`BUSY_CORE` ({T.BUSY_CORE:.0%})",
                     f"`UP_SAMPLES` ({T.UP_SAMPLES})"):
        assert fragment in text, fragment
