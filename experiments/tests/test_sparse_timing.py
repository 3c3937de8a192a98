"""experiments.sparse_timing: one row per sparsity, CSR against the dense layer."""

import pytest

from experiments.sparse_timing import sparse_vs_dense


def test_sparse_vs_dense_rows():
    pytest.importorskip("scipy")  # SparseLinear's products run in scipy.sparse
    rows = sparse_vs_dense(64, 32, 4, [0.5, 0.95], repeats=1)
    assert [r["sparsity"] for r in rows] == [0.5, 0.95]
    assert [r["nnz"] for r in rows] == [1024, 102]
    assert rows[1]["file_ratio"] < rows[0]["file_ratio"] < 1.2
    assert all(r["dense_ms"] > 0 and r["sparse_ms"] > 0 and r["max_abs_diff"] < 1e-5
               for r in rows)
