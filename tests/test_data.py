"""linearkit.data: MNIST-1D against the reference generator, its cache, and DataLoader."""

import dataclasses
import importlib
import os

import numpy as np
import pytest

import linearkit
from linearkit.data import MNIST1D, DataLoader, mnist1d
from linearkit.data.mnist1d import _Args, _generate

# `linearkit.data.mnist1d` is the function; the module behind it:
mnist1d_module = importlib.import_module("linearkit.data.mnist1d")

KEYS = ("x", "y", "x_test", "y_test", "t")


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return mnist1d(cache_dir=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def oracle():
    # make_dataset only: get_dataset downloads and unpickles.
    data = pytest.importorskip("mnist1d.data")
    return data.make_dataset(data.get_dataset_args())


def _oracle_args(**overrides):
    data = pytest.importorskip("mnist1d.data")
    from mnist1d.utils import ObjectView

    args = data.get_dataset_args(as_dict=True)
    args.update(overrides)
    return data.make_dataset(ObjectView(args))


# ------------------------------------------------------------------ agreement with the oracle


def test_matches_reference_mnist1d(ds, oracle):
    ref_x, ref_xt = np.asarray(oracle["x"]), np.asarray(oracle["x_test"])
    assert ds.x_train.shape == ref_x.shape == (4000, 40)
    assert ds.x_test.shape == ref_xt.shape == (1000, 40)
    # float32 storage of the reference's float64 values: error <= half an ulp (|x| < 16).
    np.testing.assert_allclose(ds.x_train, ref_x, rtol=0, atol=1e-6)
    np.testing.assert_allclose(ds.x_test, ref_xt, rtol=0, atol=1e-6)
    np.testing.assert_allclose(ds.t, oracle["t"], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(ds.y_train, oracle["y"])
    np.testing.assert_array_equal(ds.y_test, oracle["y_test"])


def test_float64_generator_matches_reference_to_rounding(oracle):
    ours = _generate()
    for k in KEYS:
        np.testing.assert_allclose(ours[k], oracle[k], rtol=0, atol=1e-12, err_msg=k)


@pytest.mark.parametrize(
    "overrides",
    [
        {"num_samples": 300, "shuffle_seq": True, "seed": 7},
        {
            "num_samples": 250,
            "final_seq_length": 57,
            "padding": (5, 20),
            "max_translation": 10,
            "train_split": 0.5,
            "seed": 3,
        },
    ],
)
def test_generator_follows_the_reference_for_other_arguments(overrides):
    ref = _oracle_args(**overrides)
    ours = _generate(_Args(**overrides))
    for k in KEYS:
        np.testing.assert_allclose(ours[k], ref[k], rtol=0, atol=1e-12, err_msg=k)


# ------------------------------------------------------------------ content without the oracle


def test_shapes_dtypes_and_statistics(ds):
    assert isinstance(ds, MNIST1D)
    assert (ds.x_train.shape, ds.x_train.dtype) == ((4000, 40), np.float32)
    assert (ds.x_test.shape, ds.x_test.dtype) == ((1000, 40), np.float32)
    assert (ds.y_train.shape, ds.y_train.dtype) == ((4000,), np.int64)
    assert (ds.y_test.shape, ds.y_test.dtype) == ((1000,), np.int64)
    assert (ds.t.shape, ds.t.dtype) == ((40,), np.float32)
    x = np.concatenate([ds.x_train, ds.x_test]).astype(np.float64)
    assert abs(x.mean()) < 1e-6 and abs(x.std() - 1) < 1e-6  # standardized globally
    assert np.all(np.isfinite(x))
    assert np.all(np.diff(ds.t) > 0)
    # 500 per class in all, shuffled before the split
    y = np.concatenate([ds.y_train, ds.y_test])
    np.testing.assert_array_equal(np.bincount(y, minlength=10), [500] * 10)
    counts = np.bincount(ds.y_train, minlength=10)
    assert counts.min() > 350 and counts.max() < 450
    assert len(np.unique(ds.y_train[:50])) > 5  # not class-sorted


def test_known_values(ds):
    # Regression anchors (from the reference generator, seed 42), independent of mnist1d.
    np.testing.assert_array_equal(ds.y_train[:10], [2, 6, 4, 5, 6, 6, 6, 0, 3, 1])
    np.testing.assert_array_equal(ds.y_test[:5], [2, 6, 3, 9, 4])
    np.testing.assert_allclose(
        ds.x_train[0, :4], [-0.3320057, -0.4719104, -0.7786971, -1.0097408], atol=1e-6
    )
    np.testing.assert_allclose(ds.x_test[-1, -3:], [0.6598756, 0.8777344, 1.1931518], atol=1e-6)
    np.testing.assert_allclose(ds.t[[0, -1]], [-5.387535, 5.387535], atol=1e-5)
    assert len({ds.x_train[i].tobytes() for i in range(len(ds.x_train))}) == 4000


def test_resample_is_np_interp():
    rng = np.random.default_rng(0)
    for m, n in [(17, 2), (17, 5), (17, 17), (17, 40), (72, 40), (48, 72), (2, 9)]:
        f = rng.standard_normal((300, m))
        s, xp = np.linspace(0, 1, n), np.linspace(0, 1, m)
        want = np.stack([np.interp(s, xp, row) for row in f])
        np.testing.assert_array_equal(mnist1d_module._resample(f, n), want)  # bitwise


def test_gaussian_smooth_against_direct_formula():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 30))
    r, sigma = 8, 2.0
    w = np.exp(-0.5 * np.arange(-r, r + 1) ** 2 / sigma**2)
    w /= w.sum()
    padded = np.concatenate([x[:, :r][:, ::-1], x, x[:, -r:][:, ::-1]], axis=1)  # reflect
    want = np.stack([np.convolve(row, w, mode="valid") for row in padded])
    np.testing.assert_allclose(mnist1d_module._gaussian_smooth(x, sigma), want, rtol=0, atol=1e-14)


# ------------------------------------------------------------------ cache


def _files(folder):
    return sorted(os.listdir(folder))


def test_cache_written_once_then_loaded(tmp_path, monkeypatch):
    first = mnist1d(cache_dir=tmp_path)
    files = _files(tmp_path)
    assert len(files) == 1 and files[0].startswith("mnist1d-") and files[0].endswith(".npz")
    with np.load(tmp_path / files[0], allow_pickle=False) as f:  # loads without pickle
        assert {"x_train", "y_train", "x_test", "y_test", "t"} <= set(f.files)
        assert all(f[k].dtype != object for k in f.files)

    def boom(*a, **k):
        raise AssertionError("regenerated although a cache file exists")

    monkeypatch.setattr(mnist1d_module, "_generate", boom)
    second = mnist1d(cache_dir=tmp_path)
    for name in ("x_train", "y_train", "x_test", "y_test", "t"):
        a, b = getattr(first, name), getattr(second, name)
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    assert _files(tmp_path) == files  # nothing new, no temp file left behind


def test_regenerate_rebuilds(tmp_path, monkeypatch):
    mnist1d(cache_dir=tmp_path)
    calls = []
    real = mnist1d_module._generate
    monkeypatch.setattr(mnist1d_module, "_generate", lambda *a: calls.append(1) or real(*a))
    mnist1d(cache_dir=tmp_path)
    assert calls == []
    ds = mnist1d(cache_dir=tmp_path, regenerate=True)
    assert calls == [1]
    assert ds.x_train.shape == (4000, 40) and len(_files(tmp_path)) == 1


def test_env_var_sets_default_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("LINEARKIT_CACHE", str(tmp_path / "env"))
    assert linearkit.data.default_cache_dir() == tmp_path / "env"
    mnist1d()
    assert [f for f in _files(tmp_path / "env") if f.endswith(".npz")]
    # an explicit cache_dir wins over the environment
    mnist1d(cache_dir=tmp_path / "arg")
    assert len(_files(tmp_path / "arg")) == 1


def test_cache_file_name_depends_on_arguments():
    assert _Args().key() == _Args().key()
    assert _Args().key() != _Args(seed=0).key()
    assert _Args().key() != dataclasses.replace(_Args(), padding=(36, 61)).key()


def test_corrupt_cache_is_rebuilt(tmp_path, ds):
    good = mnist1d(cache_dir=tmp_path)
    (path,) = [tmp_path / f for f in _files(tmp_path)]
    path.write_bytes(b"not a zip file")
    with pytest.warns(RuntimeWarning, match="rebuilding"):
        again = mnist1d(cache_dir=tmp_path)
    np.testing.assert_array_equal(again.x_train, good.x_train)
    with np.load(path, allow_pickle=False) as f:  # the file was repaired
        np.testing.assert_array_equal(f["x_train"], good.x_train)


def test_failed_write_leaves_no_temp_file(tmp_path, monkeypatch):
    def broken_savez(file, **arrays):
        file.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(mnist1d_module.np, "savez", broken_savez)
    with pytest.warns(RuntimeWarning, match="could not cache"):
        ds = mnist1d(cache_dir=tmp_path)
    assert ds.x_train.shape == (4000, 40)  # still returned
    assert _files(tmp_path) == []  # neither a partial .npz nor a temp file


def test_write_is_atomic_via_replace(tmp_path, monkeypatch):
    seen = []
    real_replace = os.replace

    def spy(src, dst):
        seen.append((os.path.basename(src), os.path.basename(dst), _files(tmp_path)))
        real_replace(src, dst)

    monkeypatch.setattr(mnist1d_module.os, "replace", spy)
    mnist1d(cache_dir=tmp_path)
    ((src, dst, before),) = seen
    assert src != dst and dst.endswith(".npz") and before == [src]  # final name appears last
    assert _files(tmp_path) == [dst]


# ------------------------------------------------------------------ DataLoader


def _epoch(loader):
    return [(xb.copy(), yb.copy()) for xb, yb in loader]


def test_loader_sequential_batches_and_len():
    x, y = np.arange(20).reshape(10, 2), np.arange(10)
    loader = DataLoader(x, y, batch_size=4)
    assert len(loader) == 3
    batches = _epoch(loader)
    assert [len(yb) for _, yb in batches] == [4, 4, 2]
    np.testing.assert_array_equal(np.concatenate([xb for xb, _ in batches]), x)
    np.testing.assert_array_equal(np.concatenate([yb for _, yb in batches]), y)
    dropped = DataLoader(x, y, batch_size=4, drop_last=True)
    assert len(dropped) == 2 and [len(yb) for _, yb in dropped] == [4, 4]
    assert len(DataLoader(x, y, batch_size=5, drop_last=True)) == 2
    assert len(DataLoader(x, y, batch_size=11)) == 1
    assert len(DataLoader(x, y, batch_size=11, drop_last=True)) == 0


@pytest.mark.parametrize("shuffle", [False, True])
def test_an_epoch_without_a_batch_is_an_error(shuffle):
    # `while step < steps: for xb, yb in loader` spun forever on such a loader (a fixed bug).
    x, y = np.arange(20).reshape(10, 2), np.arange(10)
    loader = DataLoader(x, y, batch_size=11, shuffle=shuffle, drop_last=True, seed=0)
    with pytest.raises(ValueError) as info:
        next(iter(loader))
    message = str(info.value)
    assert "batch_size=11" in message and "10 rows" in message and "drop_last=True" in message
    assert "batch_size <= 10" in message and "drop_last=False" in message  # the fixes
    empty = DataLoader(np.zeros((0, 2)), np.zeros(0), batch_size=4)
    with pytest.raises(ValueError, match="0 rows"):
        list(empty)
    # one short batch is still a batch
    assert [len(yb) for _, yb in DataLoader(x, y, batch_size=11)] == [10]


def test_loader_shuffle_covers_every_sample_once_and_reshuffles():
    n = 103
    x, y = np.arange(n * 3).reshape(n, 3).astype(np.float32), np.arange(n)
    loader = DataLoader(x, y, batch_size=10, shuffle=True, seed=0)
    orders = []
    for _ in range(3):
        batches = _epoch(loader)
        assert len(batches) == len(loader) == 11
        yy = np.concatenate([yb for _, yb in batches])
        np.testing.assert_array_equal(np.sort(yy), y)  # each sample exactly once
        for xb, yb in batches:  # rows stay paired
            np.testing.assert_array_equal(xb, x[yb])
            assert xb.dtype == np.float32
        orders.append(yy)
    assert not np.array_equal(orders[0], y)  # shuffled
    assert not np.array_equal(orders[0], orders[1])  # reshuffled every epoch


def test_loader_shuffle_drop_last_drops_a_random_remainder():
    y = np.arange(103)
    loader = DataLoader(y, y, batch_size=10, shuffle=True, drop_last=True, seed=1)
    seen = [np.concatenate([yb for _, yb in loader]) for _ in range(2)]
    assert all(len(s) == 100 and len(np.unique(s)) == 100 for s in seen)
    assert set(y) - set(seen[0]) != set(y) - set(seen[1])


def test_loader_is_deterministic_by_seed():
    x, y = np.random.default_rng(0).standard_normal((50, 4)), np.arange(50)

    def run(seed):
        loader = DataLoader(x, y, batch_size=7, shuffle=True, seed=seed)
        return [yb for _ in range(2) for _, yb in loader]

    a, b, c = run(123), run(123), run(124)
    assert all(np.array_equal(u, v) for u, v in zip(a, b))
    assert not all(np.array_equal(u, v) for u, v in zip(a, c))
    # seed=None draws from the library generator, so manual_seed makes it reproducible
    linearkit.manual_seed(5)
    d = [yb for _, yb in DataLoader(x, y, batch_size=7, shuffle=True)]
    linearkit.manual_seed(5)
    e = [yb for _, yb in DataLoader(x, y, batch_size=7, shuffle=True)]
    assert all(np.array_equal(u, v) for u, v in zip(d, e))
    # a Generator is accepted as is
    g = [
        yb
        for _, yb in DataLoader(x, y, batch_size=7, shuffle=True, seed=np.random.default_rng(123))
    ]
    assert all(np.array_equal(u, v) for u, v in zip(a, g))


def test_loader_errors():
    x = np.zeros((10, 3))
    with pytest.raises(ValueError, match="same number of rows"):
        DataLoader(x, np.zeros(9), batch_size=2)
    for bad in (0, -3):
        with pytest.raises(ValueError, match="batch_size must be >= 1"):
            DataLoader(x, np.zeros(10), batch_size=bad)
    for bad in (2.0, True, None):
        with pytest.raises(TypeError, match="batch_size must be an int"):
            DataLoader(x, np.zeros(10), batch_size=bad)
    with pytest.raises(ValueError, match="batch dimension"):
        DataLoader(np.float32(1.0), np.zeros(1))


def test_loader_on_mnist1d(ds):
    loader = DataLoader(
        ds.x_train, ds.y_train, batch_size=100, shuffle=True, drop_last=True, seed=42
    )
    assert len(loader) == 40
    xb, yb = next(iter(loader))
    assert xb.shape == (100, 40) and xb.dtype == np.float32 and yb.dtype == np.int64
