"""Files that are not what they claim, and the disk under the writer: the atomic writer reads the
umask without changing it, names the target in its errors and removes only its own stale temp
files; the reader refuses anything but a regular file before it opens it."""

import errno
import os
import socket
import stat
import sys
import tempfile
import threading
import time

import numpy as np
import pytest

import linearkit as lk
from linearkit.storage import atomic, safetensors_header
from linearkit.storage.atomic import write_atomically

STALE_AFTER_S = getattr(atomic, "STALE_AFTER_S", 60.0)  # a temp file older than this is stale


def remove_stale_temp_files(folder, suffix):
    return atomic.remove_stale_temp_files(folder, suffix)

POSIX = pytest.mark.skipif(sys.platform == "win32", reason="POSIX file types and modes")


def _state():
    return {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}


# ------------------------------------------------------------------ the umask

@POSIX
def test_save_never_sets_the_umask_and_a_new_file_follows_it(tmp_path, monkeypatch):
    old = os.umask(0o027)
    try:
        calls = []
        real = os.umask
        monkeypatch.setattr(os, "umask", lambda mask: (calls.append(mask), real(mask))[1])
        new = tmp_path / "new.safetensors"
        lk.save(_state(), new)
        raw = write_atomically(tmp_path / "raw.bin", b"bytes", suffix=".bin")
        assert calls == []  # another thread creating a file meanwhile gets the real umask
        assert stat.S_IMODE(new.stat().st_mode) == 0o666 & ~0o027 == 0o640
        assert stat.S_IMODE(os.stat(raw).st_mode) == 0o640
    finally:
        os.umask(old)


@POSIX
def test_without_proc_the_umask_read_at_import_is_used(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic, "_umask_from_proc", lambda: None)
    monkeypatch.setattr(atomic, "_IMPORT_UMASK", 0o077)
    monkeypatch.setattr(os, "umask", lambda mask: pytest.fail("os.umask called after import"))
    path = tmp_path / "private.safetensors"
    lk.save(_state(), path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="Linux /proc")
def test_the_umask_is_read_from_proc():
    old = os.umask(0o037)
    try:
        assert atomic._umask_from_proc() == 0o037
        assert atomic._new_file_mode() == 0o640
    finally:
        os.umask(old)


# ------------------------------------------------------------------ errors while writing

@pytest.mark.parametrize("where", ["write", "fsync"])
def test_disk_full_names_the_target_and_keeps_the_old_file(where, tmp_path, monkeypatch):
    path = tmp_path / "w.safetensors"
    lk.save(_state(), path)
    before = path.read_bytes()

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, where, full)
    with pytest.raises(OSError) as caught:
        lk.save({"w": np.zeros(4, np.float32)}, path)
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(path)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["w.safetensors"]


def test_a_short_write_is_continued(tmp_path, monkeypatch):
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real(fd, bytes(data[:3])))
    path = write_atomically(tmp_path / "x.bin", b"0123456789", suffix=".bin")
    with open(path, "rb") as f:
        assert f.read() == b"0123456789"


# ------------------------------------------------------------------ stale temp files

def _aged(path, seconds):
    path.write_bytes(b"half a save")
    then = time.time() - seconds
    os.utime(path, (then, then))
    return path


def test_the_next_save_removes_only_stale_temp_files_of_its_own_pattern(tmp_path):
    old = _aged(tmp_path / ".tmp-ab_c1234.safetensors", 2 * STALE_AFTER_S)
    young = _aged(tmp_path / ".tmp-zzzz9999.safetensors", 5)
    look_alikes = [_aged(tmp_path / name, 2 * STALE_AFTER_S) for name in (
        ".tmp-abcdefg.safetensors",          # 7 random characters, not 8
        ".tmp-abcdefghi.safetensors",        # 9
        ".tmp-ABCDEFGH.safetensors",         # mkstemp never uses capitals
        ".tmp-abcd-fgh.safetensors",         # nor '-'
        ".tmp-abcdefgh.safetensors.bak",
        "x.tmp-abcdefgh.safetensors",
        ".tmp-abcdefgh.onnx",                # another writer's suffix
        ".tmp-abcdefgh",
        "model.safetensors",
    )]
    lk.save(_state(), tmp_path / "w.safetensors")
    assert not old.exists()
    assert young.exists() and all(p.exists() for p in look_alikes)


@POSIX
def test_links_folders_other_users_and_locked_files_are_left_alone(tmp_path):
    import fcntl

    victim = _aged(tmp_path / "precious.bin", 2 * STALE_AFTER_S)
    link = tmp_path / ".tmp-link0000.safetensors"
    link.symlink_to(victim)
    folder = tmp_path / ".tmp-folder00.safetensors"
    folder.mkdir()
    then = time.time() - 2 * STALE_AFTER_S
    os.utime(folder, (then, then))
    locked = _aged(tmp_path / ".tmp-locked00.safetensors", 2 * STALE_AFTER_S)
    stale = _aged(tmp_path / ".tmp-stale000.safetensors", 2 * STALE_AFTER_S)
    kept = [link, folder, locked, victim]
    if os.geteuid() == 0:  # root can give a file away: someone else's is never removed
        foreign = _aged(tmp_path / ".tmp-foreign0.safetensors", 2 * STALE_AFTER_S)
        os.chown(foreign, 12345, 12345)
        os.utime(foreign, (then, then))
        kept.append(foreign)
    with open(locked, "rb") as held:  # a save still writing it holds this lock
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        removed = remove_stale_temp_files(tmp_path, ".safetensors")
    assert removed == [stale.name]
    assert all(os.path.lexists(p) for p in kept) and victim.read_bytes() == b"half a save"


def test_a_temp_file_of_a_save_in_progress_is_never_taken(tmp_path, monkeypatch):
    """The writer holds its temp file's lock from creation to rename: a cleaner running in the
    middle (another process saving into the same folder) skips it even when it looks old."""
    seen = []
    real_fsync = os.fsync

    def slow_fsync(fd):
        for entry in os.scandir(tmp_path):
            if entry.name.startswith(".tmp-"):
                then = time.time() - 2 * STALE_AFTER_S
                os.utime(entry.path, (then, then))
                seen.append(remove_stale_temp_files(tmp_path, ".safetensors"))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    path = tmp_path / "w.safetensors"
    lk.save(_state(), path)
    assert seen and all(removed == [] for removed in seen)
    np.testing.assert_array_equal(lk.load(path)["w"], _state()["w"])


def test_a_temp_file_left_by_a_killed_save_is_removed_by_the_next(tmp_path):
    import signal
    import subprocess

    saver = subprocess.Popen([sys.executable, "-c", (
        "import os, sys, linearkit.storage.atomic as a\n"
        "os.fsync = lambda fd: (print('writing', flush=True), sys.stdin.read())\n"
        "a.write_atomically(sys.argv[1], b'x' * 1000, suffix='.safetensors')\n"),
        str(tmp_path / "w.safetensors")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True)
    try:
        assert saver.stdout.readline().strip() == "writing"
        os.kill(saver.pid, signal.SIGKILL)  # mid-save: the temp file stays behind
        saver.wait(30)
    finally:
        saver.kill()
        saver.stdin.close()
        saver.stdout.close()
    (left,) = [p for p in tmp_path.iterdir()]
    assert left.name.startswith(".tmp-") and left.name.endswith(".safetensors")
    lk.save(_state(), tmp_path / "w.safetensors")
    assert left.exists()  # young: it could be a save still running
    then = time.time() - 2 * STALE_AFTER_S
    os.utime(left, (then, then))
    lk.save(_state(), tmp_path / "w.safetensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.safetensors"]


# ------------------------------------------------------------------ not a regular file

def _reads_within(path, seconds=10):
    """read_header(path) in a thread: what it raised, or a failure when it blocks."""
    outcome = {}

    def run():
        try:
            safetensors_header.read_header(path)
            outcome["error"] = None
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        if stat.S_ISFIFO(os.stat(path).st_mode):  # unblock the open, then fail
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail(f"reading {path} blocked for {seconds} s")
    return outcome["error"]


def _refused(error, path, kind):
    assert isinstance(error, lk.FormatError), repr(error)
    text = str(error)
    assert str(path) in text and "not a regular file" in text and kind in text, text


@POSIX
def test_a_fifo_is_refused_at_once(tmp_path):
    fifo = tmp_path / "pipe.safetensors"
    os.mkfifo(fifo)
    _refused(_reads_within(fifo), fifo, "FIFO")
    with pytest.raises(lk.FormatError, match="not a regular file"):
        lk.load(fifo)


def test_a_folder_is_refused(tmp_path):
    folder = tmp_path / "dir.safetensors"
    folder.mkdir()
    _refused(_reads_within(folder), folder, "folder")
    with pytest.raises(lk.FormatError, match="not a regular file"):
        lk.load(folder)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_dev_zero_is_refused_not_read():
    _refused(_reads_within("/dev/zero"), "/dev/zero", "character device")


@POSIX
def test_a_socket_is_refused():
    folder = tempfile.mkdtemp(prefix="lk-")  # a short path: socket names are limited
    path = os.path.join(folder, "s.safetensors")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(path)
        _refused(_reads_within(path), path, "socket")
    finally:
        server.close()
        os.unlink(path)
        os.rmdir(folder)


@POSIX
def test_a_path_swapped_for_a_fifo_after_the_check_is_refused_on_the_descriptor(tmp_path,
                                                                              monkeypatch):
    """Between the stat and the open, the regular file is replaced by a FIFO: the open does not
    wait for a writer (O_NONBLOCK) and the descriptor's own fstat refuses it."""
    regular = tmp_path / "real.safetensors"
    lk.save(_state(), regular)
    fifo = tmp_path / "swapped.safetensors"
    os.mkfifo(fifo)
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda p, *a, **k: real_stat(
        regular if os.fspath(p) == str(fifo) else p, *a, **k))
    _refused(_reads_within(fifo), fifo, "FIFO")


def test_a_regular_file_still_reads_and_a_missing_one_stays_file_not_found(tmp_path):
    path = tmp_path / "w.safetensors"
    lk.save(_state(), path)
    np.testing.assert_array_equal(lk.load(path)["w"], _state()["w"])
    with pytest.raises(FileNotFoundError, match="nope"):
        lk.load(tmp_path / "nope.safetensors")


def test_a_header_nested_100000_deep_is_a_format_error_not_a_recursion_error(tmp_path):
    """json.loads stops at Python's recursion limit: that is a malformed header, said as such."""
    import struct

    path = tmp_path / "deep.safetensors"
    header = b'{"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(lk.FormatError, match="nests deeper than a reader can follow"):
        lk.load(path)
