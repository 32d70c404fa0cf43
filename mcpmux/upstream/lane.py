"""The upstream half of the fast path: raw `tools/call` requests on an upstream's own transport.

`UpstreamLane` writes a `tools/call` request with a lane-private string id (`mux.N`; the SDK
numbers its own requests with ints) through the `Send` its transport attached, stamped exactly as
the SDK's session would stamp it (2026 `_meta` envelope, per-message HTTP headers), and takes the
response with that id, and progress notifications for that token, away from the session before it
sees them. Two kinds of transport carry it:

- mcpmux's stdio transport (`mcpmux.upstream.stdio_transport`) writes the request as a raw JSON line and hands
  each raw message it reads to `take()`: no pydantic model and no task between the call and the pipe.
  It can also write a short line from synchronous code (`SendNow`), so `launch()` sends a request
  from the very code that read the client's line, and a response can be answered in `take()` itself
  (see `FastPath.launch`).
- an SDK transport (streamable HTTP) gets `session_sender(write_stream)`, and `WatchedTransport`
  hands every `SessionMessage` it reads to `divert()`.

When the transport ends, every call still waiting fails with the SDK's "Connection closed" error,
so that `Upstream.request` words it as it does for the SDK path.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import mcp_types as types
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ClientMessageMetadata, SessionMessage
from mcp_types.jsonrpc import CONNECTION_CLOSED
from pydantic import ValidationError

from mcpmux.core.inbound import InboundCall

CLIENT_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"

logger = logging.getLogger(__name__)


class ProgressFn(Protocol):
    """Receives an upstream's progress notifications for one request."""

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None: ...


# A courtesy cancel must not hang a caller whose upstream stopped reading.
_CANCEL_WRITE_TIMEOUT = 2.0


@dataclass(slots=True)
class _Progress:
    progress: float
    total: float | None
    message: str | None


_Outcome = dict[str, Any] | types.ErrorData | _Progress


Answered = Callable[[dict[str, Any]], bool]
"""Sees a launched call's result the moment it is read; True when that ended the call (nobody waits for it)."""


class _Outcomes:
    """What arrives for one call, in order: progress reports, then its answer.

    A memory object stream would do, but its `receive` always yields to the event loop first, and
    on the fast path a loop iteration is a measurable share of a call.
    """

    __slots__ = ("_arrived", "_items", "answered", "caller", "on_put", "others")

    def __init__(
        self,
        answered: Answered | None = None,
        on_put: Callable[[], None] | None = None,
        others: int = 0,
        caller: InboundCall | None = None,
    ):
        self._items: deque[_Outcome] = deque()
        self.caller = caller
        """The inbound call this request serves: what the upstream sends on its stream is that call's."""
        self._arrived: anyio.Event | None = None
        """Set for `get` to wake up, while it waits."""
        self.answered = answered
        self.on_put = on_put
        """Told of everything queued: a launched call's task may not exist yet."""
        self.others = others
        """The lane's `others` count when the call went out."""

    def answer(self, outcome: dict[str, Any] | types.ErrorData, others: int) -> None:
        """The call's answer: a result goes to `answered` first when nothing else is still queued for
        the call and no other message of the connection was read since it went out (`others`), as
        what came before the answer must reach the caller before it; queued unless that ended the call."""
        answered = self.answered if not self._items and others == self.others else None
        if answered is not None and isinstance(outcome, dict):
            try:
                if answered(outcome):
                    return
            except Exception:  # the reader runs this: one call's fault must not end the connection
                logger.exception("answering a fast-path result at once failed; its task answers it")
        self.put(outcome)

    def put(self, outcome: _Outcome) -> None:
        self._items.append(outcome)
        if self._arrived is not None:
            self._arrived.set()
        if self.on_put is not None:
            self.on_put()

    async def get(self) -> _Outcome:
        while not self._items:
            self._arrived = anyio.Event()
            try:
                await self._arrived.wait()
            finally:
                self._arrived = None
        return self._items.popleft()


_CLOSED = types.ErrorData(code=CONNECTION_CLOSED, message="Connection closed")

_ID_PREFIX = "mux."
LANE_ID_MARK = f'"{_ID_PREFIX}'
"""In every raw line that answers a lane call or reports its progress (the id, or the progress token)."""


def is_lane_id(value: object) -> bool:
    """Whether `value` is a lane request's id (which no SDK session ever uses)."""
    return isinstance(value, str) and value.startswith(_ID_PREFIX)


Send = Callable[[dict[str, Any], dict[str, str] | None], Awaitable[None]]
"""Writes one JSON-RPC message (raw JSON) with the HTTP headers its session stamped (None: no headers).

Raises `anyio.BrokenResourceError` or `anyio.ClosedResourceError` once the connection is gone.
"""

SendNow = Callable[[dict[str, Any], dict[str, str] | None], bool]
"""`Send`, from synchronous code, when that needs no waiting; False when nothing was written."""


@dataclass(slots=True)
class LaneRequest:
    """A call `UpstreamLane.launch` sent."""

    lane: UpstreamLane
    request_id: str
    outcomes: _Outcomes
    client: Client
    """The session the request went out on."""

    async def wait(self, progress: ProgressFn | None) -> Any:
        """The raw result, as `UpstreamLane.call` returns it (with the same errors and cancellation)."""
        return await self.lane._settle(self, progress, None)

    def abandon(self) -> None:
        """Nobody will wait for the call: whatever arrives for it is dropped."""
        self.lane._pending.pop(self.request_id, None)

    def unlink(self) -> None:
        """The call is over: let go of its callbacks (which refer back to the call's owner)."""
        self.outcomes.answered = self.outcomes.on_put = None
        self.outcomes.caller = None


def session_sender(write_stream: Any) -> Send:
    """The `Send` for an SDK transport's write stream (of `SessionMessage`s)."""

    async def send(message: dict[str, Any], headers: dict[str, str] | None) -> None:
        parsed = types.jsonrpc_message_adapter.validate_python(message)
        metadata = ClientMessageMetadata(headers=headers) if headers else None
        await write_stream.send(SessionMessage(parsed, metadata=metadata))

    return send


class UpstreamLane:
    """Raw `tools/call` requests and their responses on one upstream connection."""

    def __init__(self, samples_for: Callable[[types.ClientCapabilities | None], bool] | None = None) -> None:
        self.samples_for = samples_for
        """Whether the upstream's sampling can be answered for a call's client (by that client or by
        mcpmux): a 2026-07-28 request of one it cannot declares no sampling (None: the session's stamp)."""
        self.send: Send | None = None
        self.send_now: SendNow | None = None
        self._ids = itertools.count(1)
        self._pending: dict[str, _Outcomes] = {}
        self.closed = False
        self.others = 0
        """Messages of the connection the transport passed on to the session (not this lane's)."""
        self._behind = False
        self._held: list[tuple[_Outcomes, _Outcome]] = []

    @property
    def can_launch(self) -> bool:
        """Whether `launch` may send: the transport can write from synchronous code, and is up."""
        return self.send_now is not None and not self.closed

    def attach(self, send: Send, send_now: SendNow | None = None) -> None:
        """How the transport writes this lane's messages, once it is up (`send_now`: where it can at once)."""
        self.send = send
        self.send_now = send_now

    def passed_on(self) -> None:
        """The transport passed a message of the connection to the session instead (not this lane's).

        What the lane reads next is held until the session asks for its next message (`caught_up`):
        by then it has dispatched this one, and the handler it started for a notification (a log to
        relay, say) runs before the call's task wakes, as on the SDK path. mcpmux's stdio
        transport, which reads the wire itself, says so.
        """
        self.others += 1
        self._behind = True

    def caught_up(self) -> None:
        """The session asks for its next message (it dispatched those before): what was held goes on."""
        self._behind = False
        held, self._held = self._held, []
        for outcomes, outcome in held:
            outcomes.put(outcome)

    def close(self) -> None:
        """The transport ended: every call in flight fails with "Connection closed"."""
        self.caught_up()
        self.closed = True
        pending, self._pending = self._pending, {}
        for outcomes in pending.values():
            outcomes.put(_CLOSED)

    def caller_of(self, request_id: str | None) -> InboundCall | None:
        """The inbound call a lane request in flight serves (None: not the lane's, or nobody's)."""
        outcomes = self._pending.get(request_id) if request_id is not None else None
        return outcomes.caller if outcomes is not None else None

    def divert(self, item: object) -> bool:
        """True when `item` (a `SessionMessage` read off an SDK transport) belongs to one of this lane's calls."""
        if not self._pending or not isinstance(item, SessionMessage):
            return False
        message = item.message
        if isinstance(message, types.JSONRPCResponse):
            return self._answer(message.id, message.result)
        if isinstance(message, types.JSONRPCError):
            return self._answer(message.id, message.error)
        if isinstance(message, types.JSONRPCNotification) and message.method == "notifications/progress":
            return self._progress(message.params or {})
        return False

    def take(self, message: object) -> bool:
        """True when `message` (raw JSON read off the wire) belongs to one of this lane's calls.

        Only well-formed messages are taken; anything else is left to the session, which words the fault.
        """
        if not self._pending or not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return False
        if "result" in message and "error" not in message:
            result = message["result"]
            return isinstance(result, dict) and self._answer(message.get("id"), result)
        if "error" in message and "result" not in message:
            try:
                error = types.ErrorData.model_validate(message["error"])
            except ValidationError:
                return False
            return self._answer(message.get("id"), error)
        params = message.get("params")
        if message.get("method") == "notifications/progress" and isinstance(params, dict):
            progress = params.get("progress")
            return isinstance(progress, int | float) and not isinstance(progress, bool) and self._progress(params)
        return False

    def _answer(self, request_id: object, outcome: dict[str, Any] | types.ErrorData) -> bool:
        outcomes = self._pending.pop(request_id, None) if isinstance(request_id, str) else None
        if outcomes is None:
            return False
        if isinstance(outcome, dict):
            complete_by_default(outcome)
        if self._behind:
            self._held.append((outcomes, outcome))
        else:
            outcomes.answer(outcome, self.others)
        return True

    def _progress(self, params: dict[str, Any]) -> bool:
        token = params.get("progressToken")
        outcomes = self._pending.get(token) if isinstance(token, str) else None
        if outcomes is None:
            return False
        progress = _Progress(params.get("progress", 0.0), params.get("total"), params.get("message"))
        if self._behind:
            self._held.append((outcomes, progress))
        else:
            outcomes.put(progress)
        return True

    async def call(
        self,
        client: Client,
        tool: str,
        arguments: dict[str, Any],
        progress: ProgressFn | None,
        *,
        logs: bool = True,
        task: dict[str, Any] | None = None,
        caller: InboundCall | None = None,
        extra: dict[str, Any] | None = None,
    ) -> Any:
        """Call `tool` (its upstream name) and return the raw `result` object of the response.

        `logs=False` asks a 2026 upstream for no log messages on this request (the session's stamp
        asks for all of them, for mcpmux to relay): for a caller that would not hear them, an
        upstream logging at debug level is only work. The upstream is asked for progress only when
        `progress` is given. Raises `MCPError` for a JSON-RPC error response and for a lost
        connection (code -32000), as the SDK's session does. Cancelling the caller sends
        `notifications/cancelled` with the lane id. `task` (2025-11-25 task metadata) asks the
        upstream to run the call as a task: the result is then its `CreateTaskResult`. `caller`: the
        inbound call it serves (what the upstream sends on its stream is that call's). `extra`: more
        params (a 2026 retry's `inputResponses` and `requestState`).
        """
        send = self.send
        if self.closed or send is None:
            raise MCPError(code=CONNECTION_CLOSED, message="Connection closed")
        request_id, message, headers = self._request(client, tool, arguments, logs, progress is not None, caller)
        if task is not None:
            message["params"]["task"] = task
        if extra:
            message["params"].update(extra)
        outcomes = self._pending[request_id] = _Outcomes(caller=caller)
        return await self._settle(LaneRequest(self, request_id, outcomes, client), progress, send(message, headers))

    def launch(
        self,
        client: Client,
        tool: str,
        arguments: dict[str, Any],
        answered: Answered,
        on_put: Callable[[], None],
        *,
        logs: bool = True,
        progress: bool = False,
        caller: InboundCall | None = None,
    ) -> LaneRequest | None:
        """`call`'s request, sent right now from synchronous code; None (and nothing sent) where that would wait.

        `answered` sees the result the moment it is read, and may end the call there. Anything else
        that arrives for the call (progress, an error, a result `answered` left, the connection's
        end) is queued and `on_put` told: then `LaneRequest.wait` must take it, as it ends the call
        and cancels it upstream when cancelled. `progress` asks the upstream for progress notifications.
        """
        if self.send_now is None or self.closed:
            return None
        request_id, message, headers = self._request(client, tool, arguments, logs, progress, caller)
        outcomes = self._pending[request_id] = _Outcomes(answered, on_put, self.others, caller)
        sent = False
        try:
            sent = self.send_now(message, headers)
        finally:
            if not sent:  # not written (or the writing raised): nothing is on its way
                del self._pending[request_id]
        return LaneRequest(self, request_id, outcomes, client) if sent else None

    def _request(
        self,
        client: Client,
        tool: str,
        arguments: dict[str, Any],
        logs: bool,
        progress: bool,
        caller: InboundCall | None,
    ) -> tuple[str, dict[str, Any], dict[str, str] | None]:
        """A new lane id, and the request with it, stamped as the session stamps its own."""
        request_id = f"{_ID_PREFIX}{next(self._ids)}"
        params: dict[str, Any] = {"name": tool, "arguments": arguments}
        data: dict[str, Any] = {"method": "tools/call", "params": params}
        opts: dict[str, Any] = {}
        # The session's own stamp: the 2026 `_meta` envelope and `Mcp-*` headers, byte for byte the SDK's.
        client.session._stamp(data, opts)  # type: ignore[arg-type]
        meta = params.setdefault("_meta", {})
        if not logs:
            meta.pop(types.LOG_LEVEL_META_KEY, None)
        capabilities = meta.get(CLIENT_CAPABILITIES)
        if (
            isinstance(capabilities, dict)
            and "sampling" in capabilities
            and caller is not None
            and self.samples_for is not None
            and not self.samples_for(caller.caller.capabilities)
        ):
            # SEP-2575: the upstream must refuse (-32021) what needs a capability nobody behind this request has.
            meta[CLIENT_CAPABILITIES] = {key: value for key, value in capabilities.items() if key != "sampling"}
        # Progress is asked for (the lane id as its token, as the SDK's session does) only for a caller who
        # will hear it: otherwise an upstream that reports progress sends notifications mcpmux must read,
        # and a launched call takes a task to read them, only to drop them.
        if progress:
            meta["progressToken"] = request_id
        message = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
        return request_id, message, opts.get("headers")

    async def _settle(self, request: LaneRequest, progress: ProgressFn | None, sending: Awaitable[None] | None) -> Any:
        """Finish sending (when `sending`), then wait for the answer; cancelled, tell the upstream."""
        try:
            if sending is not None:
                await sending
            return await self._outcome(request.outcomes, progress)
        except anyio.get_cancelled_exc_class():
            send = self.send
            if self._pending.pop(request.request_id, None) is not None and send is not None:
                await self._cancel(send, request.client.session, request.request_id)
            raise
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            raise MCPError(code=CONNECTION_CLOSED, message="Connection closed") from None
        finally:
            self._pending.pop(request.request_id, None)

    async def _outcome(self, outcomes: _Outcomes, progress: ProgressFn | None) -> Any:
        while True:
            outcome = await outcomes.get()
            if isinstance(outcome, _Progress):
                if progress is not None:
                    await progress(outcome.progress, outcome.total, outcome.message)
                continue
            if isinstance(outcome, types.ErrorData):
                raise MCPError(code=outcome.code, message=outcome.message, data=outcome.data)
            return outcome

    async def _cancel(self, send: Send, session: Any, request_id: str) -> None:
        """Tell the upstream to stop (on 2026 HTTP the SDK transport turns this into closing the POST)."""
        params: dict[str, Any] = {"requestId": request_id, "reason": "caller cancelled"}
        data: dict[str, Any] = {"method": "notifications/cancelled", "params": params}
        opts: dict[str, Any] = {}
        session._stamp(data, opts)
        note = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params}
        # A connection that is gone took the request with it: nothing to cancel then.
        with (
            anyio.move_on_after(_CANCEL_WRITE_TIMEOUT, shield=True),
            contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError),
        ):
            await send(note, opts.get("headers"))


def complete_by_default(result: dict[str, Any]) -> None:
    """A result that names no `resultType` is complete (SEP-2322: a client MUST assume so); the SDK's
    2026 models require the field, so it is written in where results enter mcpmux. A 2025 result
    reads it as the models' own default."""
    result.setdefault("resultType", "complete")
