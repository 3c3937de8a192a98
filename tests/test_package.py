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
