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
connections than `[http] idle_connections_per_client` (mcpmux.server.http_keepalive).

Everything else goes to the ASGI app as before, which words every refusal: other paths and
methods, a body over `MAX_HELD` bytes or announced with `Expect: 100-continue`, headers a proxy
added (the edge's per-client rate limit reads the client address the proxy headers give),
pipelined requests, and any request the checks or the routing turn down.
"""

from __future__ import annotations

import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, cast

import anyio
import mcp_types as types
from mcp.shared.inbound import ERROR_CODE_HTTP_STATUS
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.types import Scope
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from mcpmux.mux.fast_path import FastCall, FastPath, Flight
from mcpmux.server.http_edge import HttpEdge
from mcpmux.server.http_fast import CANCELLED_ERROR, FastPathMiddleware, session_of
from mcpmux.server.http_keepalive import IdleConnections
from mcpmux.wire.batch_array import id_key
from mcpmux.wire.json_bytes import dumps

logger = logging.getLogger(__name__)

MAX_HELD = 64 * 1024
"""Bodies up to this size are held for the fast path (uvicorn stops reading past it until the app reads)."""
# Proxy headers (the edge's rate limit reads the client's address from them, after uvicorn's
# middleware) and `Expect: 100-continue` (its body comes once the app asks for it) go to ASGI.
_NOT_HELD = frozenset({b"forwarded", b"x-forwarded-for", b"x-forwarded-proto", b"x-real-ip", b"expect"})


@dataclass(slots=True, eq=False)
class _Running:
    """A fast-path call in flight on a connection."""

    call: FastCall
    protocol: FastHttpProtocol
    cycle: RequestResponseCycle
    scope: anyio.CancelScope | None = None
    """The scope of its task, once it has one."""
    cancelled: bool = False
    flight: Flight | None = None
    gone: bool = False
    """The client closed the connection."""

    def cancel(self) -> None:
        self.cancelled = True
        if self.scope is not None:
            self.scope.cancel()
        if self.flight is not None:
            self.flight.wake()  # a launched call with no task yet gets one, to tell the upstream

    def respond(self, response: dict[str, Any]) -> bool:
        if self.cancelled:
            return False  # cancelled: the task answers (or, the client gone, nobody)
        return self.protocol.respond(self.cycle, response, self.call.version in MODERN_PROTOCOL_VERSIONS)


class HttpFastFront:
    """Takes the requests `FastPathMiddleware` would serve straight off the protocol."""

    def __init__(self, middleware: FastPathMiddleware, edge: HttpEdge) -> None:
        self.middleware = middleware
        self.edge = edge
        self.fast: FastPath = middleware.fast
        self.idle = IdleConnections(edge.policy.idle_per_client)

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
        call = self.middleware.route(scope, body)
        if call is None:
            return False
        session = session_of(scope)
        key = (session, id_key(call.request_id)) if session is not None else None
        if key in self.middleware.running:
            return False  # a duplicate id in flight: the SDK path answers that as it always has
        if not self.edge.admits(scope, len(body)):  # last: it counts the request against the rate limit
            return False
        running = _Running(call, protocol, cycle)
        if key is not None:
            self.middleware.running[key] = running
        protocol.running = running
        try:
            self._start(running, key)
        except Exception:  # nothing went out (`launch` leaves nothing behind): the ASGI app serves it
            logger.exception("launching fast-path call %r failed; the SDK path serves it", call.tool)
            self._forget(running, key)
            return False
        return True

    def _start(self, running: _Running, key: tuple[str, str] | None) -> None:
        call, protocol = running.call, running.protocol

        def deliver_now(response: dict[str, Any]) -> bool:
            if not running.respond(response):
                return False
            self._forget(running, key)
            return True

        def escalate() -> None:
            protocol.start_task(self._serve(running, key))

        flight = self.fast.launch(call, deliver_now, escalate)
        if flight is None:
            protocol.start_task(self._serve(running, key))
            return
        running.flight = flight

    async def _serve(self, running: _Running, key: tuple[str, str] | None) -> None:
        async def deliver(response: dict[str, Any]) -> None:
            running.respond(response)

        error: dict[str, Any] | None = None
        running.scope = anyio.CancelScope()
        if running.cancelled:
            running.scope.cancel()
        try:
            with running.scope:
                await self.fast.answer(running.call, deliver=deliver, flight=running.flight)
        except Exception:  # the request still gets its answer, as uvicorn's 500 on the ASGI path
            logger.exception("fast-path call %r failed", running.call.tool)
            error = {"code": types.INTERNAL_ERROR, "message": "Internal error"}
        finally:
            self._forget(running, key)
        # Cancelled (a 2025 session's notifications/cancelled), even if the call ended before it could
        # notice: the result was withheld, so the request gets the SDK's -32800 (respond writes once).
        if running.cancelled and not running.gone:
            error = CANCELLED_ERROR
        if error is not None:
            response = {"jsonrpc": "2.0", "id": running.call.request_id, "error": error}
            running.protocol.respond(running.cycle, response, running.call.version in MODERN_PROTOCOL_VERSIONS)

    def _forget(self, running: _Running, key: tuple[str, str] | None) -> None:
        if key is not None and self.middleware.running.get(key) is running:
            del self.middleware.running[key]
        if running.protocol.running is running:
            running.protocol.running = None


class FastHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with fast-path POSTs served below ASGI (see the module docstring).

    `protocol_class(front)` binds it to a front.
    """

    front: HttpFastFront
    running: _Running | None = None
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
        running = self.running
        if running is not None:
            running.gone = True
            running.cancel()
        super().connection_lost(exc)

    def start_task(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run `coroutine` as uvicorn runs a request's task: its shutdown waits for it."""
        task = self.loop.create_task(coroutine)
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def respond(self, cycle: RequestResponseCycle, response: dict[str, Any], modern: bool) -> bool:
        """Write `response` as the request's whole HTTP response, in one write; False if it cannot go out."""
        if cycle.response_complete or cycle.disconnected or self.transport.is_closing():
            return False
        # A 2026 error's status comes from the SDK's table; a 2025 session's errors ride a 200, as on its SSE.
        status = ERROR_CODE_HTTP_STATUS.get(response["error"]["code"], 200) if modern and "error" in response else 200
        if cycle.keep_alive and cycle.scope is self.scope and self.front.idle.retire(self._address):
            cycle.keep_alive = False  # nothing after this request on the connection: retire it (`HttpFastFront.idle`)
        payload = dumps(response)
        content = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            content += [name, b": ", value, b"\r\n"]
        content.append(b"content-type: application/json\r\ncontent-length: %d\r\n" % len(payload))
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
