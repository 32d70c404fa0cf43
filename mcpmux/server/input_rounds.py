"""Sampling and elicitation forwarded to 2026-07-28 clients through input-required rounds of mcpmux's own.

These are the rounds of requests an upstream *pushes* (a 2025 upstream's `sampling/createMessage`,
or a round mcpmux's SDK client answers for it): a 2026 upstream's own input-required rounds reach
the client as the upstream wrote them instead (`mcpmux.mux.relayed_rounds`), and a retry whose
`requestState` is not one of mcpmux's (`STATE_PREFIX`) goes back to that upstream.

A 2026-07-28 client has no back channel: mcpmux cannot push `sampling/createMessage` or
`elicitation/create` to it. So when such a client (one that declared sampling or elicitation in its
request) calls a tool whose upstream may ask the client (the plan's `asks_client`), the upstream
call is *parked*: it runs in a task held by mcpmux, and the client's request is answered with the
first thing that happens:

- the upstream's result: returned as the tool result, the call is over;
- a sampling or elicitation request from the upstream: returned as an `InputRequiredResult` (keys
  `sampling-1`, `elicitation-2`, ...) with an unguessable `requestState`. The upstream's callback waits.

The client retries the same tool call with `inputResponses` and that `requestState`; the answers wake
the waiting callbacks and the retry is answered, again, with the next thing that happens. Requests
that arrive together (within `GATHER_SECONDS`) share a round; one asked while the client answers
another waits for the next round. A key the client leaves unanswered is asked again.

A parked call that no request is waiting on for `idle_timeout` seconds (`[mux] sampling_round_timeout`)
expires: its unanswered sampling requests fail with an error the upstream sees, the upstream call is
cancelled and the state dropped; a retry with its `requestState` (or one mcpmux never issued) is
refused with an error saying so. A client that cancels a waiting request drops the call the same way.
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcpmux.core.inbound import may_be_asked

logger = logging.getLogger(__name__)

SamplingAnswer = types.CreateMessageResult | types.CreateMessageResultWithTools
_KINDS: dict[type[Any], tuple[str, tuple[type[Any], ...]]] = {
    types.CreateMessageRequest: ("sampling", (types.CreateMessageResult, types.CreateMessageResultWithTools)),
    types.ElicitRequest: ("elicitation", (types.ElicitResult,)),
    types.ListRootsRequest: ("roots", (types.ListRootsResult,)),
}
"""Per input request type: its keys' prefix, and the answers it takes."""
RoundResult = types.CallToolResult | types.InputRequiredResult
DEFAULT_IDLE_TIMEOUT = 30.0
"""Half the default upstream call timeout: a client that went away is noticed while the upstream still waits."""
STATE_PREFIX = "mcpmux."
"""How the `requestState` of mcpmux's own rounds begins: a retry carrying one is a parked call's, even
after the call expired; any other state is an upstream's own round's (`mcpmux.mux.relayed_rounds`)."""
GATHER_SECONDS = 0.01
"""How long a round waits, after a first sampling request, for others asked at the same time."""


@dataclass(slots=True, eq=False)
class _Ask:
    """One upstream request (sampling, elicitation) waiting for the client's answer."""

    key: str
    request: types.InputRequest
    answered: anyio.Event = field(default_factory=anyio.Event)
    answer: types.InputResponse | MCPError | None = None
    withdrawn: bool = False  # the upstream stopped waiting (its own timeout, or the call ended)

    def settle(self, answer: types.InputResponse | MCPError) -> None:
        if not self.answered.is_set():
            self.answer = answer
            self.answered.set()


@dataclass(slots=True)
class _Done:
    """The upstream call's end: its result, or the error it raised."""

    result: types.CallToolResult | None = None
    error: Exception | None = None


class ParkedCall:
    """One tool call from a 2026-07-28 client whose upstream runs in a task held by mcpmux."""

    def __init__(
        self, rounds: InputRounds, tool: str, arguments: dict[str, Any], caller: ServerSession, timeout: float
    ) -> None:
        self.token = STATE_PREFIX + secrets.token_urlsafe(32)
        self.tool = tool
        self.arguments = arguments
        self.timeout = timeout
        """Seconds the call may wait, with no request on it, for the client's next retry."""
        self.caller = caller
        """The session of the call's first request: the identity the frontend records per upstream."""
        self.current: ServerSession | None = caller
        """The session of the request waiting on the call now (progress rides it); None between rounds."""
        self._rounds = rounds
        self._send: MemoryObjectSendStream[_Ask | _Done]
        self._receive: MemoryObjectReceiveStream[_Ask | _Done]
        self._send, self._receive = anyio.create_memory_object_stream[_Ask | _Done](math.inf)
        self._open: dict[str, _Ask] = {}  # asked in a round, not answered yet
        self._done: _Done | None = None  # the upstream call's end, once it came
        self._asked = 0
        self._scope = anyio.CancelScope()
        self._idle = anyio.CancelScope(deadline=math.inf)  # its deadline runs only while nobody waits
        self._collected = anyio.Event()
        self._dropped: str | None = None

    async def ask(self, request: types.InputRequest | types.CreateMessageRequestParams) -> Any:
        """Ask the client (in the next round) and wait for its answer; MCPError if the call ends first.
        Sampling params alone stand for their request."""
        if isinstance(request, types.CreateMessageRequestParams):
            request = types.CreateMessageRequest(params=request)
        if self._dropped is not None:
            raise MCPError(types.INTERNAL_ERROR, self._dropped)
        self._asked += 1
        ask = _Ask(f"{_KINDS[type(request)][0]}-{self._asked}", request)
        self._send.send_nowait(ask)
        try:
            await ask.answered.wait()
        finally:
            ask.withdrawn = True
            self._open.pop(ask.key, None)
        if isinstance(ask.answer, MCPError):
            raise ask.answer
        assert ask.answer is not None
        return ask.answer

    async def run(self, work: Callable[[ParkedCall], Awaitable[types.CallToolResult]]) -> None:
        """The held task: the upstream call, then waiting until its end is collected or the call expires."""
        try:
            with self._scope:
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(self._expire_when_idle)
                    try:
                        done = _Done(result=await work(self))
                    except Exception as err:  # handed to the request waiting on the call, which raises it
                        done = _Done(error=err)
                    self._send.send_nowait(done)
                    await self._collected.wait()
                    tasks.cancel_scope.cancel()
        finally:
            self._send.close()  # a request still waiting learns the call ended

    async def _expire_when_idle(self) -> None:
        with self._idle:
            await anyio.sleep_forever()
        if self._idle.cancelled_caught:
            self._rounds.drop(
                self,
                f"the client did not answer sampling for tool {self.tool!r} within {self.timeout:g}s; "
                "the call was dropped",
            )

    def drop(self, reason: str) -> None:
        """End the call: its unanswered sampling requests fail with `reason`, the upstream call is cancelled."""
        if self._dropped is not None:
            return
        self._dropped = reason
        error = MCPError(types.INTERNAL_ERROR, reason)
        for ask in list(self._open.values()):
            ask.settle(error)
        while True:  # queued, never asked
            try:
                event = self._receive.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream):
                break
            if isinstance(event, _Ask):
                event.settle(error)
        self._scope.cancel()

    def attach(self, session: ServerSession) -> None:
        """A request now waits on the call: the idle clock stops."""
        self.current = session
        self._idle.deadline = math.inf

    def detach(self) -> None:
        """The request was answered with a round: the idle clock starts."""
        self.current = None
        self._idle.deadline = anyio.current_time() + self.timeout

    @property
    def attached(self) -> bool:
        return self.current is not None

    def answer(self, responses: types.InputResponses) -> None:
        """Hand the client's answers to the waiting requests; unknown keys are ignored."""
        for key, response in responses.items():
            ask = self._open.pop(key, None)
            if ask is None:
                logger.debug("input response %r for tool %r matches no open request", key, self.tool)
                continue
            kind, answers = _KINDS[type(ask.request)]
            if isinstance(response, answers):
                ask.settle(response)
            else:
                ask.settle(
                    MCPError(
                        types.INVALID_PARAMS,
                        f"the client answered {kind} request {key!r} with a {type(response).__name__}, "
                        f"not a {kind} result",
                    )
                )

    async def next_event(self) -> list[_Ask] | _Done:
        """The open requests to send in the next round, or, once none is open, the call's end.

        A request may be another call's of the same client (an upstream session of the client's own
        links a request to the client, not to one call), so the call's end waits for every request
        asked in its rounds to be answered."""
        while True:
            events: list[_Ask | _Done] = []
            if not self._open and self._done is None:
                first = await self._receive.receive()
                events.append(first)
                if isinstance(first, _Ask):
                    await anyio.sleep(GATHER_SECONDS)
            while True:
                try:
                    events.append(self._receive.receive_nowait())
                except anyio.WouldBlock:
                    break
            for event in events:
                if isinstance(event, _Done):
                    self._done = event
                elif not event.withdrawn:
                    self._open[event.key] = event
            if self._open:
                return list(self._open.values())
            if self._done is not None:
                return self._done

    def collected(self) -> None:
        """The call's end reached the client: the held task may finish."""
        self._collected.set()


def parks(session: ServerSession, asks_client: bool) -> bool:
    """Whether a call runs parked: from a 2026-07-28 client that declared sampling or elicitation in its
    request, on an upstream that may ask the client (the plan's `asks_client`)."""
    declared = may_be_asked(session.client_capabilities)
    return declared and session.protocol_version in MODERN_PROTOCOL_VERSIONS and asks_client


class InputRounds:
    """The parked calls of 2026-07-28 clients, and the task group they run in (the server's lifespan)."""

    def __init__(self, idle_timeout: float = DEFAULT_IDLE_TIMEOUT) -> None:
        self.idle_timeout = idle_timeout
        """Seconds a parked call waits, between rounds, for the client's retry before it expires."""
        self._calls: dict[str, ParkedCall] = {}
        self._tasks: TaskGroup | None = None

    @asynccontextmanager
    async def lifespan(self, server: object) -> AsyncIterator[dict[str, Any]]:
        """The low-level `Server` lifespan: holds the task group parked calls run in while the server serves."""
        async with anyio.create_task_group() as tasks:
            self._tasks = tasks
            try:
                yield {}
            finally:
                self._tasks = None
                for call in list(self._calls.values()):
                    self.drop(call, "mcpmux is stopping")
                tasks.cancel_scope.cancel()

    @property
    def available(self) -> bool:
        """Whether calls can be parked (the server is serving)."""
        return self._tasks is not None

    @property
    def parked(self) -> int:
        """How many calls are parked now (running, or finished and not yet collected by the client)."""
        return len(self._calls)

    @staticmethod
    def issued(request_state: str | None) -> bool:
        """Whether `request_state` is one of mcpmux's own rounds' (live or not)."""
        return request_state is not None and request_state.startswith(STATE_PREFIX)

    def call_of(self, caller: ServerSession) -> ParkedCall | None:
        """The parked call whose first request came on `caller`, if it is still running."""
        return next((call for call in self._calls.values() if call.caller is caller), None)

    async def start(
        self,
        tool: str,
        arguments: dict[str, Any],
        session: ServerSession,
        work: Callable[[ParkedCall], Awaitable[types.CallToolResult]],
    ) -> RoundResult:
        """Run `work` in a held task; answer with its result or with its first sampling round."""
        assert self._tasks is not None, "InputRounds.lifespan is not entered"
        call = ParkedCall(self, tool, arguments, session, self.idle_timeout)
        self._calls[call.token] = call
        self._tasks.start_soon(call.run, work, name=f"parked call {tool}")
        return await self._round(call, session)

    async def resume(self, params: types.CallToolRequestParams, session: ServerSession) -> RoundResult:
        """A client's retry: deliver its `inputResponses`, answer with the next round or the result."""
        call = self._calls.get(params.request_state or "")
        if call is None:
            raise MCPError(
                types.INVALID_PARAMS,
                f"requestState for tool {params.name!r} is unknown or expired: mcpmux keeps a call waiting for "
                f"sampling answers {self.idle_timeout:g}s; call the tool again without requestState",
            )
        if call.tool != params.name or call.arguments != (params.arguments or {}):
            raise MCPError(
                types.INVALID_PARAMS,
                f"requestState belongs to a call of tool {call.tool!r} with other arguments than this call of "
                f"{params.name!r}; retry the same tool with the same arguments",
            )
        if call.attached:
            raise MCPError(
                types.INVALID_REQUEST,
                f"requestState for tool {params.name!r} is already being resumed by another request; "
                "send one retry per round",
            )
        call.answer(params.input_responses or {})
        return await self._round(call, session)

    async def _round(self, call: ParkedCall, session: ServerSession) -> RoundResult:
        call.attach(session)
        try:
            event = await call.next_event()
        except anyio.get_cancelled_exc_class():
            # The client cancelled (or closed the stream): nothing will come back for this call.
            self.drop(call, f"the client cancelled its call of tool {call.tool!r}")
            raise
        except anyio.EndOfStream:
            self._calls.pop(call.token, None)
            raise MCPError(
                types.INTERNAL_ERROR, f"the call of tool {call.tool!r} ended without a result (mcpmux is stopping)"
            ) from None
        if isinstance(event, _Done):
            self._calls.pop(call.token, None)
            call.collected()
            if event.error is not None:
                raise event.error
            assert event.result is not None
            return event.result
        call.detach()
        requests: types.InputRequests = {ask.key: ask.request for ask in event}
        return types.InputRequiredResult(input_requests=requests, request_state=call.token)

    def drop(self, call: ParkedCall, reason: str) -> None:
        """Forget `call` and end it (see `ParkedCall.drop`)."""
        if self._calls.pop(call.token, None) is not None:
            logger.info("dropped a parked call: %s", reason)
        call.drop(reason)
