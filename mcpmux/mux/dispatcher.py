"""The executor of one upstream's calls: the road every tool call to it takes, on either path:

    result cache ▶ single-flight (coalescing) ▶ list-form batcher ▶ admission gate ▶ upstream

What each step does for a tool is its `CallPlan` (`mcpmux.core.call_plan`), built once per listing.
`run` is the executor in raw form: JSON in, the upstream's raw result and its protocol revision out,
sent over the upstream's lane (`mcpmux.upstream.lane`) with no SDK model on the way. The fast path
(`mcpmux.mux.fast_path`) answers its calls' tasks with it, and `call_tool`, the SDK path's entry, runs
it too and reads the result into the SDK's model only at the end; the steps only the SDK's client can
take (a list-form batch, a tool the upstream runs only as a task, `Mcp-Param` headers, `[mux]
fast_path = false`) are `call_tool`'s alone. Both paths therefore share one cache and one table of
flights: identical calls coalesce whichever front they came in by.

- A tool whose plan caches (`[servers.X.cache] allow`) is served from the cache while fresh; a tool
  whose plan coalesces (cached, or annotated read-only and idempotent) shares one upstream call
  among identical concurrent calls (same tool, same canonical JSON arguments, same cache scope).
  Error results are never cached.
- A call to a tool with a declared list form (`[[servers.X.batch]]`) joins a `DynamicBatcher`;
  concurrent calls that differ only in the varying argument become one call of the batch tool, and
  its answer is split back by index, each caller receiving its own item.
- Every upstream request passes the upstream's `AdmissionGate` (max_concurrency, rate), waiting in a
  priority queue with aging; a full queue or a call that waited past `queue_timeout` is answered
  with an error naming the limit.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import Any

import anyio
import mcp_types as types
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import methods
from mcp_types.jsonrpc import CONNECTION_CLOSED
from pydantic import ValidationError

from mcpmux.batching import (
    AdmissionGate,
    BatchPolicy,
    DynamicBatcher,
    GatePolicy,
    QueuePolicy,
    RejectedError,
    ResultCache,
    SingleFlight,
    canonical_json,
    deadline_in,
)
from mcpmux.core.call_plan import CallPlan, plan_tool
from mcpmux.core.config import MuxSettings
from mcpmux.core.inbound import current_call
from mcpmux.core.metrics import CallObserver, outcome_of
from mcpmux.core.output_schema import result_error
from mcpmux.core.server_policy import BatchForm
from mcpmux.errors import InputRequired, UpstreamError, error_result
from mcpmux.mux.relayed_rounds import answer_inputs, relays_round, resumed
from mcpmux.upstream.lane import ProgressFn
from mcpmux.upstream.supervisor import Upstream
from mcpmux.upstream.tasks import call_as_task
from mcpmux.wire.json_bytes import dumps, loads
from mcpmux.wire.plain_result import is_plain

MAX_INPUT_ROUNDS = 10
"""Input-required rounds one call may take (the SDK's client gives up after as many)."""
_STATE_ONLY_WAIT = 0.05
_STATE_ONLY_WAIT_CAP = 0.25
"""A round with only state is retried after a wait doubling from 50 ms to 250 ms, as the SDK's client does."""

BatchItem = tuple[str, dict[str, Any], Any]  # (key of the other arguments, the other arguments, the varying value)
RawResult = tuple[Any, str | None]
"""An upstream's raw `tools/call` result and its protocol revision (None: the revision of mcpmux's own models)."""
CachedResult = tuple[bytes, str | None]
"""A cached `RawResult`, its result as JSON text."""
FlightKey = tuple[str | None, str, str]
"""(cache scope: the client, or None for all; tool; canonical JSON arguments)."""
Shared = tuple[Any, str | None, str | None]
"""A flight's answer: the `RawResult`, and the client it is personal to (None: anyone may share it)."""
logger = logging.getLogger(__name__)


class UpstreamDispatcher:
    """Schedules, coalesces, caches and batches the calls to one upstream."""

    def __init__(
        self,
        upstream: Upstream,
        cache: ResultCache[CachedResult],
        mux: Callable[[], MuxSettings],
        observe: CallObserver | None = None,
        gate: AdmissionGate | None = None,
    ) -> None:
        """`gate`: the server's, when this executes a session of clients' own (`mcpmux.mux.sessions`)."""
        self.upstream = upstream
        self.cache = cache
        self.mux = mux
        """The running `[mux]` settings (a reload replaces them)."""
        self._plans: dict[str, CallPlan] = {}
        self._planned_for: tuple[object, object] = (None, None)
        """The listing and `[mux]` settings `_plans` were made from: new ones make them anew."""
        self.observe = observe  # told (upstream, tool, seconds, outcome) of every call: `MuxMetrics.observe_call`
        settings = upstream.config.limits
        queue = QueuePolicy(
            max_queue=settings.max_queue, on_full=settings.on_full, aging_interval=settings.aging_interval
        )
        self.gate = gate or AdmissionGate(
            GatePolicy(
                max_concurrency=settings.max_concurrency,
                rate=settings.rate or None,
                burst=settings.burst,
                queue=queue,
            ),
            name=f"upstream {upstream.name}",
        )
        self.flights: SingleFlight[FlightKey, Shared] = SingleFlight(
            name=f"coalescing for {upstream.name!r}",
            label=lambda key: key[1],  # shared calls counted per tool
        )
        """Calls in flight that identical calls may join, on either path (a launched one by `flights.lead`)."""
        self.batchers: dict[str, DynamicBatcher[BatchItem, types.CallToolResult]] = {}
        for form in upstream.config.batch:
            policy = BatchPolicy(
                max_batch_size=form.max_batch_size, max_delay=form.max_delay, mode=form.mode, max_concurrent_batches=4
            )
            batcher = DynamicBatcher(self._batch_caller(form), policy, name=f"{upstream.name}/{form.batch_tool}")
            self.batchers[form.tool] = batcher

    async def start(self, stack: AsyncExitStack) -> None:
        """Enter the parts that own tasks; they end when `stack` closes."""
        await stack.enter_async_context(self.flights)
        for batcher in self.batchers.values():
            await stack.enter_async_context(batcher)

    def plan(self, tool: str) -> CallPlan:
        """The plan of `tool` (its upstream name), made once per listing of the upstream."""
        listing, mux = self.upstream.listing, self.mux()
        if listing is not self._planned_for[0] or mux is not self._planned_for[1]:
            self._plans.clear()
            self._planned_for = (listing, mux)
        plan = self._plans.get(tool)
        if plan is None:
            listed = listing.tools_by_name.get(tool)
            plan = plan_tool(tool, listed, self.upstream.config, mux)
            if listed is not None:  # a name the upstream does not list is not remembered
                self._plans[tool] = plan
        return plan

    async def call_tool(
        self,
        tool: str,
        arguments: dict[str, Any],
        progress: ProgressFn | None,
        client: str | None,
        client_priority: int = 0,
        hears_logs: bool = False,
    ) -> types.CallToolResult:
        """Call `tool` (its upstream name) through cache, coalescing, batching and the gate.

        The call's priority is the tool's (`[servers.X.priorities]`) plus the caller's `client_priority`.
        `hears_logs`: the caller relays the upstream's log messages of this call to its client, which
        must have them before the result (see `send`'s `in_order`).
        """
        started = time.perf_counter()
        outcome = "error"
        try:
            result = await self._call_tool(tool, arguments, progress, client, client_priority, hears_logs)
            outcome = "error" if result.is_error else "ok"
            return result
        except RejectedError as err:
            outcome = "rejected"
            return error_result(str(err))
        except BaseException as err:
            outcome = outcome_of(err)
            raise
        finally:
            if self.observe is not None:
                self.observe(self.upstream.name, tool, time.perf_counter() - started, outcome)

    async def _call_tool(
        self,
        tool: str,
        arguments: dict[str, Any],
        progress: ProgressFn | None,
        client: str | None,
        client_priority: int,
        hears_logs: bool,
    ) -> types.CallToolResult:
        plan = self.plan(tool)
        priority = plan.priority + client_priority
        form = plan.batch
        if form is not None and form.argument in arguments and resumed() is None:
            batcher = self.batchers[tool]
            others = {k: v for k, v in arguments.items() if k != form.argument}
            item = (canonical_json(others), others, arguments[form.argument])
            # The batch call itself runs in the batcher's task, outside this request's log context.
            logger.debug("call joins a %s batch", form.batch_tool)
            return await batcher.submit(item, priority=priority, deadline=self.queue_deadline())
        scope = client if plan.cache is not None and plan.cache.scope == "client" else None
        raw, version = await self.run(plan, arguments, progress, priority=priority, scope=scope, in_order=hears_logs)
        return self.result_model(tool, raw, version)

    async def run(
        self,
        plan: CallPlan,
        arguments: dict[str, Any],
        progress: ProgressFn | None,
        *,
        priority: int,
        scope: str | None = None,
        logs: bool = True,
        task: dict[str, Any] | None = None,
        in_order: bool = False,
    ) -> RawResult:
        """A call of `plan`'s tool: the cache while fresh, else an identical call's flight, else its own
        upstream call through the gate at `priority`; the raw result, a copy of the caller's own.

        `scope`: whose cache entries and flights it may share (None: everybody's). `logs`, `task`,
        `in_order`: as `send`'s. A task-augmented call (`task`) shares nothing: its answer is a task of
        its caller's.
        """
        if not plan.shares or task is not None or resumed() is not None:  # a retry's answers are its own
            async with self.slot(priority):
                return await self.send(plan, arguments, progress, logs=logs, task=task, in_order=in_order)
        key = canonical_json(arguments)
        scope = self._scope(scope)
        cached = self.cached(plan, key, scope)
        if cached is not None:
            return cached

        async def fetch() -> Shared:
            async with self.slot(priority):
                raw, version = await self.send(plan, arguments, progress, logs=logs, in_order=in_order)
            personal = personal_to()
            if personal is None:
                self.keep(plan, key, scope, raw, version)
            return raw, version, personal

        try:
            raw, version, personal = await self.flights.call((scope, plan.tool, key), fetch)
        except InputRequired as relayed:
            if relayed.call is current_call():
                raise
            # That round is the leading call's client's to answer: this call is sent on its own.
            async with self.slot(priority):
                return await self.send(plan, arguments, progress, logs=logs, in_order=in_order)
        if personal is not None and personal != _client():
            # The upstream asked another client something for that answer: it is that client's own.
            async with self.slot(priority):
                return await self.send(plan, arguments, progress, logs=logs, in_order=in_order)
        return copy.deepcopy(raw), version  # each caller's answer is its own to shape

    async def send(
        self,
        plan: CallPlan,
        arguments: dict[str, Any],
        progress: ProgressFn | None,
        *,
        logs: bool = True,
        task: dict[str, Any] | None = None,
        in_order: bool = False,
    ) -> RawResult:
        """The upstream's raw result of one call, sent now (admission is the caller's), and its revision.

        `logs=False` asks a 2026 upstream for none of its log messages (for a caller who would not
        hear them); `task` (2025-11-25 task metadata) asks it to run the call as a task. `in_order`:
        the upstream's log messages of the call must reach the caller's client before its result;
        the SDK's client then sends it, as it hands a connection's messages on one by one (the lane
        takes a result off the wire while a log read before it may still be on its way to the client).
        Raises as `Upstream.request` does, and `UpstreamResultError` for a result that breaks the
        tool's output schema.
        """
        upstream, tool = self.upstream, plan.tool
        what = f"tool {tool!r}"
        logger.debug("upstream call sent: %s", tool)
        resumes = resumed()  # a retry's answers go raw: the SDK's client would answer the rounds itself
        if task is None and (plan.as_task or (in_order and resumes is None) or not self._raw_upstream(plan)):
            result: types.CallToolResult = await upstream.request(
                what, lambda client: self._send_modelled(client, plan, arguments, progress)
            )
            logger.debug("upstream call answered: %s%s", tool, " (isError)" if result.is_error else "")
            return result.model_dump(by_alias=True, mode="json", exclude_none=True), None

        async def send_raw(client: Client) -> RawResult:
            lane = upstream.lane
            if lane is None:  # the connection is closing under us
                raise MCPError(code=CONNECTION_CLOSED, message="Connection closed")
            caller = current_call()
            raw = await lane.call(client, tool, arguments, progress, logs=logs, task=task, caller=caller, extra=resumes)
            return raw, client.protocol_version

        raw, version = await upstream.request(what, send_raw)
        logger.debug("upstream call answered: %s%s", tool, " (isError)" if _is_error(raw) else "")
        return await self.checked(plan, arguments, progress, raw, version, task, logs)

    async def checked(
        self,
        plan: CallPlan,
        arguments: dict[str, Any],
        progress: ProgressFn | None,
        raw: Any,
        version: str | None,
        task: dict[str, Any] | None = None,
        logs: bool = True,
    ) -> RawResult:
        """A raw result as read off the upstream's wire, made the call's answer: an input-required result
        has its rounds driven on this very call (`_rounds`) and the answer is checked against the tool's
        output schema (`UpstreamResultError`). A task the call asked for is its answer."""
        if task is not None and created_task(raw):
            return raw, version  # the tool's result comes later, from `tasks/result`
        what = f"tool {plan.tool!r}"
        if methods.is_input_required(raw):
            logger.debug("%s on %r asked for input", what, self.upstream.name)
            call = current_call()
            if relays_round(call, self._input_required(plan, raw).input_requests or {}, self.upstream.config):
                assert call is not None  # `relays_round` says so
                call.asked = True
                raise InputRequired(raw, call)
            first = raw
            raw = await self.upstream.request(
                what, lambda client: self._rounds(client, plan, arguments, progress, first, logs)
            )
        problem = plan.output.problem(raw) if plan.output is not None else None
        if problem is not None:
            raise result_error(self.upstream.name, what, problem)
        return raw, version

    async def _rounds(
        self,
        client: Client,
        plan: CallPlan,
        arguments: dict[str, Any],
        progress: ProgressFn | None,
        raw: Any,
        logs: bool,
    ) -> Any:
        """A 2026 upstream's input-required rounds (SEP-2322), driven on the call that got them: each
        round's requests are answered as the upstream's other requests are (the calling client, in
        the inbound call's context, or the policy's fallback), and the same call is sent again with
        the answers and the upstream's `requestState`, never a fresh call through another client."""
        caller = current_call()
        state_only_wait = _STATE_ONLY_WAIT
        for _ in range(MAX_INPUT_ROUNDS):
            if not methods.is_input_required(raw):
                return raw
            interim = self._input_required(plan, raw)
            extra: dict[str, Any] = {}
            if interim.input_requests:
                state_only_wait = _STATE_ONLY_WAIT
                answers = await answer_inputs(client, interim.input_requests)
                extra["inputResponses"] = {key: _dumped(answer) for key, answer in answers.items()}
            else:
                await anyio.sleep(state_only_wait)
                state_only_wait = min(state_only_wait * 2, _STATE_ONLY_WAIT_CAP)
            if interim.request_state is not None:
                extra["requestState"] = interim.request_state
            lane = self.upstream.lane
            if lane is None:  # the connection is closing under us
                raise MCPError(code=CONNECTION_CLOSED, message="Connection closed")
            raw = await lane.call(client, plan.tool, arguments, progress, logs=logs, caller=caller, extra=extra)
        raise UpstreamError(
            f"upstream {self.upstream.name!r} kept asking for input on tool {plan.tool!r} for more than "
            f"{MAX_INPUT_ROUNDS} rounds; mcpmux gave up on the call",
            types.INTERNAL_ERROR,
        )

    def _input_required(self, plan: CallPlan, raw: Any) -> types.InputRequiredResult:
        try:
            return types.InputRequiredResult.model_validate(raw, by_name=False)
        except ValidationError as err:
            raise UpstreamError(
                f"upstream {self.upstream.name!r} asked for input on tool {plan.tool!r} in a form that is not "
                f"an input-required result: {err}",
                types.INTERNAL_ERROR,
            ) from None

    def _scope(self, scope: str | None) -> str | None:
        """Whose cache entries and flights a call may share: a session of clients' own keeps its own."""
        return scope if scope is not None else self.upstream.key

    def cached(self, plan: CallPlan, key: str, scope: str | None = None) -> RawResult | None:
        """A fresh cached result of a call whose plan caches (`key`: its canonical JSON arguments), a copy."""
        if plan.cache is None:
            return None
        cached = self.cache.get((self.upstream.name, plan.tool, key), scope=self._scope(scope))
        return None if cached is None else (loads(cached[0]), cached[1])

    def keep(self, plan: CallPlan, key: str, scope: str | None, raw: Any, version: str | None) -> None:
        """Cache a result where the plan says so: never an error, nor what is no `CallToolResult`.

        It is kept as JSON text: each hit reads a copy of its own (which a caller may shape in
        place), cheaper than copying the objects. A result of the SDK's model (`version` None) or of
        the commonest shape (`is_plain`) is known valid without reading it into the model."""
        rule = plan.cache
        if rule is None or not isinstance(raw, dict) or raw.get("isError"):
            return
        if version is not None and not is_plain(raw):
            try:
                self.result_model(plan.tool, raw, version)
            except UpstreamError:
                return  # not kept: each caller's answer says what is wrong with it
        name = self.upstream.name
        entry = (dumps(raw), version)
        self.cache.put((name, plan.tool, key), entry, scope=self._scope(scope), ttl=rule.ttl, tags=(name,))

    def result_model(self, tool: str, raw: Any, version: str | None) -> types.CallToolResult:
        """A raw result read as the SDK's model, as the SDK's client reads it; an `UpstreamError`
        (internal error) saying what is wrong with one that is no `CallToolResult`."""
        try:
            if version is None:
                return types.CallToolResult.model_validate(raw, by_name=False)
            result = methods.parse_server_result("tools/call", version, raw)
        except (ValidationError, ValueError, KeyError) as err:
            problem = f"upstream {self.upstream.name!r} answered tool {tool!r} with an invalid result: {err}"
            raise UpstreamError(problem, types.INTERNAL_ERROR) from None
        if not isinstance(result, types.CallToolResult):
            problem = f"upstream {self.upstream.name!r} answered tool {tool!r} with a {type(result).__name__}"
            raise UpstreamError(problem, types.INTERNAL_ERROR)
        return result

    def _raw_upstream(self, plan: CallPlan) -> bool:
        """Whether the call goes over the lane as raw JSON: not where only the SDK's client writes the
        request right (an argument mirrored into an `Mcp-Param` header), nor with `[mux] fast_path = false`,
        which keeps the SDK on both sides of every call."""
        return self.mux().fast_path and not plan.param_headers

    def _send_modelled(
        self, client: Client, plan: CallPlan, arguments: dict[str, Any], progress: ProgressFn | None
    ) -> Awaitable[types.CallToolResult]:
        if plan.as_task:
            lane, timeout_ms = self.upstream.lane, int(self.upstream.timeout * 1000)
            return call_as_task(client, lane, plan.tool, arguments, progress, timeout_ms)
        return client.call_tool(plan.tool, arguments, progress_callback=progress)

    async def _gated(self, tool: str, arguments: dict[str, Any], priority: int) -> types.CallToolResult:
        """A list-form batch's one call of the batch tool (the SDK's client sends it)."""
        async with self.slot(priority):
            logger.debug("upstream call sent: %s", tool)

            def send(client: Client) -> Awaitable[types.CallToolResult]:
                return client.call_tool(tool, arguments)

            result: types.CallToolResult = await self.upstream.request(f"tool {tool!r}", send)
            logger.debug("upstream call answered: %s%s", tool, " (isError)" if result.is_error else "")
            return result

    def slot(self, priority: int) -> AbstractAsyncContextManager[None]:
        """One admission through this upstream's gate (limits, queue) for the body of the `async with`."""
        return self.gate.slot(priority=priority, deadline=self.queue_deadline())

    def queue_deadline(self) -> float:
        """When a call asking for admission now stops waiting: `queue_timeout`, else the call timeout, from now."""
        limit = self.upstream.config.limits.queue_timeout
        return deadline_in(limit if limit is not None else self.upstream.timeout)

    def _batch_caller(self, form: BatchForm) -> Any:
        async def call_batch(items: list[BatchItem]) -> list[types.CallToolResult | BaseException]:
            groups: dict[str, list[int]] = {}
            for index, (key, _others, _value) in enumerate(items):
                groups.setdefault(key, []).append(index)
            results: list[types.CallToolResult | BaseException] = [RuntimeError("unanswered")] * len(items)
            for indices in groups.values():
                arguments = {**items[indices[0]][1], form.list_argument: [items[i][2] for i in indices]}
                try:
                    merged = await self._gated(form.batch_tool, arguments, self.plan(form.batch_tool).priority)
                    parts: Sequence[types.CallToolResult | BaseException] = split_batch_result(
                        merged, len(indices), form
                    )
                except Exception as err:  # the whole group fails together, each caller hears why
                    parts = [err] * len(indices)
                for index, part in zip(indices, parts, strict=True):
                    results[index] = part
            return results

        return call_batch


def personal_to() -> str | None:
    """The client the answer the running call just got is personal to: its own, if the upstream asked
    it something for it (an elicitation, its roots); None when anyone may share it."""
    call = current_call()
    if call is None or not call.asked:
        return None
    return call.caller.client or ""


def _client() -> str | None:
    """The identity of the running call's client ("" for a call of nobody's)."""
    call = current_call()
    return (call.caller.client or "") if call is not None else ""


def _dumped(answer: types.InputResponse) -> Any:
    return answer.model_dump(by_alias=True, mode="json", exclude_none=True)


def _is_error(raw: Any) -> bool:
    return isinstance(raw, dict) and raw.get("isError") is True


def created_task(raw: Any) -> bool:
    """Whether a task-augmented call was answered with the upstream's task (it may also just answer)."""
    return isinstance(raw, dict) and isinstance(raw.get("task"), dict) and "content" not in raw


def split_batch_result(merged: types.CallToolResult, count: int, form: BatchForm) -> list[types.CallToolResult]:
    """One result per item: `structuredContent[result_key]` as a list, else one content block per item.

    An error result, or one whose shape does not match `count` items, is given to every caller whole,
    marked as an error that says what was expected.
    """
    if merged.is_error:
        return [merged] * count
    structured = merged.structured_content or {}
    items = structured.get(form.result_key)
    if isinstance(items, list) and len(items) == count:
        return [
            types.CallToolResult(
                content=[types.TextContent(type="text", text=item if isinstance(item, str) else json.dumps(item))],
                structured_content={"result": item},
            )
            for item in items
        ]
    if len(merged.content) == count:
        return [types.CallToolResult(content=[block]) for block in merged.content]
    problem = types.TextContent(
        type="text",
        text=(
            f"{form.batch_tool} answered {count} items with neither structuredContent[{form.result_key!r}] as a "
            f"list of {count} nor {count} content blocks; check the [[batch]] entry for {form.tool}"
        ),
    )
    return [types.CallToolResult(content=[problem, *merged.content], is_error=True)] * count
