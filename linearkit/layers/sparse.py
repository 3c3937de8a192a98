"""SparseLinear: a linear map whose weight is stored compressed (CSR), only its nonzeros.

Pruning (``linearkit.transforms.prune``, in ``transforms/pruning.py``) and ``linearkit.init.sparse_`` only write zeros into a
*dense* matrix, which still stores (and multiplies) every one of them: nothing is saved until the
weight is converted to this layer (``linearkit.transforms.to_sparse``). The products go through
``scipy.sparse`` (the ``sparse`` extra: ``pip install linearkit[sparse]``), imported on first use.
"""

from __future__ import annotations

import math

import numpy as np

from .. import functional as F
from ..core.allocation import allocating, filled
from ..core.module import Module, Parameter
from ..errors import ShapeError
from ._checks import as_input, feature_count, float_dtype
from .linear import Linear, uninitialized

__all__ = ["SparseLinear", "csr_problem"]

#: Entries of the gathered ``(k, N)`` blocks in the values' gradient (bounds its temporaries).
_GRAD_BLOCK = 1 << 20


def _scipy_sparse():
    try:
        import scipy.sparse as sp
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("SparseLinear multiplies through scipy.sparse, which is not installed: "
                          "pip install 'linearkit[sparse]' (or pip install scipy)") from None
    return sp


def csr_problem(indices: np.ndarray, indptr: np.ndarray, n_in: int, n_out: int) -> str | None:
    """What is wrong with a CSR pattern of an ``(n_out, n_in)`` matrix, or None when it is sound.

    Sound: ``indptr (n_out + 1,)`` starts at 0, never decreases and ends at ``len(indices)``;
    every column index is in ``[0, n_in)``; no column repeats within a row. (SciPy's kernels do
    not check the bounds: an index out of range would read outside the input.)
    """
    indices, indptr = np.asarray(indices), np.asarray(indptr)
    if indptr.shape != (n_out + 1,) or indices.ndim != 1:
        return (f"indptr must have shape ({n_out + 1},) and indices be 1-D, got "
                f"{indptr.shape} and {indices.shape}")
    if indptr[0] != 0 or indptr[-1] != len(indices):
        return f"indptr must run from 0 to nnz={len(indices)}, got {indptr[0]} .. {indptr[-1]}"
    if np.any(np.diff(indptr) < 0):
        return "indptr decreases: row pointers must be non-decreasing"
    if len(indices) and (indices.min() < 0 or indices.max() >= n_in):
        return (f"column indices must lie in [0, {n_in}), got {indices.min()} .. "
                f"{indices.max()}")
    rows = np.repeat(np.arange(n_out, dtype=np.int64), np.diff(indptr))
    keys = rows * max(n_in, 1) + indices
    if len(np.unique(keys)) != len(keys):
        return "a column index repeats within a row"
    return None


class SparseLinear(Module):
    """Affine map ``y = x @ W.T + bias`` with ``W (out_features, in_features)`` stored in CSR.

    Only the stored entries exist, and only they train: the sparsity pattern is fixed (sparse
    training; an entry left out stays zero). Build one with ``SparseLinear.from_linear(linear)``
    (or ``linearkit.transforms.to_sparse(model)``); the constructor makes the placeholder a model
    file rebuilds before its weights load (the first ``nnz`` positions in row-major order, zero
    values).

    Storage: ``nnz·(itemsize + 4) + 4·(out_features + 1)`` bytes for the weight, against
    ``out_features·in_features·itemsize`` dense: at float32 it is smaller only below 50% density
    (float64: 2/3). The CSR products run on one core in SciPy; docs/surgery.md measures where
    they beat the dense GEMM on its machine (``python -m experiments surgery``, from a checkout).

    Parameters
    ----------
    in_features, out_features : int
    nnz : int
        Number of stored weight entries, ``0 <= nnz <= in_features·out_features``.
    bias : bool
    dtype : float32 (default) or float64 (SciPy's sparse kernels take no float16).

    Shape
    -----
    x ``(*, in_features)`` -> y ``(*, out_features)``. A 2-D output is Fortran-ordered (the
    transpose of SciPy's ``W @ xᵀ``); NumPy and the other layers take it as it is.

    Attributes
    ----------
    weight_values : Parameter ``(nnz,)``, the stored entries row by row (trainable)
    weight_indices : int32 buffer ``(nnz,)``, the column of each stored entry
    weight_indptr : int32 buffer ``(out_features + 1,)``, row ``i`` holds entries
        ``indptr[i]:indptr[i+1]``
    bias : Parameter ``(out_features,)`` or None
    nnz, density : int, float (``nnz / (in·out)``)

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> from linearkit.layers.sparse import SparseLinear
    >>> dense = lk.Linear(4, 3, rng=np.random.default_rng(0))
    >>> dense.weight.data[:, :2] = 0
    >>> layer = SparseLinear.from_linear(dense)
    >>> layer.nnz, layer.weight_values.shape, layer.weight_indptr.tolist()
    (6, (6,), [0, 2, 4, 6])
    >>> x = np.ones((5, 4), np.float32)
    >>> bool(np.allclose(layer(x), dense(x)))
    True
    """

    def __init__(self, in_features: int, out_features: int, nnz: int = 0, bias: bool = True, *,
                 dtype=np.float32):
        super().__init__()
        self.in_features = feature_count("in_features", in_features)
        self.out_features = feature_count("out_features", out_features)
        nnz = feature_count("nnz", nnz)
        if nnz > self.in_features * self.out_features:
            raise ValueError(f"nnz={nnz} is more than the {self.in_features * self.out_features} "
                             f"entries of a ({self.out_features}, {self.in_features}) weight")
        self.dtype = float_dtype(dtype)
        if self.dtype == np.float16:
            raise TypeError("SparseLinear takes float32 or float64: SciPy's sparse kernels have "
                            "no float16; convert first, e.g. linear.to(np.float32)")
        self.weight_values = Parameter(filled(self, "weight_values", nnz, self.dtype, 0))
        n_in = max(self.in_features, 1)
        with allocating(self, "weight_indices", (nnz,), np.int32):
            if nnz < 2**31:  # 0, 1, ..., n_in - 1, 0, 1, ...: in the int32 buffer itself
                indices = np.arange(nnz, dtype=np.int32)
                indices %= n_in
            else:
                indices = (np.arange(nnz) % n_in).astype(np.int32)
        self.register_buffer("weight_indices", indices)
        rows = np.minimum(np.arange(self.out_features + 1) * self.in_features, nnz)
        self.register_buffer("weight_indptr", rows.astype(np.int32))
        if bias:
            self.bias = Parameter(filled(self, "bias", self.out_features, self.dtype, 0))
        else:
            self.register_parameter("bias", None)
        self._scipy = None  # (values, indices, indptr, csr_array over them), built on first use

    # ------------------------------------------------------------------ conversions
    @classmethod
    def from_linear(cls, linear: Linear, mask=None) -> SparseLinear:
        """The ``Linear``'s weight entries where ``mask (out, in)`` is True (default: its
        nonzeros), copied, with its bias and ``requires_grad`` flags."""
        if not isinstance(linear, Linear) or linear.weight is None:
            raise TypeError(f"from_linear() takes a Linear, got {type(linear).__name__}")
        w = linear.weight.data
        if mask is None:
            mask = w != 0
        mask = np.asarray(mask)
        if mask.shape != w.shape or mask.dtype != bool:
            raise ShapeError(f"the mask must be a bool array of the weight's shape {w.shape}, "
                             f"got {mask.dtype} {mask.shape}", module=linear)
        rows, cols = np.nonzero(mask)  # row-major: the CSR order
        layer = cls(linear.in_features, linear.out_features, len(rows), linear.bias is not None,
                    dtype=w.dtype)
        layer.weight_values.data[...] = w[rows, cols]
        layer.weight_values.requires_grad = linear.weight.requires_grad
        layer.weight_indices[...] = cols
        layer.weight_indptr[1:] = np.cumsum(np.count_nonzero(mask, axis=1))
        if linear.bias is not None:
            layer.bias.data[...] = linear.bias.data
            layer.bias.requires_grad = linear.bias.requires_grad
        layer.training = linear.training
        return layer

    def dense_weight(self, out: np.ndarray | None = None) -> np.ndarray:
        """The weight as a dense ``(out_features, in_features)`` array: a new one, or written
        into ``out`` (of that shape) and returned."""
        if out is None:
            out = np.zeros((self.out_features, self.in_features), self.weight_values.dtype)
        else:
            out[...] = 0
        out[self._rows(), self.weight_indices] = self.weight_values.data
        return out

    def to_dense(self) -> Linear:
        """An equal plain ``Linear`` (the zeros stored again); this layer is untouched."""
        with uninitialized():  # every value is written next
            layer = Linear(self.in_features, self.out_features, self.bias is not None,
                           dtype=self.weight_values.dtype)
        self.dense_weight(out=layer.weight.data)
        layer.weight.requires_grad = self.weight_values.requires_grad
        if self.bias is not None:
            layer.bias.data[...] = self.bias.data
            layer.bias.requires_grad = self.bias.requires_grad
        layer.training = self.training
        return layer

    # ------------------------------------------------------------------ properties
    @property
    def nnz(self) -> int:
        """Number of stored weight entries."""
        return len(self.weight_values.data)

    @property
    def density(self) -> float:
        """``nnz / (in_features·out_features)`` (1.0 for an empty weight)."""
        total = self.in_features * self.out_features
        return self.nnz / total if total else 1.0

    @property
    def has_bias(self) -> bool:
        return self.bias is not None

    # ------------------------------------------------------------------ math
    def _rows(self) -> np.ndarray:
        return np.repeat(np.arange(self.out_features), np.diff(self.weight_indptr))

    def _matrix(self):
        """The ``scipy.sparse.csr_array`` over this layer's own arrays (no copy), rebuilt when
        one of them has been replaced (``to(dtype)``, an optimizer rebinding ``data``)."""
        v, i, p = self.weight_values.data, self.weight_indices, self.weight_indptr
        cached = self._scipy
        if cached is None or cached[0] is not v or cached[1] is not i or cached[2] is not p:
            if v.dtype == np.float16:
                raise TypeError("SparseLinear takes float32 or float64 (SciPy's sparse kernels "
                                "have no float16); convert with .to(np.float32)")
            sp = _scipy_sparse()
            matrix = sp.csr_array((v, i, p), shape=(self.out_features, self.in_features),
                                  copy=False)
            self._scipy = cached = (v, i, p, matrix)
        return cached[3]

    def check_input_shape(self, shape: tuple) -> None:
        """Raise the ShapeError ``forward`` would raise for an input of ``shape``."""
        shape = tuple(shape)
        if len(shape) == 0 or shape[-1] != self.in_features:
            raise ShapeError(f"expected input of shape (*, {self.in_features}), got {shape}",
                             module=self)

    def _input(self, x) -> np.ndarray:
        x = as_input(self, x, self.weight_values.data.dtype)
        self.check_input_shape(x.shape)
        return x

    def _product(self, x2: np.ndarray) -> np.ndarray:
        """``x2 (N, in) @ W.T -> (N, out)``, as ``(W @ x2ᵀ)ᵀ``: SciPy's CSR kernel runs over the
        ``(in, N)`` C-ordered copy of ``x2ᵀ``, and its ``(out, N)`` result comes back
        transposed, a Fortran-ordered view (copying it to C order costs more, and ``x @ W.T``
        through SciPy was slower still: docs/measurements.md)."""
        return (self._matrix() @ x2.T).T

    def forward(self, x: np.ndarray) -> np.ndarray:
        """``(*, in_features) -> (*, out_features)``."""
        x = self._input(x)
        y = self._product(x.reshape(math.prod(x.shape[:-1]), self.in_features))
        if self.bias is not None:
            y += self.bias.data
        return y.reshape(x.shape[:-1] + (self.out_features,))

    def vjp(self, x: np.ndarray, input_grad: bool = True):
        """Forward plus ``backward(dy (*, out)) -> dx (*, in)`` (None if not input_grad).

        ``dx = dy @ W`` (sparse); ``d weight_values[k] = Σ_n dy[n, row_k]·x[n, col_k]``, the
        stored entries only; ``db = Σ dy``; all added into ``.grad`` (``Parameter.add_grad``).
        """
        x = self._input(x)
        x2 = x.reshape(math.prod(x.shape[:-1]), self.in_features)
        y = self._product(x2)
        if self.bias is not None:
            y += self.bias.data
        y = y.reshape(x.shape[:-1] + (self.out_features,))
        v, b = self.weight_values, self.bias
        need_dv, need_db = v.requires_grad, b is not None and b.requires_grad
        saved_x = x2 if need_dv else None  # a frozen pattern keeps no activation
        matrix, cols = self._matrix(), self.weight_indices

        def backward(dy: np.ndarray):
            dy2 = dy.reshape(len(x2), self.out_features)
            if need_dv:
                v.add_grad(_values_grad(dy2, saved_x, self._rows(), cols))
            if need_db:
                b.add_grad(write=lambda out, acc: F.linear_bias_grad(dy2, out, acc))
            if not input_grad:
                return None
            return (matrix.T @ dy2.T).T.reshape(x.shape)

        return y, backward

    # ------------------------------------------------------------------ loading
    def _load_targets(self, state_dict, prefix: str, errors: list[str]):
        # A pattern that would make SciPy read outside the input is refused before any load.
        targets, prepare = super()._load_targets(state_dict, prefix, errors)
        keys = (prefix + "weight_indices", prefix + "weight_indptr")
        if all(k in state_dict for k in keys):
            try:
                indices, indptr = (np.asarray(state_dict[k]) for k in keys)
            except Exception:  # noqa: BLE001 - reported by the shape and dtype checks
                return targets, prepare
            if indices.shape == (self.nnz,) and indptr.shape == (self.out_features + 1,):
                problem = csr_problem(indices, indptr, self.in_features, self.out_features)
                if problem is not None:
                    errors.append(f"invalid sparsity pattern in {keys[0]} / {keys[1]}: "
                                  f"{problem}")
        return targets, prepare

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"nnz={self.nnz}, density={self.density:.3g}, bias={self.bias is not None}")


def _values_grad(dy2: np.ndarray, x2: np.ndarray, rows: np.ndarray, cols: np.ndarray
                 ) -> np.ndarray:
    """``g[k] = Σ_n dy2[n, rows[k]]·x2[n, cols[k]]``: dy2 ``(N, out)``, x2 ``(N, in)`` -> ``(nnz,)``
    (the dense ``dyᵀx`` sampled at the stored entries, never formed whole)."""
    n, nnz = len(x2), len(rows)
    g = np.zeros(nnz, x2.dtype)
    if n == 0 or nnz == 0:
        return g
    dyt, xt = np.ascontiguousarray(dy2.T), np.ascontiguousarray(x2.T)
    step = max(1, _GRAD_BLOCK // n)
    for s in range(0, nnz, step):
        np.einsum("kn,kn->k", dyt[rows[s:s + step]], xt[cols[s:s + step]], out=g[s:s + step])
    return g
