"""The stdio half of the fast path: lines a `StdioBatchEdge` hands over before the SDK reads them.

`StdioFastFront.take(line)` answers a `tools/call` line itself when `FastPath.route` accepts it,
and its response line is written straight to stdout. Where it can be, the call is launched right
there (`FastPath.launch`) and answered from the upstream's wire, with no task at all; otherwise, or
once something needs one, it runs in a task of the front's task group. A `notifications/cancelled`
naming such a call cancels it (the upstream hears of it, the client gets no response, as on the
SDK path). Every other line goes on to the SDK.

A 2025 client that declared sampling or elicitation keeps the fast path once its session is set up
(`connection`): a sampling, elicitation or roots request an upstream sends while the client's
fast-path calls are in flight is asked of the client on that session, as the SDK path would.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import mcp_types as types
from anyio.abc import TaskGroup
from mcp.server.connection import Connection
from mcp.shared.exceptions import NoBackChannelError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel

from mcpmux.mux.call_sink import ServedCall, serve
from mcpmux.mux.fast_path import FastCall, FastPath, decode, sampling_declared
from mcpmux.server.stdio_batch import StdioBatchEdge
from mcpmux.upstream.lane import ProgressFn
from mcpmux.wire.batch_array import id_key
from mcpmux.wire.json_bytes import line

logger = logging.getLogger(__name__)
TASK_OWNER_STDIO = "stdio"
"""Who owns the tasks the one stdio client creates (`Mux.tasks`)."""
T = TypeVar("T", bound=BaseModel)


@dataclass(slots=True, eq=False)
class _StdioSink:
    """Where one fast-path call's lines go: the client's stdout (`CallSink`)."""

    front: StdioFastFront
    call: FastCall
    key: str
    progress: ProgressFn | None
    served: ServedCall | None = None

    def respond_now(self, response: dict[str, Any]) -> bool:
        return self.front._write_now(response)

    async def respond(self, response: dict[str, Any]) -> None:
        await self.front._write(response)

    def start(self, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self.front._tasks.start_soon(work)

    def withheld(self, call: FastCall) -> dict[str, Any] | None:
        return None  # a cancelled request gets no response at all, as on the SDK path

    def ended(self) -> None:
        self.front._forget(self)


class StdioFastFront:
    """Takes fast-path calls off the lines of the one client on `edge`; calls run in `tasks`.

    Call `close()` before cancelling `tasks`: launched calls without a task get one then.
    """

    def __init__(self, fast: FastPath, edge: StdioBatchEdge, tasks: TaskGroup, callers: dict[str, Any]) -> None:
        """`callers`: `Frontend`'s calls in flight per upstream, where upstream logs are delivered."""
        self.fast = fast
        self._edge = edge
        self._tasks = tasks
        self._callers = callers
        self._running: dict[str, _StdioSink] = {}
        self._relays: dict[str, _ClientStandIn] = {}
        self.connection: Connection | None = None
        """The client's 2025 session, once initialized (set by `Frontend`): upstreams' requests to the
        client go out on it."""
        """Per upstream with calls of this client in flight: where its logs reach the client."""
        self._declares_sampling = False
        self._outbox: list[bytes] = []
        self._writing = False

    def take(self, line: str) -> bool:
        """True when the fast path took `line` (the SDK must not see it); it takes only well-formed messages.

        Called from the read callback of the client's wire (`mcpmux.wire.stdio_lines.read_lines`), so it never waits.
        """
        if '"tools/call"' in line:
            message = decode(line)
            asks = self._declares_sampling and self.connection is None  # with no session yet, the SDK path asks
            call = self.fast.route(message, self._edge.protocol_version, asks, owner=TASK_OWNER_STDIO)
            if call is None:
                return False
            key = id_key(call.request_id)
            if key in self._running:
                return False  # a duplicate id in flight: the SDK path answers that as it always has
            self._start(call, key)
            return True
        if '"notifications/cancelled"' in line:
            message = decode(line)
            if not isinstance(message, dict) or message.get("jsonrpc") != "2.0" or "id" in message:
                return False  # not a well-formed notification: the SDK path words the refusal
            params = message.get("params")
            sink = self._running.get(id_key(params.get("requestId"))) if isinstance(params, dict) else None
            if sink is None or sink.served is None:
                return False
            sink.served.cancel()
            return True
        if '"initialize"' in line:
            message = decode(line)
            if isinstance(message, dict) and message.get("method") == "initialize":
                params = message.get("params")
                capabilities = params.get("capabilities") if isinstance(params, dict) else None
                self._declares_sampling = sampling_declared(capabilities)
        return False

    def close(self) -> None:
        """Give every launched call still without a task its task (which the caller then cancels)."""
        for sink in list(self._running.values()):
            if sink.served is not None:
                sink.served.detach()

    def _start(self, call: FastCall, key: str) -> None:
        """Serve the call (`serve`: launched right here when it can be, else in a task of the front's)."""
        progress = self._progress_relay(call.progress_token) if call.progress_token is not None else None
        sink = self._running[key] = _StdioSink(self, call, key, progress)
        self._hold_relay(call)
        sink.served = serve(self.fast, call, sink)

    def _forget(self, sink: _StdioSink) -> None:
        """The call is over for this front (answered, or its task ended): once."""
        call = sink.call
        if self._running.get(sink.key) is sink:  # the id may be in use again by a newer call
            del self._running[sink.key]
        relay = self._relays[call.upstream.name]
        relay.calls -= 1
        if call.version not in MODERN_PROTOCOL_VERSIONS:
            relay.legacy_calls -= 1
        if relay.calls == 0:
            del self._relays[call.upstream.name]
            relay.callers.pop(relay, None)

    def _hold_relay(self, call: FastCall) -> None:
        """Registered like the SDK path registers a client's session: the upstream's logs meanwhile
        reach this client, once each however many of its calls are in flight there."""
        relay = self._relays.get(call.upstream.name)
        if relay is None:
            callers = self._callers.get(call.upstream.name)
            if callers is None:
                callers = self._callers[call.upstream.name] = weakref.WeakKeyDictionary()
            relay = self._relays[call.upstream.name] = _ClientStandIn(self, callers)
        relay.calls += 1
        if call.version not in MODERN_PROTOCOL_VERSIONS:
            relay.legacy_calls += 1
        relay.callers[relay] = call.request_id

    def _progress_relay(self, token: Any) -> ProgressFn:
        async def relay(progress: float, total: float | None, message: str | None) -> None:
            params: dict[str, Any] = {"progressToken": token, "progress": progress}
            if total is not None:
                params["total"] = total
            if message is not None:
                params["message"] = message
            await self._write({"jsonrpc": "2.0", "method": "notifications/progress", "params": params})

        return relay

    def _write_now(self, message: dict[str, Any]) -> bool:
        """Write one line at once, from synchronous code, when no line is queued and the wire takes it now."""
        if self._writing:
            return False
        return self._edge.write_line_now(line(message))

    async def _write(self, message: dict[str, Any]) -> None:
        """Queue one line; the first writer writes every line queued meanwhile in one go.

        Calls answered together share one write (one system call, or one thread hop where the wire
        cannot be polled).
        """
        self._outbox.append(line(message))
        if self._writing:
            return
        self._writing = True
        try:
            with anyio.CancelScope(shield=True):  # the lines queued are other calls' too
                while self._outbox:
                    lines, self._outbox = self._outbox, []
                    await self._edge.write_line(b"".join(lines))
        finally:
            self._writing = False


class _ClientStandIn:
    """Stands in for the client's SDK session in `Frontend`'s callers of one upstream, while the client
    has fast-path calls in flight there: it is told the upstream's logs, and asked what the upstream
    asks of the client (`mcpmux.server.client_relay`).

    The logs go out while at least one of those calls is a 2025 one: a 2025 client hears every level,
    as from the SDK path; a 2026 request did not opt in (those that do take the SDK path), so it
    hears none. Requests go to the client's 2025 session, once there is one, while a 2025 call is in
    flight (a 2026 client that can answer takes the SDK path, in input-required rounds).
    """

    @property
    def _connection(self) -> Connection | None:
        """The client's session, as `ServerSession._connection` names it (the relay's client identity)."""
        return self._front.connection if self.legacy_calls else None

    @property
    def client_capabilities(self) -> types.ClientCapabilities | None:
        connection = self._connection
        return connection.client_capabilities if connection is not None else None

    @property
    def can_send_request(self) -> bool:
        connection = self._connection
        return connection is not None and connection.has_standalone_channel

    async def send_request(self, request: types.ServerRequest, result_type: type[T], metadata: Any = None) -> T:
        """Ask the client on its session (stdio has one stream: nothing to relate the request to)."""
        connection = self._connection
        if connection is None:
            raise NoBackChannelError(request.method)  # its last 2025 call ended meanwhile
        data = request.model_dump(by_alias=True, mode="json", exclude_none=True)
        raw = await connection.send_raw_request(data["method"], data.get("params"))
        return result_type.model_validate(raw, by_name=False)

    def __init__(self, front: StdioFastFront, callers: Any) -> None:
        self._front = front
        self.callers = callers
        """The callers of the upstream it is registered with."""
        self.calls = 0
        """This client's calls in flight on that upstream."""
        self.legacy_calls = 0
        """Those of them made in a 2025 revision: only those hear the upstream's logs."""

    async def send_log_message(
        self, level: str, data: Any, logger: str | None = None, related_request_id: Any = None
    ) -> None:
        if not self.legacy_calls:
            return
        params: dict[str, Any] = {"level": level, "data": data}
        if logger is not None:
            params["logger"] = logger
        await self._front._write({"jsonrpc": "2.0", "method": "notifications/message", "params": params})
