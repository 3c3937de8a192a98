"""linearkit.io.onnx_export / onnx_import: every layer type written to ONNX passes the full
checker and runs in onnxruntime and onnx's ReferenceEvaluator with linearkit's outputs (batch 1,
4, 9 and a 3-D input); import_onnx reads the file back (and hand-built and torch-written graphs)
to the same outputs; what cannot be written or read is refused by name."""

import os
import sys

import numpy as np
import pytest

import linearkit as lk
from linearkit.errors import FormatError

onnx = pytest.importorskip("onnx")
from fresh_process import imports
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from linearkit.io.onnx_export import OnnxExportError, export_onnx
from linearkit.io.onnx_import import import_onnx
from linearkit.rules import register_rule, rule_for

try:
    import onnxruntime
except ImportError:  # pragma: no cover - depends on the environment
    onnxruntime = None

F32 = {"rtol": 1e-5, "atol": 1e-5}
ENGINES = ["reference", pytest.param("onnxruntime", marks=pytest.mark.skipif(
    onnxruntime is None, reason="onnxruntime is not installed: pip install 'linearkit[onnx]'"))]


def run_onnx(path, x, engine):
    if engine == "onnxruntime":
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return session.run(None, {"input": x})[0]
    return ReferenceEvaluator(str(path)).run(None, {"input": x})[0]


def trained_bn(c):
    bn = lk.BatchNorm1d(c)
    bn(np.random.default_rng(1).standard_normal((16, c)).astype(np.float32) * 3 + 1)
    return bn


# name -> (model factory, input shape without the batch dim)
CASES = {
    "linear": (lambda: lk.Linear(5, 3), (5,)),
    "linear_nobias": (lambda: lk.Sequential(lk.Linear(5, 3, bias=False)), (5,)),
    "relu": (lambda: lk.Sequential(lk.Linear(5, 4), lk.ReLU()), (5,)),
    "leakyrelu": (lambda: lk.Sequential(lk.Linear(5, 4), lk.LeakyReLU(0.2)), (5,)),
    "gelu": (lambda: lk.Sequential(lk.Linear(5, 4), lk.GELU()), (5,)),
    "gelu_tanh": (lambda: lk.Sequential(lk.Linear(5, 4), lk.GELU("tanh")), (5,)),
    "tanh": (lambda: lk.Sequential(lk.Linear(5, 4), lk.Tanh()), (5,)),
    "sigmoid": (lambda: lk.Sequential(lk.Linear(5, 4), lk.Sigmoid()), (5,)),
    "silu": (lambda: lk.Sequential(lk.Linear(5, 4), lk.SiLU()), (5,)),
    "softmax": (lambda: lk.Sequential(lk.Linear(5, 4), lk.Softmax(dim=1)), (5,)),
    "logsoftmax": (lambda: lk.Sequential(lk.Linear(5, 4), lk.LogSoftmax(dim=-1)), (5,)),
    "layernorm": (lambda: lk.Sequential(lk.Linear(5, 4), lk.LayerNorm(4, eps=1e-3)), (5,)),
    "layernorm_plain": (lambda: lk.Sequential(lk.LayerNorm(5, elementwise_affine=False)), (5,)),
    "layernorm_2d": (lambda: lk.Sequential(lk.LayerNorm((3, 4), bias=False)), (3, 4)),
    "batchnorm": (lambda: lk.Sequential(lk.Linear(5, 4), trained_bn(4)), (5,)),
    "flatten": (lambda: lk.Sequential(lk.Flatten(), lk.Linear(12, 3)), (3, 4)),
    "flatten_mid": (lambda: lk.Sequential(lk.Flatten(1, 2), lk.Linear(4, 3)), (2, 3, 4)),
    "flatten_batch": (lambda: lk.Sequential(lk.Flatten(0, 1), lk.Linear(4, 3)), (3, 4)),
    "residual": (lambda: lk.Sequential(lk.Linear(5, 4), lk.Residual(
        lk.Sequential(lk.Linear(4, 4), lk.Tanh())), lk.Residual(lk.Linear(4, 4))), (5,)),
    "dropout_identity": (lambda: lk.Sequential(lk.Linear(5, 4), lk.Dropout(0.5), lk.Identity(),
                                               lk.Linear(4, 2)), (5,)),
}


def randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.fixture(scope="module", params=sorted(CASES))
def exported(request, tmp_path_factory):
    factory, shape = CASES[request.param]
    model = factory().eval()
    path = tmp_path_factory.mktemp("onnx") / f"{request.param}.onnx"
    export_onnx(model, path, (4, *shape))
    return model, shape, path


def test_file_passes_the_full_checker(exported):
    onnx.checker.check_model(onnx.load(exported[2]), full_check=True)


@pytest.mark.parametrize("engine", ENGINES)
def test_outputs_equal_linearkit_for_batch_1_4_9(exported, engine):
    model, shape, path = exported
    for batch in (1, 4, 9):
        x = randn(batch, *shape, seed=batch)
        np.testing.assert_allclose(run_onnx(path, x, engine), model(x), **F32)


def test_import_onnx_round_trip(exported):
    model, shape, path = exported
    back = import_onnx(path)
    assert isinstance(back, lk.Sequential) and not back.training
    x = randn(9, *shape, seed=3)
    np.testing.assert_allclose(back(x), model(x), **F32)


def op_types(path):
    return [n.op_type for n in onnx.load(path).graph.node]


def test_3d_input_is_matmul_add_and_runs(tmp_path):
    model = lk.Sequential(lk.Linear(5, 4), lk.GELU(), lk.LayerNorm(4), lk.Linear(4, 3)).eval()
    export_onnx(model, tmp_path / "m.onnx", (2, 7, 5))
    ops = op_types(tmp_path / "m.onnx")
    assert "Gemm" not in ops and ops.count("MatMul") == 2 and "LayerNormalization" in ops
    for engine in ("reference", "onnxruntime") if onnxruntime else ("reference",):
        for batch in (1, 4, 9):
            x = randn(batch, 7, 5, seed=batch)
            np.testing.assert_allclose(run_onnx(tmp_path / "m.onnx", x, engine), model(x), **F32)
    x = randn(3, 7, 5)
    np.testing.assert_allclose(import_onnx(tmp_path / "m.onnx")(x), model(x), **F32)


def test_2d_linear_is_one_gemm_transb_and_batch_is_dynamic(tmp_path):
    export_onnx(lk.Linear(5, 3), tmp_path / "m.onnx", (4, 5))
    proto = onnx.load(tmp_path / "m.onnx")
    gemm = proto.graph.node[0]
    assert gemm.op_type == "Gemm" and helper.get_attribute_value(gemm.attribute[0]) == 1
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    export_onnx(lk.Linear(5, 3), tmp_path / "fixed.onnx", (4, 5), dynamic_batch=False)
    dims = onnx.load(tmp_path / "fixed.onnx").graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in dims] == [4, 5]


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_is_the_op_from_opset_20_and_a_formula_before(tmp_path, approximate):
    model = lk.Sequential(lk.Linear(5, 4), lk.GELU(approximate)).eval()
    x = randn(9, 5) * 3
    for opset in (17, 20):
        path = export_onnx(model, tmp_path / f"{opset}.onnx", (4, 5), opset=opset)
        assert ("Gelu" in op_types(path)) == (opset == 20)
        np.testing.assert_allclose(run_onnx(path, x, "reference"), model(x), **F32)
        assert import_onnx(path)[1].approximate == approximate


def gemm_graph(tmp_path, b, c, **attrs):
    n_in, n_out = b.shape[::-1] if attrs.get("transB") else b.shape
    nodes = [helper.make_node("Gemm", ["x", "B", "C"], ["y"], name="fc", **attrs)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", n_in])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", n_out])],
        [numpy_helper.from_array(b, "B"), numpy_helper.from_array(c, "C")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(proto, full_check=True)
    onnx.save(proto, tmp_path / "gemm.onnx")
    return tmp_path / "gemm.onnx"


def test_hand_built_gemm_with_alpha_beta_and_transb_0_imports(tmp_path):
    b, c = randn(6, 3, seed=1), randn(3, seed=2)  # B is (in, out): transB=0
    path = gemm_graph(tmp_path, b, c, alpha=0.5, beta=2.0, transB=0)
    model = import_onnx(path)
    x = randn(4, 6)
    expected = 0.5 * x @ b + 2.0 * c
    np.testing.assert_allclose(model(x), expected, **F32)
    np.testing.assert_allclose(ReferenceEvaluator(str(path)).run(None, {"x": x})[0], expected,
                               **F32)
    np.testing.assert_allclose(model[0].weight.data, 0.5 * b.T, **F32)  # (out, in)


def test_gemm_transa_is_refused_by_name(tmp_path):
    path = gemm_graph(tmp_path, randn(6, 3), randn(3), transA=1)
    with pytest.raises(FormatError, match=r"node 'fc' \(Gemm\).*transA=1") as info:
        import_onnx(path)
    assert str(path) in str(info.value)


def test_unsupported_node_is_named(tmp_path):
    export_onnx(lk.Sequential(lk.Linear(5, 4), lk.ReLU()), tmp_path / "m.onnx", (4, 5))
    proto = onnx.load(tmp_path / "m.onnx")
    relu = next(n for n in proto.graph.node if n.op_type == "Relu")
    relu.op_type, relu.name = "Conv", "my_conv"
    onnx.save(proto, tmp_path / "conv.onnx")
    with pytest.raises(FormatError, match=r"node 'my_conv' \(Conv\): unsupported operator"):
        import_onnx(tmp_path / "conv.onnx")


def test_not_an_onnx_file_is_a_format_error(tmp_path):
    (tmp_path / "junk.onnx").write_bytes(b"\xff\xfe not protobuf \x00" * 7)
    with pytest.raises(FormatError, match="junk.onnx: not an ONNX model"):
        import_onnx(tmp_path / "junk.onnx")
    with pytest.raises(FileNotFoundError):
        import_onnx(tmp_path / "missing.onnx")


def test_training_batchnorm_and_dropout_are_refused(tmp_path):
    model = lk.Sequential(lk.Linear(5, 4), lk.Sequential(trained_bn(4)))
    with pytest.raises(OnnxExportError, match=r"(?s)module '1\.0' \(BatchNorm1d\).*training.*"
                                              r"model\.eval\(\)"):
        export_onnx(model.train(), tmp_path / "m.onnx", (4, 5))
    with pytest.raises(OnnxExportError, match=r"(?s)module '1' \(Dropout\).*model\.eval\(\)"):
        export_onnx(lk.Sequential(lk.Linear(5, 4), lk.Dropout(0.1)), tmp_path / "m.onnx", (4, 5))
    no_stats = lk.Sequential(lk.BatchNorm1d(5, track_running_stats=False)).eval()
    with pytest.raises(OnnxExportError, match="no running statistics"):
        export_onnx(no_stats, tmp_path / "m.onnx", (4, 5))
    assert not os.path.exists(tmp_path / "m.onnx")
    assert os.listdir(tmp_path) == []  # no temp file either


class Scale(lk.Module):
    def forward(self, x):
        return 2 * x


def test_module_without_onnx_rule_names_path_and_type(tmp_path):
    model = lk.Sequential(lk.Linear(5, 4), lk.Residual(Scale()))
    with pytest.raises(OnnxExportError, match=r"module '1\.module' \(Scale\): no ONNX rule"):
        export_onnx(model, tmp_path / "m.onnx", (4, 5))
    with pytest.raises(OnnxExportError, match="LazyLinear is uninitialized"):
        export_onnx(lk.Sequential(lk.LazyLinear(3)), tmp_path / "m.onnx", (4, 5))


def test_a_users_rule_makes_its_type_exportable(tmp_path):
    from linearkit.rules import LayerRule

    def emit(m, g, x):
        return g.op("Mul", [x, g.const(np.array(2.0), "two")], "scale")

    with register_rule(Scale, LayerRule(kind="scale", onnx=emit)):
        model = lk.Sequential(lk.Linear(5, 4), Scale())
        path = export_onnx(model, tmp_path / "m.onnx", (4, 5))
    x = randn(3, 5)
    np.testing.assert_allclose(run_onnx(path, x, "reference"), model(x), **F32)
    assert rule_for(Scale) is None


class Loop(lk.Module):
    """x (*, 4) -> y (*, 4): ``tanh(layer(x))`` for each layer of a ModuleList, in order."""

    def __init__(self, n=3):
        super().__init__()
        self.layers = lk.ModuleList([lk.Linear(4, 4) for _ in range(n)])
        self.act = lk.Tanh()

    def forward(self, x):
        for layer in self.layers:
            x = self.act(layer(x))
        return x


def _emit_loop(m, g, x):
    """Loop's forward, written out: each held layer in order, then the shared Tanh."""
    for i, layer in enumerate(m.layers):
        x = g.visit(m.act, "act", g.visit(layer, f"layers.{i}", x))
    return x


def test_a_module_list_exports_through_the_module_that_calls_it(tmp_path):
    from linearkit.rules import LayerRule

    lk.manual_seed(4)
    model = Loop()
    with pytest.raises(OnnxExportError, match=r"model \(Loop\): no ONNX rule"):
        export_onnx(model, tmp_path / "m.onnx", (2, 4))
    with register_rule(Loop, LayerRule(kind="loop", onnx=_emit_loop)):
        path = export_onnx(model, tmp_path / "m.onnx", (2, 4))
    names = [node.name for node in onnx.load(str(path)).graph.node]
    assert [n for n in names if n.endswith("gemm")] == [f"layers.{i}/gemm" for i in range(3)]
    x = randn(5, 4)
    for engine in ("reference",) + (("onnxruntime",) if onnxruntime is not None else ()):
        np.testing.assert_allclose(run_onnx(path, x, engine), model(x), **F32)


def test_a_module_list_or_dict_itself_is_refused_by_path(tmp_path):
    from linearkit.rules import LayerRule

    held = lk.Sequential(lk.Linear(5, 4), lk.ModuleList([lk.ReLU()]))
    with pytest.raises(OnnxExportError, match=r"(?s)module '1' \(ModuleList\): a ModuleList "
                                              r"has no forward.*hint: export the module that "
                                              r"holds the ModuleList"):
        export_onnx(held, tmp_path / "m.onnx", (2, 5))
    with pytest.raises(OnnxExportError, match=r"model \(ModuleDict\): a ModuleDict has no forward"):
        export_onnx(lk.ModuleDict({"a": lk.Linear(5, 4)}), tmp_path / "m.onnx", (2, 5))
    whole = LayerRule(kind="loop", onnx=lambda m, g, x: g.visit(m.layers, "layers", x))
    refused = r"module 'layers' \(ModuleList\): a ModuleList has no forward"
    with register_rule(Loop, whole), pytest.raises(OnnxExportError, match=refused):
        export_onnx(Loop(), tmp_path / "m.onnx", (2, 4))  # the emitter visits the list itself
    assert not (tmp_path / "m.onnx").exists()


def test_export_is_atomic_and_keeps_an_old_file_on_failure(tmp_path):
    path = tmp_path / "m.onnx"
    export_onnx(lk.Linear(5, 3), path, (4, 5))
    before = path.read_bytes()
    with pytest.raises(OnnxExportError):
        export_onnx(lk.Sequential(Scale()), path, (4, 5))
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["m.onnx"]
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask


def test_missing_onnx_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnx", None)
    with pytest.raises(ImportError, match=r'pip install "linearkit\[onnx\]"'):
        export_onnx(lk.Linear(5, 3), tmp_path / "m.onnx", (4, 5))
    with pytest.raises(ImportError, match=r'linearkit\[onnx\]'):
        import_onnx(tmp_path / "m.onnx")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_torch_onnx_export_of_an_mlp_imports(tmp_path):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 8), torch.nn.ReLU(),
                              torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3),
                              torch.nn.LogSoftmax(dim=1)).eval()
    path = tmp_path / "torch.onnx"
    torch.onnx.export(net, (torch.randn(2, 3, 4),), str(path), dynamo=False,
                      input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "n"}})
    model = import_onnx(path)
    x = randn(9, 3, 4)
    with torch.no_grad():
        expected = net(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(model(x), expected, **F32)


def test_a_graph_that_is_not_a_chain_is_refused_by_node(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r1"),
             helper.make_node("Tanh", ["x"], ["b"], name="branch"),
             helper.make_node("Add", ["a", "b"], ["y"], name="join")]
    proto = helper.make_model(helper.make_graph(nodes, "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(proto, tmp_path / "branch.onnx")
    with pytest.raises(FormatError, match=r"node 'branch' \(Tanh\): reads \['x'\]"):
        import_onnx(tmp_path / "branch.onnx")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 4])
    proto = helper.make_model(helper.make_graph(nodes, "g", [x, w], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(proto, tmp_path / "two_inputs.onnx")
    with pytest.raises(FormatError, match="one input and one output"):
        import_onnx(tmp_path / "two_inputs.onnx")


def test_import_onnx_does_not_load_onnx_into_linearkit_import():
    assert not imports("import linearkit, linearkit.rules", "onnx")


def test_float64_model_and_empty_model_and_a_wrong_input_shape(tmp_path):
    model = lk.Sequential(lk.Linear(5, 3, dtype=np.float64), lk.GELU()).eval()
    path = export_onnx(model, tmp_path / "f64.onnx", (4, 5))
    x = np.random.default_rng(0).standard_normal((3, 5))
    # (onnxruntime has no float64 Erf kernel; the reference evaluator runs it)
    np.testing.assert_allclose(run_onnx(path, x, "reference"), model(x), rtol=1e-7, atol=1e-7)
    assert import_onnx(path)[0].dtype == np.float64
    path = export_onnx(lk.Sequential(), tmp_path / "empty.onnx", (4, 5))
    np.testing.assert_array_equal(run_onnx(path, x.astype(np.float32), "reference"),
                                  x.astype(np.float32))
    assert len(import_onnx(path)) == 0
    with pytest.raises(lk.ShapeError, match=r"module '0' \(Linear.*expected input of shape "
                                            r"\(\*, 5\), got \(4, 6\)"):
        export_onnx(model, tmp_path / "bad.onnx", (4, 6))


@pytest.mark.parametrize("engine", ENGINES)
def test_a_trained_mnist1d_model_gives_the_same_predictions_through_onnx(tmp_path, engine):
    """Real data: the `linearkit train` recipe's model (briefly trained) on MNIST-1D test rows,
    exported, run by the engine, and imported back."""
    from linearkit.recipes.train_mnist1d import train

    model, _ = train(steps=200, eval_every=0)
    model.eval()
    x = lk.data.mnist1d().x_test[:300]
    path = tmp_path / "mnist1d.onnx"
    export_onnx(model, path, (1, 40))
    ours = model(x)
    theirs = run_onnx(path, x, engine)
    np.testing.assert_allclose(theirs, ours, rtol=1.3e-6, atol=1e-5)
    assert (theirs.argmax(-1) == ours.argmax(-1)).all()
    np.testing.assert_allclose(import_onnx(path)(x), ours, rtol=1.3e-6, atol=1e-5)
