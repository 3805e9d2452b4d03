"""Reading a file the user owns only when it is a regular file.

Opening a FIFO for reading waits until something writes to it, which may be never,
and opening a device can have effects of its own. Every file the codemod reads from
the user's tree (sources, ``.gitignore`` files, ``pyproject.toml``, git's config)
goes through ``read_regular``, which looks before it opens and opens without waiting.
"""

from __future__ import annotations

import errno
import os
import stat

from ...errors import MMScheduleError

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def kind(mode: int) -> str:
    """What a file of mode ``mode`` is, in words (``a FIFO``)."""
    return next((name for test, name in _KINDS if test(mode)), "a special file")


class NotRegularFile(MMScheduleError, OSError):
    """The path names a folder, a FIFO, a socket or a device, not a regular file (an
    ``OSError`` with errno ``EINVAL`` and the path as its file name)."""

    def __init__(self, path, mode: int) -> None:
        super().__init__(errno.EINVAL, f"not a regular file ({kind(mode)})", os.fsdecode(path))


def read_regular(path) -> tuple[bytes, os.stat_result]:
    """The bytes of ``path`` and its status; ``NotRegularFile`` (an ``OSError``) when it is
    not a regular file, other ``OSError`` when it cannot be read."""
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise NotRegularFile(path, info.st_mode)
    # O_NONBLOCK: if the path became a FIFO since the look, the open still returns at once.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFile(path, info.st_mode)
        # os.read, no buffered file object: one call reads the whole file (short of the
        # size asked for: the end); a file that grew meanwhile is read on to its end
        want = info.st_size + 1
        chunks = [os.read(fd, want)]
        while len(chunks[-1]) >= want:
            chunks.append(os.read(fd, 1 << 20))
            want = 1 << 20
        return b"".join(chunks), info
    finally:
        os.close(fd)
