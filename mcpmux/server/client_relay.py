"""The server→client relay: an upstream's sampling, elicitation or roots request, its log messages and
notes for the model, each to the one client whose call caused it.

Which call, exactly, where the wire says so (`mcpmux.core.inbound`):

- an HTTP upstream's request or log on a call's own response stream, and a 2026 upstream's
  input-required rounds, are handled in that call's context: `current_call()` is the call;
- elsewhere (a 2025 stdio upstream; a 2025 HTTP upstream's standalone stream) the wire carries no
  link, and the request is attributed by the upstream session it came on (`asked_on()`): a session
  of one client's own (`[servers.X] sessions`) is that client's; on a shared session, the calls in
  flight there decide: all of one client's, that client; none, nobody (roots: the one client
  connected, if there is exactly one); several clients', nobody — the request is refused to the
  upstream with an error that says why, and logged. Either way the server's sessions are told
  (`unlinked`): under `sessions = "auto"` its clients get sessions of their own
  (`mcpmux.mux.sessions`). It is never sent to another client.

The client is asked if it declared what the request needs (`can_answer`), through its call's `ask`
(a pushed request on the call's own stream in 2025, its parked call's next input-required round in
2026-07-28); else the policy's fallback applies (`mcpmux.mux.ask_policies`, the sampling bridge).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable

import mcp_types as types
from mcp.server.connection import Connection
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcpmux.core.call_tracker import CallTracker
from mcpmux.core.inbound import (
    AmbiguousCallerError,
    Caller,
    ClientRequest,
    ClientResult,
    InboundCall,
    can_answer,
    current_call,
)
from mcpmux.server.reach import ask_on
from mcpmux.upstream.supervisor import Upstream, asked_on

logger = logging.getLogger(__name__)

MAX_OPEN_ELICITATIONS = 1024
"""Url elicitations remembered for their `notifications/elicitation/complete` (oldest forgotten first)."""

Reach = Callable[[str], InboundCall | None]
"""How a client is asked outside any call of its own (its 2025 session's standalone channel), by its identity."""


def _kind(request: ClientRequest) -> str:
    if isinstance(request, types.CreateMessageRequest):
        return "sampling request"
    return "elicitation" if isinstance(request, types.ElicitRequest) else "roots/list request"


class ClientRelay:
    """Finds the call an upstream's request belongs to and asks its client (see the module's docstring)."""

    def __init__(
        self,
        tracker: CallTracker,
        connections: weakref.WeakSet[Connection],
        reach: Reach,
        unlinked: Callable[[Upstream, bool], None],
    ) -> None:
        """`reach`: a client asked outside any call of its own; `unlinked`: told of each request that came
        on a shared session with no link to its call (and whether it was ambiguous)."""
        self._tracker = tracker
        self._connections = connections
        self._reach = reach
        self._unlinked = unlinked
        # Url elicitations forwarded, by (upstream, elicitationId): the call whose client was asked.
        self._open_urls: dict[tuple[str, str], InboundCall] = {}

    def call_of(self, upstream: str, what: str, asks: bool = True) -> InboundCall | None:
        """The inbound call an upstream's message being handled belongs to; None when it belongs to no call.

        Raises `AmbiguousCallerError` where the calls in flight on the shared session it came on are
        several clients' (see the module's docstring). `asks`: the message asks something of the
        client (a log message does not: it never makes `"auto"` give clients sessions of their own).
        """
        linked = current_call()
        if linked is not None:
            return linked
        session = asked_on()
        if session is None:
            return None
        calls = self._tracker.callers(session)
        if session.owner is not None:
            own = [call for call in calls if call is not None and call.caller.client == session.owner]
            return own[-1] if own else self._reach(session.owner)
        clients = {call.caller.client if call is not None else None for call in calls}
        one = len(clients) == 1 and None not in clients
        if asks:
            self._unlinked(session, not one and bool(clients))
        if not clients:
            return None
        if one:
            return calls[-1]
        message = (
            f"mcpmux cannot tell which of its clients upstream {upstream!r}'s {what} is for: it came with no "
            f"link to one call while calls of {len(clients)} clients were in flight on the connection they share, "
            f'so nobody was asked; set [servers.{upstream}] sessions = "per-client" (or "auto") to give each '
            "client a connection of its own"
        )
        logger.log(logging.WARNING if asks else logging.DEBUG, "%s", message)
        raise AmbiguousCallerError(types.INVALID_REQUEST, message)

    async def ask(self, upstream: str, request: ClientRequest, limit: float | None) -> ClientResult | None:
        """The answer of the client `request` belongs to; None when no client can be asked.

        Raises `AmbiguousCallerError` (see `call_of`), the client's `MCPError` and `TimeoutError`.
        """
        call = self.call_of(upstream, _kind(request))
        if call is None and isinstance(request, types.ListRootsRequest):
            call = self._only_client()
        if call is None or not call.can_answer(request):
            return None
        assert call.ask is not None  # `can_answer` says so
        call.asked = True
        answer: ClientResult = await call.ask(request, limit)
        self._remember_url(upstream, request, call)
        return answer

    def _only_client(self) -> InboundCall | None:
        """Outside any call: the one connected client (2025, with a back channel), if it is the only one."""
        connections = [connection for connection in list(self._connections) if connection.has_standalone_channel]
        if len(connections) != 1 or connections[0].protocol_version in MODERN_PROTOCOL_VERSIONS:
            return None
        connection = connections[0]
        capabilities = connection.client_capabilities
        if not can_answer(capabilities, types.ListRootsRequest()):
            return None
        return InboundCall(Caller(capabilities=capabilities), ask=ask_on(connection), notify=connection.notify)

    def _remember_url(self, upstream: str, request: ClientRequest, call: InboundCall) -> None:
        if not isinstance(request, types.ElicitRequest) or not isinstance(request.params, types.ElicitRequestURLParams):
            return
        if call.notify is None or request.params.elicitation_id is None:
            return
        if len(self._open_urls) >= MAX_OPEN_ELICITATIONS:
            self._open_urls.pop(next(iter(self._open_urls)))
        self._open_urls[(upstream, request.params.elicitation_id)] = call

    async def elicitation_complete(self, upstream: str, params: types.ElicitCompleteNotificationParams) -> None:
        """Pass `notifications/elicitation/complete` on to the client that was asked that elicitation."""
        call = self._open_urls.pop((upstream, params.elicitation_id), None)
        if call is None or call.notify is None:
            logger.debug("upstream %r completed elicitation %r, which no client was asked", upstream, params)
            return
        notification = types.ElicitCompleteNotification(params=params)
        data = notification.model_dump(by_alias=True, mode="json", exclude_none=True)
        await call.notify(data["method"], data.get("params"))

    def note(self, upstream: str, text: str) -> None:
        """Add `text` to the result of the call the message being handled belongs to (if any)."""
        try:
            call = self.call_of(upstream, "request", asks=False)
        except AmbiguousCallerError:
            return  # the refusal went to the upstream; no client's result gets the note
        if call is not None:
            call.notes.append(text)

    async def log(self, upstream: str, params: types.LoggingMessageNotificationParams) -> bool:
        """Deliver an upstream's log message to the client of the call it belongs to; False when it
        belongs to no call (the caller decides who hears a log about the upstream itself)."""
        try:
            call = self.call_of(upstream, "log message", asks=False)
        except AmbiguousCallerError:
            return True  # several clients' calls: it is nobody's to hear (mcpmux's own log has it)
        if call is None:
            return False
        if call.log is not None:
            await call.log(params)
        return True
