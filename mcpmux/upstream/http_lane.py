"""The fast path's own HTTP client: raw `tools/call` POSTs to a streamable HTTP upstream.

Through the SDK's transport a call costs a pydantic model each way, two tasks and a task group per
POST, and httpx's request machinery: over half of mcpmux's CPU per relayed call. `HttpLane` is
the `Send` of an HTTP upstream's `UpstreamLane` instead. It keeps HTTP/1.1 keep-alive connections
to the upstream (`mcpmux.upstream.http_connection`, asyncio protocols), writes each request as one buffer,
and hands each JSON-RPC message of the response to the lane as raw JSON from the protocol's own
callback, as it arrives: no task and no model on the way. It sends what the SDK's client sends:
its headers (the configured ones, its User-Agent; not Accept-Encoding, as it decodes no
compression), the session's stamp, on a 2025 session its `Mcp-Session-Id` (read off the SDK's
own responses by `on_sdk_response`, an httpx event hook), to the path the SDK's requests ended up
at after a same-origin redirect. Once the SDK's requests moved to another origin (an http→https
redirect) or the server set a cookie (which the SDK's client sends back), requests go through the
SDK's transport instead (`fallback`).

What a response carries beside the call's own progress and answer (a log, a 2025 server's request
for sampling) goes to the SDK's session through `pass_on`, whose handlers answer it as ever, for the
inbound call whose stream it came on (`mcpmux.core.inbound`). A
2026 call is cancelled by closing its connection, as the spec says; a 2025 call by POSTing
`notifications/cancelled`. Errors read as the SDK's transport words them. At most
`MAX_CONNECTIONS` connections, as httpx's pool; idle ones are reused for `IDLE_REUSE` seconds.
Left to the SDK's client (`raw_lane_allowed`): an upstream behind a proxy, or with credentials in
its URL. A call's event stream that ends before its answer, having given an event id, is resumed
as the SDK's client resumes it (SEP-1699): a `GET` with `Last-Event-ID` after the stream's `retry`
(1 s if it gave none), never the call sent again; a stream without event ids fails its call as
"SSE stream ended without a response" or "Connection closed", as on the SDK's client.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
import urllib.request
from collections import deque
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx2
import mcp_types as types
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp_types.jsonrpc import CONNECTION_CLOSED
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcpmux.core.inbound import InboundCall
from mcpmux.upstream.http_connection import Connection, Resumption
from mcpmux.upstream.json_bodies import JoinedBodies
from mcpmux.upstream.lane import Send, UpstreamLane, is_lane_id
from mcpmux.wire.json_bytes import dumps

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT = 30.0  # as the SDK's httpx client for upstreams
IDLE_REUSE = 1.5
"""Seconds an idle connection is reused within; some servers close theirs after 2 (gunicorn), most after 5."""
MAX_CONNECTIONS = 100  # as httpx's pool
DEFAULT_RETRY_MS = 1000  # as the SDK's transport, for a stream that named no `retry`
MAX_IDLE = 64

PassOn = Callable[[dict[str, Any], InboundCall | None], None]
"""Hands a message that is not the lane's to the session, with the inbound call whose stream it came on."""


def resumption_request(sent: bytes, last_id: str) -> bytes:
    """The `GET` that resumes the event stream of request `sent` (a POST, or an earlier such GET):
    its target and headers (session, protocol version, authorization), asking for the events after `last_id`."""
    head = sent.split(b"\r\n\r\n", 1)[0].decode("utf-8").split("\r\n")
    replaced = ("content-length", "content-type", "accept", "last-event-id")
    kept = [line for line in head[1:] if line.partition(":")[0].strip().lower() not in replaced]
    request = [f"GET {head[0].split(' ')[1]} HTTP/1.1", *kept, "accept: text/event-stream", f"last-event-id: {last_id}"]
    return ("\r\n".join(request) + "\r\n\r\n").encode("utf-8")


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

    def __init__(self, url: str, http: httpx2.AsyncClient, lane: UpstreamLane, joined: JoinedBodies) -> None:
        parts = urlsplit(url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if self._https else 80)
        self._origin = (parts.scheme, self._host, self._port)
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host = f"[{self._host}]" if ":" in self._host else self._host
        headers = {"host": host if parts.port in (None, 443 if self._https else 80) else f"{host}:{self._port}"}
        headers |= {key.lower(): value for key, value in http.headers.items()}
        for unsent in ("accept-encoding", "connection"):
            headers.pop(unsent, None)
        headers |= {"accept": "application/json, text/event-stream", "content-type": "application/json"}
        self._headers = headers
        self._http = http
        self._lane = lane
        self._joined = joined
        self.session_id: str | None = None
        """A 2025 session's id, from the SDK's handshake."""
        self.pass_on: PassOn | None = None
        """Where a message that is not the lane's goes: the SDK's session (set by its transport)."""
        self.fallback: Send | None = None
        """The SDK transport's own `Send`, for when the lane cannot send as the SDK's client would."""
        self._same_origin = True
        self._live: set[Connection] = set()
        self._idle: deque[Connection] = deque()
        self._carrying: dict[str, Connection] = {}
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._resending: dict[str, asyncio.Task[None]] = {}
        self._tls: ssl.SSLContext | None = None
        self.closed = False

    @property
    def usable(self) -> bool:
        """Whether requests go out on the lane's own connections (see the module docstring)."""
        return self._same_origin and not self._http.cookies

    async def on_sdk_response(self, response: httpx2.Response) -> None:
        """An httpx response hook on the SDK's client: learns the session id and where POSTs end up."""
        session_id = response.headers.get("mcp-session-id")
        if session_id:
            self.session_id = session_id
        url = response.request.url
        if response.request.method == "POST" and response.is_success:
            if (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80)) == self._origin:
                self._target = url.raw_path.decode("ascii")
            else:
                self._same_origin = False

    async def send(self, message: dict[str, Any], headers: dict[str, str] | None) -> None:
        """POST one message. A request's response reaches the lane (or `pass_on`) as it arrives.

        Raises `anyio.BrokenResourceError` when the upstream cannot be reached.
        """
        if self.closed:
            raise anyio.ClosedResourceError
        if not self.usable and self.fallback is not None:
            await self.fallback(message, headers)
            return
        stamped = headers or {}
        if message.get("method") == "notifications/cancelled" and self._cancelled(message, stamped):
            return
        data = self._encode(message, stamped)
        request_id = message.get("id") if "method" in message else None
        request_id = request_id if isinstance(request_id, str) else None
        connection = await self._connection()
        exchange = connection.start(request_id, data)
        if connection.used > 1 and await exchange.unread:
            # The server closed the idle connection as the request went out, having read none of it.
            (await self._connection(fresh=True)).start(request_id, data)

    def send_now(self, message: dict[str, Any], headers: dict[str, str] | None) -> bool:
        """`send` for a request, from synchronous code, on an idle connection; False (nothing sent) otherwise."""
        request_id = message.get("id")
        if self.closed or not self.usable or not is_lane_id(request_id):
            return False
        try:
            data = self._encode(message, headers or {})
        except anyio.BrokenResourceError:
            return False
        connection = self._reusable()
        if connection is None:
            return False
        connection.start(str(request_id), data, resend=True)  # nobody waits to send it again: `resend` will
        return True

    def resend(self, request_id: str, data: bytes) -> None:
        """Send a launched request again on a fresh connection: its idle one was closed under it, unread."""
        self._send_again(request_id, data)

    def resume(self, request_id: str, data: bytes, resumption: Resumption) -> None:
        """Reconnect, after the stream's `retry`, to the event stream of a request whose answer has not come."""
        delay = (resumption.retry if resumption.retry is not None else DEFAULT_RETRY_MS) / 1000
        self._send_again(request_id, resumption_request(data, resumption.last_id or ""), resumption, delay)

    def _send_again(self, request_id: str, data: bytes, resumed: Resumption | None = None, delay: float = 0.0) -> None:
        """Start a task that sends `data` for request `request_id` on a fresh connection after `delay` seconds."""
        if self.closed:
            return  # the lane fails its calls
        task = asyncio.get_running_loop().create_task(self._fresh(request_id, data, resumed, delay))
        self._resending[request_id] = task
        task.add_done_callback(
            lambda done: self._resending.pop(request_id, None) if self._resending.get(request_id) is done else None
        )

    async def _fresh(self, request_id: str, data: bytes, resumed: Resumption | None, delay: float) -> None:
        if delay:
            await asyncio.sleep(delay)
        try:
            connection = await self._connection(fresh=True)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            closed = {"code": CONNECTION_CLOSED, "message": "Connection closed"}
            self.deliver({"jsonrpc": "2.0", "id": request_id, "error": closed})
            return
        connection.start(request_id, data, resumed=resumed)

    def _cancelled(self, message: dict[str, Any], stamped: dict[str, str]) -> bool:
        """A 2026 request is cancelled by closing its connection (True: nothing to POST); a 2025 one by the POST."""
        if stamped.get(MCP_PROTOCOL_VERSION_HEADER) not in MODERN_PROTOCOL_VERSIONS:
            return False
        request_id = str((message.get("params") or {}).get("requestId"))
        resending = self._resending.pop(request_id, None)
        if resending is not None:
            resending.cancel()
        carrying = self._carrying.get(request_id)
        if carrying is not None:
            carrying.drop()
        return True

    def close(self) -> None:
        """Close every connection; calls still waiting get "Connection closed" from the lane."""
        self.closed = True
        for connection in list(self._live):
            connection.drop()
        self._idle.clear()
        for task in list(self._resending.values()):
            task.cancel()
        for waiter in self._waiting:
            waiter.cancel()

    def _encode(self, message: dict[str, Any], stamped: dict[str, str]) -> bytes:
        body = dumps(message)
        headers = dict(self._headers)
        if self.session_id is not None:
            headers["mcp-session-id"] = self.session_id
        headers.update((key.lower(), value) for key, value in stamped.items())
        headers["content-length"] = str(len(body))
        lines = [f"POST {self._target} HTTP/1.1", *(f"{key}: {value}" for key, value in headers.items())]
        if any(ch in line for line in lines for ch in "\r\n\0"):
            raise anyio.BrokenResourceError("a header value holds a line break")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + body

    def _reusable(self) -> Connection | None:
        """The most recently rested idle connection still fit to carry a request; stale ones are closed."""
        now = time.monotonic()
        while self._idle and now - self._idle[0].idle_since >= IDLE_REUSE:
            self._idle.popleft().drop()
        while self._idle:
            connection = self._idle.pop()
            if connection.reusable():
                return connection
            connection.drop()
        return None

    async def _connection(self, *, fresh: bool = False) -> Connection:
        """An idle connection (unless `fresh`), else a new one once fewer than `MAX_CONNECTIONS` are open."""
        while True:
            if self.closed:
                raise anyio.ClosedResourceError
            idle = None if fresh else self._reusable()
            if idle is not None:
                return idle
            if len(self._live) < MAX_CONNECTIONS:
                return await self._open()
            if self._idle:  # at the limit, a new one takes an idle one's place
                self._idle.popleft().drop()
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiting:
                    self._waiting.remove(waiter)

    async def _open(self) -> Connection:
        loop = asyncio.get_running_loop()
        if self._https and self._tls is None:
            self._tls = httpx2.create_ssl_context()  # the trust the SDK's client has
            self._tls.set_alpn_protocols(["http/1.1"])
        try:
            with anyio.fail_after(CONNECT_TIMEOUT):
                _, connection = await loop.create_connection(
                    lambda: Connection(self), self._host, self._port, ssl=self._tls
                )
        except (OSError, TimeoutError) as err:
            logger.debug("cannot connect to %s:%s: %s", self._host, self._port, err)
            raise anyio.BrokenResourceError from err
        if self.closed:
            connection.drop()
            raise anyio.ClosedResourceError
        self._live.add(connection)
        return connection

    def _wake_one(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    # -- what connections tell their pool (`mcpmux.upstream.http_connection.Pool`) ---------------------------

    def several(self, body: bytes) -> list[Any] | None:
        return self._joined.split(body)

    def carrying(self, request_id: str, connection: Connection | None) -> None:
        if connection is None:
            self._carrying.pop(request_id, None)
        else:
            self._carrying[request_id] = connection

    def rest(self, connection: Connection) -> None:
        """A connection whose response ended and that may carry another request."""
        if self.closed or len(self._idle) >= MAX_IDLE:
            connection.drop()
            return
        connection.idle_since = time.monotonic()
        self._idle.append(connection)
        self._wake_one()

    def forget(self, connection: Connection) -> None:
        """A connection ended."""
        self._live.discard(connection)
        if connection in self._idle:
            self._idle.remove(connection)
        self._wake_one()

    def deliver(self, message: dict[str, Any], carried_by: str | None = None) -> None:
        """One JSON-RPC message of a response to the request `carried_by`: the lane's, or the session's to handle."""
        if self.closed:
            return
        caller = self._lane.caller_of(carried_by)  # read first: taking the answer ends the call
        if self._lane.take(message):
            return
        request_id = message.get("id")
        if "method" in message or not is_lane_id(request_id):
            if self.pass_on is not None:
                self.pass_on(message, caller)
            return
        # An answer the lane could not read: its call (if anyone still waits) fails now, not at its timeout.
        error = {"code": types.INTERNAL_ERROR, "message": "the upstream's response is not valid JSON-RPC"}
        self._lane.take({"jsonrpc": "2.0", "id": request_id, "error": error})
