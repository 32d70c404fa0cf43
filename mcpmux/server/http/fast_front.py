"""Fast-path POSTs answered inside the HTTP protocol, below ASGI.

uvicorn runs every request in a task of its own through Starlette's stack and the edge's
middleware; for a `tools/call` the fast path serves, that cost more than the call itself.
`FastHttpProtocol` (uvicorn's httptools protocol, subclassed) holds a POST to the MCP path back
until its body is in, and hands it to `HttpFastFront.take`. That runs the edge's checks
(`HttpEdge.admits`) and the fast path's routing (`FastPathMiddleware.route`) right there and, when
both pass, launches the call (`FastPath.launch`): the response is written to the connection from
the upstream connection's callback, in one write, with no task at all, as on stdio. A call that
cannot be launched, or that something comes to need a task for (progress, a timeout, a
cancellation), runs in a task uvicorn's shutdown waits for. The client closing the connection
cancels the call; a 2025 session's `notifications/cancelled` for it (which goes through ASGI)
cancels it and the request gets the SDK's -32800, as in the middleware. An answer written here
retires its connection (`Connection: close`) when the client's address holds more idle keep-alive
connections than `[http] idle_connections_per_client` (mcpmux.server.http.keepalive).

Everything else goes to the ASGI app as before, which words every refusal: other paths and
methods, a body over `MAX_HELD` bytes or announced with `Expect: 100-continue`, headers a proxy
added (the edge's per-client rate limit reads the client address the proxy headers give),
pipelined requests, and any request the checks or the routing turn down.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, cast

import mcp_types as types
from mcp.server.connection import Connection
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.types import Scope
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, RequestResponseCycle

from mcpmux.core.inbound import InboundCall
from mcpmux.mux.call_sink import ServedCall, serve
from mcpmux.mux.fast_path import FastCall, FastPath
from mcpmux.server.http.edge import HttpEdge
from mcpmux.server.http.fast import CANCELLED_ERROR, FastPathMiddleware, http_status, session_of
from mcpmux.server.http.keepalive import IdleConnections
from mcpmux.server.http.quiet_server import DatedProtocol
from mcpmux.server.reach import Hears, ask_on
from mcpmux.upstream.lane import ProgressFn
from mcpmux.wire.batch_array import id_key
from mcpmux.wire.json_bytes import dumps

logger = logging.getLogger(__name__)

MAX_HELD = 64 * 1024
"""Bodies up to this size are held for the fast path (uvicorn stops reading past it until the app reads)."""
# Proxy headers (the edge's rate limit reads the client's address from them, after uvicorn's
# middleware) and `Expect: 100-continue` (its body comes once the app asks for it) go to ASGI.
_NOT_HELD = frozenset({b"forwarded", b"x-forwarded-for", b"x-forwarded-proto", b"x-real-ip", b"expect"})


@dataclass(slots=True, eq=False)
class _HttpSink:
    """Where one fast-path call's response goes: its request's connection (`CallSink`)."""

    front: HttpFastFront
    protocol: FastHttpProtocol
    cycle: RequestResponseCycle
    call: FastCall
    key: tuple[str, str] | None
    """(2025 session, request id) while the call is in flight, for a `notifications/cancelled` to find it."""
    modern: bool
    """The client speaks 2026-07-28: an error's HTTP status comes from the SDK's table."""
    served: ServedCall | None = None
    gone: bool = False
    """The client closed the connection."""
    progress: ProgressFn | None = None  # a call that asked for progress goes through ASGI

    def respond_now(self, response: dict[str, Any]) -> bool:
        return self.protocol.respond(self.cycle, response, self.modern)

    async def respond(self, response: dict[str, Any]) -> None:
        self.respond_now(response)

    def start(self, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self.protocol.start_task(work())

    async def withhold(self, call: FastCall) -> None:
        # A 2025 session's notifications/cancelled: the SDK's -32800, on a stream; a client gone gets nothing.
        if not self.gone:
            response = {"jsonrpc": "2.0", "id": call.request_id, "error": CANCELLED_ERROR}
            self.protocol.respond(self.cycle, response, self.modern, event_stream=True)

    def ended(self) -> None:
        self.front._forget(self)

    def cancel(self) -> None:
        if self.served is not None:
            self.served.cancel()

    def lost(self) -> None:
        """The client closed the connection: the call is cancelled, nobody is left to answer."""
        self.gone = True
        self.cancel()


class HttpFastFront:
    """Takes the requests `FastPathMiddleware` would serve straight off the protocol."""

    def __init__(
        self,
        middleware: FastPathMiddleware,
        edge: HttpEdge,
        askable: Callable[[str], Connection | None],
        hears: Callable[[Connection | None], Hears],
    ) -> None:
        """`askable`: a 2025 session's connection while requests can reach its client (its standalone
        stream is open), else None; `hears`: at which levels a client hears logs."""
        self.middleware = middleware
        self.edge = edge
        self.fast: FastPath = middleware.fast
        self.idle = IdleConnections(edge.policy.idle_per_client)
        self._askable = askable
        self._hears = hears

    def holds(self, scope: Any) -> bool:
        """Whether a request is held until its body is in, for `take` to see."""
        if scope["method"] != "POST" or (scope["path"].rstrip("/") or "/") != self.middleware.path:
            return False
        length = next((value for key, value in scope["headers"] if key == b"content-length"), b"")
        elsewhere = any(key in _NOT_HELD for key, _ in scope["headers"])
        # What the edge refuses on its headers, it refuses at once, without waiting for the body.
        return length.isdigit() and int(length) <= MAX_HELD and not elsewhere and not self.edge.refuses_at_once(scope)

    def take(self, protocol: FastHttpProtocol, cycle: RequestResponseCycle) -> bool:
        """Serve the request here (True), or leave it to the ASGI app (False, nothing done)."""
        scope, body = cast(Scope, cycle.scope), bytes(cycle.body)
        self.edge.enter(scope)  # its profile (its token's), which `route` reads
        call = self.middleware.route(scope, body, self._askable)
        if not isinstance(call, FastCall):
            return False  # the middleware decides again, below ASGI, and counts why
        session = session_of(scope)
        key = (session, id_key(call.request_id)) if session is not None else None
        if key in self.middleware.running:
            return False  # a duplicate id in flight: the SDK path answers that as it always has
        if not self.edge.admits(scope, len(body)):  # last: it counts the request against the rate limit
            return False
        sink = _HttpSink(self, protocol, cycle, call, key, call.version in MODERN_PROTOCOL_VERSIONS)
        if key is not None:
            self.middleware.running[key] = sink
            self._reachable(key[0], call.inbound)
        protocol.running = sink
        try:
            sink.served = serve(self.fast, call, sink)
        except Exception:  # nothing went out (`launch` leaves nothing behind): the ASGI app serves it
            logger.exception("launching fast-path call %r failed; the SDK path serves it", call.tool)
            return False
        return True

    def _forget(self, sink: _HttpSink) -> None:
        if sink.key is not None and self.middleware.running.get(sink.key) is sink:
            del self.middleware.running[sink.key]
        if sink.protocol.running is sink:
            sink.protocol.running = None

    def _reachable(self, session: str, inbound: InboundCall) -> None:
        """A 2025 session's call: its client is asked what the upstream asks, and hears its logs, on the
        session's standalone stream while that is open (a fast-path answer has no stream of its own)."""
        connection = self._askable(session)
        if connection is None:
            return
        hears = self._hears(connection)

        async def log(params: types.LoggingMessageNotificationParams) -> None:
            if hears(params.level):
                await connection.notify("notifications/message", params.model_dump(mode="json", exclude_none=True))

        inbound.ask, inbound.log, inbound.notify = ask_on(connection), log, connection.notify


class FastHttpProtocol(DatedProtocol):
    """uvicorn's httptools protocol, with fast-path POSTs served below ASGI (see the module docstring).

    `protocol_class(front)` binds it to a front.
    """

    front: HttpFastFront
    running: _HttpSink | None = None
    _held: tuple[RequestResponseCycle, Any] | None = None
    _address = ""
    """The client's IP address, for `HttpFastFront.idle`."""

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        if self.client:
            self._address = self.client[0]
        self.front.idle.opened(self._address)

    def data_received(self, data: bytes) -> None:
        self.front.idle.busy(self._address, self)
        super().data_received(data)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.timeout_keep_alive_task is not None:  # armed: the connection waits for its next request
            self.front.idle.resting(self._address, self)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        if app is self.app and cycle is self.cycle and not self.pipeline and self.front.holds(cycle.scope):
            if cycle.more_body:  # decide once the body is in
                self._held = (cycle, app)
                return
            if self.front.take(self, cycle):
                return
        super()._start_asgi_task(cycle, app)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        held, self._held = self._held, None
        if held is not None:
            cycle, app = held
            if not (cycle is self.cycle and not cycle.more_body and self.front.take(self, cycle)):
                super()._start_asgi_task(cycle, app)

    def connection_lost(self, exc: Exception | None) -> None:
        self.front.idle.busy(self._address, self)
        if self.running is not None:
            self.running.lost()
        super().connection_lost(exc)

    def start_task(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run `coroutine` as uvicorn runs a request's task: its shutdown waits for it."""
        task = self.loop.create_task(coroutine)
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def respond(
        self, cycle: RequestResponseCycle, response: dict[str, Any], modern: bool, event_stream: bool = False
    ) -> bool:
        """Write `response` as the request's whole HTTP response, in one write; False if it cannot go out.
        `event_stream`: as one event of a `text/event-stream` body (a 2025 session's answer to a
        cancelled call, as the SDK's server writes it: clients read a late answer on a stream safely)."""
        if cycle.response_complete or cycle.disconnected or self.transport.is_closing():
            return False
        status = http_status(response, modern)
        if cycle.keep_alive and cycle.scope is self.scope and self.front.idle.retire(self._address):
            cycle.keep_alive = False  # nothing after this request on the connection: retire it (`HttpFastFront.idle`)
        payload = dumps(response)
        content = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            content += [name, b": ", value, b"\r\n"]
        kind = b"application/json"
        if event_stream:
            kind, payload = b"text/event-stream", b"event: message\ndata: %s\n\n" % payload
        content.append(b"content-type: %s\r\ncontent-length: %d\r\n" % (kind, len(payload)))
        if not cycle.keep_alive:
            content.append(b"connection: close\r\n")
        content += [b"\r\n", payload]
        self.transport.write(b"".join(content))
        cycle.response_started = cycle.response_complete = True
        if not cycle.keep_alive:
            self.transport.close()
        self.on_response_complete()
        return True


def protocol_class(front: HttpFastFront) -> type[FastHttpProtocol]:
    """The protocol class for uvicorn's `Config(http=...)`, bound to `front`."""
    return type("BoundFastHttpProtocol", (FastHttpProtocol,), {"front": front})
