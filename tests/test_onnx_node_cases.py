"""ONNX's own node test cases (``onnx.backend.test.loader.load_model_tests(kind="node")``)
through ``import_onnx``: none may import and give a wrong answer.

Every case whose graph uses an operator import_onnx reads is taken (the others hold only
operators it refuses by op type before anything else). A case's graph inputs after the first
are its weights, so they become initializers holding the case's stored input values; the first
stays the model's input. A case with several graph outputs is run twice: as stored (import_onnx
must refuse a second output) and cut to its first output, which is then compared.

Each case either imports and the model's output equals the stored expected output (same
shape and dtype; float32 within rtol 1e-5 / atol 1e-6, float64 within 1e-12) and onnxruntime's
output on the same file where onnxruntime runs it, or ``import_onnx`` raises a FormatError
naming a node of the graph and its op type. The last test prints the counts.
"""

import os
import re
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import numpy_helper

from linearkit.errors import FormatError
from linearkit.io.onnx_import import import_onnx
from linearkit.io.onnx_ops import READ_OPS

try:
    import onnxruntime
except ImportError:  # pragma: no cover - depends on the environment
    onnxruntime = None

TOLERANCE = {np.dtype(np.float32): {"rtol": 1e-5, "atol": 1e-6},
             np.dtype(np.float64): {"rtol": 1e-12, "atol": 1e-12}}
# ONNX's Gemm cases a Linear expresses: every bias shape constant across rows, alpha, beta and
# transB (transA=1 and a bias that varies by row are refused)
GEMM_IMPORTED = ["test_gemm_default_no_bias", "test_gemm_default_scalar_bias",
                 "test_gemm_default_single_elem_vector_bias", "test_gemm_default_vector_bias",
                 "test_gemm_default_zero_bias", "test_gemm_alpha", "test_gemm_beta",
                 "test_gemm_transposeB"]


def _cases() -> dict:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the case generators' own overflow warnings
        cases = load_model_tests(kind="node")
    picked = {}
    for case in cases:
        if {n.op_type for n in case.model.graph.node} & READ_OPS and case.data_sets:
            picked[case.name] = (case, False)
            if len(case.model.graph.output) > 1:
                picked[case.name + "[first_output]"] = (case, True)
    return picked


CASES = _cases()
_OUTCOMES: dict = {}


def _as_model(case, data_set, first_output: bool):
    """The case's model with its inputs after the first as initializers; (model, feeds,
    expected outputs)."""
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    inputs, outputs = data_set
    graph, keep, feeds = model.graph, [], {}
    for k, (info, value) in enumerate(zip(list(graph.input), inputs)):
        if k == 0 or not isinstance(value, (np.ndarray, np.generic)):
            keep.append(info)
            feeds[info.name] = value
        else:
            graph.initializer.append(numpy_helper.from_array(np.asarray(value), info.name))
    del graph.input[:]
    graph.input.extend(keep)
    if first_output:
        del graph.output[1:]
        outputs = outputs[:1]
    return model, feeds, outputs


def _named_ops(message: str) -> set:
    return set(re.findall(r"node '[^']*' \((\w+)\)", message))


def outcome(key: str, folder) -> tuple:
    """("passed", n engines compared) | ("refused", message) | ("wrong", what differs)."""
    if key in _OUTCOMES:
        return _OUTCOMES[key]
    case, first_output = CASES[key]
    ops = {n.op_type for n in case.model.graph.node}
    result = None
    compared = 0
    for n, data_set in enumerate(case.data_sets):
        model, feeds, expected = _as_model(case, data_set, first_output)
        stem = re.sub(r"\W", "_", key)
        path = os.path.join(folder, f"{stem}_{n}.onnx")
        onnx.save(model, path)
        try:
            imported = import_onnx(path)
        except FormatError as e:
            named = _named_ops(str(e)) & ops
            result = (("refused", str(e)) if named else
                      ("wrong", f"refused without naming a node of the graph: {e}"))
            break
        x = next(iter(feeds.values()))
        try:
            got = imported(x)
        except Exception as e:  # noqa: BLE001 - an import that cannot run the input is wrong
            result = ("wrong", f"imported, then {type(e).__name__}: {e}")
            break
        want = expected[0]
        engines = [("the stored expected output", want)]
        if onnxruntime is not None:
            try:
                session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
                engines.append(("onnxruntime", session.run(None, feeds)[0]))
            except Exception:  # noqa: BLE001, S110 - an opset or type it does not run: no comparison
                pass
        for name, ref in engines:
            ref = np.asarray(ref)
            if got.shape != ref.shape or got.dtype != ref.dtype:
                result = ("wrong", f"output {got.dtype}{got.shape}, {name} {ref.dtype}{ref.shape}")
            elif not np.allclose(got, ref, **TOLERANCE[ref.dtype]):
                result = ("wrong", f"output differs from {name} by {np.abs(got - ref).max():.3g}")
            if result is not None:
                break
        if result is not None:
            break
        compared = max(compared, len(engines))
    _OUTCOMES[key] = result or ("passed", compared)
    return _OUTCOMES[key]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("node_cases")


@pytest.mark.parametrize("key", sorted(CASES))
def test_node_case_imports_right_or_is_refused_by_name(key, folder):
    kind, detail = outcome(key, folder)
    assert kind != "wrong", f"{key}: {detail}"


def test_counts_and_no_wrong_answer(folder, capsys):
    results = {key: outcome(key, folder) for key in sorted(CASES)}
    passed = [k for k, (kind, _) in results.items() if kind == "passed"]
    refused = [k for k, (kind, _) in results.items() if kind == "refused"]
    wrong = {k: detail for k, (kind, detail) in results.items() if kind == "wrong"}
    with_ort = sum(1 for k in passed if results[k][1] > 1)
    stored = [k for k in results if not k.endswith("[first_output]")]
    with capsys.disabled():
        print(f"\nONNX node cases through import_onnx: {len(passed)} passed, {len(refused)} "
              f"refused, {len(wrong)} wrong, {len(results)} total ({len(stored)} cases as stored "
              f"+ {len(results) - len(stored)} cut to their first output); {with_ort} of the "
              "passed also equal onnxruntime's output")
    assert not wrong, wrong
    assert len(passed) + len(refused) == len(results)
    assert set(GEMM_IMPORTED) <= set(passed)
    assert {"test_gemm_transposeA", "test_gemm_default_matrix_bias"} <= set(refused)
    assert len(passed) >= 60  # the harness really imports and compares
