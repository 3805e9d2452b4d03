"""Replacing a user's file without ever losing what is in it.

A file is read once (``Snapshot``) and transformed from that content. Just before
its new content goes in, the file is read again: if someone changed it meanwhile,
nothing is written and the caller is told (it re-processes or reports the file).

How the new content goes in:

* a file with one name: the new content is written and flushed to an anonymous
  file in the same folder (``O_TMPFILE``: it has no name, so a killed run cannot
  leave it behind), given the old file's mode, owner, group and extended
  attributes, then linked under a temporary name and renamed over the old one in
  two consecutive system calls. A crash leaves the old or the new file, never a mix.
  The ``TempGuard`` process removes that temporary name if the run dies between
  the two calls; where ``O_TMPFILE`` is missing a named temporary file is used,
  under the same guard.
* a file with several hard links, or whose owner, group or attributes cannot be
  copied (not root, a read-only folder): written in place, into the same inode,
  so every link, the owner and the attributes stay. The guard holds the old content
  during that write and writes it back if the run is killed before the write ended.

Either way SIGINT and SIGTERM are held back while one file is replaced, so that
Ctrl-C stops between two files.
"""

from __future__ import annotations

import errno
import itertools
import os
import signal
import stat
import struct
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .regular_files import read_regular

_HELD_SIGNALS = {signal.SIGINT, signal.SIGTERM}
_TEMP_SUFFIX = ".mm-schedule-codemod.tmp"
_counter = itertools.count()


@dataclass(frozen=True)
class Snapshot:
    """A file's content as read, and the file it was read from."""

    path: Path  # the real file (symlinks resolved)
    data: bytes
    device: int
    inode: int


class FileChanged(Exception):
    """The file no longer holds the content that was transformed."""


def read_snapshot(path: Path) -> Snapshot:
    data, info = read_regular(path)
    return Snapshot(path, data, info.st_dev, info.st_ino)


def unwritable_reason(path: str) -> str | None:
    """Why a report could not be written at ``path`` (checked before a run starts), or
    None if nothing stands in the way."""
    target = Path(path)
    if target.is_dir():
        return "is a folder"
    folder = target.absolute().parent
    if not folder.is_dir():
        return f"{folder} " + ("is not a folder" if folder.exists() else "does not exist")
    if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        return "not writable"
    return None


@contextmanager
def signals_held():
    """Delay SIGINT/SIGTERM until the block ends (they are delivered then)."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def replace(snapshot: Snapshot, data: bytes, guard: TempGuard | None = None) -> None:
    """Put ``data`` into the file ``snapshot`` was read from, unless it changed since
    (``FileChanged``). ``OSError`` when it cannot be written; the file is then as it was."""
    with signals_held():
        with open(snapshot.path, "rb") as current:
            info = os.fstat(current.fileno())
            if current.read() != snapshot.data:
                raise FileChanged(str(snapshot.path))
            if info.st_nlink == 1 and _replace_by_rename(snapshot, current, info, data, guard):
                return
        _write_in_place(snapshot, data, guard)


def _unchanged(snapshot: Snapshot) -> bool:
    with open(snapshot.path, "rb") as handle:
        return handle.read() == snapshot.data


def _replace_by_rename(snapshot, current, info, data: bytes, guard) -> bool:
    """Atomic replace through a fresh inode; False when the fresh inode could not
    be given the old file's owner, group or attributes (or the folder is read-only),
    so the caller writes in place instead."""
    folder = snapshot.path.parent
    temp_name = f".{snapshot.path.name}.{os.getpid()}.{next(_counter)}{_TEMP_SUFFIX}"
    try:
        dir_fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return False  # a folder that cannot be opened here: write in place
    try:
        if _anonymous_temps.get(info.st_dev, True):
            done = _try_rename(snapshot, current, info, data, guard, dir_fd, temp_name, True)
            if done is not None:
                return done
            _anonymous_temps[info.st_dev] = False
        return bool(_try_rename(snapshot, current, info, data, guard, dir_fd, temp_name, False))
    finally:
        os.close(dir_fd)


# Per device: whether an unnamed O_TMPFILE file can be created and linked there.
_anonymous_temps: dict[int, bool] = {}
_NO_PERMISSION = (errno.EACCES, errno.EPERM, errno.EROFS)


def _try_rename(snapshot, current, info, data, guard, dir_fd, temp_name, anonymous):
    """One attempt; None when the anonymous route is not available on this device."""
    named = False
    try:
        if anonymous:
            fd = os.open(".", os.O_TMPFILE | os.O_WRONLY, 0o600, dir_fd=dir_fd)
        else:
            if guard:
                guard.pending(snapshot.path.parent / temp_name)
            named = True
            fd = os.open(temp_name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600, dir_fd=dir_fd)
    except (AttributeError, OSError) as exc:
        if named:
            _forget(guard, snapshot, temp_name, dir_fd, unlink=False)
        if getattr(exc, "errno", None) in _NO_PERMISSION:
            return False
        if anonymous:
            return None
        raise
    try:
        try:
            _copy_metadata(current.fileno(), fd, info)
        except PermissionError:
            return False
        _write_all(fd, data)
        os.fsync(fd)
        if not _unchanged(snapshot):
            raise FileChanged(str(snapshot.path))
        if anonymous:
            if guard:
                guard.pending(snapshot.path.parent / temp_name)
            named = True
            try:
                # dst_dir_fd makes os.link use linkat(AT_SYMLINK_FOLLOW), which can
                # give a name to the unnamed file behind /proc/self/fd.
                os.link(f"/proc/self/fd/{fd}", temp_name, dst_dir_fd=dir_fd)
            except OSError:
                _forget(guard, snapshot, temp_name, dir_fd, unlink=False)
                named = False
                return None
        os.rename(temp_name, snapshot.path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        named = False
        _forget(guard, snapshot, temp_name, dir_fd, unlink=False)
    finally:
        os.close(fd)
        if named:
            _forget(guard, snapshot, temp_name, dir_fd, unlink=True)
    try:
        os.fsync(dir_fd)  # make the rename durable where the platform allows it
    except OSError:
        pass
    return True


def _forget(guard, snapshot, temp_name, dir_fd, *, unlink: bool) -> None:
    if unlink:
        try:
            os.unlink(temp_name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
    if guard:
        guard.done(snapshot.path.parent / temp_name)


def _copy_metadata(source_fd: int, target_fd: int, info: os.stat_result) -> None:
    """Owner, group, mode and extended attributes of ``source_fd`` onto ``target_fd``;
    PermissionError when any of them cannot be kept."""
    if hasattr(os, "fchown"):
        try:
            os.fchown(target_fd, info.st_uid, info.st_gid)
        except OSError as exc:
            raise PermissionError(exc.errno, "cannot keep owner and group") from exc
    os.fchmod(target_fd, stat.S_IMODE(info.st_mode))  # after chown, which clears set-id bits
    if not hasattr(os, "listxattr"):
        return
    try:
        names = os.listxattr(source_fd)
    except OSError:
        return  # the file system has no extended attributes
    for name in names:
        try:
            os.setxattr(target_fd, name, os.getxattr(source_fd, name))
        except OSError as exc:
            raise PermissionError(exc.errno, f"cannot keep attribute {name}") from exc


def _write_in_place(snapshot: Snapshot, data: bytes, guard: TempGuard | None) -> None:
    """Rewrite the file's own inode. The guard holds the old content meanwhile and puts
    it back if the run is killed before the write ended; a failed write puts it back
    here."""
    fd = os.open(snapshot.path, os.O_RDWR)
    try:
        with open(fd, "rb", closefd=False) as handle:
            if handle.read() != snapshot.data:
                raise FileChanged(str(snapshot.path))
        if guard:
            guard.writing(snapshot.path, snapshot.data)
        try:
            _overwrite(fd, data, reserve=len(data) > len(snapshot.data))
        except OSError:
            _overwrite(fd, snapshot.data, reserve=False)
            raise
        finally:
            if guard:
                guard.written(snapshot.path)
    finally:
        os.close(fd)


def _overwrite(fd: int, data: bytes, *, reserve: bool) -> None:
    if reserve and hasattr(os, "posix_fallocate"):
        try:  # reserve the space first: a full disk then fails before any byte changes
            os.posix_fallocate(fd, 0, len(data))
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
    os.lseek(fd, 0, os.SEEK_SET)
    _write_all(fd, data)
    os.ftruncate(fd, len(data))
    os.fsync(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class TempGuard:
    """A small process that outlives a killed run by a moment. It is told each temporary
    name before the name exists and after it is gone, and the old content of each file
    being written in place before the write starts and after it ended. When the run's end
    of the pipe closes (normal end, or SIGKILL) it removes every name still listed and
    puts back the old content of every in-place write still listed."""

    @classmethod
    def start(cls) -> TempGuard | None:
        """A guard, or None where processes cannot be forked (temporary names then rely
        on the run's own clean-up, which a SIGKILL skips)."""
        return cls() if hasattr(os, "fork") else None

    def __init__(self) -> None:
        read_end, self.fd = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - runs in the child
            os.close(self.fd)
            _guard_loop(read_end)
        os.close(read_end)

    def _send(self, op: bytes, path: Path, data: bytes = b"") -> None:
        name = os.fsencode(path)
        _write_all(self.fd, op + _HEADER.pack(len(name), len(data)) + name + data)

    def pending(self, path: Path) -> None:
        self._send(b"+", path)

    def done(self, path: Path) -> None:
        self._send(b"-", path)

    def writing(self, path: Path, old: bytes) -> None:
        self._send(b"=", path, old)

    def written(self, path: Path) -> None:
        self._send(b".", path)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            os.waitpid(self.pid, 0)


_HEADER = struct.Struct("<IQ")  # name length, data length


def _guard_loop(read_end: int) -> None:  # pragma: no cover - runs in the child
    try:
        os.setsid()  # Ctrl-C in the terminal goes to the run, not to the guard
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.closerange(3, read_end)  # hold no other pipe open (workers watch theirs for EOF)
        os.closerange(read_end + 1, 1 << 16)
        names: set[bytes] = set()
        restore: dict[bytes, bytes] = {}
        buffer = bytearray()
        while True:
            chunk = os.read(read_end, 1 << 20)
            if not chunk:
                break
            buffer += chunk
            while len(buffer) >= 1 + _HEADER.size:
                name_len, data_len = _HEADER.unpack_from(buffer, 1)
                end = 1 + _HEADER.size + name_len + data_len
                if len(buffer) < end:
                    break
                op = buffer[:1]
                name = bytes(buffer[1 + _HEADER.size : 1 + _HEADER.size + name_len])
                data = bytes(buffer[1 + _HEADER.size + name_len : end])
                del buffer[:end]
                if op == b"+":
                    names.add(name)
                elif op == b"-":
                    names.discard(name)
                elif op == b"=":
                    restore[name] = data
                else:
                    restore.pop(name, None)
        for name in names:
            try:
                os.unlink(name)
            except OSError:
                pass
        for name, old in restore.items():
            try:
                fd = os.open(name, os.O_WRONLY)
                try:
                    _write_all(fd, old)
                    os.ftruncate(fd, len(old))
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError:
                pass
    finally:
        os._exit(0)
