"""How a call's client is reached: the `ask`, `log` and `notify` of an `InboundCall`, per kind of front.

- `on_session`: a call the SDK's server session serves (2025): requests ride the call's own
  request (`related_request_id`: its POST's SSE stream over HTTP), logs too.
- `on_connection`: a 2025 client's connection outside any SDK-path call: stdio's one session, or an
  HTTP session's standalone GET stream (what the fast fronts and `roots/list` outside any call use).
- `by_rounds`: a 2026-07-28 client's call parked for input-required rounds: it is asked in the
  call's next round (`mcpmux.server.input_rounds`).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Any

import anyio
import mcp_types as types
from mcp.server.connection import Connection
from mcp.server.session import ServerSession
from mcp.shared.message import ServerMessageMetadata

from mcpmux.core.inbound import Ask, ClientRequest, LogFn

Hears = Callable[[types.LoggingLevel], bool]
"""Whether the client hears a log message at this level (`logging/setLevel`)."""


def result_type(request: ClientRequest) -> type[Any]:
    """The model a client's answer to `request` is read as."""
    if isinstance(request, types.CreateMessageRequest):
        return types.CreateMessageResultWithTools if request.params.tools else types.CreateMessageResult
    if isinstance(request, types.ElicitRequest):
        return types.ElicitResult
    return types.ListRootsResult


def _within(limit: float | None) -> AbstractContextManager[anyio.CancelScope]:
    return anyio.fail_after(limit if limit is not None else math.inf)


def on_session(session: ServerSession, request_id: types.RequestId, hears: Hears) -> tuple[Ask, LogFn]:
    """A 2025 SDK-path call's `ask` and `log`: on the call's own request."""
    metadata = ServerMessageMetadata(related_request_id=request_id)

    async def ask(request: ClientRequest, limit: float | None) -> Any:
        with _within(limit):
            return await session.send_request(request, result_type(request), metadata=metadata)

    async def log(params: types.LoggingMessageNotificationParams) -> None:
        if hears(params.level):
            await session.send_log_message(params.level, params.data, params.logger, related_request_id=request_id)

    return ask, log


def ask_on(connection: Connection) -> Ask:
    """Asks a 2025 client on its connection (stdio's session, or an HTTP session's standalone stream)."""

    async def ask(request: ClientRequest, limit: float | None) -> Any:
        data = request.model_dump(by_alias=True, mode="json", exclude_none=True)
        with _within(limit):
            raw = await connection.send_raw_request(data["method"], data.get("params"))
        return result_type(request).model_validate(raw, by_name=False)

    return ask


def by_rounds(ask_in_round: Callable[[ClientRequest], Awaitable[Any]]) -> Ask:
    """Asks a 2026-07-28 client in its parked call's next round. Sampling waits under the rounds' own
    idle timeout; elicitation and roots under the request's `limit` too."""

    async def ask(request: ClientRequest, limit: float | None) -> Any:
        if isinstance(request, types.CreateMessageRequest):
            return await ask_in_round(request)
        with _within(limit):
            return await ask_in_round(request)

    return ask
