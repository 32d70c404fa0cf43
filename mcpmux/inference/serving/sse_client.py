"""`SseClient`: streamed completions from one OpenAI-compatible server, with little work per chunk.

A streamed completion is dozens of small server-sent events a second per request. Read through
httpx, each one passes a dozen layers (a timeout scope and an exception map per read, h11, the byte,
text and line decoders) and the socket is taken off and put back on the event loop's poll list every
read: on a small host that was most of what mcpmux spent relaying a request. Here each keep-alive
connection is an `asyncio.Protocol` whose bytes go straight into llhttp (`wire.http_response`) and
the event splitter; the reader of a response is woken once per read, with every event it carried.

What it does not do is left to httpx (`usable` says when): a proxy from the environment, or
credentials in the URL. A connection is reused only when idle and unread (an unread byte on an idle
connection can only be the server closing it); a request is never sent twice. `timeout` bounds the
connection and each wait for the next byte, as httpx's does.
"""

from __future__ import annotations

import asyncio
import ssl
import urllib.request
from collections import deque
from collections.abc import AsyncGenerator
from http import HTTPStatus
from typing import cast
from urllib.parse import urlsplit

import httpx2

from mcpmux.wire import idle
from mcpmux.wire.http_response import EventStream, Head, HttpWireError, ResponseReader

MAX_EVENT_SIZE = 4 * 1024 * 1024
MAX_ERROR_BODY = 64 * 1024
MAX_IDLE = 64  # connections kept open for reuse; more in flight at once are closed when done
PAUSE_AT = 256  # events read and not yet taken before the socket stops being read (back pressure)


class StatusError(Exception):
    """The server answered with an HTTP error status; `body` is (the start of) what it said."""

    def __init__(self, status: int, reason: str, body: str) -> None:
        super().__init__(f"HTTP {status}")
        self.status, self.reason, self.body = status, reason, body


def usable(base_url: str) -> bool:
    """Whether `SseClient` can reach `base_url`: http(s), no credentials in it, no proxy from the environment."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username is not None:
        return False
    proxies = urllib.request.getproxies()
    proxied = parts.scheme in proxies or "all" in proxies
    return not proxied or bool(urllib.request.proxy_bypass(parts.hostname))


class _Response:
    """One response as it arrives: its head, the data of its events, or its error body."""

    __slots__ = ("body", "done", "error", "events", "head", "splitter", "waiter")

    def __init__(self) -> None:
        self.head: Head | None = None
        self.events: deque[str] = deque()
        self.body = bytearray()  # an error response's body
        self.splitter: EventStream | None = None
        self.done = False
        self.error: Exception | None = None
        self.waiter: asyncio.Future[None] | None = None

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _Connection(asyncio.Protocol):
    """One keep-alive connection; carries one response at a time."""

    def __init__(self, client: SseClient) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.reader = ResponseReader(self._head, self._body, self._end)
        self.response: _Response | None = None
        self.paused = False
        self.last_read = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def send(self, request: bytes, response: _Response) -> None:
        assert self.transport is not None
        self.response = response
        self.reader.expect_next()
        loop = asyncio.get_running_loop()
        self.last_read = loop.time()
        self._timer = loop.call_at(self.last_read + self.client.timeout, self._expire)
        self.transport.write(request)

    def _expire(self) -> None:
        """The response's one timer: past `timeout` since the last byte it fails, else it fires again then."""
        self._timer = None
        if self.response is None:
            return
        loop = asyncio.get_running_loop()
        due = self.last_read + self.client.timeout
        if loop.time() < due:
            self._timer = loop.call_at(due, self._expire)
        else:
            self._fail(TimeoutError(f"no answer within {self.client.timeout:g} s"))

    def data_received(self, data: bytes) -> None:
        response = self.response
        self.last_read = asyncio.get_running_loop().time()
        try:
            self.reader.feed(data)
        except HttpWireError as err:
            self._fail(err)
            return
        if response is not None:
            response.wake()
            if len(response.events) >= PAUSE_AT and self.transport is not None and not self.paused:
                self.paused = True
                self.transport.pause_reading()

    def taken(self) -> None:
        """The reader took the events read so far: read on if back pressure had paused the socket."""
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    def eof_received(self) -> bool:
        try:
            self.reader.eof()
        except HttpWireError as err:
            self._fail(err)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.forget(self)
        self._fail(exc or ConnectionResetError("the server closed the connection before the response ended"))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, err: Exception) -> None:
        self._stop_timer()
        response, self.response = self.response, None
        if response is not None and not response.done:
            response.error = err
            response.done = True
            response.wake()
        self.close()

    def _head(self, head: Head) -> None:
        response = self.response
        if response is None:
            raise HttpWireError("a response arrived that no request asked for")
        response.head = head
        if head.status < 400:
            events = response.events
            response.splitter = EventStream(lambda event: events.append(event.data), MAX_EVENT_SIZE)
        response.wake()

    def _body(self, piece: bytes) -> None:
        response = self.response
        if response is None:
            return
        if response.splitter is not None:
            response.splitter.feed(piece)
        elif len(response.body) < MAX_ERROR_BODY:
            response.body += piece

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _end(self) -> None:
        self._stop_timer()
        response, self.response = self.response, None
        if response is not None:
            response.done = True
            response.wake()
            if response.head is not None and response.head.keep_alive:
                self.client.rest(self)
                return
        self.close()


class SseClient:
    """Keep-alive connections to one server (`base_url`); `events` sends a request and yields its events' data."""

    def __init__(self, base_url: str, headers: dict[str, str], timeout: float) -> None:
        parts = urlsplit(base_url)
        self._tls: ssl.SSLContext | None = None
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        host = f"[{self._host}]" if ":" in self._host else self._host
        extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        default_port = parts.port in (None, 443 if self._https else 80)
        self._headers = (
            f"host: {host if default_port else f'{host}:{self._port}'}\r\ncontent-type: application/json\r\n"
            f"accept: text/event-stream\r\n{extra}"
        )
        self.timeout = timeout
        self._idle: deque[_Connection] = deque()
        self._live: set[_Connection] = set()

    async def events(self, path: str, body: bytes) -> AsyncGenerator[str, None]:
        """POST `body` (JSON) to `path` and yield the data of each event of the response, as they come.

        Raises `StatusError` for an HTTP error status, `TimeoutError` when the server sends nothing for
        `timeout` s, `OSError` or `HttpWireError` when the connection fails. Leaving early closes the
        connection, which tells the server to stop generating.
        """
        connection = await self._connection()
        response = _Response()
        head = f"POST {self._prefix}{path} HTTP/1.1\r\n{self._headers}content-length: {len(body)}\r\n\r\n"
        connection.send(head.encode("latin-1") + body, response)
        loop = asyncio.get_running_loop()
        try:
            while True:
                while response.events:
                    yield response.events.popleft()
                connection.taken()
                if response.done:
                    break
                waiter = response.waiter = loop.create_future()
                try:
                    await waiter
                finally:
                    response.waiter = None
            if response.error is not None:
                raise response.error
            head_ = response.head
            assert head_ is not None, "a response ends after its head"
            if head_.status >= 400:
                raise StatusError(head_.status, _reason(head_.status), response.body.decode(errors="replace"))
        finally:
            if not response.done:
                connection.close()  # the reader left: stop the server's generation

    async def _connection(self) -> _Connection:
        while self._idle:
            connection = self._idle.pop()
            if idle.reusable(connection.transport):
                return connection
            connection.close()
        loop = asyncio.get_running_loop()
        if self._https and self._tls is None:
            self._tls = httpx2.create_ssl_context()  # the trust httpx would have
            self._tls.set_alpn_protocols(["http/1.1"])
        async with asyncio.timeout(self.timeout):
            _, connection = await loop.create_connection(
                lambda: _Connection(self), self._host, self._port, ssl=self._tls
            )
        self._live.add(connection)
        return connection

    def rest(self, connection: _Connection) -> None:
        """A response ended on `connection`, which stays open: keep it for the next request."""
        if len(self._idle) >= MAX_IDLE:
            connection.close()
        else:
            self._idle.append(connection)

    def forget(self, connection: _Connection) -> None:
        self._live.discard(connection)
        if connection in self._idle:
            self._idle.remove(connection)

    def close(self) -> None:
        """Close every connection (those carrying a response fail it)."""
        for connection in list(self._live):
            connection.close()


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""
