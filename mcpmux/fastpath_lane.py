"""The upstream half of the fast path: raw `tools/call` requests on an upstream's own transport.

`UpstreamLane` sits inside `WatchedTransport`, on the (read, write) streams the SDK's client
session uses, for stdio and streamable HTTP alike. `call()` writes a `tools/call` request with a
lane-private string id (`mux.N`; the SDK numbers its own requests with ints) onto the write stream,
stamped exactly as the SDK's session would stamp it (2026 `_meta` envelope, per-message HTTP
headers), and `divert()`, called on every message the transport reads, takes the response with
that id, and progress notifications for that token, away from the session before it sees them.
When the transport ends, every call still waiting fails with the SDK's "Connection closed" error,
so that `Upstream.request` words it as it does for the SDK path.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ClientMessageMetadata, SessionMessage
from mcp_types.jsonrpc import CONNECTION_CLOSED

if TYPE_CHECKING:  # upstream.py imports this module
    from mcpmux.upstream import ProgressFn


# A courtesy cancel must not hang a caller whose upstream stopped reading.
_CANCEL_WRITE_TIMEOUT = 2.0


@dataclass(slots=True)
class _Progress:
    progress: float
    total: float | None
    message: str | None


_Outcome = dict[str, Any] | types.ErrorData | _Progress
_CLOSED = types.ErrorData(code=CONNECTION_CLOSED, message="Connection closed")


class UpstreamLane:
    """Raw `tools/call` requests and their responses on one upstream connection."""

    def __init__(self) -> None:
        self._write: Any = None
        self._ids = itertools.count(1)
        self._pending: dict[str, MemoryObjectSendStream[_Outcome]] = {}
        self.closed = False

    def attach(self, write_stream: Any) -> None:
        """The transport's write stream (of `SessionMessage`s), once the transport is up."""
        self._write = write_stream

    def close(self) -> None:
        """The transport ended: every call in flight fails with "Connection closed"."""
        self.closed = True
        pending, self._pending = self._pending, {}
        for outcomes in pending.values():
            outcomes.send_nowait(_CLOSED)

    def divert(self, item: object) -> bool:
        """True when `item` (read off the transport) answers or reports progress on one of this lane's calls."""
        if not self._pending or not isinstance(item, SessionMessage):
            return False
        message = item.message
        if isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
            outcomes = self._pending.pop(message.id, None) if isinstance(message.id, str) else None
            if outcomes is None:
                return False
            outcomes.send_nowait(message.result if isinstance(message, types.JSONRPCResponse) else message.error)
            return True
        if isinstance(message, types.JSONRPCNotification) and message.method == "notifications/progress":
            params = message.params or {}
            token = params.get("progressToken")
            outcomes = self._pending.get(token) if isinstance(token, str) else None
            if outcomes is None:
                return False
            outcomes.send_nowait(_Progress(params.get("progress", 0.0), params.get("total"), params.get("message")))
            return True
        return False

    async def call(self, client: Client, tool: str, arguments: dict[str, Any], progress: ProgressFn | None) -> Any:
        """Call `tool` (its upstream name) and return the raw `result` object of the response.

        Raises `MCPError` for a JSON-RPC error response and for a lost connection (code -32000), as the
        SDK's session does. Cancelling the caller sends `notifications/cancelled` with the lane id.
        """
        if self.closed or self._write is None:
            raise MCPError(code=CONNECTION_CLOSED, message="Connection closed")
        request_id = f"mux.{next(self._ids)}"
        params: dict[str, Any] = {"name": tool, "arguments": arguments}
        data: dict[str, Any] = {"method": "tools/call", "params": params}
        session = client.session
        opts: dict[str, Any] = {}
        # The session's own stamp: the 2026 `_meta` envelope and `Mcp-*` headers, byte for byte the SDK's.
        session._stamp(data, opts)  # type: ignore[arg-type]
        # The SDK path always asks for progress, with its request id as the token; so does the lane.
        params.setdefault("_meta", {})["progressToken"] = request_id
        headers = opts.get("headers")
        message = types.JSONRPCRequest(jsonrpc="2.0", id=request_id, method="tools/call", params=params)
        metadata = ClientMessageMetadata(headers=headers) if headers else None
        send, receive = anyio.create_memory_object_stream[_Outcome](math.inf)
        self._pending[request_id] = send
        try:
            with receive:
                await self._write.send(SessionMessage(message, metadata=metadata))
                return await self._outcome(receive, progress)
        except anyio.get_cancelled_exc_class():
            if self._pending.pop(request_id, None) is not None:
                await self._cancel(session, request_id)
            raise
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            raise MCPError(code=CONNECTION_CLOSED, message="Connection closed") from None
        finally:
            self._pending.pop(request_id, None)

    async def _outcome(self, receive: MemoryObjectReceiveStream[_Outcome], progress: ProgressFn | None) -> Any:
        while True:
            outcome = await receive.receive()
            if isinstance(outcome, _Progress):
                if progress is not None:
                    await progress(outcome.progress, outcome.total, outcome.message)
                continue
            if isinstance(outcome, types.ErrorData):
                raise MCPError(code=outcome.code, message=outcome.message, data=outcome.data)
            return outcome

    async def _cancel(self, session: Any, request_id: str) -> None:
        """Tell the upstream to stop (on 2026 HTTP the SDK transport turns this into closing the POST)."""
        params: dict[str, Any] = {"requestId": request_id, "reason": "caller cancelled"}
        data: dict[str, Any] = {"method": "notifications/cancelled", "params": params}
        opts: dict[str, Any] = {}
        session._stamp(data, opts)
        headers = opts.get("headers")
        note = types.JSONRPCNotification(jsonrpc="2.0", method="notifications/cancelled", params=params)
        # A connection that is gone took the request with it: nothing to cancel then.
        with (
            anyio.move_on_after(_CANCEL_WRITE_TIMEOUT, shield=True),
            contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError),
        ):
            await self._write.send(SessionMessage(note, metadata=ClientMessageMetadata(headers=headers)))
