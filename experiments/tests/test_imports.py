"""Every experiments module imports without the optional extras: ``--doctest-modules`` collects
``experiments/`` (pyproject.toml's testpaths), which imports each module, so one that imported
matplotlib, scikit-learn or torch at module level would break the whole run without them."""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

OPTIONAL = ["torch", "safetensors", "tqdm", "scipy", "matplotlib", "mnist1d", "torchinfo",
            "onnx", "onnxruntime", "ml_dtypes", "mpi4py", "hypothesis", "pytest", "sklearn"]


def test_every_experiments_module_imports_without_the_optional_dependencies():
    script = textwrap.dedent(f"""
        import importlib, pkgutil, sys

        class Blocker:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {OPTIONAL!r}:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

        sys.meta_path.insert(0, Blocker())
        import experiments
        names = [m.name for m in pkgutil.walk_packages(experiments.__path__, "experiments.")
                 if m.name != "experiments.__main__"  # runs the command; pytest skips it too
                 and not m.name.startswith("experiments.tests")]
        for name in names:
            importlib.import_module(name)
        print(len(names))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 13  # the walk really went through the folder
