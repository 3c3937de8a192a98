"""Shared test setup: every test starts from the same library random state, and no
``linearkit train`` a test runs compiles numba's kernels in a background process (its cold-cache
first run, docs/fast.md): tests/test_fast_first_run.py turns that on where it tests it."""

import os

import pytest

import linearkit

os.environ["LINEARKIT_BACKGROUND_COMPILE"] = "0"    # inherited by every subprocess a test starts


@pytest.fixture(autouse=True)
def _seeded():
    """Reseed linearkit's generator before each test, so no test depends on the order run."""
    linearkit.manual_seed(0)
    yield
