"""experiments.qkv_timing: one fused QKV GEMM against three, timed in the same run."""

import pytest

from experiments.qkv_timing import time_qkv


def test_time_qkv_measures_both_in_one_run():
    t = time_qkv(32, 4, repeats=3, threads=1)
    assert set(t) == {"d", "batch", "threads", "three_gemms_s", "fused_s", "ratio"}
    assert t["three_gemms_s"] > 0 and t["fused_s"] > 0
    assert t["ratio"] == pytest.approx(t["three_gemms_s"] / t["fused_s"])
