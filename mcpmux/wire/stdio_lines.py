"""Lines in and out of the process's stdio wire, on the event loop when the wire allows it.

An MCP client talks to a stdio server over pipes (or a socket pair). Those are read and written
non-blocking right on the event loop: a line costs one `os.read`/`os.write`, with no hop to a
worker thread and back, which was a third of mcpmux's CPU per relayed call. The reader stays
registered with the loop's poller and hands each line to its taker from the read callback itself
(`read_lines(wire, offer)`). Anything else (a regular file, a terminal) cannot be polled, so a
thread does the blocking I/O for it.
"""

from __future__ import annotations

import asyncio
import os
import select
import stat
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import suppress
from typing import IO, cast

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

FINISH_LINE_TIMEOUT = 5.0
"""Seconds a cancelled writer keeps writing the rest of its line before it gives the wire up."""


def pollable(fd: int) -> bool:
    """Whether the event loop can wait on `fd`: pipes and sockets can, regular files and /dev/null cannot."""
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


Offer = Callable[[str], bool]
"""Sees a line the moment it is read; True when it took the line (then `read_lines` does not yield it)."""

_HELD_LINES = 256
"""Lines `read_lines` holds for its consumer before it stops reading the wire until they are taken."""


async def read_lines(wire: IO[bytes], offer: Offer | None = None) -> AsyncIterator[str]:
    """The wire's lines (newline kept; invalid UTF-8 replaced), until end of file.

    With `offer`, each line goes to it first, in order, and only those it declines are yielded. On
    a pollable wire it is offered straight from the event loop's read callback while no earlier
    line waits for the consumer: a line `offer` takes costs no task switch, no future and no
    registration with the poller (the reader stays registered while lines flow). An exception
    `offer` raises comes out of the iteration, where the line was. Off asyncio (another anyio
    backend), or on a wire that cannot be polled, a thread reads and `offer` sees each line as it
    comes out of the thread.
    """
    loop = _asyncio_loop()
    if loop is not None and pollable(wire.fileno()):
        lines = _LineProtocol(offer)
        transport, _ = await loop.connect_read_pipe(lambda: lines, wire)
        try:
            async for line in lines.declined():
                yield line
        finally:
            transport.close()
        return
    async for line in _thread_lines(wire):
        if offer is None or not offer(line):
            yield line


def _asyncio_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class _LineProtocol(asyncio.Protocol):
    """Splits what the pipe transport reads into lines; offers them at once, or queues them in order."""

    def __init__(self, offer: Offer | None) -> None:
        self._offer = offer
        self._pending = bytearray()
        self._queue: deque[tuple[str | Exception, bool]] = deque()
        """Lines for `declined`, in order, each with whether it was offered already (or what the offer raised)."""
        self._waiting: asyncio.Future[None] | None = None
        self._ended = False
        self._transport: asyncio.ReadTransport | None = None
        self._paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.ReadTransport, transport)

    def data_received(self, data: bytes) -> None:
        pending = self._pending
        pending += data
        start = 0
        while (end := pending.find(b"\n", start)) >= 0:
            # Split before decoding: a multi-byte character never straddles a line end.
            self._line(pending[start : end + 1].decode("utf-8", errors="replace"))
            start = end + 1
        del pending[:start]
        if len(self._queue) >= _HELD_LINES and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()  # the consumer is behind: let the writer wait
        self._wake()

    def eof_received(self) -> bool | None:
        if self._pending:
            self._line(self._pending.decode("utf-8", errors="replace"))
            self._pending.clear()
        self._ended = True
        self._wake()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            self._queue.append((exc, True))
        self._ended = True
        self._wake()

    def _line(self, line: str) -> None:
        if self._offer is None:
            self._queue.append((line, True))
        elif self._queue:
            self._queue.append((line, False))  # offered in turn, after the lines before it
        else:
            try:
                if not self._offer(line):
                    self._queue.append((line, True))
            except Exception as exc:  # raised to the consumer, in the line's place
                self._queue.append((exc, True))

    def _wake(self) -> None:
        waiting = self._waiting
        if waiting is not None and not waiting.done() and (self._queue or self._ended):
            waiting.set_result(None)

    async def declined(self) -> AsyncIterator[str]:
        queue = self._queue
        while True:
            while queue:
                item, offered = queue.popleft()
                if isinstance(item, Exception):
                    raise item
                if self._paused and len(queue) < _HELD_LINES // 2 and self._transport is not None:
                    self._paused = False
                    self._transport.resume_reading()
                if offered or self._offer is None or not self._offer(item):
                    yield item
            if self._ended:
                return
            self._waiting = asyncio.get_running_loop().create_future()
            try:
                await self._waiting
            finally:
                self._waiting = None


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
