"""The fast path's own HTTP client: raw `tools/call` POSTs to a streamable HTTP upstream.

Through the SDK's transport a call costs a pydantic model each way, two tasks and a task group per
POST, and httpx's request machinery: a third of mcpmux's CPU per relayed call. `HttpLane` is the
`Send` of an HTTP upstream's `UpstreamLane` instead. It keeps HTTP/1.1 keep-alive connections to
the upstream (asyncio protocols, `mcpmux.http_wire` for the parsing), writes each request as one
buffer, and hands each JSON-RPC message of the response to the lane as raw JSON from the protocol's
own callback, as it arrives: no task and no model on the way. It sends what the SDK's transport
would send: the configured headers, the session's stamp, and on a 2025 session its
`Mcp-Session-Id`, read off the SDK's own responses (`on_sdk_response`, an httpx event hook), to
the endpoint the SDK's requests ended up at (after a same-origin redirect).

What a response carries beside the call's own progress and answer (a log, a 2025 server's request
for sampling) goes to the SDK's session through `pass_on`, whose handlers answer it as ever. A
2026 call is cancelled by closing its connection, as the spec says; a 2025 call by POSTing
`notifications/cancelled`. Errors read as the SDK's transport words them. Not done here, left to
the SDK's path (`raw_lane_allowed`): an upstream behind a proxy; resuming a broken event stream with
`Last-Event-ID` (such a call fails as "Connection closed", as one without event ids does on the SDK).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import time
import urllib.request
from collections.abc import Callable
from typing import Any, cast
from urllib.parse import urlsplit

import anyio
import httpx2
import mcp_types as types
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp_types.jsonrpc import CONNECTION_CLOSED
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic_core import from_json

from mcpmux.fastpath_lane import UpstreamLane, is_lane_id
from mcpmux.http_wire import Event, EventStream, Head, HttpWireError, ResponseReader

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT = 30.0  # as the SDK's httpx client for upstreams
IDLE_REUSE = 4.0
"""Seconds an idle connection is reused within; common servers close theirs after 5."""
MAX_IDLE = 64
LINGER = 1.0
"""Seconds a connection whose call is answered waits for the rest of its event stream before it is closed."""
MAX_EVENT_SIZE = 1024 * 1024  # as the SDK's transport

PassOn = Callable[[dict[str, Any]], None]


def raw_lane_allowed(url: str) -> bool:
    """Whether `HttpLane` can reach `url`: http(s), and no proxy from the environment applies (httpx would use it)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username is not None:
        return False  # credentials in the URL are httpx's to turn into an Authorization header
    proxies = urllib.request.getproxies()
    proxied = parts.scheme in proxies or "all" in proxies
    return not proxied or bool(urllib.request.proxy_bypass(parts.hostname))


class HttpLane:
    """Keep-alive connections to one upstream endpoint, carrying the lane's requests."""

    def __init__(self, url: str, headers: dict[str, str], lane: UpstreamLane) -> None:
        parts = urlsplit(url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if self._https else 80)
        self._origin = (parts.scheme, self._host, self._port)
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        fixed = {key.lower(): value for key, value in headers.items() if key.lower() != "accept-encoding"}
        fixed |= {"host": parts.netloc.rpartition("@")[2], "accept": "application/json, text/event-stream"}
        fixed["content-type"] = "application/json"
        self._headers = fixed
        self._lane = lane
        self.session_id: str | None = None
        """A 2025 session's id, from the SDK's handshake."""
        self.pass_on: PassOn | None = None
        """Where a message that is not the lane's goes: the SDK's session (set by its transport)."""
        self._idle: list[_Connection] = []
        self._carrying: dict[str, _Connection] = {}
        self._closed = False
        self._tls: ssl.SSLContext | None = None
        self._resending: set[asyncio.Task[None]] = set()

    async def on_sdk_response(self, response: httpx2.Response) -> None:
        """An httpx response hook on the SDK's client: learns the session id and where POSTs end up."""
        session_id = response.headers.get("mcp-session-id")
        if session_id:
            self.session_id = session_id
        url = response.request.url
        origin = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        if response.request.method == "POST" and response.is_success and origin == self._origin:
            self._target = url.raw_path.decode("ascii")

    async def send(self, message: dict[str, Any], headers: dict[str, str] | None) -> None:
        """POST one message. A request's response reaches the lane (or `pass_on`) as it arrives.

        Raises `anyio.BrokenResourceError` when the upstream cannot be reached.
        """
        if self._closed:
            raise anyio.ClosedResourceError
        stamped = headers or {}
        if message.get("method") == "notifications/cancelled":
            params = message.get("params") or {}
            if stamped.get(MCP_PROTOCOL_VERSION_HEADER) in MODERN_PROTOCOL_VERSIONS:
                carrying = self._carrying.get(str(params.get("requestId")))
                if carrying is not None:
                    carrying.drop()  # closing a 2026 request's stream is its cancellation
                return
        data = self._encode(message, stamped)
        request_id = message.get("id") if "method" in message else None
        for _attempt in (1, 2):
            connection = self._reusable() or await self._open()
            reused = connection.used > 0
            exchange = connection.start(request_id if isinstance(request_id, str) else None, data)
            if not reused or await exchange.accepted:
                return
            # The server closed the idle connection as the request went out, having read none of it.
        raise anyio.BrokenResourceError

    def send_now(self, message: dict[str, Any], headers: dict[str, str] | None) -> bool:
        """`send` for a request, from synchronous code, on an idle connection; False (nothing sent) otherwise.

        Not on a 2025 session: a request it sends may meet an expired session (404), and only a
        request `send` sent is sent again on the new one (`Upstream.request`).
        """
        request_id = message.get("id")
        if self._closed or self.session_id is not None or not is_lane_id(request_id):
            return False
        connection = self._reusable()
        if connection is None:
            return False
        try:
            data = self._encode(message, headers or {})
        except anyio.BrokenResourceError:
            self.rest(connection)
            return False
        # Nobody waits to send it again should the connection turn out dead: `resend` will.
        connection.start(str(request_id), data, resend=True)
        return True

    def resend(self, request_id: str, data: bytes) -> None:
        """Send a request again on a fresh connection: its idle one was closed under it, unread."""
        task = asyncio.get_running_loop().create_task(self._resend(request_id, data))
        self._resending.add(task)
        task.add_done_callback(self._resending.discard)

    async def _resend(self, request_id: str, data: bytes) -> None:
        try:
            connection = await self._open()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self.deliver(
                {
                    "jsonrpc": "2.0",
                    "id": request_id,
                    "error": {"code": CONNECTION_CLOSED, "message": "Connection closed"},
                }
            )
            return
        connection.start(request_id, data)

    def close(self) -> None:
        """Close every connection; calls still waiting get "Connection closed" from the lane."""
        self._closed = True
        connections = [*self._idle, *self._carrying.values()]
        self._idle.clear()
        for connection in connections:
            connection.drop()
        for task in self._resending:
            task.cancel()

    def _encode(self, message: dict[str, Any], stamped: dict[str, str]) -> bytes:
        body = json.dumps(message, separators=(",", ":")).encode()
        headers = dict(self._headers)
        if self.session_id is not None:
            headers["mcp-session-id"] = self.session_id
        headers.update((key.lower(), value) for key, value in stamped.items())
        headers["content-length"] = str(len(body))
        lines = [f"POST {self._target} HTTP/1.1", *(f"{key}: {value}" for key, value in headers.items())]
        if any(ch in line for line in lines for ch in "\r\n\0"):
            raise anyio.BrokenResourceError("a header value holds a line break")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + body

    def _reusable(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if now - connection.idle_since < IDLE_REUSE and connection.open:
                return connection
            connection.drop()
        return None

    async def _open(self) -> _Connection:
        loop = asyncio.get_running_loop()
        ssl = httpx2.create_ssl_context() if self._https else None
        try:
            with anyio.fail_after(CONNECT_TIMEOUT):
                _, connection = await loop.create_connection(lambda: _Connection(self), self._host, self._port, ssl=ssl)
        except (OSError, TimeoutError) as err:
            logger.debug("cannot connect to %s:%s: %s", self._host, self._port, err)
            raise anyio.BrokenResourceError from err
        if self._closed:
            connection.drop()
            raise anyio.ClosedResourceError
        return connection

    def carrying(self, request_id: str, connection: _Connection | None) -> None:
        if connection is None:
            self._carrying.pop(request_id, None)
        else:
            self._carrying[request_id] = connection

    def rest(self, connection: _Connection) -> None:
        """A connection whose response ended and that may carry another request."""
        if self._closed or len(self._idle) >= MAX_IDLE:
            connection.drop()
        else:
            connection.idle_since = time.monotonic()
            self._idle.append(connection)

    def forget(self, connection: _Connection) -> None:
        if connection in self._idle:
            self._idle.remove(connection)

    def deliver(self, message: dict[str, Any]) -> None:
        """One JSON-RPC message of a response: the lane's, or the session's to handle."""
        if self._closed or self._lane.take(message):
            return
        request_id = message.get("id")
        if "method" in message or not is_lane_id(request_id):
            if self.pass_on is not None:
                self.pass_on(message)
            return
        # An answer the lane could not read: its call (if anyone still waits) fails now, not at its timeout.
        error = {"code": types.INTERNAL_ERROR, "message": "the upstream's response is not valid JSON-RPC"}
        self._lane.take({"jsonrpc": "2.0", "id": request_id, "error": error})


class _Exchange:
    """One request on a connection and what has arrived of its response."""

    __slots__ = ("accepted", "answered", "body", "data", "events", "head", "request_id", "resend")

    def __init__(self, request_id: str | None, data: bytes, resend: bool) -> None:
        self.request_id = request_id
        self.data = data
        self.resend = resend
        """Whether the connection sends it again itself when it turns out dead (nobody awaits `accepted`)."""
        self.accepted: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        """True once the response began; False when the connection ended before any of it."""
        self.head: Head | None = None
        self.body = bytearray()
        self.events: EventStream | None = None
        self.answered = request_id is None


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one request at a time (HTTP/1.1, no pipelining)."""

    def __init__(self, owner: HttpLane) -> None:
        self.owner = owner
        self.transport: asyncio.Transport | None = None
        self.reader = ResponseReader(self._head, self._body, self._end)
        self.exchange: _Exchange | None = None
        self.used = 0
        self.idle_since = 0.0
        self.closing = False
        self._linger: asyncio.TimerHandle | None = None

    def start(self, request_id: str | None, data: bytes, *, resend: bool = False) -> _Exchange:
        assert self.transport is not None
        self.exchange = exchange = _Exchange(request_id, data, resend)
        self.used += 1
        self.reader.expect_next()
        if request_id is not None:
            self.owner.carrying(request_id, self)
        self.transport.write(data)
        return exchange

    @property
    def open(self) -> bool:
        return not self.closing and self.transport is not None and not self.transport.is_closing()

    def drop(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.abort()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses

    def data_received(self, data: bytes) -> None:
        try:
            self.reader.feed(data)
        except HttpWireError as err:
            self._fail(f"the upstream's response was not valid HTTP: {err}")
            self.drop()

    def eof_received(self) -> bool:
        with contextlib.suppress(HttpWireError):  # connection_lost, right after this, fails what was unfinished
            self.reader.eof()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        if self._linger is not None:
            self._linger.cancel()
        self.owner.forget(self)
        exchange = self.exchange
        if exchange is None:
            return
        if not exchange.accepted.done():
            exchange.accepted.set_result(False)
            if self.used > 1:  # the server closed it idle as the request went out: it read none of it
                self._finish(exchange)
                if exchange.resend and exchange.request_id is not None:
                    self.owner.resend(exchange.request_id, exchange.data)
                return  # else the sender tries again
        self._fail("Connection closed")
        self._finish(exchange)

    def _head(self, head: Head) -> None:
        exchange = self.exchange
        if exchange is None:
            raise HttpWireError("a response arrived that no request asked for")
        exchange.head = head
        if not exchange.accepted.done():
            exchange.accepted.set_result(True)
        if head.status == 202 or not 200 <= head.status < 300:
            return
        kind = head.content_type()
        if kind == "text/event-stream":
            exchange.events = EventStream(self._event, MAX_EVENT_SIZE)
        elif kind != "application/json" and not exchange.answered:
            self._fail(f"Unexpected content type: {kind}", types.INVALID_REQUEST)

    def _body(self, piece: bytes) -> None:
        exchange = self.exchange
        if exchange is None or exchange.answered:
            return
        if exchange.events is not None:
            exchange.events.feed(piece)
        else:
            exchange.body += piece

    def _end(self) -> None:
        exchange = self.exchange
        if exchange is None:
            return
        head = exchange.head
        if head is not None and not exchange.answered:
            if head.status == 202:
                self._fail("server answered a request with 202 Accepted", types.INVALID_REQUEST)
            elif 300 <= head.status < 400:
                where = head.headers.get("location", "?")
                self._fail(f"the server redirected the request to {where}; not followed", types.INVALID_REQUEST)
            elif head.status >= 400:
                self._http_error(head.status)
            elif exchange.events is None:
                self._json_answer()
            else:
                self._fail("SSE stream ended without a response")
        self._finish(exchange)
        if head is not None and head.keep_alive and not self.closing:
            self.owner.rest(self)
        else:
            self.drop()

    def _event(self, event: Event) -> None:
        exchange = self.exchange
        if exchange is None or exchange.answered or event.event != "message" or not event.data:
            return
        message = self._parsed(event.data, "SSE message")
        if message is None:
            return
        if "method" not in message and ("result" in message or "error" in message):
            message["id"] = exchange.request_id  # as the SDK's transport: the answer is the request's
            exchange.answered = True
            self._linger = asyncio.get_running_loop().call_later(LINGER, self._overstayed)
        self.owner.deliver(message)

    def _json_answer(self) -> None:
        exchange = self.exchange
        assert exchange is not None
        message = self._parsed(bytes(exchange.body), "JSON response")
        if message is not None:
            exchange.answered = True
            self.owner.deliver(message)

    def _parsed(self, data: str | bytes, what: str) -> dict[str, Any] | None:
        """A JSON-RPC message as raw JSON; None (and the request failed, as the SDK words it) if it is none."""
        try:
            message = from_json(data)
        except ValueError as err:
            self._fail(f"Failed to parse {what}: {err}", types.PARSE_ERROR)
            return None
        if not isinstance(message, dict):
            self._fail(f"Failed to parse {what}: not a JSON-RPC message", types.PARSE_ERROR)
            return None
        return message

    def _http_error(self, status: int) -> None:
        """An error status; a JSON-RPC error in its body is the answer, as on the SDK's transport."""
        exchange = self.exchange
        assert exchange is not None
        assert exchange.head is not None
        if exchange.head.content_type() == "application/json":
            try:
                message = from_json(bytes(exchange.body))
            except ValueError:
                message = None
            if isinstance(message, dict) and isinstance(message.get("error"), dict):
                self._fail(str(message["error"].get("message", "")), message["error"].get("code"), message["error"])
                return
        if status == 404:
            if self.owner.session_id is None:
                self._fail("Not Found", types.METHOD_NOT_FOUND)
            else:
                self._fail("Session terminated", types.INVALID_REQUEST)
        else:
            self._fail("Server returned an error response", types.INTERNAL_ERROR)

    def _fail(self, message: str, code: object = CONNECTION_CLOSED, error: dict[str, Any] | None = None) -> None:
        """Answer the request with an error, once."""
        exchange = self.exchange
        if exchange is None or exchange.answered:
            return
        exchange.answered = True
        self.owner.deliver(
            {"jsonrpc": "2.0", "id": exchange.request_id, "error": error or {"code": code, "message": message}}
        )

    def _finish(self, exchange: _Exchange) -> None:
        self.exchange = None
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if exchange.request_id is not None:
            self.owner.carrying(exchange.request_id, None)

    def _overstayed(self) -> None:
        """An answered call's stream did not end in time: its connection goes (a 2026 server reads it as a cancel)."""
        self._linger = None
        if self.exchange is not None:
            self.drop()
