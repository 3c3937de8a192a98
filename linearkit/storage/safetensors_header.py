"""A strict reader for ``.safetensors`` files: the header is checked in full before any tensor
is read, and the tensors are read with NumPy from the checked offsets — no code runs, ever.

Stricter than the reference loader where it is lax: a duplicate tensor name, a header length
above :data:`HEADER_CAP`, an unknown or lowercase dtype, offsets that overlap, leave a gap or do
not cover the data section exactly are each a :class:`~linearkit.FormatError` naming the file.

The layout (https://github.com/huggingface/safetensors): 8 bytes little-endian ``N``, then ``N``
bytes of UTF-8 JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
{str: str}}``, then the data section; offsets count from the start of the data section.
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct

import numpy as np

from ..errors import FormatError

__all__ = ["HEADER_CAP", "file_dtype", "open_regular", "read_header", "read_tensors",
           "read_tensors_into"]

HEADER_CAP = 100_000_000  # bytes; the reference implementation's own limit

# safetensors dtype name -> NumPy dtype string (little-endian), or an ml_dtypes attribute name.
_NUMPY_DTYPES = {
    "BOOL": "|b1", "U8": "|u1", "I8": "|i1", "U16": "<u2", "I16": "<i2", "U32": "<u4",
    "I32": "<i4", "U64": "<u8", "I64": "<i8", "F16": "<f2", "F32": "<f4", "F64": "<f8",
}
_ML_DTYPES = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
#: Bytes per element of each safetensors dtype name.
ITEMSIZE = {**{k: np.dtype(v).itemsize for k, v in _NUMPY_DTYPES.items()},
             "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1}
_ENTRY_FIELDS = {"dtype", "shape", "data_offsets"}
_REWRITE = "re-export the file with safetensors' save_file (or linearkit.save)"


def _fail(path, problem: str, hint: str = _REWRITE):
    raise FormatError(problem, path=path, hint=hint)


def _no_duplicates(path):
    def hook(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                _fail(path, f"the header names {key!r} twice (a duplicate entry; the reference "
                            "loader would silently keep the last one)")
            seen.add(key)
        return dict(pairs)
    return hook


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _looks_like(head: bytes) -> str | None:
    if head[:1] == b"\x80":
        return "a Python pickle (torch.save's legacy format)"
    if head[:2] == b"PK":
        return "a zip archive (torch.save's format)"
    return None


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def _not_regular(path, mode: int):
    kind = next((name for test, name in _KINDS if test(mode)), "not a file")
    _fail(path, f"not a regular file: it is {kind}, where a .safetensors file was expected",
          hint="give the path of a .safetensors file")


def open_regular(path) -> tuple:
    """``(binary file object, os.stat_result)`` of ``path``, refused unless a regular file.

    Checked before ``open`` (a FIFO would block the open until a writer comes, a device such as
    /dev/zero would be read for ever), then again on the opened descriptor, which is what is read:
    a path swapped for something else between the two is refused too. ``O_NONBLOCK`` keeps the
    open itself from waiting on a FIFO; it changes nothing for a regular file. A missing file
    stays FileNotFoundError, which names it.
    """
    path = os.fspath(path)
    before = os.stat(path)
    if not stat.S_ISREG(before.st_mode):
        _not_regular(path, before.st_mode)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            _not_regular(path, info.st_mode)
        return os.fdopen(fd, "rb"), info
    except BaseException:
        os.close(fd)
        raise


def _raw_header(path: str) -> tuple[bytes, int, int]:
    """The header's bytes, its length and the file's size, after the length checks."""
    f, info = open_regular(path)
    size = info.st_size
    with f:
        head = f.read(8)
        if len(head) < 8:
            what = "empty" if not head else f"only {len(head)} bytes long"
            _fail(path, f"not a safetensors file: it is {what}, shorter than the 8-byte "
                        "header length", hint="the file was truncated; write it again")
        (length,) = struct.unpack("<Q", head)
        kind = _looks_like(head)
        if kind is not None and (length > HEADER_CAP or 8 + length > size):
            _fail(path, f"not a safetensors file: it looks like {kind}, which linearkit "
                        "never unpickles",
                  hint="convert it where you trust it: torch.load(path, weights_only=True)"
                       " then safetensors.torch.save_file")
        if length > HEADER_CAP:
            _fail(path, f"header length {length} bytes is above the cap of {HEADER_CAP} "
                        "bytes (a corrupt or hostile file)")
        if 8 + length > size:
            _fail(path, f"header length {length} bytes runs beyond the file "
                        f"({size} bytes): truncated in the header",
                  hint="the file was truncated; write it again")
        if length == 0:
            _fail(path, "the header is empty (a zero header length)")
        raw = f.read(length)
    return raw, length, size


def read_header(path) -> tuple[dict, dict, int, int]:
    """Read and check the header of ``path``.

    Returns ``(entries, metadata, data_start, data_size)``: ``entries`` maps each tensor name to
    ``(dtype_name, shape_tuple, begin, end)`` in file order, ``metadata`` is the str->str
    ``__metadata__`` ({} when absent), the data section spans ``[data_start, data_start +
    data_size)`` of the file. Raises :class:`~linearkit.FormatError` on any defect.
    """
    path = os.fspath(path)
    raw, length, size = _raw_header(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise FormatError(f"the header is not UTF-8 ({err.reason} at byte {err.start})",
                          path=path, hint=_REWRITE) from None
    try:
        header = json.loads(text, object_pairs_hook=_no_duplicates(path))
    except json.JSONDecodeError as err:
        raise FormatError(f"the header is not JSON ({err.msg} at character {err.pos})",
                          path=path, hint=_REWRITE) from None
    except RecursionError:          # nesting past the parser's limit; a valid header nests 3
        raise FormatError("the header's JSON nests deeper than a reader can follow (a safetensors "
                          "header nests 3 levels: entries, each with a shape list)", path=path,
                          hint=_REWRITE) from None
    if not isinstance(header, dict):
        _fail(path, f"the header is a JSON {type(header).__name__}, not an object")
    data_start, data_size = 8 + length, size - 8 - length
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        _fail(path, "__metadata__ must map str to str, got "
                    f"{json.dumps(metadata)[:120]}", hint="store every metadata value as a string")
    entries = {name: _entry(path, name, spec, data_size) for name, spec in header.items()}
    _check_layout(path, entries, data_size)
    return entries, metadata, data_start, data_size


def _entry(path, name: str, spec, data_size: int) -> tuple[str, tuple, int, int]:
    where = f"tensor {name!r}"
    if not isinstance(spec, dict):
        _fail(path, f"{where}: the entry is a JSON {type(spec).__name__}, not an object")
    if set(spec) != _ENTRY_FIELDS:
        _fail(path, f"{where}: the entry has fields {sorted(spec)}, expected exactly "
                    f"{sorted(_ENTRY_FIELDS)}")
    dtype, shape, offsets = spec["dtype"], spec["shape"], spec["data_offsets"]
    if dtype not in ITEMSIZE:
        _fail(path, f"{where}: unknown dtype {dtype!r}; safetensors names are uppercase: "
                    f"{', '.join(sorted(ITEMSIZE))}")
    if not isinstance(shape, list) or not all(_is_int(d) for d in shape):
        _fail(path, f"{where}: shape must be a list of integers, got {json.dumps(shape)}")
    if any(d < 0 for d in shape):
        _fail(path, f"{where}: shape {shape} has a negative dimension")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(_is_int(o) for o in offsets)):
        _fail(path, f"{where}: data_offsets must be [begin, end] integers, got "
                    f"{json.dumps(offsets)}")
    begin, end = offsets
    if begin < 0 or end < 0:
        _fail(path, f"{where}: data_offsets {offsets} are negative")
    if begin > end:
        _fail(path, f"{where}: data_offsets {offsets} are reversed (begin after end)")
    if end > data_size:
        _fail(path, f"{where}: data_offsets {offsets} are out of range: the data section has "
                    f"{data_size} bytes (truncated in the data?)")
    expected = math.prod(shape) * ITEMSIZE[dtype]
    if end - begin != expected:
        _fail(path, f"{where}: data_offsets {offsets} span {end - begin} bytes but shape "
                    f"{shape} x {dtype} needs {expected} bytes (offsets disagree with shape x "
                    "dtype)")
    return dtype, tuple(shape), begin, end


def _check_layout(path, entries: dict, data_size: int) -> None:
    """Tensors must tile the data section exactly: sorted, from 0, no overlap, no gap."""
    position, previous = 0, None
    for name, (_, _, begin, end) in sorted(entries.items(), key=lambda kv: kv[1][2:]):
        if begin < position:
            _fail(path, f"tensor {name!r} at bytes [{begin}, {end}) overlaps tensor "
                        f"{previous!r}, which ends at {position}")
        if begin > position:
            _fail(path, f"a gap of {begin - position} unused bytes before tensor {name!r} "
                        f"(bytes [{position}, {begin}) belong to no tensor)")
        position, previous = end, name
    if position != data_size:
        _fail(path, f"{data_size - position} trailing bytes after the last tensor (the data "
                    f"section has {data_size} bytes, the tensors cover {position})")


def _dtype(path, name: str, dtype: str) -> np.dtype:
    if dtype in _NUMPY_DTYPES:
        return np.dtype(_NUMPY_DTYPES[dtype])
    try:
        import ml_dtypes
    except ImportError:
        raise FormatError(f"tensor {name!r} is {dtype}, which NumPy cannot hold without the "
                          "'ml_dtypes' package", path=path,
                          hint="pip install 'linearkit[cli]' (or pip install ml_dtypes)") from None
    return np.dtype(getattr(ml_dtypes, _ML_DTYPES[dtype]))


def read_tensors(path, names=None) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Every tensor of ``path`` (or only those in ``names``) as a writable native-order ndarray,
    and the metadata.

    F16 comes back as ``float16``; BF16/F8 as ``ml_dtypes`` arrays (``bfloat16``, ...).
    """
    entries, metadata, data_start, _ = read_header(path)
    tensors = {}
    f, _ = open_regular(path)
    with f:
        for name, (dtype, shape, begin, end) in entries.items():
            if names is not None and name not in names:
                continue
            kind = _dtype(path, name, dtype)
            buffer = np.empty(end - begin, np.uint8)
            f.seek(data_start + begin)
            _read_exactly(f, buffer, path, name)
            array = buffer.view(kind).reshape(shape)
            if not array.dtype.isnative:
                array = array.astype(array.dtype.newbyteorder("="))
            tensors[name] = array
    return tensors, metadata


def file_dtype(path, name: str, dtype_name: str) -> np.dtype:
    """The NumPy dtype of a tensor whose header entry says ``dtype_name`` (``'F32'``), as the
    file stores it (little-endian); a FormatError naming ``ml_dtypes`` when BF16/F8 need it."""
    return _dtype(path, name, dtype_name)


def read_tensors_into(path, arrays: dict[str, np.ndarray]) -> None:
    """Read tensors of ``path`` straight into ``arrays`` (name -> array), with no copy between.

    Each array must be a writable C-contiguous ndarray of the tensor's shape and of exactly the
    dtype the file stores it in (``file_dtype``; little-endian); a FormatError otherwise, or
    when the file ended inside a tensor. An array is filled with what the file holds, as
    ``read_tensors`` would return it.
    """
    path = os.fspath(path)
    entries, _, data_start, _ = read_header(path)
    f, _ = open_regular(path)
    with f:
        for name, out in arrays.items():
            if name not in entries:
                _fail(path, f"the file holds no tensor {name!r}", hint="save the model again")
            dtype, shape, begin, _ = entries[name]
            if (out.shape != shape or out.dtype != _dtype(path, name, dtype)
                    or not out.flags.c_contiguous or not out.flags.writeable):
                _fail(path, f"tensor {name!r} ({dtype} {list(shape)}) cannot be read into an "
                            f"array {out.dtype} {list(out.shape)}", hint="save the model again")
            f.seek(data_start + begin)
            _read_exactly(f, out.reshape(-1).view(np.uint8), path, name)


_CHUNK = 1 << 26  # bytes per read call: any size works, one call need not read all of it


def _read_exactly(f, buffer: np.ndarray, path, name: str) -> None:
    """Fill the uint8 ``buffer`` from ``f``, or the FormatError of a file that ended early."""
    view = memoryview(buffer)
    done, size = 0, len(view)
    while done < size:
        got = f.readinto(view[done:done + _CHUNK])
        if not got:  # the file shrank since the header was read
            _fail(path, f"tensor {name!r}: the file ended inside its data (truncated)",
                  hint="the file was truncated; write it again")
        done += got
