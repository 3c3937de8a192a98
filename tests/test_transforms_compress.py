"""`linearkit compress` and transforms.pipeline.compress: model files in, smaller files out,
each step checked on probe inputs; misuse is one line and exit status 2."""

import subprocess
import sys

import numpy as np
import pytest

import linearkit as lk
from linearkit.cli.commands import main
from linearkit.io.convert import load_any
from linearkit.transforms.pipeline import compress


def _model():
    """A deliberately redundant MLP: a bias before BatchNorm, two Linears with no activation."""
    lk.manual_seed(0)
    model = lk.Sequential(lk.Linear(12, 32), lk.BatchNorm1d(32), lk.ReLU(), lk.Linear(32, 32),
                          lk.Identity(), lk.Linear(32, 5))
    bn = model[1]
    rng = np.random.default_rng(1)
    bn.running_mean[:] = rng.standard_normal(32)
    bn.running_var[:] = rng.uniform(0.5, 2.0, 32)
    return model.eval()


def _x(rows=50):
    return np.random.default_rng(2).standard_normal((rows, 12)).astype(np.float32)


def test_fold_then_merge_is_exact_and_smaller():
    model = _model()
    new, (fold, merge) = compress(model, fold=True, merge=True)
    assert [type(m).__name__ for m in new] == ["Linear", "ReLU", "Linear"]
    np.testing.assert_allclose(new(_x()), model(_x()), rtol=1e-5, atol=1e-5)
    assert fold.transform == "fold_norm" and merge.transform == "merge_linear"
    assert merge.params_after < merge.params_before and merge.max_rel_error < 1e-5
    assert isinstance(model[1], lk.BatchNorm1d)  # the input model is untouched


def test_the_pipeline_refuses_what_cannot_hold():
    with pytest.raises(ValueError, match="nothing to do"):
        compress(_model())
    with pytest.raises(ValueError, match="not both"):
        compress(_model(), rank=2, energy=0.9)
    with pytest.raises(ValueError, match="do not combine"):
        compress(_model(), prune=0.5, int8=True)


def test_cli_compress_writes_a_loadable_smaller_file(tmp_path, capsys):
    src, out = tmp_path / "m.safetensors", tmp_path / "small.safetensors"
    model = _model()
    lk.save(model, src)
    probe = tmp_path / "x.npy"
    np.save(probe, _x(20))
    assert main(["compress", str(src), "-o", str(out), "--fold", "--merge", "--int8",
                 "--probe", str(probe)]) == 0
    text = capsys.readouterr().out
    assert "fold_norm:" in text and "merge_linear:" in text and "quantize(int8):" in text
    assert f"wrote {out}" in text
    small = lk.load_model(out)
    assert out.stat().st_size < src.stat().st_size / 2
    np.testing.assert_allclose(small(_x()), model(_x()), atol=0.05 * np.abs(model(_x())).max())


def test_cli_compress_prunes_into_sparse_layers(tmp_path, capsys):
    pytest.importorskip("scipy")
    src, out = tmp_path / "m.safetensors", tmp_path / "sparse.safetensors"
    lk.save(_model(), src)
    # a random model: pruning 90% moves its outputs past the no-data limit, so it is forced
    assert main(["compress", str(src), "-o", str(out), "--prune", "0.9", "--force"]) == 0
    assert "to_sparse:" in capsys.readouterr().out
    assert any(type(m).__name__ == "SparseLinear" for m in lk.load_model(out).modules())


def test_cli_compress_takes_a_torch_state_dict_with_an_architecture(tmp_path):
    torch = pytest.importorskip("torch")
    arch, pt, out = (tmp_path / n for n in ("arch.safetensors", "w.pt", "o.safetensors"))
    model = _model()
    lk.save(model, arch)
    torch.save({k: torch.from_numpy(np.array(v)) for k, v in model.state_dict().items()}, pt)
    assert main(["compress", str(pt), "--arch", str(arch), "-o", str(out), "--merge"]) == 0
    np.testing.assert_allclose(lk.load_model(out)(_x()), model(_x()), rtol=1e-5, atol=1e-5)
    with pytest.raises(lk.FormatError, match="no architecture"):
        load_any(str(pt))


@pytest.mark.parametrize("args, phrase", [
    (["compress", "NOPE.safetensors", "-o", "o.safetensors", "--merge"], "no such file"),
    (["compress", "{src}", "-o", "o.onnx", "--merge"], "writes a self-describing .safetensors"),
    (["compress", "{src}", "-o", "{src}", "--merge"], "is the input file"),
    (["compress", "{src}", "-o", "o.safetensors"], "nothing to do"),
    (["compress", "{src}", "-o", "o.safetensors", "--prune", "1.5"], "[0, 1)"),
    (["compress", "{src}", "-o", "o.safetensors", "--rank", "2", "--energy", "0.9"],
     "not allowed with"),
    (["compress", "{src}", "-o", "o.safetensors", "--int8", "--prune", "0.5"], "do not combine"),
    (["compress", "{train}", "-o", "o.safetensors", "--fold"], "no architecture"),
])
def test_compress_misuse_is_one_line_and_exit_2(args, phrase, tmp_path):
    src, train = tmp_path / "m.safetensors", tmp_path / "w.safetensors"
    lk.save(_model(), src)
    lk.save(_model().state_dict(), train)
    args = [a.format(src=src, train=train) for a in args]
    done = subprocess.run([sys.executable, "-m", "linearkit.cli", *args], cwd=tmp_path,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert phrase in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert len(lines) <= 2  # the error, and a FormatError's hint line


def test_cli_compress_reads_an_onnx_mlp(tmp_path):
    pytest.importorskip("onnx")
    lk.manual_seed(3)
    model = lk.Sequential(lk.Linear(12, 16), lk.Linear(16, 16), lk.ReLU(), lk.Linear(16, 4))
    src, out = tmp_path / "m.onnx", tmp_path / "m.safetensors"
    lk.io.export_onnx(model.eval(), src, (1, 12))
    assert main(["compress", str(src), "-o", str(out), "--merge"]) == 0
    merged = lk.load_model(out)
    assert sum(isinstance(m, lk.Linear) for m in merged.modules()) == 2
    np.testing.assert_allclose(merged(_x()), model(_x()), rtol=1e-5, atol=1e-5)
