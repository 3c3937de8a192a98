"""The docstrings' examples run in CI, and every module of the package imports without extras.

``python -m pytest`` collects ``--doctest-modules`` over ``linearkit`` (pyproject.toml), which
imports every module: one that imports an optional dependency at module level would break the
whole run on a machine without that extra. So every module is imported here in a fresh
interpreter where the optional dependencies cannot be found.
"""

import subprocess
import sys
import textwrap

import linearkit

# Everything linearkit may use but does not require (numpy and threadpoolctl are required).
OPTIONAL = ["torch", "safetensors", "tqdm", "scipy", "matplotlib", "mnist1d", "torchinfo",
            "onnx", "onnxruntime", "ml_dtypes", "mpi4py", "hypothesis", "pytest"]


def test_pytest_runs_the_package_doctests(request):
    assert request.config.option.doctestmodules, "addopts should hold --doctest-modules"
    assert "linearkit" in request.config.getini("testpaths")


def test_every_module_imports_without_the_optional_dependencies():
    script = textwrap.dedent(f"""
        import importlib, pkgutil, sys

        class Blocker:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {OPTIONAL!r}:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

        sys.meta_path.insert(0, Blocker())
        import linearkit
        names = [m.name for m in pkgutil.walk_packages(linearkit.__path__, "linearkit.")]
        for name in names:
            importlib.import_module(name)
        print(len(names))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 40  # the walk really went through the package
    assert linearkit.__path__
