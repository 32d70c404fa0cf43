"""The stdio half of the fast path: lines a `StdioClientWire` hands over before the SDK reads them.

`StdioFastFront.take(line)` answers a `tools/call` line itself when `FastPath.route` accepts it,
and its response line is written straight to stdout. Where it can be, the call is launched right
there (`FastPath.launch`) and answered from the upstream's wire, with no task at all; otherwise, or
once something needs one, it runs in a task of the front's task group. A `notifications/cancelled`
naming such a call cancels it (the upstream hears of it, the client gets no response, as on the
SDK path). Every other line goes on to the SDK.

A 2025 client that declared sampling or elicitation keeps the fast path once its session is set up
(`connection`): what an upstream asks the client for one of its fast-path calls is asked on that
session, its log messages are written among the call's lines, and notes for the model join the
call's result, as the SDK path does (the call's `InboundCall`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from anyio.abc import TaskGroup
from mcp.server.connection import Connection
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcpmux.core.inbound import Caller, InboundCall
from mcpmux.mux.call_sink import ServedCall, serve
from mcpmux.mux.fast_path import FastCall, FastPath, ToSdk, decode, sampling_declared
from mcpmux.server.reach import Hears, ask_on
from mcpmux.server.stdio.batch import StdioClientWire
from mcpmux.upstream.lane import ProgressFn
from mcpmux.wire.batch_array import id_key
from mcpmux.wire.json_bytes import line

logger = logging.getLogger(__name__)
TASK_OWNER_STDIO = "stdio"
"""Who owns the tasks the one stdio client creates (`Mux.tasks`)."""


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

    async def withhold(self, call: FastCall) -> None:
        """A cancelled request gets no response at all, as on the SDK path."""

    def ended(self) -> None:
        self.front._forget(self)


class StdioFastFront:
    """Takes fast-path calls off the lines of the one client on `edge`; calls run in `tasks`.

    Call `close()` before cancelling `tasks`: launched calls without a task get one then.
    """

    def __init__(
        self,
        fast: FastPath,
        edge: StdioClientWire,
        tasks: TaskGroup,
        caller: Callable[[Connection | None], Caller],
        hears: Callable[[Connection | None], Hears],
    ) -> None:
        """`caller`: who the client is, given its session; `hears`: at which levels it hears logs."""
        self.fast = fast
        self._edge = edge
        self._tasks = tasks
        self._running: dict[str, _StdioSink] = {}
        self._caller = caller
        self._known_caller: tuple[Connection | None, Caller] | None = None
        self._hears = hears
        self.connection: Connection | None = None
        """The client's 2025 session, once initialized (set by `Frontend`): upstreams' requests to the
        client go out on it."""
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
            caller = self._caller_now()
            call = self.fast.route(message, caller, self._edge.protocol_version, asks, owner=TASK_OWNER_STDIO)
            if isinstance(call, ToSdk):
                self.fast.to_sdk(call)
                return False
            key = id_key(call.request_id)
            if key in self._running:
                self.fast.to_sdk(ToSdk.DUPLICATE_ID)  # the SDK path answers that as it always has
                return False
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

    def _caller_now(self) -> Caller:
        """The client as a caller: made again only when its session is (once, at `initialize`)."""
        known = self._known_caller
        if known is None or known[0] is not self.connection:
            known = self._known_caller = (self.connection, self._caller(self.connection))
        return known[1]

    def close(self) -> None:
        """Give every launched call still without a task its task (which the caller then cancels)."""
        for sink in list(self._running.values()):
            if sink.served is not None:
                sink.served.detach()

    def _start(self, call: FastCall, key: str) -> None:
        """Serve the call (`serve`: launched right here when it can be, else in a task of the front's).
        A 2025 call's client is asked what the upstream asks on its session, and hears the upstream's
        logs for the call at its level, written among the call's own lines."""
        progress = self._progress_relay(call.progress_token) if call.progress_token is not None else None
        if call.version not in MODERN_PROTOCOL_VERSIONS:
            self._reachable(call.inbound)
        sink = self._running[key] = _StdioSink(self, call, key, progress)
        sink.served = serve(self.fast, call, sink)

    def _reachable(self, inbound: InboundCall) -> None:
        connection = self.connection
        if connection is not None:
            inbound.ask = ask_on(connection)
        hears = self._hears(connection)

        async def log(params: types.LoggingMessageNotificationParams) -> None:
            if hears(params.level):
                data = params.model_dump(by_alias=True, mode="json", exclude_none=True)
                await self._write({"jsonrpc": "2.0", "method": "notifications/message", "params": data})

        async def notify(method: str, params: dict[str, Any] | None) -> None:
            await self._write({"jsonrpc": "2.0", "method": method, **({"params": params} if params else {})})

        inbound.log, inbound.notify = log, notify

    def _forget(self, sink: _StdioSink) -> None:
        """The call is over for this front (answered, or its task ended): once."""
        if self._running.get(sink.key) is sink:  # the id may be in use again by a newer call
            del self._running[sink.key]

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
