"""The `linearkit` command: train (--json), ledger, gradcheck."""

import json

import numpy as np
import pytest

import linearkit as lk
from linearkit.cli.commands import main


def test_train_json_saves_weights_that_reload(tmp_path, capsys):
    out = tmp_path / "w.safetensors"
    assert main(["train", "--steps", "60", "--json", "--out", str(out), "--eval-every", "30"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert set(record) >= {"test_accuracy", "train_accuracy", "steps", "seconds", "params"}
    assert record["steps"] == 60 and record["params"] == 15210
    assert 0.1 < record["test_accuracy"] <= 1.0
    assert record["flush_denormal"] is True           # the command's default
    from linearkit.recipes.train_mnist1d import build_model

    model = lk.load(out, build_model("mlp"))
    data = lk.data.mnist1d()
    from linearkit.recipes.train_mnist1d import accuracy

    assert accuracy(model, data.x_test, data.y_test) == pytest.approx(record["test_accuracy"])


def test_train_no_flush_denormal_gives_the_same_weights_here(tmp_path, capsys):
    """The recipe's subnormals never reach a weight: both modes save the same bits."""
    outs = []
    for flag in ("--flush-denormal", "--no-flush-denormal"):
        out = tmp_path / f"{flag}.safetensors"
        assert main(["train", "--steps", "300", "--json", "--eval-every", "0", flag,
                     "--out", str(out)]) == 0
        assert json.loads(capsys.readouterr().out)["flush_denormal"] is (flag[2] == "f")
        outs.append(lk.load(out))
    for key in outs[0]:
        assert outs[0][key].tobytes() == outs[1][key].tobytes()


def test_train_linear_prints_paper_table(tmp_path, capsys):
    assert main(["train", "--model", "linear", "--steps", "20", "--out", str(tmp_path / "l.safetensors")]) == 0
    text = capsys.readouterr().out
    assert "logistic regression 32%" in text and "MLP 68%" in text and "parameters: 410" in text


def test_ledger_preset_and_bad_shape(capsys):
    assert main(["ledger", "linear-512-256", "--input-shape", "64,512"]) == 0
    text = capsys.readouterr().out
    assert "131,328" in text and "2,101,248" in text
    assert main(["ledger", "mlp-mnist", "--input-shape", "64,3,16"]) == 2
    err = capsys.readouterr().err
    assert "ShapeError" in err and "module '0'" in err and "Traceback" not in err


def test_gradcheck_command(capsys):
    assert main(["gradcheck"]) == 0
    from linearkit.analysis.cases import LOSS_CASES, MODULE_CASES

    assert f"{len(MODULE_CASES) + len(LOSS_CASES)} passed, 0 failed" in capsys.readouterr().out


def test_build_model_matches_the_paper_architecture():
    from linearkit.recipes.train_mnist1d import build_model

    model = build_model("mlp", 100, rng=np.random.default_rng(0))
    assert sum(p.size for p in model.parameters()) == 40 * 100 + 100 + 100 * 100 + 100 + 100 * 10 + 10


# ------------------------------------------------------------------ misuse, through a real process
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402

README = Path(__file__).resolve().parents[1] / "README.md"


def cli(*args, env=None, timeout=120, **kwargs):
    """``python -m linearkit.cli ARGS`` in a fresh process: (returncode, stdout, stderr)."""
    proc = subprocess.run([sys.executable, "-m", "linearkit.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, **kwargs)
    return proc.returncode, proc.stdout, proc.stderr


def one_line_usage_error(rc, out, err):
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in err and "Traceback" not in out, err
    assert err.endswith("\n") and err.count("\n") == 1, err  # exactly one line
    return err


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    (root / "a-file").write_text("not a folder")
    trained = root / "trained.safetensors"
    trained.write_bytes(b"weights of a long run")
    shim = root / "no-cli-extra" / "safetensors"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('the cli extra is not installed')\n")
    (root / "folder").mkdir()
    return root


MISUSES = {  # name: (arguments, words the one line must contain)
    "batch 0": (["train", "--batch-size", "0"], ["--batch-size", "must be >= 1", "got 0"]),
    "batch -3": (["train", "--batch-size", "-3"], ["--batch-size", "got -3"]),
    "batch 5000": (["train", "--batch-size", "5000"], ["5000", "4,000 training rows",
                                                       "--batch-size 4000 or less"]),
    "lr -1": (["train", "--lr", "-1"], ["--lr", "finite and > 0", "'-1'"]),
    "lr nan": (["train", "--lr", "nan"], ["--lr", "'nan'"]),
    "lr inf": (["train", "--lr", "inf"], ["--lr", "'inf'"]),
    "lr 0": (["train", "--lr", "0"], ["--lr", "'0'"]),
    "lr abc": (["train", "--lr", "abc"], ["--lr", "a number", "'abc'"]),
    "steps 0": (["train", "--steps", "0"], ["--steps", "must be >= 1"]),
    "threads abc": (["train", "--threads", "abc"], ["--threads", "auto, default", "'abc'"]),
    "threads 0": (["train", "--threads", "0"], ["--threads", "'0'"]),
    "threads -1": (["train", "--threads", "-1"], ["--threads", "'-1'"]),
    "hidden 0": (["train", "--hidden", "0"], ["--hidden", "must be >= 1"]),
    "seed -1": (["train", "--seed", "-1"], ["--seed", "must be >= 0"]),
    "out under a file": (["train", "--out", "{work}/a-file/w.safetensors"],
                         ["cannot write --out", "is a file, not a folder"]),
    "out is a folder": (["train", "--out", "{work}/folder"], ["is a folder", "name a file"]),
    "no cli extra": (["train", "--out", "{work}/w.safetensors"],
                     ['pip install "linearkit[cli]"']),
    "dtype float17": (["ledger", "mlp-mnist", "--dtype", "float17"],
                      ["--dtype", "float16", "'float17'"]),
    "dtype object": (["ledger", "mlp-mnist", "--dtype", "object"], ["--dtype", "'object'"]),
    "ledger not safetensors": (["ledger", str(README)], ["is not a .safetensors file"]),
    "ledger missing file": (["ledger", "{work}/missing.safetensors"],
                            ["neither a file nor a preset"]),
    "ledger folder": (["ledger", "{work}/folder"], ["is a folder"]),
    "shape 3,x": (["ledger", "mlp-mnist", "--input-shape", "3,x"],
                  ["--input-shape", "'x' is not an integer"]),
    "shape empty piece": (["ledger", "mlp-mnist", "--input-shape", "64,,784"],
                          ["a piece is empty"]),
    "shape negative": (["ledger", "mlp-mnist", "--input-shape=-3,784"],
                       ["'-3' is not an integer >= 1"]),
    "shape negative, no =": (["ledger", "mlp-mnist", "--input-shape", "-3,784"],
                             ["--input-shape", "the = form"]),
    "shape mismatch": (["ledger", "mlp-mnist", "--input-shape", "64,28,28"],
                       ["ShapeError", "module '0'", "-- hint: ", "flatten it first"]),
    "unknown command": (["bogus"], ["invalid choice: 'bogus'"]),
    # The experiments are repository tooling (python -m experiments), not a subcommand; their
    # misuses are checked in experiments/tests/test_main.py.
    "no experiment command": (["experiment", "init-depth"], ["invalid choice: 'experiment'"]),
}
if sys.platform.startswith("linux"):  # a folder nobody can write to, even root
    MISUSES["out unwritable"] = (["train", "--out", "/proc/linearkit-test.safetensors"],
                                 ["cannot write --out", "not writable"])
if hasattr(os, "geteuid") and os.geteuid() != 0:
    MISUSES["out read-only"] = (["train", "--out", "{work}/read-only/w.safetensors"],
                                ["cannot write --out", "not writable"])


@pytest.fixture(scope="module")
def misuse_results(work):
    """Every misuse, run in parallel processes once (each would fail in about a second)."""
    (work / "read-only").mkdir()
    (work / "read-only").chmod(0o555)

    def one(name):
        args = [a.replace("{work}", str(work)) for a in MISUSES[name][0]]
        env = {"PYTHONPATH": str(work / "no-cli-extra")} if name == "no cli extra" else None
        started = time.perf_counter()
        return cli(*args, env=env, cwd=work), time.perf_counter() - started

    with ThreadPoolExecutor(4) as pool:
        results = dict(zip(MISUSES, pool.map(one, MISUSES)))
    (work / "read-only").chmod(0o755)
    return results


@pytest.mark.parametrize("name", list(MISUSES))
def test_every_misuse_is_one_line_and_exit_2(name, misuse_results, work):
    (rc, out, err), seconds = misuse_results[name]
    line = one_line_usage_error(rc, out, err)
    for word in MISUSES[name][1]:
        assert word in line, (word, line)
    assert out == ""  # nothing was trained, nothing printed
    assert not (work / "w.safetensors").exists()
    assert (work / "trained.safetensors").read_bytes() == b"weights of a long run"


def test_steps_0_does_not_replace_a_trained_file(work):
    trained = work / "trained.safetensors"
    one_line_usage_error(*cli("train", "--steps", "0", "--out", trained))
    assert trained.read_bytes() == b"weights of a long run"


def _start_training(out, *extra):
    proc = subprocess.Popen(
        [sys.executable, "-m", "linearkit.cli", "train", "--steps", "1000000", "--out", str(out),
         *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err = bytearray()
    started = threading.Event()

    def read():
        while chunk := proc.stderr.read1(4096):
            err.extend(chunk)
            if b"step" in err or b"replaced" in err:  # the bar, or the notice before training
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert started.wait(120), "training did not start"
    time.sleep(0.5)
    return proc, err, reader


def test_ctrl_c_exits_130_with_one_line_and_no_file(tmp_path):
    out = tmp_path / "w.safetensors"
    proc, err, reader = _start_training(out)  # with the progress bar
    proc.send_signal(signal.SIGINT)
    try:
        rc = proc.wait(60)
    finally:
        proc.kill()
    reader.join(10)
    text = err.decode()
    assert rc == 130 and "Traceback" not in text, text
    assert text.count("\n") == 1 and text.endswith("interrupted; partial results were discarded\n")
    assert list(tmp_path.iterdir()) == []  # no weights, no temporary file beside them


def test_ctrl_c_keeps_the_file_it_would_have_replaced(tmp_path):
    out = tmp_path / "w.safetensors"
    out.write_bytes(b"the previous run")
    proc, err, reader = _start_training(out, "--json")
    proc.send_signal(signal.SIGINT)
    try:
        rc = proc.wait(60)
    finally:
        proc.kill()
    reader.join(10)
    lines = err.decode().splitlines()
    assert rc == 130 and len(lines) == 2, lines
    assert "will be replaced" in lines[0] and "interrupted" in lines[1]
    assert out.read_bytes() == b"the previous run" and list(tmp_path.iterdir()) == [out]
    assert proc.stdout.read() == b""


@pytest.mark.parametrize("args", [["ledger", "mlp-mnist"], ["ledger", "mlp-mnist", "--json"],
                                  ["--help"]])
def test_closed_stdout_exits_quietly(args):
    proc = subprocess.Popen([sys.executable, "-m", "linearkit.cli", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before anything is written (`| head -0`)
    err = proc.stderr.read()
    rc = proc.wait(120)
    assert err == b"", err.decode()
    assert rc in (0, 141)  # 141 = 128 + SIGPIPE, what a tool killed by SIGPIPE reports
    if args[0] == "ledger":
        assert rc == 141


def _no_constants(name):
    raise ValueError(f"{name} is not JSON")


def test_json_has_null_not_nan(tmp_path):
    rc, out, err = cli("train", "--lr", "1e30", "--steps", "30", "--eval-every", "0", "--json",
                       "--out", tmp_path / "w.safetensors")
    assert rc == 0, err
    record = json.loads(out, parse_constant=_no_constants)
    assert record["final_loss"] is None  # the loss overflowed: NaN in Python, null in JSON
    rc, out, err = cli("ledger", "mlp-mnist", "--json")
    assert rc == 0, err
    json.loads(out, parse_constant=_no_constants)


def test_python_dash_m_linearkit_is_the_same_command(tmp_path):
    """``python -m linearkit`` (no scripts on PATH) parses, fails and succeeds like ``linearkit``."""
    def run(*args):
        proc = subprocess.run([sys.executable, "-m", "linearkit", *args], capture_output=True,
                              text=True, timeout=120, cwd=tmp_path)
        return proc.returncode, proc.stdout, proc.stderr

    line = one_line_usage_error(*run("train", "--batch-size", "0"))
    assert line.startswith("linearkit train: error:") and "--batch-size" in line, line
    rc, out, err = run("train", "--steps", "20", "--eval-every", "0", "--json",
                       "--out", str(tmp_path / "w.safetensors"))
    assert rc == 0, err
    assert json.loads(out)["steps"] == 20


def test_json_safe_turns_every_non_finite_number_into_null():
    from linearkit.cli.commands import _json_safe

    got = _json_safe({"a": float("nan"), "b": [np.float32("inf"), np.float64(1.5), np.int64(3)],
                      "c": (1, float("-inf")), "d": {"e": np.float64("nan")}})
    assert got == {"a": None, "b": [None, 1.5, 3], "c": [1, None], "d": {"e": None}}


def test_replacing_weights_says_so_on_stderr(tmp_path, capsys):
    out = tmp_path / "w.safetensors"
    assert main(["train", "--model", "linear", "--steps", "5", "--json", "--out", str(out)]) == 0
    assert capsys.readouterr().err == ""
    assert main(["train", "--model", "linear", "--steps", "5", "--json", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(out) in err and "will be replaced" in err
    meta = __import__("safetensors").safe_open(str(out), "np").metadata()
    recipe = json.loads(meta["linearkit.recipe"])
    assert recipe["steps"] == 5 and "run" not in recipe


def test_help_shows_defaults_and_version_works(capsys):
    with pytest.raises(SystemExit) as info:
        main(["train", "--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for default in ("(default: 6000)", "(default: 0.01)", "(default: 100)", "(default: 42)",
                    "(default: auto)", "default: runs/mnist1d-MODEL.safetensors"):
        assert default in text, default
    with pytest.raises(SystemExit):
        main(["ledger", "--help"])
    assert "(default: adam)" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out == f"linearkit {lk.__version__}\n"


def test_the_help_names_every_experiment(capsys):
    """The experiments are not installed, so the help lists them itself: an experiment added to
    experiments/ without its name here fails this test."""
    from experiments import EXPERIMENTS

    from linearkit.cli.commands import REPOSITORY_EXPERIMENTS

    assert sorted(REPOSITORY_EXPERIMENTS) == sorted(EXPERIMENTS)
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    epilog = " ".join(text[text.index("experiments:"):].split())
    assert "python -m experiments NAME" in epilog and "not installed" in epilog
    named = epilog.split("NAME one of ", 1)[1].split(";", 1)[0]
    assert sorted(named.split(", ")) == sorted(EXPERIMENTS)
    assert all(name in text.split() or f"{name}," in text.split() or f"{name};" in text.split()
               for name in EXPERIMENTS)                  # a name is never broken at its hyphen


def test_an_internal_error_is_shown_as_a_bug_with_its_traceback(monkeypatch, capsys):
    import linearkit.cli.commands as cli_module

    def broken(args):
        raise RuntimeError("an invariant broke")

    monkeypatch.setattr(cli_module, "_gradcheck", broken)  # build_parser looks it up per call
    assert main(["gradcheck"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: an invariant broke" in err
    assert err.splitlines()[-1].endswith("this is a bug in linearkit; please report it with the "
                                         "command line and the traceback above")


def test_train_saves_a_model_that_loads_back_with_the_accuracy_it_printed(tmp_path, monkeypatch,
                                                                          capsys):
    # README's "Load a saved model back" (its block runs in tests/test_docs_examples.py)
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--steps", "50", "--eval-every", "0"]) == 0
    printed = capsys.readouterr().out
    assert "weights saved to runs/mnist1d-mlp.safetensors" in printed
    model = lk.load_model("runs/mnist1d-mlp.safetensors").eval()
    data = lk.data.mnist1d()
    accuracy = lk.loop.evaluate(model, data.x_test, data.y_test)["accuracy"]
    assert f"test accuracy:  {accuracy:.1%}" in printed
