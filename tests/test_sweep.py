"""linearkit.analysis.layer_sweep and `linearkit sweep`: rows, the knee, misuse, --json, --plot (no timing
assertions: the numbers depend on the machine)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from linearkit.analysis.layer_sweep import (
    ALIGNMENT,
    KNEE_FRACTION,
    SweepResult,
    SweepRow,
    aligned_neighbour,
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


def test_dim_sweep_keeps_order_and_compares_each_width_with_its_aligned_neighbour():
    r = dim_sweep([60, 64, 130, 128], batch=3, dtype=np.float64, repeats=1)
    assert r.kind == "dims" and r.knee is None and r.dtype == "float64"
    assert [(row.in_features, row.out_features, row.batch) for row in r.rows] == [
        (60, 60, 3), (64, 64, 3), (130, 130, 3), (128, 128, 3)]
    assert r.rows[0].train_ms is None
    assert r.aligned_pairs() == [(60, 64), (130, 128)]
    notes = {line.split()[0]: line for line in r.table().splitlines()[2:6]}
    t = {row.in_features: row.forward_ms for row in r.rows}
    assert f"-> 64: work {(64 / 60) ** 2:.2f}x, time {t[64] / t[60]:.2f}x" in notes["60x60"]
    assert "-> 128: work" in notes["130x130"] and "64" not in notes["130x130"]
    assert notes["128x128"].endswith("a multiple of 64")


def _rows(widths):
    """Width-sweep rows with made-up times (no timing): ``d`` takes ``d`` ms."""
    return [SweepRow(64, d, d, float(d), 64e3 / d, 2 * 64 * d * d / (d / 1e3) / 1e9)
            for d in widths]


def test_each_width_is_paired_with_its_aligned_neighbour_not_the_row_before():
    assert ALIGNMENT == 64
    widths = [250, 256, 1000, 1024, 4000, 4096]
    for order in (widths, widths[::-1], [1000, 4096, 250, 4000, 256, 1024]):
        assert {d: aligned_neighbour(d, order) for d in widths} == {
            250: 256, 256: None, 1000: 1024, 1024: None, 4000: 4096, 4096: None}
    assert aligned_neighbour(4000, [3968, 4000, 4032]) == 4032    # a tie: the wider
    assert aligned_neighbour(250, [250, 1024]) is None            # 4x away: no neighbour
    result = SweepResult("dims", "float32", False, 1, 1, _rows(widths))
    assert result.aligned_pairs() == [(250, 256), (1000, 1024), (4000, 4096)]
    lines = {line.split()[0]: line for line in result.table().splitlines()[2:8]}
    assert "-> 1024: work 1.05x, time 1.02x" in lines["1000x1000"]
    assert "256" not in lines["1000x1000"] and "-> 4096" in lines["4000x4000"]
    assert result.to_dict()["aligned_pairs"] == [[250, 256], [1000, 1024], [4000, 4096]]
    alone = SweepResult("dims", "float32", False, 1, 1, _rows([250, 1000]))
    assert "no multiple of 64 swept near it: add 256 to --dims" in alone.table()
    assert "add 1024 to --dims" in alone.table()


def test_the_cli_width_table_pairs_1000_with_1024(capsys):
    assert main(["sweep", "--dims", "250,256,1000,1024", "--batch", "2", "--repeats", "1"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()
            if line.split() and "x" in line.split()[0]}
    assert "-> 256:" in rows["250x250"] and "-> 1024:" in rows["1000x1000"]
    assert "256" not in rows["1000x1000"]


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


def _batch_result(batches, latencies):
    """A batch sweep's result with made-up latencies (ms per call), no timing."""
    rows = [SweepRow(b, 64, 64, ms, b / ms * 1e3, 2 * b * 64 * 64 / ms / 1e6)
            for b, ms in zip(batches, latencies)]
    return SweepResult("batch", "float32", False, 1, 1, rows,
                       knee=find_knee(batches, [r.forward_samples_s for r in rows]))


@pytest.mark.parametrize("result", [
    _batch_result([1, 2, 4, 8], [0.011, 0.012, 0.015, 0.02]),   # under one decade of latency
    _batch_result(powers_of_two(65536), [0.01 * 1.7 ** i for i in range(17)]),
    _batch_result([1, 3, 5, 6, 7, 9, 11, 13, 100, 110, 120], [0.1 + 0.01 * i for i in range(11)]),
    SweepResult("dims", "float32", False, 1, 1, _rows([250, 256, 1000, 1024, 4000, 4096])),
    SweepResult("dims", "float32", False, 1, 1, _rows(range(1000, 1100, 2))),
], ids=["narrow-latency", "batch-to-65536", "uneven-batches", "six-widths", "fifty-widths"])
def test_no_two_x_tick_labels_overlap(result):
    pytest.importorskip("matplotlib")
    from linearkit.analysis.layer_sweep_plot import sweep_figure

    fig = sweep_figure(result)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        labels = [t for t in ax.xaxis.get_ticklabels(which="both")
                  if t.get_visible() and t.get_text()]
        assert len(labels) >= 2, ax.get_xlabel()               # thinned, not emptied
        boxes = [t.get_window_extent(renderer) for t in labels]
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                assert not a.overlaps(b), (ax.get_xlabel(), [t.get_text() for t in labels])
