"""One way every linearkit writer puts a file in place: temp file beside it, fsync, rename.

``path`` is always either the old file or the complete new one; after an exception the temp file
is removed; a SIGKILL (or power loss) mid-write can leave one ``.tmp-*`` file beside the target,
which the next save into the same folder removes (:func:`remove_stale_temp_files`), never a
truncated target. A new file gets the mode the umask gives any new file (mkstemp's 0600 would
otherwise survive the rename); overwriting keeps the old file's mode.

An ``OSError`` raised while writing (disk full, permission denied, read-only filesystem...)
names ``path``, the file the caller asked for, not the temp file, which no longer exists.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
import time

__all__ = ["STALE_AFTER_S", "remove_stale_temp_files", "write_atomically"]

#: A temp file is left over from a killed save only once it is this old (seconds since its
#: last write) and no process holds its lock: a save in progress keeps both fresh.
STALE_AFTER_S = 60.0

_PREFIX = ".tmp-"
# mkstemp's names: the prefix, 8 characters of tempfile's alphabet, the suffix.
_RANDOM = "[a-z0-9_]{8}"

try:  # POSIX: a save holds an exclusive lock on its temp file until the rename
    import fcntl
except ImportError:  # pragma: no cover - Windows: only the age tells a stale file
    fcntl = None


def _umask_from_proc() -> int | None:
    """The umask from ``/proc/self/status`` (Linux >= 4.7), read without changing it."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _umask_at_import() -> int | None:
    """Where /proc has no ``Umask:`` line, the umask read once here, at import: os.umask can
    only read it by setting it, and setting it while other threads create files could make
    theirs world-writable, so this is the only moment linearkit calls it."""
    if _umask_from_proc() is not None:
        return None
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


_IMPORT_UMASK = _umask_at_import()


def _new_file_mode() -> int:
    """The mode ``open()`` gives a new file: 0o666 less the process's umask."""
    umask = _umask_from_proc()
    if umask is None:
        umask = _IMPORT_UMASK if _IMPORT_UMASK is not None else 0o022
    return 0o666 & ~umask


def _naming_path(exc: OSError, path: str) -> OSError:
    """``exc`` again, naming ``path`` (an error on the temp file would name a file that is gone
    after the cleanup); an error without an errno (raised by a caller's hook) stays as it is."""
    if exc.errno is None:
        return exc
    # OSError(errno, ...) picks the subclass itself: FileNotFoundError, PermissionError, ...
    return OSError(exc.errno, exc.strerror or os.strerror(exc.errno), path)


def write_atomically(path, data: bytes, suffix: str = "") -> str:
    """Write ``data`` to ``path`` atomically (see the module docstring); returns the path."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)
        except FileNotFoundError:
            mode = _new_file_mode()
        remove_stale_temp_files(folder, suffix)
        fd, tmp = tempfile.mkstemp(prefix=_PREFIX, suffix=suffix, dir=folder)
    except OSError as exc:
        raise _naming_path(exc, path) from exc
    try:
        try:
            if fcntl is not None:  # "a save is writing it": see remove_stale_temp_files
                fcntl.flock(fd, fcntl.LOCK_EX)
            _write_all(fd, data)
            os.fsync(fd)
            if hasattr(os, "fchmod"):
                os.fchmod(fd, mode)
            else:  # pragma: no cover - Windows
                os.chmod(tmp, mode)
            if fcntl is not None:  # renamed under the lock, so no cleaner ever takes it
                os.replace(tmp, path)
        finally:
            os.close(fd)
        if fcntl is None:  # pragma: no cover - Windows renames no open file
            os.replace(tmp, path)
    except BaseException as exc:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise _naming_path(exc, path) from exc
        raise
    _fsync_folder(folder)
    return path


def _write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte is written (one call may write fewer)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _is_stale(entry: os.DirEntry, pattern: re.Pattern, now: float) -> bool:
    if not pattern.fullmatch(entry.name):
        return False
    info = entry.stat(follow_symlinks=False)
    return (stat.S_ISREG(info.st_mode) and now - info.st_mtime > STALE_AFTER_S
            and (not hasattr(os, "geteuid") or info.st_uid == os.geteuid()))


def remove_stale_temp_files(folder, suffix: str) -> list[str]:
    """Remove the temp files killed saves left in ``folder``; returns the names removed.

    Only a file whose name is exactly what :func:`write_atomically` makes with ``suffix``
    (``.tmp-`` + 8 of mkstemp's characters + ``suffix``), a regular file (not a link), owned by
    this user, last written over :data:`STALE_AFTER_S` seconds ago and not locked by a save in
    progress. Anything else is left alone, and a failure here never fails the save.
    """
    if not suffix:  # ".tmp-XXXXXXXX" alone is too common a name to claim as ours
        return []
    pattern = re.compile(re.escape(_PREFIX) + _RANDOM + re.escape(suffix))
    removed = []
    now = time.time()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        try:
            if not _is_stale(entry, pattern, now):
                continue
            fd = os.open(entry.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
                         | getattr(os, "O_NONBLOCK", 0))
        except OSError:
            continue
        try:
            if fcntl is not None:  # fails (EWOULDBLOCK) while a save is writing it
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            opened = os.fstat(fd)
            current = os.lstat(entry.path)  # still the same file under that name?
            if (opened.st_dev, opened.st_ino) == (current.st_dev, current.st_ino):
                os.unlink(entry.path)
                removed.append(entry.name)
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


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
