"""experiments.factorize_claims: the rank-64 claim's measurement, on a small layer."""

import pytest

from experiments.factorize_claims import measure_factorization_claim


def test_the_article_claim_measurement_runs_on_a_small_layer():
    result = measure_factorization_claim(n=128, rank=8, batch=(4, 16), repeats=1)
    assert result["bytes_before"] == 4 * (128 * 128 + 128)
    assert result["bytes_after"] == 4 * (8 * 256 + 128)
    assert set(result["batches"]) == {4, 16}
    assert all(t["speedup"] == pytest.approx(t["ms_before"] / t["ms_after"])
               for t in result["batches"].values())
    with pytest.raises(ValueError, match="does not save"):
        measure_factorization_claim(n=8, rank=4, batch=4, repeats=1)
