"""`FolderEvents`: wait, asleep, until something in a folder changes (Linux inotify).

The config watcher (`mcpmux.mux.reload`) used to look at the file every second, which woke an idle
`mcpmux serve` once a second for as long as it ran. With inotify the kernel wakes it only when a
watched file is written, renamed or removed. Folders are watched, not files, because editors save
by writing a new file and renaming it over the old one; events naming other files in those folders
(a log written next to the config) are read and dropped, and the watcher looks only when its own
files change. Where inotify cannot be had (another OS, the per-user watch limit reached)
`FolderEvents.open` returns None and the watcher polls as before.

Why not `watchfiles`, the library made for this: its `awatch` wakes 20 times a second while nothing
changes (its Rust side checks a stop event every 50 ms): measured with watchfiles 1.3.0, 20.5
wake-ups and 0.9 ms of CPU a second, which is what this module exists to remove.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import struct
from pathlib import Path

import anyio

logger = logging.getLogger(__name__)

_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
# modify, attrib, close_write, moved_from, moved_to, create, delete
_MASK = 0x002 | 0x004 | 0x008 | 0x040 | 0x080 | 0x100 | 0x200
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then len bytes of name


class FolderEvents:
    """An inotify instance: `add` folders, then `wait` until a file in them changes. `close` when done."""

    def __init__(self, libc: ctypes.CDLL, fd: int) -> None:
        self._libc = libc
        self._fd = fd
        self._folders: dict[int, Path] = {}

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
        watch = self._libc.inotify_add_watch(self._fd, os.fsencode(folder), _MASK)
        if watch >= 0:
            self._folders[watch] = folder
            return True
        code = ctypes.get_errno()
        if code != errno.ENOENT:
            logger.warning("config watch: cannot watch %s (%s); polling the file", folder, os.strerror(code))
        return False

    async def wait(self, files: set[Path]) -> None:
        """Sleep until one of `files` (in the watched folders) changes; other files' events are dropped."""
        while True:
            await anyio.wait_readable(self._fd)
            if files & set(self._changed()):
                return

    def _changed(self) -> list[Path]:
        """The files named by the events read so far (all of them: the descriptor is left empty)."""
        changed: list[Path] = []
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return changed
            offset = 0
            while offset < len(data):
                watch, _, _, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size
                name = data[offset : offset + length].rstrip(b"\0")
                offset += length
                folder = self._folders.get(watch)
                if folder is not None and name:
                    changed.append(folder / os.fsdecode(name))

    def close(self) -> None:
        os.close(self._fd)
