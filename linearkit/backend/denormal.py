"""``set_flush_denormal``: PyTorch's switch for subnormal floats on the CPU, for NumPy code.

Why it matters here: a weight whose gradient stays 0 (a dead ReLU unit) has a first moment
that Adam decays by ``beta1`` every step into the subnormal range (|x| < 2**-126 in float32),
where it stays (``m * (1 - beta1)`` rounds to 0 for the smallest ones). On x86 every float
operation that reads or makes a subnormal takes a microcode assist, far slower than a normal
one. In ``linearkit train``'s recipe, after 3,000 steps, many of one layer's ``exp_avg`` entries
are subnormal and Adam's step is slowed by them (``python -m benchmarks.subnormals`` measures it;
docs/fast.md, "Subnormal floats", has the figures). PyTorch's Adam keeps the same subnormals;
JAX (XLA) flushes them by default.

``set_flush_denormal(True)`` sets the CPU's flush-to-zero and denormals-are-zero modes (x86:
MXCSR's FTZ and DAZ bits; AArch64: FPCR's FZ bit) for the calling thread, as
``torch.set_flush_denormal`` does: NumPy's ufuncs and the compiled kernels (linearkit.backend.fast),
which run in that thread, then treat subnormal inputs and results as zero. It changes results
only where a value falls below 2**-126 (float32) or 2**-1022 (float64), and then no longer
matches PyTorch's default bit for bit. BLAS worker threads keep their own mode. Returns True
when the mode was set, False where this platform is not supported (nothing changes).
"""

from __future__ import annotations

import functools
import sys
from contextlib import contextmanager

__all__ = ["flush_denormal", "set_flush_denormal"]

_X86_FTZ_DAZ = 0x8040          # MXCSR: flush-to-zero (bit 15), denormals-are-zero (bit 6)
_ARM_FZ = 1 << 24              # FPCR: flush-to-zero
# glibc's fenv_t: 32 bytes on x86-64 with the MXCSR at byte 28; two uint32 (FPCR, FPSR) on
# AArch64. Other C libraries (macOS, Windows, musl layouts not checked) are not supported.
_LAYOUTS = {"x86_64": (32, 28, _X86_FTZ_DAZ), "aarch64": (8, 0, _ARM_FZ)}


def set_flush_denormal(mode: bool) -> bool:
    """Flush subnormal floats to zero in this thread (True) or compute them exactly (False,
    the default). Returns whether the platform supports it (Linux with glibc on x86-64 or
    AArch64); PyTorch's ``torch.set_flush_denormal`` semantics.

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> tiny = np.float32(1e-39)                     # a float32 subnormal
    >>> if lk.set_flush_denormal(True):
    ...     assert tiny * np.float32(1) == 0
    >>> lk.set_flush_denormal(False) in (True, False)
    True
    >>> float(tiny * np.float32(1)) > 0
    True
    """
    return _switch(mode) is not None


@contextmanager
def flush_denormal(mode: bool = True):
    """``set_flush_denormal(mode)`` inside a ``with`` block; the thread's previous mode is put
    back afterwards, also on an error. Yields whether the platform supports it.

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> with lk.denormal.flush_denormal() as supported:
    ...     assert not supported or np.float32(1e-39) * np.float32(1) == 0
    >>> float(np.float32(1e-39) * np.float32(1)) > 0
    True
    """
    before = _switch(mode)
    if before is None:
        yield False
        return
    try:
        yield True
    finally:
        _write(*before)


def _switch(mode: bool):
    """Set this thread's flush mode; ``(fenv buffer, previous control word)`` to put it back,
    or None where unsupported (or the C library refused)."""
    current = _read()
    if current is None:
        return None
    buffer, word, bits = current
    if not _write(buffer, word | bits if mode else word & ~bits):
        return None
    return buffer, word


def _read():
    """``(fenv buffer, control word, its flush bits)`` of this thread, or None (unsupported)."""
    env = _env()
    if env is None:
        return None
    import ctypes

    libc, size, offset, bits = env
    buffer = ctypes.create_string_buffer(size)
    if libc.fegetenv(buffer) != 0:
        return None
    return buffer, int.from_bytes(buffer.raw[offset:offset + 4], sys.byteorder), bits


def _write(buffer, word: int) -> bool:
    libc, _, offset, _ = _env()
    buffer[offset:offset + 4] = word.to_bytes(4, sys.byteorder)
    return libc.fesetenv(buffer) == 0


@functools.cache
def _env():
    """``(libc, size of fenv_t, offset of the control word, its bits)``, or None."""
    import platform  # only when asked (import linearkit stays light)

    layout = _LAYOUTS.get(platform.machine().lower())
    if layout is None or not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        libc.fegetenv, libc.fesetenv   # noqa: B018 - both present, or unsupported
    except (OSError, AttributeError):
        return None
    return (libc, *layout)
