"""Measure SparseLinear against the dense Linear: file size and forward time across sparsities.

For the docs page (docs/surgery.md): where does the CSR layer start to win on this machine?
Times are medians over ``repeats`` of the two layers run alternately (the ratio is taken within
one run, so a busy machine slows both), with the 1-minute load average recorded beside them.
"""

from __future__ import annotations

import os
import tempfile
from functools import partial

import numpy as np

from linearkit import Linear, SparseLinear
from linearkit.analysis.timing import same_run_seconds
from linearkit.transforms import prune_weight

__all__ = ["sparse_vs_dense"]

def _file_bytes(module, folder: str, name: str) -> int:
    from linearkit import save

    path = os.path.join(folder, name)
    save(module, path)
    return os.path.getsize(path)


def sparse_vs_dense(n_in: int, n_out: int, batch: int, sparsities, repeats: int = 7, *,
                    seed: int = 0) -> list[dict]:
    """One row per sparsity: a ``Linear(n_in, n_out)`` magnitude-pruned to it (float32), against
    the ``SparseLinear`` holding its nonzeros, on a ``(batch, n_in)`` input.

    Returns
    -------
    list of dict, each with ``n_in``, ``n_out``, ``batch``, ``sparsity``, ``nnz``, ``density``;
    ``dense_file_bytes`` / ``sparse_file_bytes`` (``linearkit.save`` files, architecture
    included) and ``file_ratio`` (sparse / dense); ``dense_ms`` / ``sparse_ms`` (median forward
    time) and ``speedup`` (dense / sparse: above 1, sparse wins); ``max_abs_diff`` between the
    two outputs; ``load`` (1-minute load average before and after the row's timing).
    """
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, n_in)).astype(np.float32)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for sparsity in sparsities:
            dense = Linear(n_in, n_out, rng=np.random.default_rng(seed))
            dense.weight.data[~prune_weight(dense.weight.data, float(sparsity))] = 0
            sparse = SparseLinear.from_linear(dense)
            load_before = os.getloadavg()[0]
            dense_s, sparse_s = same_run_seconds([partial(dense, x), partial(sparse, x)],
                                                 repeats=repeats, min_seconds=0.01)
            dense_ms, sparse_ms = 1e3 * dense_s, 1e3 * sparse_s
            dense_file = _file_bytes(dense, folder, "dense.safetensors")
            sparse_file = _file_bytes(sparse, folder, "sparse.safetensors")
            rows.append({
                "n_in": n_in, "n_out": n_out, "batch": batch, "sparsity": float(sparsity),
                "nnz": sparse.nnz, "density": sparse.density,
                "dense_file_bytes": dense_file, "sparse_file_bytes": sparse_file,
                "file_ratio": sparse_file / dense_file,
                "dense_ms": float(dense_ms), "sparse_ms": float(sparse_ms),
                "speedup": float(dense_ms / sparse_ms),
                "max_abs_diff": float(np.max(np.abs(dense(x) - sparse(x)), initial=0.0)),
                "load": (load_before, os.getloadavg()[0]),
            })
    return rows
