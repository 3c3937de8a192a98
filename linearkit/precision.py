"""The precision policy, in one place: storage dtypes, compute dtypes, what 16-bit training keeps.

A parameter is *stored* in float32 (the default), float64, float16 or bfloat16 (``ml_dtypes``,
imported only when bfloat16 is asked for). The GEMMs *compute* in float32 or float64: NumPy has
no half-precision BLAS (a float16 GEMM runs far slower than float32: docs/dtypes.md), so a 16-bit
parameter is upcast for the arithmetic and its layer takes and returns float32 arrays.

The policy says what 16-bit training keeps, and is read by a layer when its forward runs (fixed
then, as ``requires_grad`` is):

- ``grads``: ``"float32"`` (default) — the ``.grad`` of a 16-bit parameter is float32;
  ``"storage"`` — ``.grad`` is kept in the parameter's own dtype (reproduces fp16 gradients
  that underflow to zero, the reason for loss scaling). float32/float64 parameters always get
  a gradient of their own dtype.
- ``activations``: None (default) — what a layer saves for its backward (Linear's input, the
  norms' normalized input) stays in the compute dtype; ``float16`` or ``bfloat16`` — it is kept
  in that dtype (half the activation memory) and upcast again for the backward's arithmetic.
- ``compute``: None (default) — float32 for 16-bit storage, else the storage dtype. Any other
  request is refused by the layer that sees it, naming the layer and the dtypes.

Set it for the process with ``set_policy(...)`` or for a block::

    with linearkit.precision.policy(activations=np.float16, grads="storage"):
        pred, back = model.vjp(x)

Examples
--------
>>> import numpy as np
>>> from linearkit import precision
>>> precision.compute_dtype(np.float16), precision.storage_dtype("bf16").name
(dtype('float32'), 'bfloat16')
>>> with precision.policy(grads="storage"):
...     precision.get_policy().grads
'storage'
>>> precision.get_policy().grads
'float32'
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from .errors import DTypeError

__all__ = [
    "GRADS",
    "STORAGE",
    "Policy",
    "bfloat16",
    "check_compute",
    "compute_array",
    "compute_dtype",
    "get_policy",
    "grad_dtype",
    "is_16bit",
    "is_float",
    "policy",
    "saved_activation",
    "set_policy",
    "storage_dtype",
    "to_storage",
]

F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
#: the storage dtypes, by name
STORAGE = ("float32", "float64", "float16", "bfloat16")
#: the values of the policy's ``grads``
GRADS = ("float32", "storage")
_EXTRA = 'pip install "linearkit[cli]"'
_ALIASES = {"float32": F32, "fp32": F32, "f4": F32, "single": F32,
            "float64": F64, "fp64": F64, "f8": F64, "double": F64,
            "float16": F16, "fp16": F16, "f2": F16, "half": F16}
_BF16: np.dtype | None = None


def bfloat16() -> np.dtype:
    """``ml_dtypes.bfloat16`` as a NumPy dtype; ImportError naming the extra when it is missing."""
    global _BF16
    if _BF16 is None:
        try:
            import ml_dtypes
        except ImportError:
            raise ImportError(f"bfloat16 needs the ml_dtypes package: {_EXTRA}") from None
        _BF16 = np.dtype(ml_dtypes.bfloat16)
    return _BF16


def _is_bf16(dtype: np.dtype) -> bool:
    # ml_dtypes' bfloat16 is a 2-byte dtype of kind 'V' named 'bfloat16'; no array can have it
    # unless ml_dtypes is loaded, so this never imports it
    return dtype.kind == "V" and dtype.itemsize == 2 and dtype.name == "bfloat16"


def is_float(dtype) -> bool:
    """Whether ``dtype`` is a storage dtype: float16, bfloat16, float32 or float64.

    Use this, never ``dtype.kind == "f"`` alone: bfloat16 has kind ``'V'``. (float128 and
    complex are not storage dtypes.)
    """
    dtype = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
    return dtype in (F32, F64, F16) or _is_bf16(dtype)


def is_16bit(dtype) -> bool:
    """Whether ``dtype`` is float16 or bfloat16 (stored in 16 bits, computed in float32)."""
    dtype = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
    return dtype == F16 or _is_bf16(dtype)


def storage_dtype(spec) -> np.dtype:
    """``spec`` as a storage dtype, else a TypeError listing the ones that exist.

    Accepts NumPy dtypes and types (``np.float16``), ``ml_dtypes.bfloat16``, and names:
    ``"float32"``, ``"bfloat16"``, ``"bf16"``, ``"fp16"``, ``"fp32"``, ``"fp64"``, ...
    """
    if isinstance(spec, str):
        key = spec.strip().lower()
        if key in ("bfloat16", "bf16"):
            return bfloat16()
        if key in _ALIASES:
            return _ALIASES[key]
    try:
        dtype = spec if isinstance(spec, np.dtype) else np.dtype(spec)
    except TypeError:
        dtype = None
    if dtype is not None and is_float(dtype):
        return dtype
    got = f"{spec!r}" if dtype is None else f"{dtype} ({spec!r})"
    raise TypeError(f"dtype must be a storage dtype: float16, float32 or float64, or bfloat16 "
                    f"('bfloat16' or ml_dtypes.bfloat16); got {got}. Parameters are float32 by "
                    f"default, as in PyTorch")


def compute_dtype(storage) -> np.dtype:
    """The dtype the arithmetic of a ``storage`` parameter runs in: float32 for float16,
    bfloat16 and float32; float64 for float64. A TypeError for anything else."""
    storage = storage if isinstance(storage, np.dtype) else storage_dtype(storage)
    if storage == F64:
        return F64
    if storage == F32 or is_16bit(storage):
        return F32
    raise TypeError(f"{storage} is not a storage dtype (float32, float64, float16, bfloat16)")


# ----------------------------------------------------------------------------- the policy
class Policy:
    """What 16-bit training keeps: ``grads``, ``activations``, ``compute`` (see the module)."""

    __slots__ = ("activations", "compute", "grads")

    def __init__(self, grads: str = "float32", activations=None, compute=None):
        if grads not in GRADS:
            raise ValueError(f"grads must be 'float32' (a 16-bit parameter's gradient is "
                             f"stored in float32) or 'storage' (in the parameter's own dtype), "
                             f"got {grads!r}")
        if activations is not None:
            activations = storage_dtype(activations)
            if not is_16bit(activations):
                raise ValueError(f"activations must be None (the compute dtype), float16 or "
                                 f"bfloat16, got {activations}")
        self.grads = grads
        self.activations = activations
        self.compute = None if compute is None else storage_dtype(compute)

    def _replace(self, **changes) -> Policy:
        values = {name: getattr(self, name) for name in self.__slots__}
        values.update(changes)
        return Policy(**values)

    def __eq__(self, other) -> bool:
        return isinstance(other, Policy) and all(
            getattr(self, n) == getattr(other, n) for n in self.__slots__)

    __hash__ = None

    def __repr__(self) -> str:
        act = None if self.activations is None else self.activations.name
        comp = None if self.compute is None else self.compute.name
        return f"Policy(grads={self.grads!r}, activations={act!r}, compute={comp!r})"


#: the policy in force; layers read its fields when their forward runs (replaced, never mutated)
current = Policy()
_UNSET = object()


def get_policy() -> Policy:
    """The policy in force (a ``Policy``: ``.grads``, ``.activations``, ``.compute``)."""
    return current


def set_policy(grads=_UNSET, activations=_UNSET, compute=_UNSET) -> Policy:
    """Change the process-wide policy (only the fields given); returns the previous one.

    ``set_policy(Policy())`` is not the form: pass fields, e.g. ``set_policy(grads="storage")``;
    ``set_policy(grads="float32", activations=None, compute=None)`` restores the default.
    """
    global current
    changes = {k: v for k, v in (("grads", grads), ("activations", activations),
                                 ("compute", compute)) if v is not _UNSET}
    previous, current = current, current._replace(**changes)
    return previous


@contextmanager
def policy(grads=_UNSET, activations=_UNSET, compute=_UNSET):
    """``with policy(grads=..., activations=..., compute=...):`` — the fields given apply inside
    the block (to the forwards run there; their backwards keep what was fixed at forward time);
    the previous policy is restored afterwards, even on error. Yields the policy in force."""
    global current
    previous = set_policy(grads, activations, compute)
    try:
        yield current
    finally:
        current = previous


# --------------------------------------------------------------------- for the layers
def check_compute(module, storage: np.dtype) -> np.dtype:
    """The compute dtype of a layer whose parameters are stored in ``storage``, under the policy.

    ``policy.compute`` None gives ``compute_dtype(storage)``; asking for exactly that is fine;
    anything else is a DTypeError naming the layer (``module``) and the dtypes: float16 or
    bfloat16 compute has no BLAS in NumPy (far slower than float32), and a compute dtype other
    than the storage's for float32/float64 parameters is a conversion of the model.
    """
    natural = compute_dtype(storage)
    asked = current.compute
    if asked is None or asked == natural:
        return natural
    if is_16bit(asked):
        raise DTypeError(
            f"{asked} compute is not supported for {storage} parameters: NumPy has no "
            f"half-precision BLAS (a {asked} GEMM runs far slower than float32: docs/dtypes.md), "
            f"so 16-bit parameters are stored in 16 bits and computed in {natural}",
            module=module, hint="leave the policy's compute at None (precision.set_policy("
                                "compute=None)); 16-bit storage already halves weight memory")
    raise DTypeError(
        f"{asked} compute is not supported for {storage} parameters (they compute in "
        f"{natural})", module=module,
        hint=f"convert the model instead: model.to(np.{asked}), and leave the policy's compute "
             f"at None")


def grad_dtype(storage: np.dtype) -> np.dtype:
    """The dtype a new ``.grad`` of a ``storage`` parameter gets under the policy in force."""
    if current.grads == "storage" or not is_16bit(storage):
        return storage
    return F32


def compute_array(a: np.ndarray) -> np.ndarray:
    """``a`` in its compute dtype: a float32 copy of a float16/bfloat16 array, else ``a`` itself.

    The one helper layers use for their compute arrays. Both conversions are exact. A bfloat16
    is the top half of a float32, so its copy is one NumPy pass, ``uint16 << 16`` into a uint32
    array viewed as float32 (``_bfloat16_to_float32``): every bit of ``astype``'s result, NaN
    payloads kept. Measured, it beat ml_dtypes' ``astype`` on blocks of a large weight (rows, or
    a strided block of columns) and matched it on the whole weight. NumPy's float16 ``astype``
    (scalar: its F16C path is not in the baseline build) beat the alternatives tried: a float32
    table lookup (``take``), the exponent-rebias bit trick in cache-sized pieces, and the two
    halves on two threads (faster alone, but not between two GEMMs: OpenBLAS's threads spin on
    the other core for a while after each GEMM). docs/dtypes.md, "What the upcasts cost", has
    the figures.
    """
    if a.itemsize == 2:
        if _is_bf16(a.dtype):
            return _bfloat16_to_float32(a) if type(a) is np.ndarray else a.astype(F32)
        if a.dtype == F16:
            return a.astype(F32)
    return a


def _bfloat16_to_float32(a: np.ndarray) -> np.ndarray:
    """A float32 copy of the bfloat16 array ``a`` (any strides), exact: each value's 16 bits
    become the top half of its float32's."""
    out = np.empty(a.shape, np.uint32)
    np.left_shift(a.view(np.uint16), 16, out=out, dtype=np.uint32)
    return out.view(F32)


def to_storage(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``a`` rounded to ``dtype`` (round to nearest even, as PyTorch's ``.to``); ``a`` itself
    when it already has that dtype."""
    return a if a.dtype == dtype else a.astype(dtype)


def saved_activation(x: np.ndarray) -> np.ndarray:
    """What a layer keeps of ``x`` (a compute-dtype array) for its backward: ``x`` itself, or
    under ``policy(activations=...)`` a copy rounded to that dtype (``compute_array`` upcasts it
    again in the backward)."""
    keep = current.activations
    return x if keep is None or x.dtype == keep else x.astype(keep)
