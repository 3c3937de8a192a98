"""Shared test setup: every test starts from the same library random state (as in tests/)."""

import pytest

import linearkit


@pytest.fixture(autouse=True)
def _seeded():
    """Reseed linearkit's generator before each test, so no test depends on the order run."""
    linearkit.manual_seed(0)
    yield
