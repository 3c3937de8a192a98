"""Optional compiled kernels (numba), loaded lazily: the ``linearkit[fast]`` extra.

Each kernel replaces a NumPy sequence with one pass and gives the same bits (tests/test_fast.py
runs both on the same inputs). The NumPy path is used when numba is not installed, for dtypes a
kernel does not cover, and whenever the environment sets ``LINEARKIT_FAST=0``.

``import linearkit`` never imports numba: the kernels' module (and numba with it, a slow import:
docs/fast.md) is imported the first time a caller asks for it, typically the first optimizer
step. Kernels are compiled with numba's on-disk cache, so a second process reloads them instead
of recompiling. On a machine where they were never compiled, ``linearkit train`` trains on the
NumPy path while a background process compiles them into that cache (``background.py``; inside
``held()`` the kernels stay unloaded): docs/fast.md, "The first run".
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import types

import numpy as np

__all__ = ["available", "enabled", "held", "kernels", "loaded", "supports"]

_FLOAT32, _FLOAT64 = np.dtype(np.float32), np.dtype(np.float64)
_loaded = None       # the kernels (a namespace) once imported, False when the import failed
_held = False        # inside held(): kernels() leaves them unloaded (the NumPy path runs)


# os.environ's own store, read without the Mapping's per-call key encoding (most of the cost of
# each enabled() call, several per training step: docs/fast.md); any other platform reads
# os.environ itself
_ENV = getattr(os.environ, "_data", None)
try:
    _ENV_KEY = os.environ.encodekey("LINEARKIT_FAST") if _ENV is not None else None
except AttributeError:
    _ENV = None


def enabled() -> bool:
    """False when the environment sets ``LINEARKIT_FAST=0`` (read at every call)."""
    if _ENV is not None:
        value = _ENV.get(_ENV_KEY)
        return value is None or os.environ.decodevalue(value).strip() != "0"
    return os.environ.get("LINEARKIT_FAST", "1").strip() != "0"


def available() -> bool:
    """True when the kernels can be used: enabled and numba installed (imports nothing)."""
    if not enabled() or _loaded is False:
        return False
    if _loaded is not None:
        return True
    if _held:
        return False
    try:
        return importlib.util.find_spec("numba") is not None
    except (ImportError, ValueError):    # ValueError: sys.modules['numba'] is None
        return False


def kernels():
    """The kernels (numba imported on the first call), or None: ``adam_flat``, ``sgd_momentum``
    (optim), ``bias_relu_``, ``relu_``, ``relu_backward_into`` (runtime/thin_path.py), ``outer_add_``
    (one-row dW), ``softmax_ce_forward``/``_backward`` (CrossEntropyLoss), ``chain`` (a
    Sequential of Linear/ReLU/Residual as two calls: runtime/compiled_chain.py), ``train_step`` and
    ``adam_settings`` (a whole ``loop.step`` as one call: linearkit/runtime/compiled_step.py)."""
    global _loaded
    if not enabled():
        return None
    if _loaded is None:
        if _held:            # a background process is compiling them: NumPy path, no numba
            return None
        try:
            from . import (
                adam_kernel,
                chain_kernel,
                elementwise_kernel,
                sgd_kernel,
                softmax_ce_kernel,
                step_kernel,
            )
        except ImportError:      # numba absent or broken: the NumPy path, for good
            _loaded = False
        else:
            _loaded = types.SimpleNamespace(
                adam_flat=adam_kernel.adam_flat, sgd_momentum=sgd_kernel.sgd_momentum,
                bias_relu_=elementwise_kernel.bias_relu_, relu_=elementwise_kernel.relu_,
                relu_backward_into=elementwise_kernel.relu_backward_into,
                outer_add_=elementwise_kernel.outer_add_,
                softmax_ce_forward=softmax_ce_kernel.softmax_ce_forward,
                softmax_ce_backward=softmax_ce_kernel.softmax_ce_backward,
                chain=chain_kernel, adam_settings=adam_kernel.adam_settings,
                train_step=step_kernel.train_step)
    return _loaded or None


def loaded():
    """``kernels()`` if an earlier call already imported them, else None: never imports numba
    (for a plain forward, where a kernel saves far less than importing numba costs: docs/fast.md).
    The environment is read only once they are loaded (a forward asks up to three times)."""
    if not _loaded:
        return None
    return _loaded if enabled() else None


@contextlib.contextmanager
def held():
    """Inside the block, ``kernels()`` returns None and ``available()`` False unless the kernels
    were loaded before it: every caller takes the NumPy path and numba is not imported (while
    another process compiles the kernels into numba's cache: ``background.py``). Blocks nest."""
    global _held
    before = _held
    _held = True
    try:
        yield
    finally:
        _held = before


def supports(dtype) -> bool:
    """Whether the kernels cover this compute dtype (float32 and float64)."""
    return dtype == _FLOAT32 or dtype == _FLOAT64
