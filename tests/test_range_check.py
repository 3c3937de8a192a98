"""analysis.range_check: each layer's output range against a 16-bit dtype's limits."""

import numpy as np
import pytest

import linearkit as lk
from linearkit.analysis import range_check
from linearkit.analysis.range_check import dtype_limits


def _x(rows=32, n=8, scale=1.0):
    return (scale * np.random.default_rng(0).standard_normal((rows, n))).astype(np.float32)


def test_overflow_is_flagged_at_the_first_layer_whose_float16_cast_is_inf():
    model = lk.Sequential(lk.Linear(8, 16), lk.ReLU(), lk.Linear(16, 4))
    model[2].weight.data *= 3e3  # the second Linear's outputs pass float16's 65504
    x = _x(scale=100.0)
    report = range_check(model, x, np.float16)
    assert report.first_problem.path == "2" and report.first_problem.flag == "overflow"
    # the verdict is the real cast's: layer 0's output fits float16, layer 2's does not
    with np.errstate(over="ignore"):
        assert np.isfinite(model[0](x).astype(np.float16)).all()
        assert not np.isfinite(model(x).astype(np.float16)).all()
    assert [r.path for r in report.rows] == ["0", "1", "2", ""]
    assert "first problem: '2' (Linear(16, 4)): overflow" in str(report)


def test_underflow_counts_the_outputs_below_the_smallest_normal():
    model = lk.Sequential(lk.Linear(8, 16, bias=False))
    x = _x(scale=1e-6)
    report = range_check(model, x, np.float16)
    (row, _) = report.rows
    y = np.abs(model(x)[model(x) != 0])
    assert row.subnormal == pytest.approx(np.mean(y < np.finfo(np.float16).smallest_normal))
    assert row.flag == "underflow" and row.subnormal > 0.5
    # the same outputs are normal numbers in bfloat16 (float32's exponent range)
    pytest.importorskip("ml_dtypes")
    assert range_check(model, x, "bfloat16").ok


def test_headroom_and_parameter_ranges():
    model = lk.Sequential(lk.Linear(8, 4))
    model[0].weight.data[0, 0] = 1e5  # the weight itself overflows float16 storage
    row = range_check(model, np.zeros((2, 8), np.float32), np.float16).rows[0]
    assert row.param_max_abs == 1e5 and row.flag == "overflow"
    model[0].weight.data[0, 0] = 1e4  # fits, but within 16x of the max
    assert range_check(model, np.zeros((2, 8), np.float32), np.float16).rows[0].flag == "headroom"


def test_the_model_is_not_modified():
    model = lk.Sequential(lk.Linear(8, 6), lk.BatchNorm1d(6), lk.Dropout(0.5))
    before = {k: np.array(v, copy=True) for k, v in model.state_dict().items()}
    range_check(model, _x(), np.float16)
    assert model.training
    assert all(np.array_equal(v, before[k]) for k, v in model.state_dict().items())


def test_dtype_limits_and_errors():
    assert dtype_limits(np.float16)[1:] == (65504.0, 2.0 ** -14, 2.0 ** -24)
    ml_dtypes = pytest.importorskip("ml_dtypes")
    dt, top, normal, _ = dtype_limits(ml_dtypes.bfloat16)
    assert str(dt) == "bfloat16" and normal == float(np.finfo(np.float32).smallest_normal)
    assert top == pytest.approx(3.3895e38, rel=1e-4)
    with pytest.raises(TypeError, match="floating dtype"):
        dtype_limits(np.int8)
    with pytest.raises(TypeError, match="linearkit Module"):
        range_check(object(), _x())


def test_a_running_statistic_beyond_the_dtype_is_flagged():
    """A BatchNorm's running variance of 1e10 is fine in float32 and inf in float16 storage:
    the model trains, then scores at chance in eval mode."""
    model = lk.Sequential(lk.Linear(8, 4), lk.BatchNorm1d(4)).eval()
    model[1].running_var[:] = 1e10
    report = range_check(model, _x(), np.float16)
    assert report.first_problem.path == "1" and report.first_problem.flag == "overflow"
