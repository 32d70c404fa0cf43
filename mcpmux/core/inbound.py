"""Who is asking: one value per inbound call, made by the front that received it, carried end to end.

An upstream's server→client request (sampling, elicitation, roots), a log message and a note for
the model must reach the client whose call caused them, and no other. The front that reads a call
makes its `InboundCall` once: who the client is (`Caller`: identity, profile, declared capabilities
and extensions), the request's id and era, how that client can be asked something (`ask`), and
where the upstream's log messages for the call go (`log`). The call then carries it:

- in the task that serves it, as `CURRENT_CALL` (a context variable). The SDK's transports run a
  request's POST, and what arrives on that POST's stream, in the context of the task that sent the
  request, so an HTTP upstream's request on a call's stream, and a 2026 upstream's input-required
  rounds, find their call here (`current_call`);
- on the raw lane, in the lane's entry for the call (`mcpmux.upstream.lane`): what an HTTP upstream
  sends on that call's response stream is handed on in the call's context (`in_call`).

Where the wire carries no link (a 2025 stdio upstream; a 2025 HTTP upstream's standalone stream),
the request is attributed by the upstream session it came on (`mcpmux.server.client_relay`), never guessed.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

ClientRequest = types.CreateMessageRequest | types.ElicitRequest | types.ListRootsRequest
ClientResult = (
    types.CreateMessageResult | types.CreateMessageResultWithTools | types.ElicitResult | types.ListRootsResult
)


class Ask(Protocol):
    """Asks one call's client `request` and returns its answer.

    Raises `MCPError` with the client's own error, `TimeoutError` past `limit` seconds, and
    `NoBackChannelError` when the client can no longer be reached.
    """

    async def __call__(self, request: ClientRequest, limit: float | None) -> Any: ...


class AmbiguousCallerError(MCPError):
    """An upstream asked something on a session several clients share, with no link to one call: it is
    refused to the upstream (`mcpmux.server.client_relay`), never asked of a client."""


LogFn = Callable[[types.LoggingMessageNotificationParams], Awaitable[None]]
"""Delivers one upstream log message to a call's client (at or above the level it asked for)."""

NotifyFn = Callable[[str, dict[str, Any] | None], Awaitable[None]]
"""Sends a call's client a notification (method, params)."""


_NONE: Mapping[str, dict[str, Any]] = {}

ANONYMOUS = "request:"
"""How the identity of a 2026-07-28 HTTP request without a bearer token begins: a client of its own,
with nothing that lasts beyond the request (no session can be kept for it)."""


@dataclass(slots=True)
class Caller:
    """Who is calling.

    `client`: the client's identity, the key of whatever is kept per client (a 2025 session, a
    bearer token's keyed hash, the one stdio client; None for the library and mcpmux's own calls);
    `name`: its clientInfo name; `profile`: its `[profiles.NAME]` (its calls and searches stay inside
    it; None: the whole catalog); `capabilities`: what it declared (its 2025 session's, or this
    2026 request's envelope), extensions included; `era`: the protocol revision it speaks (None:
    not known).
    """

    client: str | None = None
    name: str | None = None
    profile: str | None = None
    capabilities: types.ClientCapabilities | None = None
    era: str | None = None

    @property
    def handshakes(self) -> bool:
        """Whether it speaks a 2025 revision (the `initialize` handshake): an upstream asks it in requests of
        its own, on the session, where a 2026-07-28 client is asked in input-required rounds."""
        return self.era is not None and self.era not in MODERN_PROTOCOL_VERSIONS

    @property
    def can_be_asked(self) -> bool:
        """Whether it declared anything an upstream may ask it (sampling, elicitation, roots)."""
        declared = self.capabilities
        return declared is not None and any(
            ask is not None for ask in (declared.sampling, declared.elicitation, declared.roots)
        )

    @property
    def lasting(self) -> bool:
        """Whether the identity lasts beyond one request (a session of its own can be kept for it)."""
        return self.client is not None and not self.client.startswith(ANONYMOUS)

    @property
    def extensions(self) -> Mapping[str, dict[str, Any]]:
        """The extensions the client declared (SEP-2133), by identifier."""
        declared = self.capabilities.extensions if self.capabilities is not None else None
        return declared or _NONE


@dataclass(slots=True, eq=False)
class InboundCall:
    """One request a client sent mcpmux, as it travels to the upstream and back (see the module docstring)."""

    caller: Caller
    request_id: types.RequestId | None = None
    era: str | None = None
    """The protocol revision the client speaks."""
    ask: Ask | None = None
    """How this call's client is asked what the upstream asks (None: it cannot be asked)."""
    log: LogFn | None = None
    """Where the upstream's log messages for this call go (None: its client hears none)."""
    notify: NotifyFn | None = None
    """How its client is sent a notification about what it was asked (None: it cannot be)."""
    notes: list[str] = field(default_factory=list)
    """Notes for the model (why mcpmux declined an elicitation), added to the call's result."""
    asked: bool = False
    """Whether the upstream asked this call's client something: its answer is that client's own."""
    takes_rounds: bool = False
    """A 2026-07-28 request: an upstream's input-required round that its client can answer, and that the
    upstream's policy lets it answer, is relayed to it as it is (`mcpmux.errors.InputRequired`)."""
    resumes: dict[str, Any] | None = None
    """A 2026-07-28 retry of a relayed round: its `inputResponses` and `requestState` as the client wrote
    them, sent on to the upstream with the request (never shared with another call, nor cached)."""

    def can_answer(self, request: ClientRequest) -> bool:
        """Whether this call's client can be asked `request` (it declared what the request needs)."""
        return self.ask is not None and can_answer(self.caller.capabilities, request)

    def take_notes(self) -> list[str]:
        notes, self.notes = self.notes, []
        return notes


def may_be_asked(capabilities: types.ClientCapabilities | None) -> bool:
    """Whether a client that declared `capabilities` may be asked, during a call, what an upstream's
    sampling or elicitation wants (its calls then go where that request can reach it)."""
    return capabilities is not None and (capabilities.sampling is not None or capabilities.elicitation is not None)


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


CURRENT_CALL: contextvars.ContextVar[InboundCall | None] = contextvars.ContextVar("mcpmux_call", default=None)


def current_call() -> InboundCall | None:
    """The inbound call the running code serves, or that caused the upstream message being handled."""
    return CURRENT_CALL.get()


@contextmanager
def serving(call: InboundCall | None) -> Iterator[None]:
    """Run the body as serving `call`: what its upstream requests cause finds it (`current_call`)."""
    token = CURRENT_CALL.set(call)
    try:
        yield
    finally:
        CURRENT_CALL.reset(token)


def in_call(call: InboundCall | None) -> contextvars.Context:
    """A context in which `current_call()` is `call`: for a message read off `call`'s own stream."""
    context = contextvars.copy_context()
    context.run(CURRENT_CALL.set, call)
    return context
