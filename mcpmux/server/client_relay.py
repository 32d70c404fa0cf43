"""The server->client request relay: an upstream's sampling, elicitation or roots request to one client.

Upstream sessions are shared by every client, and nothing in the protocol says which client call
caused a request, so the `Frontend` records the calls in flight on each upstream (`callers`), and
the relay takes the request for one of the calls of the client whose call is the most recent; it
asks that client if it declared what the request needs (else the policy's fallback applies: another
client is never asked, so no client sees a question that may be about another's call; and nobody
is asked while a call the relay cannot see is in flight on that upstream, such as an HTTP fast-path
call of a client that declared neither sampling nor elicitation):

- `sampling/createMessage`: `sampling` (and `sampling.tools` when the request carries tools);
- `elicitation/create`: `elicitation`, with `url` for a url-mode request (an empty `elicitation`
  object means form mode only, as the spec says);
- `roots/list`: `roots`; outside any call, the one connected 2025 client that declared roots, if
  there is exactly one.

A 2026-07-28 client is asked in its parked call's next input-required round
(`mcpmux.server.input_rounds`); a 2025 session by a pushed request, which rides the caller's own
request (`related_request_id`: its POST's SSE stream on HTTP). Either waits at most `limit`
seconds (sampling rounds: the rounds' own idle timeout); on timeout, or when the upstream withdraws
its request, a pushed request is cancelled (`notifications/cancelled`). A client without a back
channel and no parked call is passed over. A fast-path call's client is among the callers as its
`ClientStandIn` (`mcpmux.server.client_stand_in`): it is asked on its 2025 session (stdio's one
session, an HTTP session's standalone stream), and notes for the model reach the fast-path result.
The answer, the client's error (raised as `MCPError`) or None (nobody could be asked) goes back to the policy in
`mcpmux.mux.client_requests` or the sampling bridge.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

import anyio
import mcp_types as types
from mcp.server.connection import Connection
from mcp.server.session import ServerSession
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcpmux.mux.client_requests import ClientRequest
from mcpmux.server.client_stand_in import ClientStandIn
from mcpmux.server.input_rounds import InputRounds

logger = logging.getLogger(__name__)

Callers = dict[str, weakref.WeakKeyDictionary[Any, types.RequestId]]
MAX_OPEN_ELICITATIONS = 1024
"""Url elicitations remembered for their `notifications/elicitation/complete` (oldest forgotten first)."""


def can_answer(capabilities: types.ClientCapabilities | None, request: ClientRequest) -> bool:
    """Whether a client that declared `capabilities` can answer `request`."""
    if capabilities is None:
        return False
    if isinstance(request, types.CreateMessageRequest):
        sampling = capabilities.sampling
        return sampling is not None and (not request.params.tools or sampling.tools is not None)
    if isinstance(request, types.ElicitRequest):
        elicitation = capabilities.elicitation
        if elicitation is None:
            return False
        if isinstance(request.params, types.ElicitRequestURLParams):
            return elicitation.url is not None
        return elicitation.form is not None or elicitation.url is None
    return capabilities.roots is not None


def _result_type(request: ClientRequest) -> type[Any]:
    if isinstance(request, types.CreateMessageRequest):
        return types.CreateMessageResultWithTools if request.params.tools else types.CreateMessageResult
    if isinstance(request, types.ElicitRequest):
        return types.ElicitResult
    return types.ListRootsResult


def _askable(caller: Any) -> bool:
    """Whether a caller registered in `callers` can be asked: it is, or holds, a client's session."""
    return getattr(caller, "_connection", None) is not None


class ClientRelay:
    """Finds the client an upstream's request belongs to and asks it (see the module's docstring)."""

    def __init__(
        self,
        callers: Callers,
        rounds: InputRounds,
        connections: weakref.WeakSet[Connection],
        in_flight: Callable[[str], int] | None = None,
    ) -> None:
        self._callers = callers
        self._in_flight = in_flight
        """Every call in flight on an upstream, seen or not by the relay (`CallTracker.in_flight`)."""
        self._rounds = rounds
        self._connections = connections
        # Per client session, per call in flight (request id): notes for the model, added to its result.
        self._notes: weakref.WeakKeyDictionary[ServerSession, dict[types.RequestId, list[str]]] = (
            weakref.WeakKeyDictionary()
        )
        # Url elicitations forwarded, by (upstream, elicitationId): the connection that was asked.
        self._open_urls: dict[tuple[str, str], weakref.ref[Connection]] = {}

    async def ask(self, upstream: str, request: ClientRequest, limit: float | None) -> Any:
        """The answer of the client `request` belongs to; None when no client can be asked."""
        in_flight = list(self._callers.get(upstream, {}).items())
        # A client's SDK session, or a fast-path stand-in holding the client's session (`stdio_fast`).
        calls = [(session, request_id) for session, request_id in in_flight if _askable(session)]
        seen = sum(getattr(session, "calls", 1) for session, _ in in_flight)  # a stand-in counts its calls
        if calls and self._in_flight is not None and self._in_flight(upstream) > seen:
            # Also in flight: a call the relay does not see (an HTTP fast-path call, whose client can answer
            # nothing; a resource read): the request may be that one's, so no client is asked.
            return None
        # The request belongs to the client of the most recent call: never ask another client about it.
        client = calls[-1][0]._connection if calls else None
        for session, request_id in reversed(calls):
            if session._connection is not client or not can_answer(session.client_capabilities, request):
                continue
            parked = self._rounds.call_of(session)
            if parked is not None:  # a 2026-07-28 client: in its parked call's next input-required round
                if isinstance(request, types.CreateMessageRequest):
                    return await parked.ask(request)  # the round's own idle timeout applies
                with anyio.fail_after(limit if limit is not None else float("inf")):
                    return await parked.ask(request)
            if not session.can_send_request:
                continue
            metadata = ServerMessageMetadata(related_request_id=request_id)
            with anyio.fail_after(limit if limit is not None else float("inf")):
                answer = await session.send_request(request, _result_type(request), metadata=metadata)
            self._remember_url(upstream, request, session)
            return answer
        if isinstance(request, types.ListRootsRequest) and not calls:
            return await self._ask_only_rooted_client(limit)
        return None

    async def _ask_only_rooted_client(self, limit: float | None) -> types.ListRootsResult | None:
        """Outside any call: the roots of the one connected 2025 client that declared roots, if exactly one."""
        rooted = [
            connection
            for connection in list(self._connections)
            if connection.protocol_version not in MODERN_PROTOCOL_VERSIONS
            and connection.has_standalone_channel
            and can_answer(connection.client_capabilities, types.ListRootsRequest())
        ]
        if len(rooted) != 1:
            return None
        with anyio.fail_after(limit if limit is not None else float("inf")):
            return await rooted[0].send_request(types.ListRootsRequest())

    def _remember_url(self, upstream: str, request: ClientRequest, session: Any) -> None:
        if not isinstance(request, types.ElicitRequest) or not isinstance(request.params, types.ElicitRequestURLParams):
            return
        connection = getattr(session, "_connection", None)
        if connection is None or request.params.elicitation_id is None:
            return
        if len(self._open_urls) >= MAX_OPEN_ELICITATIONS:
            self._open_urls.pop(next(iter(self._open_urls)))
        self._open_urls[(upstream, request.params.elicitation_id)] = weakref.ref(connection)

    async def elicitation_complete(self, upstream: str, params: types.ElicitCompleteNotificationParams) -> None:
        """Pass `notifications/elicitation/complete` on to the client that was asked that elicitation."""
        held = self._open_urls.pop((upstream, params.elicitation_id), None)
        connection = held() if held is not None else None
        if connection is None:
            logger.debug("upstream %r completed elicitation %r, which no client was asked", upstream, params)
            return
        notification = types.ElicitCompleteNotification(params=params)
        data = notification.model_dump(by_alias=True, mode="json", exclude_none=True)
        await connection.notify(data["method"], data.get("params"))

    def note(self, upstream: str, text: str) -> None:
        """Add `text` to the result of the most recent call in flight on `upstream` (if any): an SDK-path
        call's, or a fast-path call's through its client's stand-in."""
        for session, request_id in reversed(list(self._callers.get(upstream, {}).items())):
            if isinstance(session, ServerSession):
                self._notes.setdefault(session, {}).setdefault(request_id, []).append(text)
                return
            if isinstance(session, ClientStandIn):
                session.note(request_id, text)
                return

    def take_notes(self, session: ServerSession, request_id: types.RequestId) -> list[str]:
        """The notes for one call, forgotten as they are taken."""
        calls = self._notes.get(session)
        return calls.pop(request_id, []) if calls is not None else []
