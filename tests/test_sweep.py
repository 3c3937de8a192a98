"""linearkit.analysis.layer_sweep and `linearkit sweep`: rows, the knee, misuse, --json, --plot (no timing
assertions: the numbers depend on the machine)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from linearkit.analysis.layer_sweep import (
    KNEE_FRACTION,
    batch_sweep,
    dim_sweep,
    find_knee,
    powers_of_two,
)
from linearkit.cli.commands import main


def test_find_knee_on_synthetic_numbers():
    assert KNEE_FRACTION == 0.9
    assert find_knee([1, 2, 4, 8, 16], [10, 20, 40, 89, 99]) == 16  # 89 < 0.9 * 99
    assert find_knee([1, 2, 4, 8, 16], [10, 20, 40, 90, 100]) == 8   # exactly 90%
    assert find_knee([1, 2, 4], [5, 3, 1]) == 1                      # best at the start
    assert find_knee([1, 2, 4, 8], [10, 100, 50, 60]) == 2           # a dip after the best
    assert find_knee([1, 2, 4], [10, 20, 40], fraction=1.0) == 4
    assert find_knee([7], [3.0]) == 7
    with pytest.raises(ValueError, match="as many throughputs"):
        find_knee([1, 2], [1.0])
    with pytest.raises(ValueError, match="fraction"):
        find_knee([1], [1.0], fraction=0)


def test_powers_of_two():
    assert powers_of_two(256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert powers_of_two(1) == [1]
    assert powers_of_two(100)[-2:] == [64, 100]


def test_batch_sweep_rows_and_knee():
    r = batch_sweep(8, 4, [4, 1, 2], backward=True, repeats=1)
    assert r.kind == "batch" and r.dtype == "float32" and r.backward
    assert [row.batch for row in r.rows] == [1, 2, 4]
    for row in r.rows:
        assert (row.in_features, row.out_features) == (8, 4)
        assert row.forward_ms > 0 and row.train_ms > 0
        assert row.forward_samples_s == pytest.approx(row.batch / (row.forward_ms / 1e3))
        assert row.forward_gflops == pytest.approx(2 * row.batch * 32 / (row.forward_ms / 1e3) / 1e9)
    assert r.knee == find_knee([1, 2, 4], [row.forward_samples_s for row in r.rows])
    assert r.knee_backward == find_knee([1, 2, 4], [row.train_samples_s for row in r.rows])
    assert "<- knee (fwd)" in r.table()
    with pytest.raises(ValueError, match="repeat"):
        batch_sweep(8, 4, [1, 1])
    with pytest.raises(ValueError, match="integers >= 1"):
        batch_sweep(8, 4, [0, 1])


def test_dim_sweep_keeps_order_and_compares_to_previous():
    r = dim_sweep([10, 8], batch=3, dtype=np.float64, repeats=1)
    assert r.kind == "dims" and r.knee is None and r.dtype == "float64"
    assert [(row.in_features, row.out_features, row.batch) for row in r.rows] == [(10, 10, 3), (8, 8, 3)]
    assert r.rows[0].train_ms is None
    assert "vs 10" in r.table()


def test_import_linearkit_does_not_import_sweep_or_matplotlib():
    code = ("import sys, linearkit; bad = [m for m in ('linearkit.analysis.layer_sweep', 'linearkit.analysis.layer_sweep_plot', "
            "'matplotlib') if m in sys.modules]; print(bad); sys.exit(bool(bad))")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


@pytest.mark.parametrize("argv, words", [
    (["--batches", "1,x"], "'x' is not an integer"),
    (["--batches", "1,,2"], "a piece is empty"),
    (["--batches", "4,4"], "repeated"),
    (["--dims", "250,0"], "'0' is not an integer"),
    (["--dims", "8,16", "--batches", "1,2"], "give one of them"),
    (["--max-batch", "0"], "must be >= 1"),
    (["--batches", "1,2", "--max-batch", "4"], "not allowed with"),
    (["--plot", "out.jpg"], "ending in .png"),
    (["--dtype", "int8"], "invalid choice"),
])
def test_misuse_is_one_line_exit_2(argv, words, capsys):
    code = None
    try:
        code = main(["sweep", *argv])
    except SystemExit as exc:  # argparse's errors exit from parse_args
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_json_parses(capsys):
    assert main(["sweep", "--in-features", "8", "--out-features", "4", "--max-batch", "4",
                 "--repeats", "1", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["kind"] == "batch" and [r["batch"] for r in record["rows"]] == [1, 2, 4]
    assert record["knee"] in (1, 2, 4) and record["knee_fraction"] == 0.9
    assert main(["sweep", "--dims", "6,8", "--batch", "2", "--repeats", "1", "--backward",
                 "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["kind"] == "dims" and record["rows"][1]["train_ms"] > 0


def test_table_output(capsys):
    assert main(["sweep", "--in-features", "8", "--out-features", "4", "--batches", "1,3",
                 "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "knee" in out and "fwd samples/s" in out


@pytest.mark.parametrize("extra", [["--max-batch", "4", "--backward"], ["--dims", "6,8"]])
def test_plot_is_written(tmp_path, capsys, extra):
    pytest.importorskip("matplotlib")
    png = tmp_path / "sweep.png"
    assert main(["sweep", "--in-features", "8", "--out-features", "4", "--repeats", "1",
                 "--plot", str(png), *extra]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot written to {png}" in capsys.readouterr().out


def test_plot_without_matplotlib_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    assert main(["sweep", "--max-batch", "2", "--plot", str(tmp_path / "s.png")]) == 2
    err = capsys.readouterr().err
    assert 'pip install "linearkit[plot]"' in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "s.png").exists()
