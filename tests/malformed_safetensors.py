"""Generates malformed ``.safetensors`` files (and a few impostors) into a folder, for the tests.

No binary is committed: every case is built here from bytes. ``CASES`` maps a case name to a
builder ``(folder) -> Case``; a case says which file to load, a phrase its FormatError must
contain, and how to load it (with the reference model or not, ``strict``, ``strict_finite``).
The reference model is :func:`reference_model`; a good file for it is :func:`good_state`.
"""

from __future__ import annotations

import json
import pickle
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import linearkit as lk

# Two float32 tensors: "a" (2,) at [0, 8), "b" (1,) at [8, 12).
A = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
B = {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}
DATA = np.arange(3, dtype="<f4").tobytes()


@dataclass
class Case:
    path: Path
    phrase: str  # must appear in the FormatError's message
    with_model: bool = False  # load into reference_model() (else: load(path) alone)
    kwargs: dict = field(default_factory=dict)


def reference_model() -> lk.Module:
    """``Linear(3, 2) -> ReLU -> Linear(2, 1)``: keys 0.weight (2, 3), 0.bias, 2.weight, 2.bias."""
    lk.manual_seed(0)
    return lk.Sequential(lk.Linear(3, 2), lk.ReLU(), lk.Linear(2, 1))


def good_state() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {k: rng.standard_normal(v.shape).astype(np.float32)
            for k, v in reference_model().state_dict().items()}


def raw(path: Path, header, data: bytes = DATA, length: int | None = None) -> Path:
    """Write ``length`` (default: the header's), the header (an object -> JSON, or bytes), data."""
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body) if length is None else length) + body + data)
    return path


def _header(**changes) -> dict:
    """The good two-tensor header with entries replaced (None removes one)."""
    header = {"__metadata__": {"format": "np"}, "a": dict(A), "b": dict(B)}
    for name, entry in changes.items():
        if entry is None:
            header.pop(name)
        else:
            header[name] = entry
    return header


def _with(entry: dict, **fields) -> dict:
    return {**entry, **fields}


def _simple(name: str, phrase: str, header, data: bytes = DATA, length: int | None = None):
    return lambda d: Case(raw(d / f"{name}.safetensors", header, data, length), phrase)


def _bytes(name: str, content: bytes, phrase: str):
    def build(d: Path) -> Case:
        path = d / f"{name}.safetensors"
        path.write_bytes(content)
        return Case(path, phrase)
    return build


def _good_file(d: Path, name: str, state: dict) -> Path:
    return Path(lk.save(state, d / f"{name}.safetensors"))


def _truncated_data(d: Path) -> Case:
    path = _good_file(d, "truncated_data", good_state())
    path.write_bytes(path.read_bytes()[:-5])
    return Case(path, "truncated in the data")


def _truncated_header(d: Path) -> Case:
    path = _good_file(d, "truncated_header", good_state())
    path.write_bytes(path.read_bytes()[:40])
    return Case(path, "truncated in the header")


def _trailing(d: Path) -> Case:
    path = _good_file(d, "trailing", good_state())
    path.write_bytes(path.read_bytes() + b"\0" * 4)
    return Case(path, "4 trailing bytes")


class MarkerPayload:
    """Unpickling this creates the file ``marker`` — proof that code ran."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def pickle_payload(path: Path, marker: Path, protocol: int = pickle.DEFAULT_PROTOCOL) -> Path:
    path.write_bytes(pickle.dumps(MarkerPayload(marker), protocol=protocol))
    return path


def _pickle(protocol: int):
    return lambda d: Case(pickle_payload(d / f"pickle{protocol}.safetensors",
                                         d / f"PWNED{protocol}", protocol), "never unpickles")


def _zip(d: Path) -> Case:
    path = d / "torch_zip.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps(MarkerPayload(d / "PWNED_zip")))
    return Case(path, "zip archive")


def _model_case(name: str, phrase: str, change, **kwargs):
    def build(d: Path) -> Case:
        state = good_state()
        change(state)
        return Case(_good_file(d, name, state), phrase, with_model=True, kwargs=kwargs)
    return build


def _reshape(state):
    state["0.weight"] = np.zeros((3, 2), np.float32)  # (in, out): the layout bug


def _drop(state):
    del state["2.bias"]


def _extra(state):
    state["3.weight"] = np.zeros((1, 1), np.float32)


def _nan(state):
    state["2.weight"][0, 1] = np.nan
    state["0.bias"][0] = np.inf


CASES = {
    "empty_file": _bytes("empty", b"", "it is empty"),
    "shorter_than_length": _bytes("short", b"\x05\0\0\0\0", "only 5 bytes long"),
    "zero_length_header": _simple("zero_header", "header is empty", b"", b""),
    "length_beyond_file": _simple("beyond", "runs beyond the file", _header(), length=10_000),
    "length_above_cap": _simple("cap", "above the cap", _header(), length=2**40),
    "truncated_in_header": _truncated_header,
    "truncated_in_data": _truncated_data,
    "trailing_bytes": _trailing,
    "header_not_utf8": _simple("utf8", "not UTF-8", b'{"a\xff\xfe": 1}'),
    "header_not_json": _simple("json", "not JSON", b"{'a': nope}"),
    "header_json_array": _simple("array", "JSON list, not an object", b"[1, 2]"),
    "header_json_string": _simple("string", "JSON str, not an object", b'"hello"'),
    "entry_not_object": _simple("entry", "the entry is a JSON list", _header(a=[1, 2])),
    "entry_missing_dtype": _simple("nodtype", "expected exactly",
                                   _header(a={"shape": [2], "data_offsets": [0, 8]})),
    "entry_extra_field": _simple("extra", "expected exactly", _header(a=_with(A, name="x"))),
    "offsets_negative": _simple("neg", "are negative", _header(a=_with(A, data_offsets=[-8, 0]))),
    "offsets_reversed": _simple("rev", "reversed", _header(
        a=_with(A, data_offsets=[8, 0]))),
    "offsets_overlapping": _simple("overlap", "overlaps", _header(
        b=_with(B, data_offsets=[4, 8])), DATA[:8]),
    "offsets_gapped": _simple("gap", "a gap of 4 unused bytes", _header(
        b=_with(B, data_offsets=[12, 16])), DATA + b"\0" * 4),
    "offsets_not_from_zero": _simple("gap0", "a gap of 4 unused bytes", _header(
        a=_with(A, data_offsets=[4, 12]), b=_with(B, data_offsets=[12, 16])), DATA + b"\0" * 4),
    "offsets_out_of_range": _simple("range", "out of range", _header(
        b=_with(B, data_offsets=[8, 16]), a=_with(A, shape=[2]))),
    "offsets_disagree_with_shape": _simple("disagree", "disagree with shape x dtype", _header(
        a=_with(A, shape=[3]))),
    "offsets_disagree_with_dtype": _simple("disagree_dt", "disagree with shape x dtype", _header(
        a=_with(A, dtype="F64"))),
    "offsets_not_a_pair": _simple("pair", "data_offsets must be", _header(
        a=_with(A, data_offsets=[0, 8, 12]))),
    "offsets_not_ints": _simple("floats", "data_offsets must be", _header(
        a=_with(A, data_offsets=[0.0, 8.0]))),
    "dtype_unknown": _simple("f128", "unknown dtype 'F128'", _header(a=_with(A, dtype="F128"))),
    "dtype_lowercase": _simple("lower", "unknown dtype 'f32'", _header(a=_with(A, dtype="f32"))),
    "dims_negative": _simple("negdim", "negative dimension", _header(a=_with(A, shape=[-2]))),
    "dims_not_int": _simple("floatdim", "shape must be a list of integers", _header(
        a=_with(A, shape=[2.0]))),
    "dims_bool": _simple("booldim", "shape must be a list of integers", _header(
        a=_with(A, shape=[True, 2]))),
    "shape_not_list": _simple("shapestr", "shape must be a list of integers", _header(
        a=_with(A, shape="2"))),
    "duplicate_names": _simple("dup", "names 'a' twice", (
        b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, '
        b'"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}}')),
    "duplicate_names_other_dtype": _simple("dup_dtype", "names 'b' twice", (
        b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, '
        b'"b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}, '
        b'"b": {"dtype": "I32", "shape": [1], "data_offsets": [8, 12]}}')),
    "duplicate_metadata_key": _simple("dup_meta", "names 'k' twice", (
        b'{"__metadata__": {"k": "1", "k": "2"}, '
        b'"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}}')),
    "metadata_not_object": _simple("meta_list", "__metadata__ must map str to str",
                                   _header(__metadata__=["format", "np"])),
    "metadata_value_not_str": _simple("meta_int", "__metadata__ must map str to str",
                                      _header(__metadata__={"epoch": 3})),
    "pickle_payload": _pickle(pickle.DEFAULT_PROTOCOL),
    "pickle_payload_protocol2": _pickle(2),
    "torch_zip_file": _zip,
    "shape_disagrees_with_model": _model_case("shape", "size mismatch for 0.weight", _reshape),
    "shape_disagrees_non_strict": _model_case("shape_ns", "size mismatch for 0.weight", _reshape,
                                              strict=False),
    "missing_key_strict": _model_case("missing", 'Missing key(s) in state_dict: "2.bias"', _drop),
    "unexpected_key_strict": _model_case("unexpected", 'Unexpected key(s) in state_dict: '
                                         '"3.weight"', _extra),
    "non_finite_strict": _model_case("nan", "non-finite values (NaN or Inf) in tensor(s) "
                                     "'0.bias', '2.weight'", _nan, strict_finite=True),
}
