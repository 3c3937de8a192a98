"""What the commands say about files they do not read and shapes the file already gives: an ONNX
or PyTorch file or a folder given to ``inspect``, memory in human units, the input width taken
from a model file's first layer, and a ``--ranks`` job's disk-full error and Ctrl-C status."""

import errno
import json
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest

import linearkit as lk
from linearkit.cli import commands
from linearkit.cli.commands import main

ROOT = pathlib.Path(__file__).resolve().parents[1]
STEPS = ["--steps", "2", "--eval-every", "0"]


def one_line(err: str) -> str:
    assert "Traceback" not in err, err
    assert err.endswith("\n") and err.count("\n") == 1, err
    return err


def _model_file(path, *layers):
    lk.manual_seed(0)
    layers = layers or (lk.Linear(4, 8), lk.ReLU(), lk.Linear(8, 3))
    lk.save(lk.Sequential(*layers), path)
    return path


# ------------------------------------------------------------------ inspect: what the file is
def test_inspect_an_onnx_file_says_it_is_onnx_and_which_command_reads_it(tmp_path, capsys):
    pytest.importorskip("onnx")
    src, onnx_file = _model_file(tmp_path / "m.safetensors"), tmp_path / "m.onnx"
    assert main(["convert", str(src), str(onnx_file), "--input-shape", "1,4"]) == 0
    capsys.readouterr()
    for name in (onnx_file, tmp_path / "renamed.bin"):  # by extension, and by its first bytes
        if name != onnx_file:
            name.write_bytes(onnx_file.read_bytes())
        assert main(["inspect", str(name)]) == 2
        line = one_line(capsys.readouterr().err)
        assert "header length" not in line and "hostile" not in line, line
        assert f"{name} is an ONNX model" in line, line
        assert f"linearkit doctor {name}" in line and f"linearkit convert {name} " in line, line
        assert "Gemm x2" in line and "Relu x1" in line, line  # onnx is installed: its graph


def test_inspect_a_pytorch_file_suggests_convert(tmp_path, capsys):
    pt = tmp_path / "m.pt"
    with zipfile.ZipFile(pt, "w") as z:  # torch.save's layout: a zip archive with a pickle
        z.writestr("m/data.pkl", b"\x80\x02}q\x00.")
    assert main(["inspect", str(pt)]) == 2
    line = one_line(capsys.readouterr().err)
    assert f"{pt} is a PyTorch file" in line and "header length" not in line, line
    assert f"linearkit convert {pt} {tmp_path / 'm'}.safetensors" in line, line
    assert "--arch ARCH.safetensors" in line, line


def test_inspect_a_folder_lists_its_model_files(tmp_path, capsys):
    _model_file(tmp_path / "a.safetensors")
    (tmp_path / "b.onnx").write_bytes(b"\x08\x07\x12\x00")
    (tmp_path / "notes.txt").write_text("not a model")
    assert main(["inspect", str(tmp_path)]) == 2
    line = one_line(capsys.readouterr().err)
    assert "no such file" not in line and f"{tmp_path} is a folder" in line, line
    assert "a.safetensors, b.onnx" in line and "notes.txt" not in line, line
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["inspect", str(empty)]) == 2
    assert "holds no model file" in one_line(capsys.readouterr().err)


def test_inspect_prints_memory_in_human_units(tmp_path, capsys):
    path = _model_file(tmp_path / "m.safetensors", lk.Linear(40, 300), lk.ReLU(),
                       lk.Linear(300, 3))
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    ledger_line = next(line for line in out.splitlines() if line.startswith("ledger:"))
    assert "memory weights 51.6 KiB, buffers 0 B" in ledger_line, ledger_line
    assert "{" not in ledger_line, ledger_line


# ------------------------------------------------------------ the input shape the file gives
@pytest.mark.parametrize("layers, width", [
    ((lk.Linear(4, 8), lk.ReLU(), lk.Linear(8, 3)), 4),
    ((lk.Dropout(0.1), lk.Linear(40, 3)), 40),
    ((lk.LayerNorm(12), lk.Linear(12, 3)), 12),
    ((lk.LazyLinear(3),), None),          # not materialized: its width is not in the file
])
def test_first_layer_width(tmp_path, layers, width):
    from linearkit.analysis.inspect_file import first_layer_width

    assert first_layer_width(_model_file(tmp_path / "m.safetensors", *layers)) == width


def test_first_layer_width_of_a_weights_only_file_is_unknown(tmp_path):
    from linearkit.analysis.inspect_file import first_layer_width

    path = tmp_path / "w.safetensors"
    lk.save(lk.Linear(4, 3).state_dict(), path)
    assert first_layer_width(path) is None


def test_convert_to_onnx_takes_the_input_shape_from_the_file(tmp_path, capsys):
    onnx = pytest.importorskip("onnx")
    src, target = _model_file(tmp_path / "m.safetensors"), tmp_path / "m.onnx"
    assert main(["convert", str(src), str(target)]) == 0
    captured = capsys.readouterr()
    line = one_line(captured.err)
    assert "input shape (1, 4) taken from the file's first layer; give --input-shape" in line
    graph = onnx.load(str(target)).graph
    assert [d.dim_value for d in graph.input[0].type.tensor_type.shape.dim][-1] == 4


def test_convert_to_onnx_still_asks_when_the_file_does_not_give_it(tmp_path, capsys):
    path = tmp_path / "w.safetensors"
    lk.save(lk.Linear(4, 3).state_dict(), path)  # weights only: no first layer to read
    assert main(["convert", str(path), str(tmp_path / "m.onnx")]) == 2
    line = one_line(capsys.readouterr().err)
    assert "needs the input shape" in line and "taken from" not in line, line


def test_ledger_of_a_file_takes_the_input_shape_from_the_file(tmp_path, capsys):
    pytest.importorskip("safetensors")
    path = _model_file(tmp_path / "m.safetensors")
    assert main(["ledger", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    assert "input shape (1, 4) taken from the file's first layer" in one_line(captured.err)
    report = json.loads(captured.out)
    assert report["input_shape"] == [1, 4]
    assert main(["ledger", str(path), "--json", "--input-shape", "8,4"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and json.loads(captured.out)["input_shape"] == [8, 4]


# ----------------------------------------------------------------- a --ranks job's errors
class _Aborted(Exception):
    pass


class _FakeComm:
    """Rank 0 of a 2-rank world whose ``Abort`` raises (instead of ending the process)."""

    def __init__(self):
        self.code = None

    def Get_size(self):
        return 2

    def Get_rank(self):
        return 0

    def Abort(self, code):
        self.code = code
        raise _Aborted(code)


def _disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), kwargs.get("out") or args[1])


def test_a_full_disk_in_a_rank_is_the_cli_line_and_status_2(tmp_path, monkeypatch, capsys):
    from linearkit.distributed import comm

    out = tmp_path / "w.safetensors"
    args = commands.build_parser().parse_args(["train", *STEPS, "--out", str(out)])
    fake = _FakeComm()
    monkeypatch.setattr(comm, "world_size", lambda c=None: 2)
    monkeypatch.setattr(comm, "get_comm", lambda c=None: fake)
    with pytest.raises(_Aborted), commands._abort_job_on_error(True, args):
        _disk_full(None, str(out))
    line = one_line(capsys.readouterr().err)
    assert fake.code == 2
    assert line.startswith(f"rank 0: linearkit train: error: cannot write {out}: No space left "
                           "on device (ENOSPC); no file was created"), line
    assert "free some space" in line, line

    # the same words as the single-process command prints
    monkeypatch.setattr(lk.io, "save", lambda model, path, **kw: _disk_full(model, path))
    assert main(["train", *STEPS, "--json", "--out", str(out)]) == 2  # --json: no progress bar
    assert one_line(capsys.readouterr().err) == line.removeprefix("rank 0: ")


def test_a_bug_in_a_rank_still_shows_its_traceback(monkeypatch, capsys):
    from linearkit.distributed import comm

    fake = _FakeComm()
    monkeypatch.setattr(comm, "world_size", lambda c=None: 2)
    monkeypatch.setattr(comm, "get_comm", lambda c=None: fake)
    with pytest.raises(_Aborted), commands._abort_job_on_error(True):
        raise RuntimeError("a bug")
    err = capsys.readouterr().err
    assert "Traceback" in err and "rank 0: RuntimeError: a bug" in err and fake.code == 1


class _InterruptedPopen:
    """mpirun as Ctrl-C finds it: the first wait is interrupted, then it exits with
    ``status`` (0: every rank had finished)."""

    status = 0

    def __init__(self, *args, **kwargs):
        self.returncode = None
        self.waits = 0

    def wait(self, timeout=None):
        self.waits += 1
        if self.waits == 1:
            raise KeyboardInterrupt
        self.returncode = self.status
        return self.status

    def send_signal(self, signum):
        pass


@pytest.mark.parametrize("status", [0, 130])
def test_run_ranks_returns_mpiruns_status_after_ctrl_c(monkeypatch, status):
    from linearkit.distributed import launch

    monkeypatch.setattr(launch, "mpirun_command", lambda ranks, command: ["mpirun", *command])
    monkeypatch.setattr(launch.subprocess, "Popen",
                        type("P", (_InterruptedPopen,), {"status": status}))
    try:
        code = launch.run_ranks(2, ["true"])
    except KeyboardInterrupt:  # caught: uncaught, it would end the whole pytest session
        pytest.fail("run_ranks raised KeyboardInterrupt instead of returning mpirun's status")
    assert code == status and code.interrupted


def test_ctrl_c_after_a_ranks_job_completed_exits_0(tmp_path, monkeypatch, capsys):
    from linearkit import distributed
    from linearkit.distributed import launch

    if not distributed.is_available():
        pytest.skip("needs mpi4py")
    try:
        launch.find_mpirun()
    except FileNotFoundError:
        pytest.skip("needs mpirun")
    out = tmp_path / "w.safetensors"

    def completed_then_interrupted(ranks, command):
        _model_file(out)  # rank 0's save; rank 0 then reported and every rank exited 0
        return launch.JobStatus(0, interrupted=True)

    monkeypatch.setattr(launch, "run_ranks", completed_then_interrupted)
    assert main(["train", *STEPS, "--ranks", "2", "--out", str(out)]) == 0
    line = one_line(capsys.readouterr().err)
    assert "after it had completed" in line and f"saved to {out}" in line, line

    def failed_with_a_user_error(ranks, command):
        return launch.JobStatus(2)  # a rank printed its one line and aborted with 2

    monkeypatch.setattr(launch, "run_ranks", failed_with_a_user_error)
    assert main(["train", *STEPS, "--ranks", "2", "--out", str(out)]) == 2
    assert capsys.readouterr().err == ""


_FULL_DISK_RANKS = """
import errno, os, sys
import linearkit.io
from linearkit.cli.commands import main

def full(model, path, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

linearkit.io.save = full
sys.exit(main(sys.argv[1:]))
"""


def test_a_full_disk_in_a_two_rank_job_is_one_line_and_status_2(tmp_path):
    from linearkit import distributed as D

    pytest.importorskip("safetensors")
    if not D.is_available():
        pytest.skip("needs mpi4py")
    from linearkit.distributed.launch import find_mpirun, mpirun_command, rank_environment

    try:
        find_mpirun()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    script, out = tmp_path / "full.py", tmp_path / "w.safetensors"
    script.write_text(_FULL_DISK_RANKS)
    env = {k: v for k, v in rank_environment(2).items()
           if k not in D.comm.LAUNCHER_VARIABLES}
    done = subprocess.run(mpirun_command(2, [sys.executable, str(script), "train", *STEPS,
                                             "--ranks", "2", "--out", str(out)]),
                          capture_output=True, text=True, timeout=60, cwd=ROOT, env=env,
                          check=False)
    if "rank 0:" not in done.stderr and done.returncode != 2:
        pytest.skip(f"mpirun -n 2 cannot start here: {done.stderr.strip()[-400:]}")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert (f"rank 0: linearkit train: error: cannot write {out}: No space left on device "
            "(ENOSPC)") in done.stderr, done.stderr[-3000:]
    assert not out.exists()
