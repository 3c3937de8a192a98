"""The top-level namespace: lazy subpackages, and no error for a name that does not exist."""

import subprocess
import sys

import linearkit as lk


def test_hasattr_for_a_name_that_does_not_exist_is_false():
    assert hasattr(lk, "no_such_namespace") is False  # not a ModuleNotFoundError from __getattr__
    assert hasattr(lk, "hooks") and hasattr(lk, "analysis") and hasattr(lk, "transforms")


def test_import_pulls_no_optional_dependency():
    code = ("import sys, linearkit; heavy = {'torch', 'scipy', 'threadpoolctl', 'safetensors', "
            "'tqdm', 'matplotlib', 'mpi4py'}; print(sorted(heavy & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_wheel_holds_the_library_and_no_experiment_tooling(tmp_path):
    """A wheel built from the checkout ships ``linearkit`` only: no ``experiments`` or
    ``benchmarks`` module, none of the measurement helpers that write docs pages or time claims,
    and ``transforms/qkv.py`` without ``time_qkv``. Built from a copy of the sources (so the
    in-tree build leaves no build/ or egg-info in the checkout), offline (``--no-index``)."""
    import shutil
    import zipfile
    from pathlib import Path

    import pytest

    try:
        import setuptools  # noqa: F401  (the build backend, used as installed)
    except ImportError:
        pytest.skip("setuptools is not installed: no wheel can be built without the network")
    root = Path(__file__).resolve().parents[1]
    src = tmp_path / "linearkit-src"
    src.mkdir()
    junk = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(root / name, src / name)
    for name in ("linearkit", "experiments", "benchmarks"):  # the tooling sits beside it
        shutil.copytree(root / name, src / name, ignore=junk)
    out = tmp_path / "wheel"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "-q", "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = out.glob("linearkit-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        qkv = z.read("linearkit/transforms/qkv.py").decode("utf-8")
    assert {n.split("/")[0] for n in names} == {"linearkit", wheel.name.split("-py")[0]
                                                + ".dist-info"}
    assert "linearkit/__init__.py" in names and "linearkit/transforms/qkv.py" in names
    for gone in ("experiments", "checkpoint_measure", "sparse_timing", "factorize_claims"):
        assert not [n for n in names if gone in n], gone
    assert "time_qkv" not in qkv and "def split_qkv" in qkv
