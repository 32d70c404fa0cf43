"""Upstream servers' requests to the client, other than sampling: `elicitation/create` and `roots/list`.

An upstream session is shared by every client of mcpmux, and mcpmux declares upstream what its
clients may do (elicitation in form and url modes, roots with listChanged, sampling with tools).
Each request is answered here under the upstream's settings; the frontend's relay
(`mcpmux.server.client_relay`) finds the client to ask, the same way for sampling, elicitation
and roots: the client whose call on that upstream is in flight (the most recent one, when
several are) and that declared the capability the request needs.

- **Elicitation** (`[servers.X.elicitation] policy`): `client` forwards it to that client, with
  `timeout` seconds to answer; a client that declines, cancels or fails has the last word. When no
  such client can be asked (none has a call in flight, or the caller did not declare elicitation, or
  not the url mode a url request needs, or has no back channel), and under policy `decline`, the
  upstream is answered `decline`, and the reason is added as a text block to the result of the call
  in flight, so the model reads why. `notifications/elicitation/complete` for a url elicitation goes
  to the client that was asked it.
- **Roots**: the calling client's roots when it declared roots; else, outside any call, the one
  connected client that declared roots if there is exactly one; else `[servers.X] roots`, else
  `[mux] roots`, else no roots. A client's `notifications/roots/list_changed` (and a client with
  roots connecting) is passed on to every upstream.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import mcp_types as types
from mcp.client.session import ClientRequestContext, ElicitationFnT, ListRootsFnT
from mcp.shared.exceptions import MCPError

from mcpmux.core.inbound import AmbiguousCallerError, ClientRequest, ClientResult
from mcpmux.core.server_policy import ElicitationSettings, RootEntry

logger = logging.getLogger(__name__)

REASON_META = "io.github.mcpmux/reason"
"""`_meta` key of a declined elicitation result: why mcpmux declined it."""


class ClientAsker(Protocol):
    """Forwards one request to the client an upstream's request belongs to (`mcpmux.server.client_relay`).

    Returns the client's result, or None when no client can be asked. Raises `MCPError` with the
    client's own error, and `TimeoutError` when it did not answer within `limit` seconds.
    """

    async def __call__(self, upstream: str, request: ClientRequest, limit: float | None) -> ClientResult | None: ...


Noter = Callable[[str, str], None]
"""`(upstream, text)`: tell the model behind the most recent call in flight on `upstream`."""


@dataclass(slots=True)
class ClientRequestCounts:
    """How this process answered upstream elicitation and roots requests so far."""

    elicitation_forwarded: int = 0
    elicitation_declined: int = 0
    roots_forwarded: int = 0
    roots_configured: int = 0


@dataclass(slots=True)
class ClientRequests:
    """Answers upstream elicitation and roots requests; `asker` and `noter` are set by the frontend."""

    asker: ClientAsker | None = None
    noter: Noter | None = None
    complete_listener: Callable[[str, types.ElicitCompleteNotificationParams], Awaitable[None]] | None = None
    counts: ClientRequestCounts = field(default_factory=ClientRequestCounts)

    def elicitation_callback(self, upstream: str, settings: ElicitationSettings) -> ElicitationFnT:
        """The `elicitation_callback` for one upstream's `Client`."""

        async def on_elicitation(
            context: ClientRequestContext, params: types.ElicitRequestParams
        ) -> types.ElicitResult | types.ErrorData:
            return await self.elicit(upstream, settings, params)

        return on_elicitation

    async def elicit(
        self, upstream: str, settings: ElicitationSettings, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        """Answer one elicitation under the upstream's policy (see the module's docstring)."""
        mode = "url" if isinstance(params, types.ElicitRequestURLParams) else "form"
        if settings.policy == "decline":
            reason = (
                f"mcpmux declined upstream {upstream!r}'s {mode} elicitation ({params.message!r}) under "
                f'[servers.{upstream}.elicitation] policy = "decline"; set policy = "client" to ask the user'
            )
            return self._decline(upstream, reason)
        if self.asker is not None:
            try:
                answer = await self.asker(upstream, types.ElicitRequest(params=params), settings.timeout)
            except MCPError as err:  # the client failed or refused: its word stands
                return err.error
            except TimeoutError:
                logger.info("elicitation from upstream %r: the client did not answer in time", upstream)
                return types.ErrorData(
                    code=types.REQUEST_TIMEOUT,
                    message=f"the client did not answer the elicitation within {settings.timeout:g}s "
                    f"([servers.{upstream}.elicitation] timeout)",
                )
            if isinstance(answer, types.ElicitResult):
                self.counts.elicitation_forwarded += 1
                return answer
        capability = "elicitation with url mode" if mode == "url" else "elicitation"
        reason = (
            f"mcpmux declined upstream {upstream!r}'s {mode} elicitation ({params.message!r}): no client with a "
            f"call in flight on it declared {capability}, so nobody could be asked; use a client that supports "
            "elicitation to answer it"
        )
        return self._decline(upstream, reason)

    def _decline(self, upstream: str, reason: str) -> types.ElicitResult:
        self.counts.elicitation_declined += 1
        logger.info("%s", reason)
        if self.noter is not None:
            self.noter(upstream, reason)
        return types.ElicitResult(action="decline", _meta={REASON_META: reason})

    async def elicitation_complete(self, upstream: str, params: types.ElicitCompleteNotificationParams) -> None:
        if self.complete_listener is not None:
            await self.complete_listener(upstream, params)

    def roots_callback(self, upstream: str, configured: list[RootEntry], limit: float) -> ListRootsFnT:
        """The `list_roots_callback` for one upstream's `Client`; `configured`: its roots from the config;
        `limit`: seconds a client has to answer."""

        async def on_list_roots(context: ClientRequestContext) -> types.ListRootsResult | types.ErrorData:
            return await self.list_roots(upstream, configured, limit)

        return on_list_roots

    async def list_roots(
        self, upstream: str, configured: list[RootEntry], limit: float
    ) -> types.ListRootsResult | types.ErrorData:
        if self.asker is not None:
            try:
                answer = await self.asker(upstream, types.ListRootsRequest(), limit)
            except AmbiguousCallerError as err:  # no client's roots, nor the configured ones as if they were
                return err.error
            except (MCPError, TimeoutError) as err:  # the configured roots stand in for a client that failed
                logger.info("roots/list from upstream %r: the client could not answer (%s)", upstream, err)
                answer = None
            if isinstance(answer, types.ListRootsResult):
                self.counts.roots_forwarded += 1
                return answer
        self.counts.roots_configured += 1
        return types.ListRootsResult(
            roots=[types.Root.model_validate(root.model_dump(exclude_none=True)) for root in configured]
        )
