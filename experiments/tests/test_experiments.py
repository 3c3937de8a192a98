"""experiments: the init-depth experiment in quick mode, and its building blocks."""

import math

import numpy as np
import pytest

import experiments
import linearkit as lk
from experiments import init_depth as E

ROWS = [(t, d, i) for t in ("mnist1d", "gmm128") for d in (8, 16) for i in E.INITS]


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    pytest.importorskip("matplotlib")
    out = tmp_path_factory.mktemp("init_depth")
    return E.run(out, quick=True, seed=0, verbose=False), out


def test_quick_run_has_every_row_with_finite_numbers(quick):
    result, _ = quick
    assert [(r.task, r.depth, r.init) for r in result.runs] == ROWS
    for r in result.runs:
        assert len(r.train_loss) == result.config.epochs + 1 == 4
        for epoch in (0, 1, 3):
            assert math.isfinite(r.loss_after(epoch))
        assert math.isfinite(r.final_loss) and not r.diverged
        assert math.isfinite(r.test_loss) and 0.0 <= r.test_acc <= 1.0
        assert r.stats is not None and r.stats.layers
    table = result.table()
    assert len(table.splitlines()) == len(ROWS) + 2
    assert "nan" not in table.lower()
    # The Adam supplement: the small, default and Kaiming inits on the 128-d task.
    assert [(r.task, r.depth, r.init, r.optimizer) for r in result.adam_runs] == [
        ("gmm128", d, i, "adam") for d in (8, 16) for i in ("small", "default", "kaiming")]
    for r in result.adam_runs:
        assert all(math.isfinite(v) for v in r.train_loss) and 0.0 <= r.test_acc <= 1.0
    assert "Supplement, Adam" in str(result)


def test_quick_run_writes_the_page_and_plots(quick):
    _, out = quick
    names = sorted(p.name for p in out.iterdir())
    assert names == ["init_experiment_quick.md", "init_experiment_quick.png",
                     "init_experiment_quick_stats.png"]
    for png in ("init_experiment_quick.png", "init_experiment_quick_stats.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "init_experiment_quick.md").read_text(encoding="utf-8")
    assert "Quick smoke run" in page
    assert "(init_experiment_quick.png)" in page and "(init_experiment_quick_stats.png)" in page
    table_lines = [line for line in page.splitlines()
                   if line.startswith(("| mnist1d", "| gmm128"))]
    assert len(table_lines) == len(ROWS) + 6  # + the Adam supplement
    assert "## What we measured, in short" in page and "## Supplement" in page
    assert "*Kaiming drops fast in epoch 1*" in page
    assert "- depth 8: N(0, 0.01²)" in page and "- depth 16: N(0, 0.01²)" in page


def test_kaiming_flags_nothing_and_small_init_is_flagged_at_init(quick):
    result, _ = quick
    for task in ("mnist1d", "gmm128"):
        assert result.get(task, 16, "kaiming").stats.flags == []
        assert result.get(task, 16, "small").stats.flagged("vanishing_activation")


def test_build_mlp_layers_and_inits():
    rng = np.random.default_rng(0)
    model = E.build_mlp(128, 8, "kaiming", rng=rng)
    linears = [m for m in model if isinstance(m, lk.Linear)]
    assert len(linears) == 8 and len(model) == 15
    assert all(isinstance(m, lk.ReLU) for m in list(model)[1::2])
    assert (linears[0].in_features, linears[-1].out_features) == (128, 10)
    w = np.concatenate([m.weight.data.ravel() for m in linears[1:-1]])
    assert abs(w.std() - math.sqrt(2 / 256)) < 0.002
    assert all(np.all(m.bias.data == 0) for m in linears)

    small = E.build_mlp(40, 8, "small", rng=1)
    w = np.concatenate([m.weight.data.ravel() for m in small if isinstance(m, lk.Linear)])
    assert abs(w.std() - 0.01) < 2e-4 and abs(w.mean()) < 2e-4

    const = E.build_mlp(40, 8, "constant", rng=1)
    assert all(np.all(m.weight.data == np.float32(0.01)) for m in const
               if isinstance(m, lk.Linear))
    h = const[:3](np.random.default_rng(2).normal(size=(5, 40)).astype(np.float32))
    assert np.all(h == h[:, :1])  # every unit of a layer computes the same number

    xavier = E.build_mlp(40, 3, "xavier", rng=1)
    assert np.abs(xavier[2].weight.data).max() <= math.sqrt(6 / 512)

    default = E.build_mlp(40, 3, "default", rng=1)
    bound = 1 / math.sqrt(256)
    assert np.abs(default[2].weight.data).max() <= bound
    assert np.abs(default[2].bias.data).max() <= bound and np.any(default[2].bias.data != 0)

    with pytest.raises(ValueError, match="unknown init"):
        E.build_mlp(4, 2, "orthogonal")


def test_same_seed_same_weights_for_every_run():
    a = E.build_mlp(40, 4, "xavier", rng=np.random.default_rng([0, 4]))
    b = E.build_mlp(40, 4, "xavier", rng=np.random.default_rng([0, 4]))
    for (k, v), (_, u) in zip(a.state_dict().items(), b.state_dict().items()):
        np.testing.assert_array_equal(v, u, err_msg=k)


def test_gmm128_task_is_fixed_and_well_formed():
    xtr, ytr, xte, yte = E.make_task("gmm128")
    assert xtr.shape == (4000, 128) and xte.shape == (1000, 128)
    assert xtr.dtype == np.float32 and ytr.dtype == np.int64
    counts = np.bincount(ytr, minlength=10)
    assert counts.min() > 300 and counts.max() < 500
    again = E.make_task("gmm128", E.Config(seed=7))
    np.testing.assert_array_equal(xtr, again[0])
    np.testing.assert_array_equal(yte, again[3])
    with pytest.raises(ValueError, match="unknown task"):
        E.make_task("cifar")


def test_main_parses_the_cli_options(tmp_path, capsys):
    assert E.main(["--quick", "--out", str(tmp_path), "--epochs", "1", "--no-write"]) == 0
    out = capsys.readouterr().out
    assert "loss@final" in out and "1 epochs" in out
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(SystemExit):
        E.main(["--epochs", "0"])
    # A caller may pass the experiment's name along: `init-depth --quick ...`.
    assert E.main(["init-depth", "--quick", "--epochs", "1", "--no-write"]) == 0


def test_experiments_registry():
    assert experiments.get("init-depth") is E
    with pytest.raises(ValueError, match="unknown experiment"):
        experiments.get("nope")
    assert experiments.main([]) == 2


def test_default_output_is_runs_not_docs(tmp_path, monkeypatch):
    assert E.DEFAULT_OUT_DIR == "runs/init-depth".replace("/", __import__("os").sep)
    seen = {}
    monkeypatch.setattr(E, "run", lambda out_dir, **kw: seen.update(out_dir=out_dir, **kw))
    monkeypatch.chdir(tmp_path)
    assert E.main(["--quick"]) == 0
    assert seen["out_dir"] == E.DEFAULT_OUT_DIR and seen["write"] is True
    assert list(tmp_path.iterdir()) == []  # the write check leaves nothing behind
    assert E.main(["--out-dir", str(tmp_path / "mine")]) == 0
    assert seen["out_dir"] == str(tmp_path / "mine") and seen["quick"] is False
    # The repository's docs/ only when asked.
    assert E.main(["--write-docs"]) == 0
    assert seen["out_dir"] == E.repo_docs() and (E.repo_docs() / "init_experiment.md").is_file()


def test_run_defaults_to_runs_folder():
    import inspect

    from experiments import init_depth

    assert inspect.signature(init_depth.run).parameters["out_dir"].default == E.DEFAULT_OUT_DIR


@pytest.mark.parametrize("argv, words", [
    (["--quick", "--write-docs"], ["--write-docs", "--quick"]),
    (["--write-docs", "--out-dir", "x"], ["--write-docs chooses the folder"]),
    (["--write-docs", "--no-write"], ["--write-docs chooses the folder"]),
    (["--epochs", "0"], ["--epochs", "must be >= 1"]),
    (["--seed", "-2"], ["--seed", "must be >= 0"]),
])
def test_main_rejects_bad_options_in_one_line(argv, words, capsys, monkeypatch):
    monkeypatch.setattr(E, "run", lambda *a, **k: pytest.fail("ran despite a bad option"))
    with pytest.raises(SystemExit) as info:
        E.main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1
    for word in words:
        assert word in err


def test_missing_matplotlib_is_caught_before_training_and_names_the_cli_flag(
        tmp_path, capsys, monkeypatch):
    import sys

    def hide_matplotlib():  # every `import matplotlib...` raises ImportError, loaded or not
        for name in [m for m in sys.modules if m.split(".")[0] == "matplotlib"] + ["matplotlib"]:
            monkeypatch.setitem(sys.modules, name, None)

    hide_matplotlib()
    monkeypatch.setattr(E, "run", lambda *a, **k: pytest.fail("trained without matplotlib"))
    with pytest.raises(SystemExit) as info:
        E.main(["--quick", "--out-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1
    assert 'pip install "linearkit[plot]"' in err and "--no-write" in err
    assert "write=False" not in err  # the Python argument is not the CLI's hint
    with pytest.raises(ImportError, match="--no-write"):  # the plots' own hint names it too
        from experiments.init_depth_plots import _figure

        _figure(1, 1, (2, 2))
