"""A client's stand-in among an upstream's callers while the client has fast-path calls in flight there.

`Frontend` keeps, per upstream, the callers with calls in flight (`callers`): where the upstream's
log messages go, and whom its sampling, elicitation and roots requests are asked of
(`mcpmux.server.client_relay`). An SDK-path call registers the client's SDK session; a fast-path
call has none, so its front registers the client's `ClientStandIn` for as long as the client has
fast-path calls in flight on that upstream. The stand-in is told the upstream's logs, is asked what
the upstream asks of the client, on the client's 2025 session (stdio: its one session; HTTP: the
session's standalone GET stream), and keeps the notes for the model (why an elicitation was
declined) that the front adds to the call's result, as the SDK path adds them.

Logs and requests go out while at least one of those calls is a 2025 one: a 2025 client hears
every level, as from the SDK path; a 2026 request did not opt in (those that do take the SDK path),
so it hears none, and a 2026 client that can answer requests takes the SDK path, in input-required
rounds.
"""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import mcp_types as types
from mcp.server.connection import Connection
from mcp.shared.exceptions import NoBackChannelError
from pydantic import BaseModel

T = TypeVar("T", bound=BaseModel)
Write = Callable[[dict[str, Any]], Awaitable[None]]
"""Writes a JSON-RPC notification to the client."""


class ClientStandIn:
    """Stands in for one client's SDK session among one upstream's callers (see the module docstring)."""

    def __init__(self, connection: Callable[[], Connection | None], write: Write, callers: Any) -> None:
        """`connection`: the client's 2025 session, when it has one; `write`: sends it a notification;
        `callers`: the upstream's callers this stand-in is registered with."""
        self._session_of = connection
        self._write = write
        self.callers = callers
        self.calls = 0
        """This client's fast-path calls in flight on that upstream."""
        self.legacy_calls = 0
        """Those of them made in a 2025 revision: only those hear the upstream's logs and are asked."""
        self._notes: dict[types.RequestId, list[str]] = {}

    @property
    def _connection(self) -> Connection | None:
        """The client's session, as `ServerSession._connection` names it (the relay's client identity)."""
        return self._session_of() if self.legacy_calls else None

    @property
    def client_capabilities(self) -> types.ClientCapabilities | None:
        connection = self._connection
        return connection.client_capabilities if connection is not None else None

    @property
    def can_send_request(self) -> bool:
        connection = self._connection
        return connection is not None and connection.has_standalone_channel

    async def send_request(self, request: types.ServerRequest, result_type: type[T], metadata: Any = None) -> T:
        """Ask the client on its session (a fast-path call has no stream of its own to relate it to)."""
        connection = self._connection
        if connection is None:
            raise NoBackChannelError(request.method)  # its last 2025 call ended meanwhile
        data = request.model_dump(by_alias=True, mode="json", exclude_none=True)
        raw = await connection.send_raw_request(data["method"], data.get("params"))
        return result_type.model_validate(raw, by_name=False)

    async def send_log_message(
        self, level: str, data: Any, logger: str | None = None, related_request_id: Any = None
    ) -> None:
        if not self.legacy_calls:
            return
        params: dict[str, Any] = {"level": level, "data": data}
        if logger is not None:
            params["logger"] = logger
        await self._write({"jsonrpc": "2.0", "method": "notifications/message", "params": params})

    def started(self, request_id: types.RequestId, legacy: bool) -> None:
        """A call of the client's starts: registered (again) as the most recent caller."""
        self.calls += 1
        if legacy:
            self.legacy_calls += 1
        self.callers[self] = request_id

    def ended(self, request_id: types.RequestId, legacy: bool) -> bool:
        """A call of the client's is over; True when it was the last one (the stand-in is unregistered)."""
        self._notes.pop(request_id, None)
        self.calls -= 1
        if legacy:
            self.legacy_calls -= 1
        if self.calls:
            return False
        self.callers.pop(self, None)
        return True

    def note(self, request_id: types.RequestId, text: str) -> None:
        """A note for the model, added to the result of the call `request_id`."""
        self._notes.setdefault(request_id, []).append(text)

    def with_notes(self, response: dict[str, Any]) -> dict[str, Any]:
        """`response` (a JSON-RPC response about to be written) with the notes for its call in its result."""
        request_id = response.get("id")
        notes = self._notes.pop(request_id, None) if isinstance(request_id, str | int) else None
        result = response.get("result")
        if not notes or not isinstance(result, dict) or not isinstance(result.get("content"), list):
            return response
        blocks = [{"type": "text", "text": note} for note in notes]
        return {**response, "result": {**result, "content": [*result["content"], *blocks]}}


class StandIns:
    """A front's stand-ins, one per client and upstream while that client has fast-path calls in flight there."""

    def __init__(self, callers: dict[str, Any]) -> None:
        """`callers`: `Frontend`'s callers per upstream (weak dictionaries of caller -> request id)."""
        self._callers = callers
        self._held: dict[tuple[object, str], ClientStandIn] = {}

    def hold(
        self,
        client: object,
        upstream: str,
        request_id: types.RequestId,
        legacy: bool,
        connection: Callable[[], Connection | None],
        write: Write,
    ) -> ClientStandIn:
        """The stand-in of `client` on `upstream`, registered as its most recent caller for the call `request_id`
        (`connection`, `write`: the client's session and how to write to it, used when it is first made)."""
        stand_in = self._held.get((client, upstream))
        if stand_in is None:
            callers = self._callers.get(upstream)
            if callers is None:
                callers = self._callers[upstream] = weakref.WeakKeyDictionary()
            stand_in = self._held[(client, upstream)] = ClientStandIn(connection, write, callers)
        stand_in.started(request_id, legacy)
        return stand_in

    def release(self, client: object, upstream: str, request_id: types.RequestId, legacy: bool) -> None:
        """The call `request_id` is over: the stand-in goes once its client has no call left there."""
        if self._held[(client, upstream)].ended(request_id, legacy):
            del self._held[(client, upstream)]
