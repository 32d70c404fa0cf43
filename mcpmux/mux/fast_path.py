"""The fast path: `tools/call` relayed as raw JSON-RPC, around the SDK's server and client sessions.

The SDK path parses, validates and re-serialises every call twice (the server session that
answers the client, the client session that asks the upstream) and spends a task and session
bookkeeping on each side. A call that needs none of mcpmux's own machinery skips all that: the
front (the stdio and HTTP fast fronts, the ASGI middleware, and the SDK's own `tools/call` handler
for what reaches it) hands the parsed JSON-RPC request to `FastPath.route`; when it returns a
`FastCall`, the front serves it through `mcpmux.mux.call_sink` (`FastPath.answer` sends it through
the upstream's `UpstreamLane` and returns the JSON-RPC response to write back). Everything else
takes the SDK handler's own path (`Mux.call_tool`), for the reason `ToSdk` names.

Where the wires allow it (stdio on both sides), `FastPath.launch` goes further: called from the
code that read the client's line, it admits the call and writes its request to the upstream at
once, and the result is answered from the code that reads it off the upstream's wire, where the
call then ends. A call the gate cannot admit at once takes its place in the gate's line without a
task (`AdmissionGate.hold`), and its request goes out from the code that released the slot before
it. A task, running `FastPath.answer`, is started only for what that cannot do (a timeout, a
cancellation, progress, an error, a result not answered at once).

Which tools it serves is their `CallPlan`'s to say (`mcpmux.core.call_plan`: `slow` is None): cached
and coalesced tools included. A call that takes a task is run by the upstream's executor
(`UpstreamDispatcher.run`: cache, flights, gate, upstream), as the SDK path's calls are; a launched
call takes the same steps without one, with the same cache, flights and gate. Besides, the name
must route to a connected upstream (not a local tool, not an unknown name: the SDK path words that
error), the request carry nothing but `name`, `arguments` and `_meta` (and no 2026 `logLevel`: the
SDK path relays the upstream's logs to such a request), the upstream not want to ask the calling
client for sampling (its plan's `asks_client`, where the client declared sampling), and a 2026 call
that declares the tasks extension not go to an upstream that offers it (it may be answered with a
task, which `mcpmux.server.task_front` relays). A call that may
share another's answer (`CallPlan.shares`) is answered at once from the cache while fresh; else it
waits, in a task, for an identical call in flight, or is launched as any other call, and identical
calls arriving meanwhile wait for it (`SingleFlight.lead`).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import mcp_types as types
from mcp import Client
from mcp.shared.inbound import InboundLadderRejection, classify_inbound_request
from mcp_types import methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError
from pydantic_core import from_json

from mcpmux.batching import AdmissionGate, Held, Lead, RejectedError, canonical_json
from mcpmux.core.call_plan import CallPlan
from mcpmux.core.call_tracker import TrackedCall
from mcpmux.core.inbound import Caller, InboundCall
from mcpmux.core.metrics import outcome_of
from mcpmux.errors import (
    CallFailedError,
    MuxError,
    UpstreamError,
    UpstreamUnavailableError,
    error_data,
    error_result,
)
from mcpmux.mux.dispatcher import RawResult, Shared, UpstreamDispatcher, created_task
from mcpmux.mux.multiplexer import Mux
from mcpmux.upstream.lane import LaneRequest, ProgressFn
from mcpmux.upstream.supervisor import Upstream, UpstreamState
from mcpmux.upstream.task_extension import declared as declares_tasks
from mcpmux.upstream.task_extension import offered as offers_tasks
from mcpmux.wire.plain_result import SERVER_INFO, is_plain

logger = logging.getLogger(__name__)

_PARAM_KEYS = frozenset({"name", "arguments", "_meta"})
_PROTOCOL_VERSION = "io.modelcontextprotocol/protocolVersion"
_CLIENT_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
_LOG_LEVEL = "io.modelcontextprotocol/logLevel"


class ToSdk(StrEnum):
    """Why a request is left to the SDK path: a request the SDK words the refusal of, or what the
    direct mode does not serve (each reason a feature to move into it, never one to add)."""

    NOT_A_CALL = "not a tools/call request"
    MALFORMED = "malformed: the SDK words the refusal"
    MORE_PARAMS = "params besides name, arguments and _meta (a 2026 retry's inputResponses)"
    LOGS = "a 2026 request that asked for the upstream's logs"
    NO_REVISION = "no protocol revision known for the request"
    NOT_AN_UPSTREAM_TOOL = "a local tool, or a name no connected upstream lists (the SDK path words it)"
    SESSION = "the client's own upstream session is to be started, or its call takes turns on the shared one"
    NOT_CONNECTED = "its upstream is not connected"
    PLAN = "its call plan (a list form, a tool run only as a task, a per-client cache, Mcp-Param headers)"
    ASKS_CLIENT = "the upstream may ask this very client (2026: in input-required rounds)"
    TASK = "a 2026 call that declared the tasks extension, to an upstream that offers it"
    DUPLICATE_ID = "a request id already in flight"
    FRONT = "the front's transport needs the SDK (HTTP: progress, a 2025 session it does not hold, headers)"


@dataclass(slots=True)
class FastCall:
    """A `tools/call` the fast path serves: the client's id and era, and where the call goes."""

    request_id: types.RequestId
    version: str
    """The protocol revision the client speaks (the response is shaped for it)."""
    inbound: InboundCall
    """Who asks (the front fills in how its client is asked and hears logs)."""
    upstream: Upstream
    """The session the call goes to (the shared one, or its client's own)."""
    dispatcher: UpstreamDispatcher
    plan: CallPlan
    arguments: dict[str, Any]
    progress_token: types.ProgressToken | None
    task: dict[str, Any] | None = None
    """A 2025-11-25 task-augmented call's `task`: the upstream's task is adopted for `owner` (`Mux.tasks`)."""
    owner: str | None = None

    @property
    def tool(self) -> str:
        """The tool's name on its upstream."""
        return self.plan.tool


Deliver = Callable[[dict[str, Any]], Awaitable[None]]
"""Sends a JSON-RPC response to the client."""

DeliverNow = Callable[[dict[str, Any]], bool]
"""Sends a JSON-RPC response to the client from synchronous code when that needs no waiting; False when not sent."""


Escalate = Callable[[], None]
"""Starts the task that finishes a launched call: `answer(call, ..., launched=)`."""


@dataclass(slots=True)
class Launched:
    """A call `FastPath.launch` took on: sent, or waiting in the gate's line to be sent. It ends at once
    when its result is answered the moment it is read; anything else (`wake`) has a task finish it,
    with `answer(..., launched=)`."""

    tracked: TrackedCall
    gate: AdmissionGate
    """The upstream's gate, released when the call ends (once it was admitted)."""
    started: float
    deadline: float
    """When it stops waiting (`anyio.current_time()`'s clock): for admission while `held`, then for its result."""
    escalate: Escalate
    held: Held | None = None
    """Its place in the gate's line while it waits there; None once admitted."""
    sent: LaneRequest | None = None
    """Its request, once written at once; None while it waits, or when its task must send it."""
    escalated: bool = False
    """Whether a task finishes it (else it ended at once, or is still out)."""
    timer: asyncio.TimerHandle | None = None
    """Wakes it at `deadline`, for its task to word the timeout; cancelled once it ends or has a task."""
    response: dict[str, Any] | None = None
    """The response, once it reached the client the moment the result was read; then `outcome` is its outcome."""
    outcome: str = "ok"
    lead: Lead[Shared] | None = None
    arguments_key: str = ""
    """Its arguments as canonical JSON, once it holds a `lead` (the key its answer is shared and cached under)."""
    """Its claim on its plan's in-flight sharing, when it may share its answer (`CallPlan.shares`):
    identical calls arriving meanwhile wait for it (`FastPath._shared`)."""

    @property
    def answered(self) -> bool:
        """Whether the client has its response already."""
        return self.response is not None

    def wake(self) -> None:
        """Have a task finish the call (something arrived for it, it was cancelled, it timed out); once."""
        if not self.escalated:
            self.escalated = True
            self.stop_timer()
            self.escalate()

    def stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()

    def unlink(self) -> None:
        """Once the call is over: drop the references back to it (the tracker's hook, the lane's
        callbacks, its escalation), so that it is freed at once rather than by the cycle collector.
        Every launched call left some 36 objects in cycles; collecting them took about a fifth of
        mcpmux's CPU under load (session 10). A `wake` after this does nothing."""
        self.escalated = True
        self.escalate = _nothing
        self.tracked.on_cancel = None
        if self.sent is not None:
            self.sent.unlink()


@dataclass(slots=True)
class _Eligibility:
    listing: object
    upstream: Upstream | None
    plan: CallPlan | None = None


@dataclass(slots=True)
class FastPath:
    """Decides which `tools/call` requests skip the SDK, and serves them."""

    mux: Mux
    server_info: dict[str, Any]
    """mcpmux's `serverInfo` stamp, put in 2026 results whose upstream gave none (as the SDK server does)."""
    _eligible: dict[str, _Eligibility] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.mux.on_catalog_changed(self._forget)

    async def _forget(self) -> None:
        self._eligible.clear()

    def route(
        self,
        message: Any,
        caller: Caller,
        legacy_version: str | None,
        declares_sampling: bool = False,
        headers: Mapping[str, str] | None = None,
        owner: str | None = None,
    ) -> FastCall | ToSdk:
        """The `FastCall` for a parsed JSON-RPC message, or why the SDK path must serve it.

        `caller`: who sent it (a 2026 request's capabilities are read off its envelope here).
        `legacy_version` is what a 2025 client negotiated on its session (None if unknown); a 2026
        request names its revision in `_meta`. `declares_sampling`: the 2025 client declared sampling.
        `headers` (lower-case names): an HTTP request's, which a 2026 request's envelope must agree with.
        `owner`: who the client is, for the tasks it creates (a task-augmented call needs one).
        """
        if not isinstance(message, dict) or message.get("method") != "tools/call" or "id" not in message:
            return ToSdk.NOT_A_CALL
        if message.get("jsonrpc") != "2.0":
            return ToSdk.MALFORMED  # the SDK path refuses it
        params = message.get("params")
        if not isinstance(params, dict) or not _PARAM_KEYS.issuperset(params.keys() - {"task"}):
            return ToSdk.MORE_PARAMS
        task = params.get("task")
        if task is not None and (not isinstance(task, dict) or owner is None):
            return ToSdk.MALFORMED
        name, arguments, meta = params.get("name"), params.get("arguments", {}), params.get("_meta") or {}
        if not isinstance(name, str) or not isinstance(arguments, dict) or not isinstance(meta, dict):
            return ToSdk.MALFORMED
        if _LOG_LEVEL in meta:
            return ToSdk.LOGS  # the SDK path relays the upstream's logs on this request (2026 logging is per request)
        version = meta.get(_PROTOCOL_VERSION)
        capabilities = None
        if version in MODERN_PROTOCOL_VERSIONS:
            if isinstance(classify_inbound_request(message, headers=headers), InboundLadderRejection):
                return ToSdk.MALFORMED  # a malformed envelope: the SDK words the refusal
            capabilities = meta.get(_CLIENT_CAPABILITIES)
            declares_sampling = sampling_declared(capabilities)
        elif version is None and legacy_version is not None:
            version = legacy_version
        else:
            return ToSdk.NO_REVISION
        if task is not None and version in MODERN_PROTOCOL_VERSIONS:
            return ToSdk.MALFORMED  # tasks are 2025-11-25's
        upstream = self._upstream_for(name)
        if upstream is None:
            return ToSdk.NOT_AN_UPSTREAM_TOOL
        plan = self._eligible[name].plan
        assert plan is not None  # an upstream was found for it
        if isinstance(capabilities, dict) and "extensions" in capabilities:
            caller = _declaring(caller, capabilities)
        sessions = self.mux.sessions.get(upstream.name)
        session = sessions.find(caller) if sessions is not None else None
        if session is None:
            return ToSdk.SESSION  # its own session is to be started first, or its call takes turns
        upstream, dispatcher = session
        if upstream.lane is None or upstream.state != UpstreamState.READY:
            return ToSdk.NOT_CONNECTED
        if sessions is not None and upstream is not sessions.shared[0]:
            plan = dispatcher.plan(plan.tool)  # as the caller's own session lists the tool
        if plan.slow is not None and task is None:
            return ToSdk.PLAN  # e.g. the upstream runs it only as a task: the SDK path creates and awaits one
        if declares_sampling and plan.asks_client:
            return ToSdk.ASKS_CLIENT  # the upstream may want this very client to sample
        if isinstance(capabilities, dict) and declares_tasks(capabilities) and offers_tasks(upstream.client):
            return ToSdk.TASK  # a 2026 call that may be answered with a task: the SDK path's task front relays it
        request_id = message["id"]
        if not isinstance(request_id, str | int) or isinstance(request_id, bool):
            return ToSdk.MALFORMED
        inbound = InboundCall(caller, request_id, version)
        progress_token = meta.get("progressToken")
        return FastCall(
            request_id, version, inbound, upstream, dispatcher, plan, arguments, progress_token, task, owner
        )

    def to_sdk(self, reason: ToSdk) -> None:
        """A `tools/call` goes to the SDK path for `reason`: counted (`mcpmux_sdk_path_calls_total`)."""
        if reason is not ToSdk.NOT_A_CALL:
            counts, key = self.mux.to_sdk, reason.name.lower()
            counts[key] = counts.get(key, 0) + 1

    def _upstream_for(self, name: str) -> Upstream | None:
        """The upstream of a fast-path tool, decided once per listing of its upstream."""
        known = self._eligible.get(name)
        if known is not None and (known.upstream is None or known.listing is known.upstream.listing):
            return known.upstream
        known = self._eligibility(name)
        if known.listing is not None:  # unknown names are not remembered: a client could send any number
            self._eligible[name] = known
        return known.upstream

    def _eligibility(self, name: str) -> _Eligibility:
        mux = self.mux
        if name in mux.local_tools:
            return _Eligibility(None, None)
        try:
            route = mux.catalog.resolve_tool(name)
        except MuxError:
            return _Eligibility(None, None)  # unknown: the SDK path words the error
        upstream = mux.upstreams[route.upstream]
        plan = mux.dispatchers[route.upstream].plan(route.name)
        if plan.slow is not None and not plan.as_task:
            return _Eligibility(upstream.listing, None)
        return _Eligibility(upstream.listing, upstream, plan)  # a tool run as a task: for task-augmented calls

    def launch(self, call: FastCall, deliver_now: DeliverNow, escalate: Escalate) -> Launched | None:
        """Admit `call` and write its request to the upstream right now, from synchronous code; None
        (nothing done) where anything would have to wait or refuse: a rate limit or a full queue at
        the gate, a busy wire, an upstream reconnecting, shutdown; or off asyncio (the timeout's
        timer is asyncio's). A call the gate cannot admit yet waits in its line without a task, and
        is sent from the code that releases the slot it gets (`_admitted_held`).

        The result, the moment it is read, goes to the client through `deliver_now` if it can, and
        the call ends there, its books kept: no task, no trip through the event loop either way.
        Anything else (progress, an error, a result not answered at once, the connection's end, a
        cancellation by mcpmux, the timeout, a wire that could not take the request once admitted)
        calls `escalate`, once, which must start a task that runs `answer(call, ..., launched=)`; so
        must the caller's own reasons (`Launched.wake`: the client cancelled, the caller shuts down).
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
        upstream, lane = call.upstream, call.upstream.lane
        calls = self.mux.calls
        if lane is None or not lane.can_launch or upstream.client is None or call.task is not None:
            return None
        if calls.refusal(upstream.name) is not None:
            return None
        dispatcher = call.dispatcher
        lead = None
        if call.plan.shares:
            arguments = canonical_json(call.arguments)
            hit = self._from_cache(call, arguments, deliver_now)
            if hit is not None:
                return hit
            lead = dispatcher.flights.lead((None, call.tool, arguments))
            if lead is None:
                return None  # an identical call is under way: a task waits for its answer
        gate = dispatcher.gate
        tracked = calls.track(upstream.name, call.inbound, upstream)
        launched = Launched(tracked, gate, time.perf_counter(), loop.time() + upstream.timeout, escalate)
        launched.lead = lead
        if lead is not None:
            launched.arguments_key = arguments
        if gate.try_acquire():
            try:
                sent = self._send_now(call, launched, deliver_now)
            except BaseException:
                gate.refund()
                _give_up(lead)
                raise
            if not sent:  # the wire could not take it at once
                gate.refund()
                _give_up(lead)
                return None
        else:
            launched.deadline = dispatcher.queue_deadline()  # `anyio.current_time()`, on asyncio
            launched.held = gate.hold(
                lambda: self._admitted_held(call, launched, deliver_now),
                priority=call.plan.priority,
                deadline=launched.deadline,
            )
            if launched.held is None:
                _give_up(lead)
                return None
        launched.tracked.on_cancel = launched.wake
        launched.tracked.admit()  # cannot refuse: nothing yielded since the refusal was checked
        launched.timer = loop.call_at(launched.deadline, launched.wake)
        return launched

    def _send_now(self, call: FastCall, launched: Launched, deliver_now: DeliverNow) -> bool:
        """Write the admitted call's request at once (`UpstreamLane.launch`); False (nothing sent) if it would wait."""
        upstream = call.upstream
        lane, client = upstream.lane, upstream.client
        if lane is None or not lane.can_launch or client is None:
            return False
        version = client.protocol_version

        def answered(raw: dict[str, Any]) -> bool:
            output = call.plan.output
            if methods.is_input_required(raw) or (output is not None and output.problem(raw) is not None):
                return False  # the task takes these: another round, or the error
            self._share(call, launched, raw, version)
            try:
                response, outcome = self._response(call, raw, version)
            except ValidationError:
                return False  # likewise
            if not deliver_now(response):
                return False
            launched.response, launched.outcome = response, outcome
            if launched.escalated:
                return False  # its task is under way: it keeps the books
            self._ended_at_once(call, launched)
            return True

        wants_progress = call.progress_token is not None
        launched.sent = lane.launch(
            client,
            call.tool,
            call.arguments,
            answered,
            launched.wake,
            logs=_logs_for(call),
            progress=wants_progress,
            caller=call.inbound,
        )
        return launched.sent is not None

    def _admitted_held(self, call: FastCall, launched: Launched, deliver_now: DeliverNow) -> None:
        """The gate admitted a call waiting in its line (called by whoever released the slot): its
        request goes out now, its timeout running from here; or its task sends it."""
        launched.held = None
        if launched.escalated:
            return  # its task is under way: it sends the call, with this admission
        launched.stop_timer()
        loop = asyncio.get_running_loop()
        launched.deadline = loop.time() + call.upstream.timeout
        try:
            sent = self._send_now(call, launched, deliver_now)
        except Exception:  # whoever released the slot must not fail for this call
            logger.exception("sending fast-path call %r on its turn failed; its task sends it", call.tool)
            sent = False
        if not sent:
            launched.wake()
            return
        launched.timer = loop.call_at(launched.deadline, launched.wake)

    def abandon(self, call: FastCall, launched: Launched) -> None:
        """End a launched call no task can finish (its caller is gone): out of the gate's line or
        forgotten by the lane, books kept."""
        if launched.sent is not None:
            launched.sent.abandon()
        launched.outcome = "cancelled"
        self._ended_at_once(call, launched)

    def _ended_at_once(self, call: FastCall, launched: Launched) -> None:
        """The books of a call that ended without a task (answered the moment its result was read,
        or abandoned), as `answer` keeps them."""
        launched.stop_timer()
        if launched.held is not None:
            launched.gate.withdraw(launched.held)  # never admitted: no slot to give back
        else:
            launched.gate.release()
        launched.tracked.release()
        _give_up(launched.lead)
        launched.unlink()
        elapsed = time.perf_counter() - launched.started
        self.mux.metrics.observe_call(call.upstream.name, call.tool, elapsed, launched.outcome)

    async def answer(
        self,
        call: FastCall,
        progress: ProgressFn | None = None,
        deliver: Deliver | None = None,
        launched: Launched | None = None,
    ) -> dict[str, Any]:
        """Serve `call` (sent already when `launched`); the JSON-RPC response (result or error), with the client's id.

        Failures read as on the SDK path: an unavailable or timed-out upstream, or a limit's refusal,
        is an `isError` result saying so; the upstream's JSON-RPC errors pass through. `deliver`, when
        given, gets the response as soon as it is ready, before the call's bookkeeping (the gate's
        release, shutdown tracking, metrics): what the client waits for goes first. A response the
        flight already delivered is not delivered again.
        """
        started = time.perf_counter() if launched is None else launched.started
        outcome = "error"
        delivered = False
        try:
            try:
                # Shutdown waits for (or cancels) it and a reload that stops its upstream cancels it.
                upstream, calls = call.upstream, self.mux.calls
                with calls.track(upstream.name, call.inbound, upstream) if launched is None else launched.tracked:
                    if launched is None:
                        fetch = call.dispatcher.run(
                            call.plan,
                            call.arguments,
                            progress,
                            priority=call.plan.priority,
                            logs=_logs_for(call),
                            task=call.task,
                        )
                        response, outcome = await self._respond(call, fetch, None)
                    else:
                        async with self._admitted(launched):
                            response, outcome = await self._respond(call, self._led(call, progress, launched), launched)
                    if deliver is not None and not _answered(launched):
                        delivered = True
                        await deliver(response)
            except (UpstreamUnavailableError, RejectedError) as err:
                # Refused by a limit, or by mcpmux (shutting down, the upstream being stopped), or
                # cancelled by it after the grace period (`CallCancelledError`). Once the client has
                # its answer, what came after was bookkeeping's and changes nothing.
                if not delivered and not _answered(launched):
                    response, outcome = self._failed(call, err), outcome_of(err)
                    if deliver is not None:
                        await deliver(response)
            if launched is not None and launched.response is not None:  # the books follow what the client got
                response, outcome = launched.response, launched.outcome
            return response
        except BaseException as err:
            outcome = outcome_of(err)
            raise
        finally:
            self.mux.metrics.observe_call(call.upstream.name, call.tool, time.perf_counter() - started, outcome)
            if launched is not None:
                _give_up(launched.lead)
                launched.unlink()

    @asynccontextmanager
    async def _admitted(self, launched: Launched) -> AsyncIterator[None]:
        """A launched call's admission through its upstream's gate for the body: had already, or
        waited for now where it stands in the gate's line."""
        if launched.held is not None:
            await launched.gate.wait_held(launched.held)
            launched.held = None
        try:
            yield
        finally:
            launched.gate.release()

    def _from_cache(self, call: FastCall, arguments: str, deliver_now: DeliverNow) -> Launched | None:
        """A launched call answered from the cache at once: an ended flight; None when there is no
        fresh entry, or the client could not take the answer now (its task serves it)."""
        started = time.perf_counter()
        cached = call.dispatcher.cached(call.plan, arguments)
        if cached is None:
            return None
        response, outcome = self._response(call, *cached)
        if not deliver_now(response):
            return None
        tracked, gate = self.mux.calls.track(call.upstream.name, call.inbound, call.upstream), call.dispatcher.gate
        launched = Launched(tracked, gate, started, 0.0, _nothing, escalated=True, response=response, outcome=outcome)
        self.mux.metrics.observe_call(call.upstream.name, call.tool, time.perf_counter() - started, outcome)
        return launched

    def _share(self, call: FastCall, launched: Launched, raw: Any, version: str | None) -> None:
        """A launched call's raw result, read: cached where the plan says so, and given to the
        identical calls that wait for it (a copy of their own, as this call's answer is shaped in place)."""
        lead = launched.lead
        if lead is None or lead.ended:
            return
        inbound = call.inbound
        personal = (inbound.caller.client or "") if inbound.asked else None
        if personal is None:
            call.dispatcher.keep(call.plan, launched.arguments_key, None, raw, version)
        lead.finish((copy.deepcopy(raw), version, personal) if lead.waiting else (raw, version, personal))

    async def _led(self, call: FastCall, progress: ProgressFn | None, launched: Launched) -> RawResult:
        """`_call`; a launched call that others may share gives them its result, or its error."""
        lead = launched.lead
        if lead is None:
            return await self._call(call, progress, launched)
        try:
            raw, version = await self._call(call, progress, launched)
        except Exception as err:
            lead.fail(err)
            raise
        self._share(call, launched, raw, version)
        return raw, version

    async def _respond(
        self, call: FastCall, fetch: Awaitable[tuple[Any, str | None]], launched: Launched | None
    ) -> tuple[dict[str, Any], str]:
        """The response to `call` and the outcome to count, from `fetch` (the raw result and its revision)."""
        try:
            raw, upstream_version = await fetch
        except CallFailedError as err:
            return self._failed(call, err), outcome_of(err)
        except UpstreamError as err:
            return {"jsonrpc": "2.0", "id": call.request_id, "error": _dump(error_data(err))}, "error"
        if launched is not None and launched.response is not None:
            return launched.response, launched.outcome  # shaped and sent already
        if call.task is not None and created_task(raw):
            assert call.owner is not None  # `route` takes no task-augmented call without one
            adopted = self.mux.tasks.adopt(call.upstream.name, raw, call.owner)
            return {"jsonrpc": "2.0", "id": call.request_id, "result": adopted}, "ok"
        try:
            return self._response(call, raw, upstream_version)
        except ValidationError as err:
            problem = f"upstream {call.upstream.name!r} answered tool {call.tool!r} with an invalid result: {err}"
            error = types.ErrorData(code=types.INTERNAL_ERROR, message=problem)
            return {"jsonrpc": "2.0", "id": call.request_id, "error": _dump(error)}, "error"

    def _response(self, call: FastCall, raw: Any, upstream_version: str | None) -> tuple[dict[str, Any], str]:
        """The JSON-RPC response carrying the upstream's result, and the outcome to count; see `_shape`."""
        raw = self.mux.results.fit(call.plan, raw, call.upstream.name)  # cut to the plan's result_limit
        result = self._shape(raw, upstream_version, call.version)
        self.mux.catalog.name_raw_result(call.upstream.name, result)  # its `ui://` URIs, as clients see them
        return {"jsonrpc": "2.0", "id": call.request_id, "result": result}, "error" if result.get("isError") else "ok"

    async def _call(self, call: FastCall, progress: ProgressFn | None, launched: Launched) -> RawResult:
        """A launched call's raw result and its protocol revision, as `UpstreamDispatcher.send` gives it
        (the same checks; `UpstreamResultError` for a result that breaks the tool's output schema)."""
        dispatcher = call.dispatcher
        logs = _logs_for(call)
        sent = launched.sent
        if sent is None:  # not sent yet: its task sends it
            return await dispatcher.send(call.plan, call.arguments, progress, logs=logs)

        def wait_or_resend(client: Client) -> Awaitable[RawResult]:
            # A new session (the first one expired, HTTP 404) never saw the request: it is sent there anew.
            if client is sent.client:
                return _wait(sent, progress)
            return dispatcher.send(call.plan, call.arguments, progress, logs=logs)

        what = f"tool {call.tool!r}"
        raw, version = await call.upstream.request(what, wait_or_resend, sent.client, launched.deadline)
        if _answered(launched):
            return raw, version  # it passed the checks before it was sent
        return await dispatcher.checked(call.plan, call.arguments, progress, raw, version)

    def _failed(self, call: FastCall, err: Exception) -> dict[str, Any]:
        """The `isError` result the SDK path gives for an unavailable or timed-out upstream, or a refusal."""
        raw = error_result(str(err)).model_dump(by_alias=True, mode="json", exclude_none=True)
        return {"jsonrpc": "2.0", "id": call.request_id, "result": self._shape(raw, None, call.version)}

    def _shape(self, raw: Any, upstream_version: str | None, version: str) -> dict[str, Any]:
        """The result as the SDK path sends it: read as the upstream's revision, written as the client's.

        Raises `ValidationError` for a result that is no `CallToolResult`, as the SDK's client does.
        """
        as_it_came = version in MODERN_PROTOCOL_VERSIONS  # 2026 to 2026: a plain result goes on unread
        if upstream_version is not None and upstream_version not in MODERN_PROTOCOL_VERSIONS:
            raw = methods.serialize_server_result("tools/call", upstream_version, raw)
            raw.setdefault("resultType", "complete")  # the SDK model's default, which its path sends on
            as_it_came = False
        if isinstance(raw, dict):
            raw.setdefault("isError", False)  # likewise
        if as_it_came and is_plain(raw):
            result: dict[str, Any] = raw  # what the model would write back (mcpmux.wire.plain_result)
        else:
            result = methods.serialize_server_result("tools/call", version, raw)
        if version in MODERN_PROTOCOL_VERSIONS:
            result.setdefault("resultType", "complete")
            meta = result.get("_meta")
            if meta is None:
                result["_meta"] = {SERVER_INFO: self.server_info}
            elif isinstance(meta, dict) and meta.get(SERVER_INFO) is None:
                result["_meta"] = {**meta, SERVER_INFO: self.server_info}
        return result


async def _wait(sent: LaneRequest, progress: ProgressFn | None) -> tuple[Any, str | None]:
    return await sent.wait(progress), sent.client.protocol_version


def _nothing() -> None:
    """What an ended call's escalation does."""


def _give_up(lead: Lead[Shared] | None) -> None:
    """A launched call ends without sharing an answer: whoever waits for it calls anew (once ended, nothing)."""
    if lead is not None:
        lead.abandon()


def _answered(launched: Launched | None) -> bool:
    return launched is not None and launched.answered


def _logs_for(call: FastCall) -> bool:
    """Whether the upstream is asked for its logs: a 2026 caller on the fast path asked for none
    (else it takes the SDK path)."""
    return call.version not in MODERN_PROTOCOL_VERSIONS


def decode(data: str | bytes) -> Any:
    """A JSON-RPC message as the fast path reads it; None where the SDK's own parser would refuse it.

    The SDK parses with pydantic-core, whose nesting limit is lower than `json.loads`'s. A message
    only the latter reads would reach the upstream transport, whose serialiser then fails and takes
    the connection down with it; parsing with the SDK's parser leaves such messages to the SDK path,
    which refuses them as it always has.
    """
    try:
        return from_json(data)
    except ValueError:
        return None


def sampling_declared(capabilities: object) -> bool:
    """Whether a client's capabilities (raw JSON) declare sampling or elicitation, which an upstream may
    ask of the calling client (`mcpmux.server.client_relay`). A malformed value counts as yes: its
    calls then take the SDK path, which words any refusal."""
    if capabilities is None:
        return False
    if not isinstance(capabilities, dict):
        return True
    return capabilities.get("sampling") is not None or capabilities.get("elicitation") is not None


def _declaring(caller: Caller, capabilities: dict[str, Any]) -> Caller:
    """`caller` with the capabilities a 2026 request declared in its envelope (read only where they name
    extensions, which pick its session: the rest cannot change how the fast path serves it)."""
    try:
        declared = types.ClientCapabilities.model_validate(capabilities)
    except ValidationError:
        return caller  # the SDK path words the refusal of a malformed envelope, where it matters
    return replace(caller, capabilities=declared)


def _dump(error: types.ErrorData) -> dict[str, Any]:
    return error.model_dump(by_alias=True, mode="json", exclude_none=True)
