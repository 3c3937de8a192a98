"""MNIST-1D, generated procedurally and cached on disk.

MNIST-1D (Greydanus 2020, "Scaling Down Deep Learning") turns ten hand-drawn 12-point
templates, one per digit, into 40-point signals by padding, dilating, scaling, translating,
adding correlated and i.i.d. noise, shearing and subsampling. With the published default
arguments (seed 42) this module reproduces the reference ``mnist1d.data.make_dataset``
to float rounding: it draws the same random numbers in the same order from a local legacy
``numpy.random.RandomState`` and replaces SciPy's ``interp1d`` (linear) and
``gaussian_filter`` (sigma 2, mode "reflect") by NumPy code that does the same arithmetic.

No network, no pickle, no SciPy: the arrays are built here in a fraction of a second and
cached as ``.npz`` (written atomically, read with ``allow_pickle=False``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import tempfile
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["MNIST1D", "default_cache_dir", "mnist1d"]

# Bump when the arrays written to the cache change meaning, so old files are not reused.
_FORMAT_VERSION = 1

# The ten digit templates of the reference implementation, 12 points each.
_DIGITS = (
    (5, 6, 6.5, 6.75, 7, 7, 7, 7, 6.75, 6.5, 6, 5),
    (5, 3, 3, 3.4, 3.8, 4.2, 4.6, 5, 5.4, 5.8, 5, 5),
    (5, 6, 6.5, 6.5, 6, 5.25, 4.75, 4, 3.5, 3.5, 4, 5),
    (5, 6, 6.5, 6.5, 6, 5, 5, 6, 6.5, 6.5, 6, 5),
    (5, 4.4, 3.8, 3.2, 2.6, 2.6, 5, 5, 5, 5, 5, 5),
    (5, 3, 3, 3, 3, 5, 6, 6.5, 6.5, 6, 4.5, 5),
    (5, 4, 3.5, 3.25, 3, 3, 3, 3, 3.25, 3.5, 4, 5),
    (5, 7, 7, 6.6, 6.2, 5.8, 5.4, 5, 4.6, 4.2, 5, 5),
    (5, 4, 3.5, 3.5, 4, 5, 5, 4, 3.5, 3.5, 4, 5),
    (5, 4, 3.5, 3.5, 4, 5, 5, 5, 5, 4.7, 4.3, 5),
)


@dataclass(frozen=True)
class _Args:
    """The generator's arguments; the defaults are the published ones."""

    num_samples: int = 5000
    train_split: float = 0.8
    template_len: int = 12
    padding: tuple[int, int] = (36, 60)  # zeros appended: uniform integer in [36, 60]
    scale_coeff: float = 0.4  # amplitude factor in [0.8, 1.2)
    max_translation: int = 48  # circular shift: uniform integer in [0, 48)
    corr_noise_scale: float = 0.25  # std of the noise before Gaussian smoothing (sigma 2)
    iid_noise_scale: float = 2e-2
    shear_scale: float = 0.75  # slope added: uniform in [-0.375, 0.375)
    shuffle_seq: bool = False  # also permute the 40 time steps (same permutation for all)
    final_seq_length: int = 40
    seed: int = 42

    def key(self) -> str:
        """Short hash naming the cache file for these arguments."""
        text = json.dumps({"version": _FORMAT_VERSION, **dataclasses.asdict(self)}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True, repr=False)
class MNIST1D:
    """The MNIST-1D arrays, split as published (first 80 % of the shuffled samples train).

    Attributes
    ----------
    x_train : ndarray, shape (4000, 40), float32
        Training signals, standardized over the whole data set (mean 0, std 1).
    y_train : ndarray, shape (4000,), int64
        Digit labels 0..9.
    x_test : ndarray, shape (1000, 40), float32
    y_test : ndarray, shape (1000,), int64
    t : ndarray, shape (40,), float32
        The time grid of the signals (for plotting), scaled like ``x``.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    t: np.ndarray

    num_classes = 10

    def __repr__(self) -> str:
        return (
            f"MNIST1D(x_train={self.x_train.shape}, x_test={self.x_test.shape}, "
            f"num_classes={self.num_classes})"
        )


def default_cache_dir() -> Path:
    """``$LINEARKIT_CACHE`` if set, else ``~/.cache/linearkit``."""
    env = os.environ.get("LINEARKIT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "linearkit"


def mnist1d(*, cache_dir: str | os.PathLike | None = None, regenerate: bool = False) -> MNIST1D:
    """Load MNIST-1D, generating it (and caching it) on first use.

    Parameters
    ----------
    cache_dir : path, optional
        Folder for the cache file ``mnist1d-<hash of the arguments>.npz``. Default:
        ``$LINEARKIT_CACHE``, else ``~/.cache/linearkit``.
    regenerate : bool
        Rebuild the arrays and overwrite the cache file even if it exists.

    Returns
    -------
    MNIST1D
        ``x_train (4000, 40) float32``, ``y_train (4000,) int64``, ``x_test (1000, 40)
        float32``, ``y_test (1000,) int64``, ``t (40,) float32``.

    Notes
    -----
    Never touches the network and never unpickles. An unreadable cache file is rebuilt; an
    unwritable cache folder only costs a warning (the arrays are still returned).

    Examples
    --------
    >>> import tempfile
    >>> ds = mnist1d(cache_dir=tempfile.mkdtemp())
    >>> ds.x_train.shape, ds.x_train.dtype, ds.y_test.shape
    ((4000, 40), dtype('float32'), (1000,))
    """
    args = _Args()
    folder = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    path = folder / f"mnist1d-{args.key()}.npz"
    if not regenerate and path.exists():
        data = _load(path, args)
        if data is not None:
            return data
    data = _to_public(_generate(args))
    try:
        _save_atomic(path, data, args)
    except OSError as err:
        warnings.warn(f"could not cache MNIST-1D at {path}: {err}", RuntimeWarning, stacklevel=2)
    return data


# --------------------------------------------------------------------------- generation


def _generate(args: _Args = _Args()) -> dict[str, np.ndarray]:
    """Build MNIST-1D in float64, exactly as the reference procedure does.

    Returns a dict with ``x (n_train, L)``, ``y (n_train,)``, ``x_test``, ``y_test`` and
    ``t (L,)``, ``L = final_seq_length`` — the reference's own keys and dtypes.
    """
    templates, t_template = _templates()
    n_classes = len(templates)
    per_class = args.num_samples // n_classes
    n = per_class * n_classes
    width = args.template_len + args.padding[1]  # length after dilation
    labels = np.repeat(np.arange(n_classes), per_class)  # class-major, as the reference loops

    # 1. Every random draw, in the reference's order: per sample, padding, scale,
    #    translation, correlated noise, i.i.d. noise, shear; then the sample shuffle.
    rs = np.random.RandomState(args.seed)
    lo, hi = args.padding
    pad_len = np.empty(n, dtype=np.int64)
    scale = np.empty(n)
    shift = np.empty(n, dtype=np.int64)
    corr = np.empty((n, width))
    iid = np.empty((n, width))
    shear = np.empty(n)
    for i in range(n):
        pad_len[i] = lo + int(rs.rand() * (hi - lo + 1))
        scale[i] = 1 + args.scale_coeff * (rs.rand() - 0.5)
        shift[i] = rs.randint(0, args.max_translation)  # same stream as rs.choice(max_translation)
        corr[i] = args.corr_noise_scale * rs.randn(width)
        iid[i] = args.iid_noise_scale * rs.randn(width)
        shear[i] = args.shear_scale * (rs.rand() - 0.5)
    order = rs.permutation(n)
    seq_order = rs.permutation(args.final_seq_length) if args.shuffle_seq else None

    # 2. Pad with zeros and dilate to `width`. Only len(templates) x (hi - lo + 1) distinct
    #    results exist, so compute each once. The +1e-8 keeps the signal's own zeros nonzero,
    #    which is how step 4 tells the signal from the padding.
    x = np.empty((n, width))
    for p in np.unique(pad_len):
        padded = np.concatenate([templates + 1e-8, np.zeros((n_classes, p))], axis=1)
        rows = pad_len == p
        x[rows] = _resample(padded, width)[labels[rows]]

    # 3. Scale the amplitude and shift circularly: x[i, j] <- x[i, (j - shift[i]) % width].
    x *= scale[:, None]
    cols = (np.arange(width) - shift[:, None]) % width
    x = np.take_along_axis(x, cols, axis=1)

    # 4. Fill the padding with smoothed noise, add i.i.d. noise everywhere, shear.
    x = np.where(x != 0, x, _gaussian_smooth(corr, sigma=2.0))
    x = x + iid
    x = x - shear[:, None] * np.linspace(-0.5, 0.5, width)

    # 5. Subsample to the final length; shuffle; standardize with the global mean and std.
    x = _resample(x, args.final_seq_length)[order]
    y = labels[order]
    if seq_order is not None:
        x = x[:, seq_order]
    t = _resample(_resample(t_template, width), args.final_seq_length) / x.std()
    x = (x - x.mean()) / x.std()

    split = int(n * args.train_split)
    return {"x": x[:split], "y": y[:split], "x_test": x[split:], "y_test": y[split:], "t": t}


def _templates() -> tuple[np.ndarray, np.ndarray]:
    """The templates ``(10, 12)``, standardized per digit, starting and ending at 0, and
    their time grid ``(12,)``."""
    x = np.array(_DIGITS, dtype=np.float64)
    x -= x.mean(axis=1, keepdims=True)
    x /= x.std(axis=1, keepdims=True)
    x -= x[:, :1]
    return x / 6.0, np.linspace(-5, 5, x.shape[1]) / 6.0


def _resample(f: np.ndarray, n: int) -> np.ndarray:
    """Linear interpolation of ``f (..., m)``, sampled on ``linspace(0, 1, m)``, at
    ``linspace(0, 1, n)`` -> ``(..., n)``.

    Row by row this is ``np.interp`` (which SciPy's linear ``interp1d`` calls for 1-D data),
    including its arithmetic: ``slope * (s - xp[j]) + f[j]`` with ``xp[j] <= s < xp[j + 1]``
    (exactly ``f[j]`` on a knot), and ``f[-1]`` at ``s = 1``.
    """
    m = f.shape[-1]
    xp = np.linspace(0, 1, m)
    s = np.linspace(0, 1, n)
    j = np.minimum(np.searchsorted(xp, s, side="right") - 1, m - 2)
    slope = (f[..., j + 1] - f[..., j]) / (xp[j + 1] - xp[j])
    out = slope * (s - xp[j]) + f[..., j]
    out[..., -1] = f[..., -1]  # np.interp returns the last knot's value, not slope * h + f[-2]
    return out


def _gaussian_smooth(x: np.ndarray, sigma: float, truncate: float = 4.0) -> np.ndarray:
    """Gaussian filter along the last axis with mode "reflect" (``d c b a | a b c d | d c b a``).

    Same kernel and the same order of operations as ``scipy.ndimage.gaussian_filter1d``
    (symmetric kernel: centre tap first, then the outermost pair inwards).
    """
    radius = int(truncate * sigma + 0.5)
    w = np.exp(-0.5 / sigma**2 * np.arange(-radius, radius + 1) ** 2)
    w = w / w.sum()
    pad_width = [(0, 0)] * (x.ndim - 1) + [(radius, radius)]
    xp = np.pad(x, pad_width, mode="symmetric")
    m = x.shape[-1]
    out = xp[..., radius : radius + m] * w[radius]
    for k in range(radius, 0, -1):
        out += (xp[..., radius - k : radius - k + m] + xp[..., radius + k : radius + k + m]) * w[
            radius - k
        ]
    return out


# --------------------------------------------------------------------------- cache

_SHAPES = {"x_train": 2, "y_train": 1, "x_test": 2, "y_test": 1, "t": 1}
_DTYPES = {
    "x_train": np.float32,
    "y_train": np.int64,
    "x_test": np.float32,
    "y_test": np.int64,
    "t": np.float32,
}


def _to_public(raw: dict[str, np.ndarray]) -> MNIST1D:
    return MNIST1D(
        x_train=raw["x"].astype(np.float32),
        y_train=raw["y"].astype(np.int64),
        x_test=raw["x_test"].astype(np.float32),
        y_test=raw["y_test"].astype(np.int64),
        t=raw["t"].astype(np.float32),
    )


def _save_atomic(path: Path, data: MNIST1D, args: _Args) -> None:
    """Write ``path`` so that readers see either no file or the whole file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {name: getattr(data, name) for name in _SHAPES}
    meta = json.dumps(dataclasses.asdict(args), sort_keys=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, args=np.array(meta), **arrays)  # a str array: no pickle needed
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _load(path: Path, args: _Args) -> MNIST1D | None:
    """The cached arrays, or None (with a warning) when the file is unusable."""
    try:
        with np.load(path, allow_pickle=False) as f:
            meta = json.loads(str(f["args"]))
            arrays = {name: f[name] for name in _SHAPES}
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as err:
        warnings.warn(
            f"ignoring unreadable cache {path} ({err}); rebuilding", RuntimeWarning, stacklevel=3
        )
        return None
    ok = meta == json.loads(json.dumps(dataclasses.asdict(args))) and all(
        arrays[k].ndim == nd and arrays[k].dtype == _DTYPES[k] for k, nd in _SHAPES.items()
    )
    if not ok:
        warnings.warn(
            f"cache {path} does not match the expected arrays; rebuilding",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    return MNIST1D(**arrays)
