"""`QuietServer`: uvicorn that sleeps while nothing happens.

uvicorn's `Server.main_loop` wakes every 0.1 s to see whether it should exit and, once a second, to
put the time in the `Date` header its responses carry. In an idle `mcpmux serve --transport http`
(and `--openai-only`) that was nearly all that ran: 1.5-2 ms of CPU a second, ten wake-ups, for as
long as the process lives. Here the loop waits on the exit itself (setting `should_exit` ends it at once, as before),
and `DatedProtocol` refreshes the `Date` header when a request arrives in a new second, so that it
still says when the response was made.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from email.utils import formatdate

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class QuietServer(uvicorn.Server):
    """A uvicorn server with no timer of its own; it leaves signals to the CLI, which owns the process
    (uvicorn would re-raise them after shutdown). Give it `DatedProtocol` as `Config(http=...)`."""

    def __init__(self, config: uvicorn.Config) -> None:
        self._exit = asyncio.Event()
        super().__init__(config)

    @property
    def should_exit(self) -> bool:
        return self._exit.is_set()

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        if value:
            self._exit.set()
        else:
            self._exit.clear()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def main_loop(self) -> None:
        await self.on_tick(0)  # the headers as uvicorn sets them at start (what answers a malformed request)
        await self._exit.wait()


class DatedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, which puts the current second in the `Date` header itself (the
    fast front's `FastHttpProtocol` builds on it, and writes those headers in its own answers)."""

    def on_headers_complete(self) -> None:
        if self.config.date_header:
            date = _clock.now()
            headers = self.server_state.default_headers
            if not headers or headers[0][1] is not date:
                self.server_state.default_headers = [(b"date", date), *self.config.encoded_headers]
        super().on_headers_complete()


class _Clock:
    """The current second as an HTTP date, formatted once a second at most."""

    def __init__(self) -> None:
        self._second = -1
        self._date = b""

    def now(self) -> bytes:
        second = int(time.time())
        if second != self._second:
            self._second, self._date = second, formatdate(second, usegmt=True).encode()
        return self._date


_clock = _Clock()
