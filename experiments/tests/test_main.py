"""``python -m experiments``: the list, the dispatch to each experiment, and every misuse one line
on stderr with exit status 2 (run in fresh processes from outside the checkout)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import experiments

ROOT = Path(__file__).resolve().parents[2]


def run_experiments(*args, cwd):
    """``python -m experiments ARGS`` in a fresh process, the checkout on the path: (returncode,
    stdout, stderr)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    proc = subprocess.run([sys.executable, "-m", "experiments", *map(str, args)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=cwd)
    return proc.returncode, proc.stdout, proc.stderr


def test_help_lists_every_experiment_and_its_page(tmp_path):
    rc, out, err = run_experiments("--help", cwd=tmp_path)
    assert rc == 0 and err == ""
    assert out.startswith("usage: python -m experiments {init-depth,precision,surgery}")
    for name, page in (("init-depth", "docs/init_experiment.md"), ("surgery", "docs/surgery.md"),
                       ("precision", "docs/precision.md")):
        line = next(line for line in out.splitlines() if line.strip().startswith(name))
        assert page in line, line
    assert set(experiments.ABOUT) == set(experiments.EXPERIMENTS)


def test_no_name_is_the_usage_line_and_exit_2(capsys):
    assert experiments.main([]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("usage: python -m experiments {")
    assert captured.err.count("\n") == 1


def test_each_name_dispatches_to_its_module(monkeypatch):
    seen = []
    for name in experiments.EXPERIMENTS:
        module = experiments.get(name)
        monkeypatch.setattr(module, "main", lambda argv, name=name: seen.append((name, argv)))
        assert experiments.main([name, "--quick", "--no-write"]) == 0
    assert seen == [(name, ["--quick", "--no-write"]) for name in experiments.EXPERIMENTS]


MISUSES = {  # name: (arguments, words the one line must contain)
    "unknown experiment": (["nope"], ["unknown experiment 'nope'", "init-depth"]),
    "experiment epochs 0": (["init-depth", "--epochs", "0"], ["--epochs", "must be >= 1"]),
    "experiment out-dir under a file": (
        ["init-depth", "--quick", "--out-dir", "{work}/a-file/x"],
        ["cannot write --out-dir", "is a file"]),
    "experiment docs and quick": (["init-depth", "--quick", "--write-docs"],
                                  ["--write-docs", "--quick"]),
    "page docs and quick": (["surgery", "--quick", "--write-docs"], ["--write-docs", "--quick"]),
    "page seed -1": (["precision", "--seed", "-1"], ["--seed", "must be >= 0"]),
}


@pytest.mark.parametrize("name", list(MISUSES))
def test_every_misuse_is_one_line_and_exit_2(name, tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    args = [a.replace("{work}", str(tmp_path)) for a in MISUSES[name][0]]
    rc, out, err = run_experiments(*args, cwd=tmp_path)
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in err and "Traceback" not in out, err
    assert err.endswith("\n") and err.count("\n") == 1, err  # exactly one line
    for word in MISUSES[name][1]:
        assert word in err, (word, err)
    assert out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # nothing was written
