"""import_onnx means what ONNX means: each graph here either imports to a model whose outputs
equal onnxruntime's on the same file, or is refused with a FormatError naming the file, the
node and its op type. Softmax before opset 13 (the input flattened from axis on), nodes of
other domains, Gemm's C and a MatMul's bias broadcast from any row-constant shape, onnx's
load and checker errors, external data outside the model's folder, Reshape checked against
the shapes the graph declares, and a training-mode Dropout."""

import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper

import linearkit as lk
from linearkit.errors import FormatError
from linearkit.io.onnx_import import import_onnx

try:
    import onnxruntime
except ImportError:  # pragma: no cover - depends on the environment
    onnxruntime = None

needs_ort = pytest.mark.skipif(onnxruntime is None, reason="onnxruntime is not installed")
F32 = {"rtol": 1e-5, "atol": 1e-6}
F64 = {"rtol": 1e-12, "atol": 1e-12}


def randn(*shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def save(tmp_path, nodes, x_shape, y_shape, inits=(), *, opset=17, elem=TensorProto.FLOAT,
         extra_opsets=(), value_info=(), name="m.onnx"):
    """A one-input ('x') one-output ('y') model file; not checked here (some are invalid on
    purpose)."""
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", elem, x_shape)],
                              [helper.make_tensor_value_info("y", elem, y_shape)], list(inits),
                              value_info=list(value_info))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    proto = helper.make_model(graph, opset_imports=opsets)
    path = tmp_path / name
    onnx.save(proto, path)
    return path


def ort(path, x):
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def refused(path, pattern):
    with pytest.raises(FormatError, match=pattern) as info:
        import_onnx(path)
    assert str(path) in str(info.value)
    return str(info.value)


# ----------------------------------------------------------------------------- Softmax


@needs_ort
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset", [7, 11])
def test_softmax_before_opset_13_over_several_dims_is_refused_by_name(tmp_path, op, opset):
    path = save(tmp_path, [helper.make_node(op, ["x"], ["y"], name="sm")], ["n", 3, 4],
                ["n", 3, 4], opset=opset)
    x = randn(2, 3, 4) * 3
    flat = ort(path, x)  # onnxruntime normalizes each sample's 12 values together
    one_axis = lk.Softmax(1)(x) if op == "Softmax" else lk.LogSoftmax(1)(x)
    assert np.abs(flat - one_axis).max() > 0.1  # so a one-axis import would be wrong
    message = refused(path, rf"node 'sm' \({op}\): {op}-\d+ \(opset {opset}\) normalizes the "
                            r"input flattened from axis=1 on")
    assert "opset >= 13" in message


@needs_ort
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset,axis,shape", [
    (11, 2, ["n", 3, 4]), (11, -1, ["n", 3, 4]), (11, None, ["n", 5]), (7, None, ["n", 5]),
    (11, 1, ["n", 1, 4]), (11, 0, [1, 1, 6]), (13, None, ["n", 3, 4]), (13, 1, ["n", 3, 4]),
    (13, 0, [2, 3, 4])])
def test_softmax_imports_where_it_is_a_one_axis_softmax(tmp_path, op, opset, axis, shape):
    attrs = {} if axis is None else {"axis": axis}
    path = save(tmp_path, [helper.make_node(op, ["x"], ["y"], name="sm", **attrs)], shape,
                shape, opset=opset)
    x = randn(*[2 if d == "n" else d for d in shape]) * 3
    np.testing.assert_allclose(import_onnx(path)(x), ort(path, x), **F32)


# ----------------------------------------------------------------------------- domains


def test_a_node_outside_the_default_domain_is_refused_by_name(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="r", domain="com.example")]
    path = save(tmp_path, nodes, ["n", 4], ["n", 4], extra_opsets=[("com.example", 1)])
    if onnxruntime is not None:
        with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.Fail):  # it refuses it too
            ort(path, randn(2, 4))
    refused(path, r"node 'r' \(Relu\): its domain is 'com.example'")


def test_the_ai_onnx_domain_is_the_default_one(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="r", domain="ai.onnx")]
    path = save(tmp_path, nodes, ["n", 4], ["n", 4], extra_opsets=[("ai.onnx", 17)])
    x = randn(3, 4)
    np.testing.assert_array_equal(import_onnx(path)(x), np.maximum(x, 0))


# ----------------------------------------------------------------------------- Gemm, MatMul+Add


def gemm_file(tmp_path, b, c, m=None, elem=TensorProto.FLOAT, **attrs):
    n_in, n_out = b.shape[::-1] if attrs.get("transB") else b.shape
    inits = [numpy_helper.from_array(b, "B")]
    inputs = ["x", "B"]
    if c is not None:
        inits.append(numpy_helper.from_array(c, "C"))
        inputs.append("C")
    nodes = [helper.make_node("Gemm", inputs, ["y"], name="fc", **attrs)]
    return save(tmp_path, nodes, [m or "m", n_in], [m or "m", n_out], inits, elem=elem)


@needs_ort
@pytest.mark.parametrize("c_shape", [(), (1,), (3,), (1, 3), (1, 1)])
@pytest.mark.parametrize("attrs", [{}, {"transB": 1}, {"alpha": 0.5, "beta": 2.0},
                                   {"alpha": -1.5, "beta": 0.25, "transB": 1}])
def test_gemm_bias_of_any_row_constant_shape_imports(tmp_path, c_shape, attrs):
    b = randn(3, 6, seed=1) if attrs.get("transB") else randn(6, 3, seed=1)
    c = randn(*c_shape, seed=2)
    path = gemm_file(tmp_path, b, c, **attrs)
    onnx.checker.check_model(onnx.load(path), full_check=True)
    x = randn(4, 6)
    w = b.T if attrs.get("transB") else b
    expected = attrs.get("alpha", 1.0) * x @ w + attrs.get("beta", 1.0) * c
    model = import_onnx(path)
    np.testing.assert_allclose(model(x), expected, **F32)
    np.testing.assert_allclose(model(x), ort(path, x), **F32)
    assert model[0].bias.shape == (3,)


@pytest.mark.parametrize("c_shape", [(4, 3), (4, 1)])
def test_gemm_bias_that_varies_by_row_is_refused(tmp_path, c_shape):
    path = gemm_file(tmp_path, randn(6, 3), randn(*c_shape), m=4)
    refused(path, rf"node 'fc' \(Gemm\): its bias C has shape \({c_shape[0]}, {c_shape[1]}\): "
                  r"it varies by row.*a Linear's bias cannot vary by row")


def test_gemm_bias_that_does_not_broadcast_is_refused(tmp_path):
    path = gemm_file(tmp_path, randn(6, 3), randn(5))
    refused(path, r"node 'fc' \(Gemm\)")


@needs_ort
def test_float64_gemm_uses_alpha_and_beta_as_stored(tmp_path):
    """alpha=0.1 is stored as float32 (0.100000001490116...); a float64 engine multiplies by
    that value, not by the decimal 0.1."""
    b, c = randn(6, 3, seed=1, dtype=np.float64), randn(3, seed=2, dtype=np.float64)
    path = gemm_file(tmp_path, b, c, elem=TensorProto.DOUBLE, alpha=0.1, beta=0.3)
    x = randn(5, 6, dtype=np.float64)
    np.testing.assert_allclose(import_onnx(path)(x), ort(path, x), **F64)


def matmul_add_file(tmp_path, x_shape, w, bias):
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "b"], ["y"], name="add")]
    y_shape = list(x_shape[:-1]) + [w.shape[1]]
    y_shape = [1] * (bias.ndim - len(y_shape)) + y_shape  # a bias of more dims adds them
    return save(tmp_path, nodes, x_shape, y_shape,
                [numpy_helper.from_array(w, "W"), numpy_helper.from_array(bias, "b")])


@needs_ort
@pytest.mark.parametrize("x_shape,b_shape", [(["n", 6], (3,)), (["n", 6], (1, 3)),
                                             (["n", 6], ()), (["n", 6], (1, 1)),
                                             (["n", 5, 6], (1, 1, 3)), (["n", 5, 6], (1, 3))])
def test_matmul_add_bias_of_any_row_constant_shape_imports(tmp_path, x_shape, b_shape):
    path = matmul_add_file(tmp_path, x_shape, randn(6, 3, seed=1), randn(*b_shape, seed=2))
    x = randn(*[4 if d == "n" else d for d in x_shape])
    model = import_onnx(path)
    assert len(model) == 1 and model[0].bias.shape == (3,)
    np.testing.assert_allclose(model(x), ort(path, x), **F32)


@pytest.mark.parametrize("x_shape,b_shape,why", [
    ([4, 6], (4, 3), "varies by row"), (["n", 5, 6], (5, 3), "varies by row"),
    (["n", 6], (1, 1, 3), "more dims than the output")])
def test_matmul_add_bias_that_is_not_one_row_is_refused(tmp_path, x_shape, b_shape, why):
    path = matmul_add_file(tmp_path, x_shape, randn(6, 3), randn(*b_shape))
    refused(path, rf"node 'add' \(Add\): its bias has shape .*{why}")


# ----------------------------------------------------------------------------- load and checker


def external_model(tmp_path, location, data: bytes | None = None):
    """A MatMul by W (4, 3) whose data lives in the file ``location`` (relative to the model's
    folder ``tmp_path/model`` unless absolute)."""
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    w = numpy_helper.from_array(randn(4, 3), "W")
    if data is None:
        data = w.raw_data
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("length", str(len(data)))):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, ["n", 4])],
                              [helper.make_tensor_value_info("y", 1, ["n", 3])], [w])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(proto, folder / "m.onnx")
    return folder / "m.onnx", data


@pytest.mark.parametrize("kind", ["climbs out", "absolute", "symlink out"])
def test_external_data_outside_the_models_folder_is_refused_and_not_read(tmp_path, kind):
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.bin"
    secret.write_bytes(numpy_helper.from_array(randn(4, 3), "W").raw_data)
    location = {"climbs out": "../outside/secret.bin", "absolute": str(secret),
                "symlink out": "link.bin"}[kind]
    path, _ = external_model(tmp_path, location)
    if kind == "symlink out":
        try:
            os.symlink(secret, path.parent / "link.bin")
        except (OSError, NotImplementedError):  # pragma: no cover - platform without symlinks
            pytest.skip("symlinks are not available")
    refused(path, r"tensor 'W' stores its data in external file .*expected a file inside the "
                  r"model's folder")


def test_external_data_inside_the_folder_is_read(tmp_path):
    path, data = external_model(tmp_path, "weights.bin")
    (path.parent / "weights.bin").write_bytes(data)
    w = np.frombuffer(data, np.float32).reshape(4, 3)
    x = randn(5, 4)
    np.testing.assert_allclose(import_onnx(path)(x), x @ w, **F32)


def test_a_missing_external_file_is_a_format_error(tmp_path):
    path, _ = external_model(tmp_path, "gone.bin")
    refused(path, r"tensor 'W' stores its data in external file 'gone.bin': no such file")


def test_a_checker_error_names_the_node(tmp_path):
    nodes = [helper.make_node("Softmax", ["x"], ["y"], name="sm", axes=[1])]
    path = save(tmp_path, nodes, ["n", 4], ["n", 4])
    refused(path, r"node 'sm' \(Softmax\): the ONNX checker rejects the model")
    b = numpy_helper.from_array(randn(6, 3), "B")  # K=6 against an input of 5 features
    path = save(tmp_path, [helper.make_node("Gemm", ["x", "B"], ["y"], name="fc")], ["n", 5],
                ["n", 3], [b], name="k.onnx")
    refused(path, r"node 'fc' \(Gemm\): the ONNX checker rejects the model")


def test_the_cli_reports_a_hostile_file_without_a_traceback(tmp_path, capsys):
    from linearkit.cli.commands import main

    path, _ = external_model(tmp_path, "../../../../../../etc/passwd")
    assert main(["convert", str(path), str(tmp_path / "out.safetensors")]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "inside the model's folder" in err and "Traceback" not in err
    assert not (tmp_path / "out.safetensors").exists()


# ----------------------------------------------------------------------------- Reshape


def reshape_file(tmp_path, x_shape, target, y_shape, **attrs):
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"], name="rs", **attrs)]
    return save(tmp_path, nodes, x_shape, y_shape,
                [numpy_helper.from_array(np.array(target, np.int64), "shape")])


@needs_ort
@pytest.mark.parametrize("x_shape,target,y_shape", [
    ([2, 3, 4], [2, 12], [2, 12]), ([2, 3, 4], [6, 4], [6, 4]), ([2, 3, 4], [24], [24]),
    ([2, 3, 4], [0, -1], [2, 12]), ([2, 3, 4], [-1, 4], [6, 4]), ([2, 3, 4], [2, 3, 4], [2, 3, 4]),
    (["n", 3, 4], [0, -1], ["n", 12]), (["n", 3, 4], [-1, 4], [None, 4]),
    (["n", 3, 4], [0, 12], ["n", 12]), (["n", 3, 4], [0, 0, -1], ["n", 3, 4]),
    (["n", 3, 4], [-1], [None]), (["n", 3, 1, 4], [0, 3, -1], ["n", 3, 4])])
def test_reshape_imports_as_the_flatten_it_is(tmp_path, x_shape, target, y_shape):
    path = reshape_file(tmp_path, x_shape, target, y_shape)
    x = randn(*[2 if d == "n" else d for d in x_shape])
    expected = ort(path, x)
    got = import_onnx(path)(x)
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("x_shape,target,why", [
    ([2, 3, 4], [4, 2, 3], "reshape of .* is not a merge of neighbouring dims"),
    ([2, 3, 4], [2, 4, 3], "reshape of .* is not a merge of neighbouring dims"),
    ([2, 3, 4], [2, 3, 2, 2], "reshape of .* is not a merge of neighbouring dims"),
    ([2, 3, 4], [1, 24], "reshape of .* is not a merge of neighbouring dims"),
    (["n", 3, 4], [2, 12], "reshape of .*it fits only some inputs"),
    (["n", 3, 4], [2, -1], r"reshape of \(n, 3, 4\) to \(2, 6\*n\) is not a merge"),
    (["n", 3, 4], [5, -1], "reshape of .*the -1 cannot be inferred"),
    (["n", 3, 4], [0, 0, 0, 0], "the ONNX checker rejects the model.*Invalid position of 0")])
def test_reshape_that_is_not_a_flatten_is_refused_by_name(tmp_path, x_shape, target, why):
    y_shape = [None] * len(target)
    path = reshape_file(tmp_path, x_shape, target, y_shape)
    refused(path, rf"node 'rs' \(Reshape\): {why}")


@needs_ort
def test_reshape_is_checked_against_a_shape_the_graph_declares(tmp_path):
    """The graph input leaves the batch open; value_info declares the Relu's output (2, 3, 4),
    so a Reshape to [2, 12] is known to be a Flatten(1, 2)."""
    nodes = [helper.make_node("Relu", ["x"], ["h"], name="relu"),
             helper.make_node("Reshape", ["h", "shape"], ["y"], name="rs")]
    path = save(tmp_path, nodes, ["n", 3, 4], [2, 12],
                [numpy_helper.from_array(np.array([2, 12], np.int64), "shape")],
                value_info=[helper.make_tensor_value_info("h", 1, [2, 3, 4])])
    x = randn(2, 3, 4)
    model = import_onnx(path)
    assert (model[1].start_dim, model[1].end_dim) == (1, 2)
    np.testing.assert_array_equal(model(x), ort(path, x))


@needs_ort
def test_reshape_with_allowzero_and_no_zero_imports(tmp_path):
    path = reshape_file(tmp_path, [2, 3, 4], [2, 12], [2, 12], allowzero=1)
    x = randn(2, 3, 4)
    np.testing.assert_array_equal(import_onnx(path)(x), ort(path, x))


def test_flatten_that_adds_a_dim_is_refused(tmp_path):
    path = save(tmp_path, [helper.make_node("Flatten", ["x"], ["y"], name="fl", axis=0)],
                ["n", 3, 4], [1, None])
    refused(path, r"node 'fl' \(Flatten\): axis=0 on an input of shape \(n, 3, 4\) gives "
                  r"\(1, 12\*n\)")


# ----------------------------------------------------------------------------- Dropout and more


def dropout_file(tmp_path, training, opset=13):
    inits = [numpy_helper.from_array(np.array(0.5, np.float32), "ratio"),
             numpy_helper.from_array(np.array(training), "training")]
    nodes = [helper.make_node("Relu", ["x"], ["h"], name="relu"),
             helper.make_node("Dropout", ["h", "ratio", "training"], ["y"], name="drop")]
    return save(tmp_path, nodes, ["n", 4], ["n", 4], inits, opset=opset)


def test_a_training_mode_dropout_is_refused(tmp_path):
    path = dropout_file(tmp_path, True)
    refused(path, r"node 'drop' \(Dropout\): a training-mode Dropout.*\n.*export the model in "
                  r"eval mode")


def test_an_inference_dropout_is_the_identity(tmp_path):
    x = randn(3, 4)
    model = import_onnx(dropout_file(tmp_path, False))
    assert [type(m).__name__ for m in model] == ["ReLU"]
    np.testing.assert_array_equal(model(x), np.maximum(x, 0))


def test_an_operator_version_with_legacy_attributes_is_refused(tmp_path):
    b, c = numpy_helper.from_array(randn(6, 3), "B"), numpy_helper.from_array(randn(3), "C")
    nodes = [helper.make_node("Gemm", ["x", "B", "C"], ["y"], name="fc", broadcast=1)]
    path = save(tmp_path, nodes, ["n", 6], ["n", 3], [b, c], opset=6)
    refused(path, r"node 'fc' \(Gemm\): Gemm-6 \(opset 6\) is not read: its 'broadcast'")


def test_a_batch_norm_of_a_4d_input_is_refused_at_import(tmp_path):
    inits = [numpy_helper.from_array(np.ones(3, np.float32), n) for n in ("s", "b", "m", "v")]
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn")]
    path = save(tmp_path, nodes, ["n", 3, 4, 5], ["n", 3, 4, 5], inits, opset=15)
    refused(path, r"node 'bn' \(BatchNormalization\): input of shape \(n, 3, 4, 5\)")


def test_a_gelu_formula_whose_constants_broadcast_up_is_not_a_gelu(tmp_path):
    """Div by a (1, 1, 1) constant makes a (1, n, 4) output from (n, 4): not GELU's shape."""
    consts = {"s2": np.full((1, 1, 1), np.sqrt(2.0), np.float32),
              "one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32)}
    nodes = [helper.make_node("Div", ["x", "s2"], ["a"], name="div"),
             helper.make_node("Erf", ["a"], ["b"]), helper.make_node("Add", ["b", "one"], ["c"]),
             helper.make_node("Mul", ["x", "c"], ["d"]), helper.make_node("Mul", ["d", "half"], ["y"])]
    path = save(tmp_path, nodes, ["n", 4], [1, "n", 4],
                [numpy_helper.from_array(v, k) for k, v in consts.items()])
    refused(path, r"node 'div' \(Div\)")


def test_an_integer_input_is_refused_by_the_node_reading_it(tmp_path):
    path = save(tmp_path, [helper.make_node("Relu", ["x"], ["y"], name="r")], ["n", 4], ["n", 4],
                elem=TensorProto.INT32)
    refused(path, r"node 'r' \(Relu\): the graph input 'x' is a TensorProto.INT32")


def test_a_float64_gelu_op_is_refused_and_the_float64_formula_imports(tmp_path):
    """ONNX's Gelu holds its constants as float32, so a float64 Gelu is ~1e-8 off an exact
    GELU; the formula export_onnx writes before opset 20 has float64 constants."""
    path = save(tmp_path, [helper.make_node("Gelu", ["x"], ["y"], name="g")], ["n", 4],
                ["n", 4], opset=20, elem=TensorProto.DOUBLE)
    refused(path, r"node 'g' \(Gelu\): a float64 Gelu")
    model = lk.Sequential(lk.Linear(4, 4, dtype=np.float64), lk.GELU("tanh")).eval()
    path = lk.io.export_onnx(model, tmp_path / "formula.onnx", (3, 4), opset=17)
    x = randn(3, 4, dtype=np.float64)
    np.testing.assert_allclose(import_onnx(path)(x), model(x), **F64)
