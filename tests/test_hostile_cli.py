"""The `linearkit` command against a hostile world: a full or read-only disk, files that are not
regular files, names and metadata that carry terminal escapes, sizes that cannot fit in memory,
and a Ctrl-C that lands after the file is already written."""

import errno
import json
import os
import subprocess
import sys
import unicodedata

import numpy as np
import pytest

import linearkit as lk
from linearkit.cli import commands
from linearkit.cli.commands import main

STEPS = ["--steps", "2", "--eval-every", "0"]


def one_line(err: str) -> str:
    assert "Traceback" not in err, err
    assert err.endswith("\n") and err.count("\n") == 1, err
    return err


def _model_file(path):
    lk.manual_seed(0)
    lk.save(lk.Sequential(lk.Linear(4, 8), lk.ReLU(), lk.Linear(8, 3)), path)
    return path


# ------------------------------------------------------------------ disk full and other OSErrors

def _fail_writes_of_temp_files(monkeypatch, where, number=errno.ENOSPC):
    """``os.write`` / ``os.fsync`` fail with ``number`` for the atomic writer's temp files only
    (pytest's own output capture keeps working)."""
    real = getattr(os, where)

    def failing(fd, *args):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if os.path.basename(target).startswith(".tmp-"):
            raise OSError(number, os.strerror(number))
        return real(fd, *args)

    monkeypatch.setattr(os, where, failing)


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="Linux /proc")


def _commands(tmp_path):
    source = _model_file(tmp_path / "model.safetensors")
    return {
        "train": (["train", *STEPS, "--out"], tmp_path / "trained.safetensors"),
        "compress": (["compress", str(source), "--int8", "-o"], tmp_path / "small.safetensors"),
        "convert": (["convert", str(source)], tmp_path / "model.onnx"),
    }


@needs_proc
@pytest.mark.parametrize("where", ["write", "fsync"])
@pytest.mark.parametrize("name", ["train", "compress", "convert"])
def test_disk_full_is_one_line_exit_2_and_keeps_the_old_file(name, where, tmp_path, monkeypatch,
                                                              capsys):
    if name == "convert":
        pytest.importorskip("onnx")
    argv, out = _commands(tmp_path)[name]
    if name == "convert":
        argv = argv + [str(out), "--input-shape", "1,4"]
    else:
        argv = argv + [str(out)]
    out.write_bytes(b"the previous result")
    listing = sorted(os.listdir(tmp_path))
    _fail_writes_of_temp_files(monkeypatch, where)
    assert main(argv) == 2
    line = one_line(capsys.readouterr().err.splitlines(keepends=True)[-1])
    assert f"linearkit {name}: error: cannot write {out}" in line, line
    assert "No space left on device (ENOSPC)" in line and "free some space" in line, line
    assert "is unchanged" in line and "a bug" not in line, line
    assert out.read_bytes() == b"the previous result"
    assert sorted(os.listdir(tmp_path)) == listing  # no temp file left


@pytest.mark.parametrize("number, words", [
    (errno.EACCES, "check the permissions"),
    (errno.EROFS, "read-only"),
    (errno.ENOENT, "check that the path exists"),
    (errno.EISDIR, "a folder is in the way"),
    (errno.EDQUOT, "quota"),
    (errno.EIO, "I/O error"),
])
def test_every_oserror_of_a_save_is_one_line_naming_the_file(number, words, tmp_path,
                                                             monkeypatch, capsys):
    out = tmp_path / "w.safetensors"

    def refuse(src, dst):
        raise OSError(number, os.strerror(number), src)  # as the kernel names the temp file

    monkeypatch.setattr(os, "replace", refuse)
    assert main(["train", *STEPS, "--json", "--out", str(out)]) == 2
    line = one_line(capsys.readouterr().err)
    assert f"cannot write {out}: {os.strerror(number)} ({errno.errorcode[number]})" in line, line
    assert words in line and "no file was created" in line and ".tmp-" not in line, line
    assert os.listdir(tmp_path) == []


def test_an_oserror_reading_an_input_names_it(tmp_path, monkeypatch, capsys):
    source = _model_file(tmp_path / "model.safetensors")
    import linearkit.io.convert as convert_module

    def unreadable(path, arch=None):
        raise PermissionError(errno.EACCES, "Permission denied", str(source))

    monkeypatch.setattr(convert_module, "load_any", unreadable)
    assert main(["compress", str(source), "--int8", "-o", str(tmp_path / "o.safetensors")]) == 2
    line = one_line(capsys.readouterr().err)
    assert f"{source}: Permission denied (EACCES); check the permissions" in line, line
    assert "cannot write" not in line


def test_memory_error_is_one_line_exit_2(tmp_path, monkeypatch, capsys):
    import safetensors.numpy

    source = _model_file(tmp_path / "model.safetensors")

    def too_big(*args, **kwargs):
        raise MemoryError("Unable to allocate 3.64 TiB for an array")

    monkeypatch.setattr(safetensors.numpy, "save", too_big)
    assert main(["compress", str(source), "--int8", "-o", str(tmp_path / "o.safetensors")]) == 2
    line = one_line(capsys.readouterr().err)
    assert "out of memory (Unable to allocate 3.64 TiB" in line and "smaller" in line, line
    assert not (tmp_path / "o.safetensors").exists()


def test_an_unexpected_exception_is_still_shown_as_a_bug(tmp_path, monkeypatch, capsys):
    import safetensors.numpy

    source = _model_file(tmp_path / "model.safetensors")
    monkeypatch.setattr(safetensors.numpy, "save",
                        lambda *a, **k: (_ for _ in ()).throw(RuntimeError("broken\x1b[2J")))
    assert main(["compress", str(source), "--int8", "-o", str(tmp_path / "o.safetensors")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: broken\\x1b[2J" in err and "\x1b" not in err
    assert err.endswith("a bug in linearkit; please report it with the command line and the "
                        "traceback above\n")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0 or sys.platform != "linux",
                    reason="mounting a tmpfs needs root on Linux")
def test_a_real_full_disk(tmp_path):
    """A 64 KiB tmpfs that the model (60 KiB) cannot fit in twice."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                      capture_output=True, check=False).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        out = mount / "w.safetensors"
        out.write_bytes(b"the previous run" * 2000)  # 32 KB: the new file does not fit beside it
        done = subprocess.run([sys.executable, "-m", "linearkit.cli", "train", *STEPS, "--json",
                               "--out", str(out)], capture_output=True, text=True, timeout=300,
                              check=False)
        assert done.returncode == 2, done.stderr
        line = one_line(done.stderr.splitlines(keepends=True)[-1])
        assert f"cannot write {out}: No space left on device (ENOSPC)" in line, line
        assert out.read_bytes() == b"the previous run" * 2000
        assert os.listdir(mount) == ["w.safetensors"] and done.stdout == ""
    finally:
        subprocess.run(["umount", str(mount)], check=False)


# ------------------------------------------------------------------ not a regular file

def _fifo(tmp_path):
    fifo = tmp_path / "pipe.safetensors"
    os.mkfifo(fifo)
    return fifo


@pytest.mark.skipif(sys.platform == "win32", reason="FIFOs")
@pytest.mark.parametrize("argv", [
    ["inspect", "{fifo}"], ["ledger", "{fifo}"], ["convert", "{fifo}", "{tmp}/o.pt"],
    ["compress", "{fifo}", "--int8", "-o", "{tmp}/o.safetensors"],
    ["inspect", "/dev/zero"], ["ledger", "/dev/zero"], ["inspect", "{tmp}"],
])
def test_fifos_devices_and_folders_are_refused_in_one_line(argv, tmp_path):
    fifo = _fifo(tmp_path)
    args = [a.format(fifo=fifo, tmp=tmp_path) for a in argv]
    done = subprocess.run([sys.executable, "-m", "linearkit.cli", *args], capture_output=True,
                          text=True, timeout=60, check=False)  # a blocked open would time out
    assert done.returncode == 2, done.stderr
    line = one_line(done.stderr)
    assert args[1] in line and ("not a regular file" in line or "is a folder" in line), line


# ------------------------------------------------------------------ terminal escapes

HOSTILE_NAMES = ["clear\x1b[2J\x1b[Hscreen", "over\rwrite", "bell\x07", "back\x08space",
                 "csi\x9b31m", "rtl\u202egnp.exe", "new\nline  F32  (1,)  4", "\u4e2d\u6587"]
HOSTILE_METADATA = {"title\x1b]0;pwned\x07": "value\x1b[31mred\x1b[0m",
                    "dir\u2066": "bidi\u202eisolate\u2069", "plain": "\u65e5\u672c\u8a9e ok",
                    "esc\x1b": "one", "esc\\x1b": "two"}


def _unsafe(text: str) -> list[str]:
    return [c for c in text if c != "\n"
            and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs")]


@pytest.fixture
def hostile(tmp_path):
    import safetensors.numpy

    path = tmp_path / "hostile.safetensors"
    safetensors.numpy.save_file({n: np.ones(1, np.float32) for n in HOSTILE_NAMES}, str(path),
                                metadata=HOSTILE_METADATA)
    return path


@pytest.mark.parametrize("argv", [["inspect"], ["ledger"], ["ledger", "--markdown"]])
def test_control_characters_from_a_file_never_reach_the_terminal(argv, hostile, capsys):
    assert main([argv[0], str(hostile), *argv[1:]]) == 0
    out = capsys.readouterr().out
    assert _unsafe(out) == [], sorted(set(_unsafe(out)))
    assert "clear\\x1b[2J\\x1b[Hscreen" in out and "rtl\\u202egnp" in out
    assert "\u4e2d\u6587" in out  # printable Unicode is kept
    if argv == ["inspect"]:
        assert "new\\nline  F32" in out  # one row per tensor: no faked row
        lines = out.splitlines()
        assert not any(line.lstrip().startswith("line  F32") for line in lines)
        assert "value\\x1b[31mred\\x1b[0m" in out and "\u65e5\u672c\u8a9e ok" in out
        assert "'esc\\x1b': one" in out and "'esc\\\\x1b': two" in out  # neither hides


@pytest.mark.parametrize("argv", [["inspect", "--json"], ["ledger", "--json"]])
def test_json_output_escapes_them_and_keeps_the_names(argv, hostile, capsys):
    assert main([argv[0], str(hostile), *argv[1:]]) == 0
    out = capsys.readouterr().out
    assert _unsafe(out) == [] and out.isascii()
    record = json.loads(out)
    if argv[0] == "inspect":
        assert [t["name"] for t in record["tensors"]] == sorted(HOSTILE_NAMES)
        assert record["metadata"] == HOSTILE_METADATA


def test_an_error_naming_a_hostile_path_is_escaped(tmp_path, capsys):
    path = tmp_path / "evil\x1b[2J\x07name.safetensors"
    path.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{\"a\":1}")
    assert main(["inspect", str(path)]) == 2
    line = one_line(capsys.readouterr().err)
    assert _unsafe(line) == [] and "evil\\x1b[2J\\x07name.safetensors" in line, line


def test_terminal_safe_escapes_controls_and_keeps_printable_text():
    from linearkit.analysis.render import terminal_safe

    assert terminal_safe("a\x1bb\rc\x07\x08\x7f\x9b\u202e\u2028\ud800") == (
        "a\\x1bb\\rc\\x07\\x08\\x7f\\x9b\\u202e\\u2028\\ud800")
    assert terminal_safe("x\ny") == "x\\ny" and terminal_safe("x\ny", keep_newlines=True) == "x\ny"
    assert terminal_safe("\u4e2d\u6587 caf\u00e9 \U0001f600") == "\u4e2d\u6587 caf\u00e9 \U0001f600"


# ------------------------------------------------------------------ sweep sizes that cannot fit

def test_a_sweep_too_large_for_memory_is_a_usage_error_before_allocating(monkeypatch, capsys):
    from linearkit.layers import linear

    monkeypatch.setattr(linear.Linear, "__init__",
                        lambda *a, **k: pytest.fail("the sweep allocated a layer"))
    assert main(["sweep", "--in-features", "1000000", "--out-features", "1000000"]) == 2
    line = one_line(capsys.readouterr().err)
    assert "Linear(1000000, 1000000) in float32" in line and "GiB of memory" in line, line
    assert "this machine has" in line and "--in-features" in line, line
    assert main(["sweep", "--dims", "8,1000000", "--backward"]) == 2
    line = one_line(capsys.readouterr().err)
    assert "Linear(1000000, 1000000)" in line and "--dims or --batch" in line, line


def test_the_sweep_estimate_and_the_limit(monkeypatch):
    from linearkit.analysis import layer_sweep

    assert layer_sweep.memory_limit() is None or layer_sweep.memory_limit() > 2**20
    # weight + bias, the inputs of batches 1 and 2, one output (batch 2), and the float64 draw
    assert layer_sweep.sweep_bytes([(1, 4, 3), (2, 4, 3)], 4, False) == (
        (12 + 3 + 4 + 8 + 6) * 4 + 8 * 8)
    monkeypatch.setattr(layer_sweep, "memory_limit", lambda: 2**20)
    with pytest.raises(layer_sweep.SweepTooLarge, match=r"more than the 1\.0 MiB"):
        layer_sweep.batch_sweep(512, 512, [1, 2], repeats=1)
    result = layer_sweep.batch_sweep(8, 4, [1, 2], repeats=1)  # small sizes still run
    assert [r.batch for r in result.rows] == [1, 2]


# ------------------------------------------------------------------ compress/convert replacing

@pytest.mark.parametrize("name", ["compress", "convert"])
def test_compress_and_convert_say_when_they_replace_a_file(name, tmp_path, capsys):
    source = _model_file(tmp_path / "model.safetensors")
    out = tmp_path / ("small.safetensors" if name == "compress" else "model.pt")
    argv = (["compress", str(source), "--int8", "-o", str(out)] if name == "compress"
            else ["convert", str(source), str(out)])
    if name == "convert":
        pytest.importorskip("torch")
    assert main(argv) == 0
    assert capsys.readouterr().err == ""  # a new file: nothing to say
    assert main(argv) == 0
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"linearkit {name}: {out} exists and will be replaced"), line


# ------------------------------------------------------------------ Ctrl-C after the save

def _interrupt_after(monkeypatch, module, name):
    real = getattr(module, name)

    def then_interrupt(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(module, name, then_interrupt)


def _loads(path):
    from linearkit.recipes.train_mnist1d import build_model

    return lk.load(path, build_model("mlp"))


def test_ctrl_c_right_after_the_save_reports_the_file_as_written(tmp_path, monkeypatch, capsys):
    import linearkit.io

    out = tmp_path / "w.safetensors"
    _interrupt_after(monkeypatch, linearkit.io, "save")
    assert main(["train", *STEPS, "--out", str(out)]) == 130
    captured = capsys.readouterr()
    line = one_line(captured.err.splitlines(keepends=True)[-1])
    assert f"interrupted after the weights were saved to {out} (the file is complete)" in line
    assert "discarded" not in captured.err and "weights saved" not in captured.out
    _loads(out)
    assert os.listdir(tmp_path) == ["w.safetensors"]


def test_ctrl_c_after_the_rename_inside_the_save_reports_the_file_as_written(tmp_path,
                                                                            monkeypatch, capsys):
    from linearkit.storage import atomic

    out = tmp_path / "w.safetensors"
    _interrupt_after(monkeypatch, os, "replace")  # before the folder's fsync
    assert main(["train", *STEPS, "--json", "--out", str(out)]) == 130
    captured = capsys.readouterr()
    assert "(the file is complete)" in captured.err and captured.out == ""
    _loads(out)
    assert atomic  # the writer under test


def test_ctrl_c_before_the_rename_keeps_the_old_file(tmp_path, monkeypatch, capsys):
    out = tmp_path / "w.safetensors"
    out.write_bytes(b"the previous run")

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    assert main(["train", *STEPS, "--out", str(out)]) == 130
    assert capsys.readouterr().err.endswith("interrupted; partial results were discarded\n")
    assert out.read_bytes() == b"the previous run" and os.listdir(tmp_path) == ["w.safetensors"]


def test_ctrl_c_during_the_report_says_the_file_is_complete(tmp_path, monkeypatch, capsys):
    out = tmp_path / "w.safetensors"

    def cut(args, model, result, path, **report):
        print(model)
        raise KeyboardInterrupt

    monkeypatch.setattr(commands, "_report_training", cut)
    assert main(["train", *STEPS, "--out", str(out)]) == 130
    assert "the report on stdout was cut short" in capsys.readouterr().err
    _loads(out)


def test_ctrl_c_once_everything_is_done_exits_0(tmp_path, monkeypatch, capsys):
    out = tmp_path / "w.safetensors"
    real = sys.stdout.flush

    def flush():
        real()
        if sys._getframe(1).f_code is main.__code__:  # main's flush, after the command returned
            raise KeyboardInterrupt

    monkeypatch.setattr(sys.stdout, "flush", flush)
    assert main(["train", *STEPS, "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert f"weights saved to {out}" in captured.out
    assert "interrupted after the command had completed" in captured.err
    _loads(out)


def test_ctrl_c_as_a_ranks_job_ends_reports_the_file_it_wrote(tmp_path, monkeypatch, capsys):
    from linearkit import distributed
    from linearkit.distributed import launch

    if not distributed.is_available():
        pytest.skip("needs mpi4py")
    try:
        launch.find_mpirun()
    except FileNotFoundError:
        pytest.skip("needs mpirun")
    out = tmp_path / "w.safetensors"

    def job_saved_then_interrupted(ranks, command):
        _model_file(out)  # rank 0's atomic save
        raise KeyboardInterrupt

    monkeypatch.setattr(launch, "run_ranks", job_saved_then_interrupted)
    assert main(["train", *STEPS, "--ranks", "2", "--out", str(out)]) == 130
    line = one_line(capsys.readouterr().err)
    assert "2-rank job" in line and f"saved to {out} (the file is complete)" in line, line
    assert "discarded" not in line

    def job_interrupted_before_saving(ranks, command):
        raise KeyboardInterrupt

    monkeypatch.setattr(launch, "run_ranks", job_interrupted_before_saving)
    assert main(["train", *STEPS, "--ranks", "2", "--out", str(out)]) == 130
    assert "partial results were discarded" in capsys.readouterr().err.splitlines()[-1]
