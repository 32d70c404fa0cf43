"""Lines in and out of the process's stdio wire, on the event loop when the wire allows it.

An MCP client talks to a stdio server over pipes (or a socket pair). Those are read and written
non-blocking right on the event loop: a line costs one `os.read`/`os.write`, with no hop to a
worker thread and back, which was a third of mcpmux's CPU per relayed call. Anything else (a
regular file, a terminal) cannot be polled, so a thread does the blocking I/O for it.
"""

from __future__ import annotations

import os
import select
import stat
import threading
from collections.abc import AsyncIterator
from contextlib import suppress
from typing import IO

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

_CHUNK = 1 << 16

FINISH_LINE_TIMEOUT = 5.0
"""Seconds a cancelled writer keeps writing the rest of its line before it gives the wire up."""


def pollable(fd: int) -> bool:
    """Whether the event loop can wait on `fd`: pipes and sockets can, regular files and /dev/null cannot."""
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


async def read_lines(wire: IO[bytes]) -> AsyncIterator[str]:
    """The wire's lines (newline kept; invalid UTF-8 replaced), until end of file."""
    fd = wire.fileno()
    lines = _loop_lines(fd) if pollable(fd) else _thread_lines(wire)
    async for line in lines:
        yield line


async def _loop_lines(fd: int) -> AsyncIterator[str]:
    os.set_blocking(fd, False)
    pending = bytearray()
    while True:
        try:
            chunk = os.read(fd, _CHUNK)
        except BlockingIOError:
            await anyio.wait_readable(fd)
            continue
        if not chunk:
            break
        pending += chunk
        start = 0
        while (end := pending.find(b"\n", start)) >= 0:
            # Split before decoding: a multi-byte character never straddles a line end.
            yield pending[start : end + 1].decode("utf-8", errors="replace")
            start = end + 1
        del pending[:start]
        if len(chunk) < _CHUNK:
            await anyio.wait_readable(fd)  # the pipe is empty: don't pay a failed read to learn it
    if pending:
        yield pending.decode("utf-8", errors="replace")


async def _thread_lines(wire: IO[bytes]) -> AsyncIterator[str]:
    """A daemon thread reads: a worker thread blocked in a read would hold up shutdown on SIGTERM."""
    send, receive = anyio.create_memory_object_stream[str](1)
    token = anyio.lowlevel.current_token()

    def pump() -> None:
        try:
            for raw in wire:
                anyio.from_thread.run(send.send, raw.decode("utf-8", errors="replace"), token=token)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, RuntimeError):
            return  # the reader stopped, or its event loop is gone
        finally:
            with suppress(RuntimeError):
                anyio.from_thread.run_sync(send.close, token=token)

    threading.Thread(target=pump, name="mcpmux stdin", daemon=True).start()
    async with receive:
        async for line in receive:
            yield line


class LineWriter:
    """Writes whole lines to the wire, one at a time (a line is never interleaved with another)."""

    def __init__(self, wire: IO[bytes]) -> None:
        self._wire = wire
        self._fd = wire.fileno()
        self._on_loop = pollable(self._fd)
        if self._on_loop:
            os.set_blocking(self._fd, False)
        # A pipe writes up to PIPE_BUF bytes all at once or not at all, never part of them.
        self._atomic = select.PIPE_BUF if self._on_loop and stat.S_ISFIFO(os.fstat(self._fd).st_mode) else 0
        self._lock = anyio.Lock()
        self._closed = False

    async def write(self, text: str | bytes) -> None:
        """Raises `OSError` when the reader is gone, `anyio.ClosedResourceError` once `close()` ran.

        A line the pipe takes at once is written without yielding to the event loop: that is
        nearly every line, and a checkpoint costs a whole loop iteration.
        """
        data = memoryview(text.encode("utf-8") if isinstance(text, str) else text)
        if not self._on_loop:
            async with self._lock:
                await anyio.to_thread.run_sync(self._write_blocking, data)
            return
        if self._lock.locked():  # another line is part-way out: this one waits its turn
            async with self._lock:
                await self._write_rest(data, started=False)
            return
        if self._closed:
            raise anyio.ClosedResourceError
        rest = data
        with suppress(BlockingIOError):  # the pipe is full: the rest waits below
            rest = data[os.write(self._fd, data) :]
        if rest:
            self._lock.acquire_nowait()  # the rest of this line goes before any other
            try:
                await self._write_rest(rest, started=len(rest) < len(data))
            finally:
                self._lock.release()

    def write_now(self, text: str | bytes) -> bool:
        """Write a line right now, from synchronous code, when that needs no waiting; False when nothing was written.

        Only a short line on a pipe, with no other line part-way out, and a pipe with room for all
        of it: any other write would have to wait, so `write` must do it.
        """
        data = text.encode("utf-8") if isinstance(text, str) else text
        if len(data) > self._atomic or self._lock.locked() or self._closed:
            return False
        try:
            os.write(self._fd, data)
        except OSError:  # no room (or the reader is gone, which `write` then reports)
            return False
        return True

    async def _write_rest(self, data: memoryview, *, started: bool) -> None:
        """Write `data` (the whole line, or its rest once `started`) as the reader makes room.

        A writer cancelled part-way through a line still finishes it (for up to
        `FINISH_LINE_TIMEOUT` seconds) or else closes the wire: half a line must never be followed
        by another, which would garble both for the reader.
        """
        rest = [data]
        try:
            await self._pump(rest)
        except anyio.get_cancelled_exc_class():
            if started or len(rest[0]) < len(data):
                with (
                    anyio.move_on_after(FINISH_LINE_TIMEOUT, shield=True),
                    suppress(anyio.ClosedResourceError, OSError),
                ):
                    await self._pump(rest)
                if rest[0]:
                    self.close()
            raise

    async def _pump(self, rest: list[memoryview]) -> None:
        while rest[0]:
            if self._closed:
                raise anyio.ClosedResourceError
            try:
                rest[0] = rest[0][os.write(self._fd, rest[0]) :]
            except BlockingIOError:
                await anyio.wait_writable(self._fd)  # the reader is behind: wait, don't stall the loop

    def close(self) -> None:
        """Closes the wire; a write waiting for room on it raises `anyio.ClosedResourceError`."""
        if self._closed:
            return
        self._closed = True
        if self._on_loop:
            anyio.notify_closing(self._fd)
        self._wire.close()

    def _write_blocking(self, data: memoryview) -> None:
        self._wire.write(data)
        self._wire.flush()
