"""Tests of the experiments (``python -m pytest experiments/tests``; the default run has them)."""
