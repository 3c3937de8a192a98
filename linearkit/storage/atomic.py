"""One way every linearkit writer puts a file in place: temp file beside it, fsync, rename.

``path`` is always either the old file or the complete new one; after an exception the temp file
is removed; a SIGKILL (or power loss) mid-write can leave one ``.tmp-*`` file beside the target,
safe to delete, never a truncated target. A new file gets the mode the umask gives any new file
(mkstemp's 0600 would otherwise survive the rename); overwriting keeps the old file's mode.
"""

from __future__ import annotations

import os
import stat
import tempfile

__all__ = ["write_atomically"]


def _new_file_mode() -> int:
    """The mode ``open()`` gives a new file: 0o666 less the process's umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_atomically(path, data: bytes, suffix: str = "") -> str:
    """Write ``data`` to ``path`` atomically (see the module docstring); returns the path."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = _new_file_mode()
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=suffix, dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_folder(folder)
    return path


def _fsync_folder(folder: str) -> None:
    """Make the rename itself durable where the platform allows it (POSIX)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - Windows cannot open a folder
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some filesystems refuse
        pass
    finally:
        os.close(fd)
