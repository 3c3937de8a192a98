"""The rules of Bilinear and RMSNorm: the ledger's row (costs against the multiply-adds the code
runs, saved bytes against the real closures, the torch path), model files (a header that
disagrees is refused before allocating), ONNX export (RMSNorm in onnxruntime and onnx's
reference evaluator, Bilinear refused by name)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from closure_oracle import closure_bytes

import linearkit as lk
from linearkit.analysis.ledger import ledger
from linearkit.rules import rule_for


def draw(shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


class _MacCounter:
    """Counts the multiply-adds of every ``np.tensordot`` and ``np.matmul`` while installed:
    the product of the output's size and the contracted dims' sizes."""

    def __init__(self, monkeypatch):
        self.macs = 0
        real_dot, real_mm = np.tensordot, np.matmul

        def tensordot(a, b, axes=2):
            out = real_dot(a, b, axes=axes)
            self.macs += out.size * math.prod(np.shape(a)[i] for i in axes[0])
            return out

        def matmul(a, b, *args, **kwargs):
            out = real_mm(a, b, *args, **kwargs)
            self.macs += out.size * np.shape(a)[-1]
            return out

        monkeypatch.setattr(np, "tensordot", tensordot)
        monkeypatch.setattr(np, "matmul", matmul)


# ---------------------------------------------------------------- ledger: Bilinear
@pytest.mark.parametrize("shape", [(6, 3), (2, 5, 3), (3,)])
@pytest.mark.parametrize("need_dx", [False, True])
def test_bilinear_macs_are_the_multiply_adds_the_code_runs(shape, need_dx, monkeypatch):
    layer = lk.Bilinear(3, 4, 5)
    x1, x2 = draw(shape), draw(shape[:-1] + (4,), seed=1)
    macs, _, bias, _, bwd_macs, _ = rule_for(layer).cost(layer, shape, need_dx)
    counter = _MacCounter(monkeypatch)
    y, backward = layer.vjp(x1, x2, input_grad=need_dx)
    assert counter.macs == macs
    counter.macs = 0
    backward(np.ones_like(y))
    assert counter.macs == bwd_macs
    B = math.prod(shape[:-1])
    assert macs == B * 5 * 4 * (3 + 1) and bias == B * 5


def test_bilinear_row_params_flops_and_saved_bytes():
    layer = lk.Bilinear(3, 4, 5)
    row = ledger(layer, (6, 3))[""]
    B, full = 6, 6 * 3 * 5 * 4
    assert (row.type, row.kind, row.params, row.output_shape) == ("Bilinear(3, 4, 5)", "bilinear",
                                                                   5 * 3 * 4 + 5, (6, 5))
    assert row.flops == 2 * (full + B * 5 * 4) + B * 5
    # first layer: no dx; dW from g = dy ⊗ x1 (B·out·in1 products), db
    assert row.backward_macs == full and row.backward_flops == 2 * full + B * 5 * 3 + B * 5
    _, backward = layer.vjp(draw((6, 3)), draw((6, 4), seed=1), input_grad=False)
    assert row.saved_bytes == closure_bytes(backward, layer) == (6 * 3 + 6 * 4) * 4
    layer.requires_grad_(False)
    frozen = ledger(layer, (6, 3))[""]
    assert frozen.saved_bytes == frozen.backward_flops == 0
    _, backward = layer.vjp(draw((6, 3)), draw((6, 4), seed=1), input_grad=False)
    assert closure_bytes(backward, layer) == 0
    assert ledger(lk.Bilinear(3, 4, 5, bias=False), (6, 3))[""].type == \
        "Bilinear(3, 4, 5, bias=False)"


def test_a_bilinear_in_a_users_module_is_costed_by_its_rule_on_both_paths():
    """Inside a module without a rule the ledger runs it once; the Bilinear called there is a row
    of its own, costed by its rule, and torch's nn.Bilinear gets the same row on the torch
    path."""
    torch = pytest.importorskip("torch")

    class Gate(lk.Module):
        def __init__(self):
            super().__init__()
            self.mix = lk.Bilinear(4, 4, 3)

        def forward(self, x):
            return self.mix(x, x)

        def vjp(self, x, input_grad=True):
            y, back = self.mix.vjp(x, x, input_grad=input_grad)

            def backward(dy):
                grads = back(dy)
                return None if grads is None else grads[0] + grads[1]

            return y, backward

    class TorchGate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mix = torch.nn.Bilinear(4, 4, 3)

        def forward(self, x):
            return self.mix(x, x)

    ours, theirs = ledger(Gate(), (5, 4))["mix"], ledger(TorchGate(), (5, 4))["mix"]
    assert ours.type == theirs.type == "Bilinear(4, 4, 3)"
    assert (ours.params, ours.macs, ours.flops) == (theirs.params, theirs.macs, theirs.flops)
    assert ours.macs == 5 * 3 * 4 * 5


# ---------------------------------------------------------------- ledger: RMSNorm
@pytest.mark.parametrize("affine", [True, False])
def test_rms_norm_row(affine):
    norm = lk.RMSNorm((3, 4), elementwise_affine=affine)
    model = lk.Sequential(lk.Linear(4, 4), norm)  # a layer before it: dx is computed
    L = ledger(model, (2, 3, 4))
    row, n = L["1"], 2 * 3 * 4
    assert (row.type, row.kind, row.params) == ("RMSNorm((3, 4))", "rmsnorm", 12 * affine)
    assert row.flops == n * (3 + affine)
    assert row.backward_flops == n * (5 + affine) + 2 * n * affine
    assert row.saved_bytes == n * 4 + 2 * 8  # xhat, and a float64 rstd per normalized row
    _, backward = norm.vjp(draw((2, 3, 4)))
    assert closure_bytes(backward, norm) == row.saved_bytes
    assert "fold_norm" in rule_for(norm).transforms


def test_rms_norm_shape_check_is_the_forwards():
    with pytest.raises(lk.ShapeError) as real:
        lk.RMSNorm(4)(np.zeros((4, 3), np.float32))
    with pytest.raises(lk.ShapeError) as shape_only:
        ledger(lk.RMSNorm(4), (4, 3))
    assert str(shape_only.value) == str(real.value)


# ---------------------------------------------------------------- model files
def test_a_model_file_whose_bilinear_weight_disagrees_is_refused_before_building(tmp_path):
    import json

    from linearkit.io.model_file import SPEC_KEY, read_spec

    layer, path = lk.Bilinear(3, 4, 2), tmp_path / "m.safetensors"
    lk.save(layer, path)
    spec = read_spec(path)
    spec["root"]["args"]["in2_features"] = 5  # the file's weight is (2, 3, 4)
    lk.save(layer.state_dict(), path, metadata={SPEC_KEY: json.dumps(spec)})
    with pytest.raises(lk.FormatError, match=r"weight.*\(2, 3, 5\)") as err:
        lk.load_model(path)
    assert "Bilinear" in str(err.value)


# ---------------------------------------------------------------- ONNX
onnx_cases = pytest.mark.parametrize("opset", [17, 18, 23])


def _run(path, x, engine):
    if engine == "onnxruntime":
        ort = pytest.importorskip("onnxruntime")
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return session.run(None, {"input": x})[0]
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(str(path)).run(None, {"input": x})[0]


@onnx_cases
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("engine", ["onnxruntime", "reference"])
def test_rms_norm_exports_and_runs_as_linearkit(opset, dtype, engine, tmp_path):
    onnx = pytest.importorskip("onnx")
    from linearkit.io.onnx_export import export_onnx

    rng = np.random.default_rng(3)
    model = lk.Sequential(lk.Linear(5, 4, dtype=dtype, rng=rng), lk.RMSNorm(4, dtype=dtype),
                          lk.Linear(4, 2, dtype=dtype, rng=rng),
                          lk.RMSNorm(2, eps=1e-3, elementwise_affine=False, dtype=dtype))
    model[1].weight.data[...] = rng.uniform(0.5, 1.5, 4)
    path = export_onnx(model, tmp_path / "m.onnx", (3, 5), opset=opset)
    ops = [n.op_type for n in onnx.load(path).graph.node]
    assert ("RMSNormalization" in ops) == (opset >= 23)
    from linearkit.io.onnx_import import import_onnx

    node = "RMSNormalization" if opset >= 23 else "ReduceMean"
    with pytest.raises(lk.FormatError, match=rf"node '1/rmsnorm\w*' \({node}\): unsupported"):
        import_onnx(path)  # export only: the importer names the node it has no layer for
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == np.float32 else {"rtol": 1e-10, "atol": 1e-12}
    for batch in (1, 4):
        x = draw((batch, 5), dtype, seed=batch)
        np.testing.assert_allclose(_run(path, x, engine), model(x), **tol)


def test_rms_norm_over_two_dims_exports(tmp_path):
    pytest.importorskip("onnx")
    from linearkit.io.onnx_export import export_onnx

    model = lk.RMSNorm((3, 4), dtype=np.float64)
    model.weight.data[...] = np.random.default_rng(4).uniform(0.5, 1.5, (3, 4))
    x = draw((2, 3, 4), np.float64)
    for opset in (17, 18, 23):
        path = export_onnx(model, tmp_path / f"m{opset}.onnx", (2, 3, 4), opset=opset)
        np.testing.assert_allclose(_run(path, x, "onnxruntime"), model(x), rtol=1e-10,
                                   atol=1e-12)


def test_bilinear_export_is_refused_by_name(tmp_path):
    pytest.importorskip("onnx")
    from linearkit.io.onnx_export import OnnxExportError, export_onnx

    model = lk.Sequential(lk.Linear(3, 3), lk.Bilinear(3, 3, 2))
    with pytest.raises(OnnxExportError, match=r"module '1' \(Bilinear\): Bilinear takes two "
                                              r"inputs") as err:
        export_onnx(model, tmp_path / "m.onnx", (4, 3))
    assert not (tmp_path / "m.onnx").exists() and "hint:" in str(err.value)
    assert "Einsum" in str(err.value)
