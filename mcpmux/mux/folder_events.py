"""`FolderEvents`: wait, asleep, until something in a folder changes (Linux inotify).

The config watcher (`mcpmux.mux.reload`) used to look at the file every second, which woke an idle
`mcpmux serve` once a second for as long as it ran. With inotify the kernel wakes it only when a
watched folder sees a write, a rename or a removal. Folders are watched, not files, because editors
save by writing a new file and renaming it over the old one. Where inotify cannot be had (another OS,
the per-user watch limit reached) `FolderEvents.open` returns None and the watcher polls as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
from pathlib import Path

import anyio

logger = logging.getLogger(__name__)

_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
# modify, attrib, close_write, moved_from, moved_to, create, delete
_MASK = 0x002 | 0x004 | 0x008 | 0x040 | 0x080 | 0x100 | 0x200


class FolderEvents:
    """An inotify instance: `add` folders, then `wait` until one of them changes. `close` when done."""

    def __init__(self, libc: ctypes.CDLL, fd: int) -> None:
        self._libc = libc
        self._fd = fd

    @classmethod
    def open(cls) -> FolderEvents | None:
        """A new instance, or None where inotify is not available (the caller polls instead)."""
        name = ctypes.util.find_library("c")
        if not hasattr(os, "O_CLOEXEC") or name is None:
            return None
        libc = ctypes.CDLL(name, use_errno=True)
        if not hasattr(libc, "inotify_init1"):
            return None
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            logger.warning("config watch: inotify unavailable (%s); polling the file", os.strerror(ctypes.get_errno()))
            return None
        return cls(libc, fd)

    def add(self, folder: Path) -> bool:
        """Watch `folder` (again: no harm); False when it cannot be watched (the caller polls)."""
        if self._libc.inotify_add_watch(self._fd, os.fsencode(folder), _MASK) >= 0:
            return True
        code = ctypes.get_errno()
        if code != errno.ENOENT:
            logger.warning("config watch: cannot watch %s (%s); polling the file", folder, os.strerror(code))
        return False

    async def wait(self) -> None:
        """Sleep until a watched folder changes; the events so far are consumed."""
        await anyio.wait_readable(self._fd)
        while True:
            try:
                if not os.read(self._fd, 65536):
                    return
            except BlockingIOError:
                return

    def close(self) -> None:
        os.close(self._fd)
