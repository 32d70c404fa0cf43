"""The road every tool call to one upstream takes:

    result cache ▶ single-flight (coalescing) ▶ list-form batcher ▶ admission gate ▶ upstream session

What each step does for a tool is its `CallPlan` (`mcpmux.core.call_plan`), built once per listing.

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

import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import Any

import mcp_types as types
from mcp import Client

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
from mcpmux.core.metrics import CallObserver, outcome_of
from mcpmux.core.server_policy import BatchForm
from mcpmux.errors import error_result
from mcpmux.upstream.lane import ProgressFn
from mcpmux.upstream.supervisor import Upstream
from mcpmux.upstream.tasks import call_as_task

BatchItem = tuple[str, dict[str, Any], Any]  # (key of the other arguments, the other arguments, the varying value)
logger = logging.getLogger(__name__)


class UpstreamDispatcher:
    """Schedules, coalesces, caches and batches the calls to one upstream."""

    def __init__(
        self,
        upstream: Upstream,
        cache: ResultCache[types.CallToolResult],
        mux: Callable[[], MuxSettings],
        observe: CallObserver | None = None,
    ) -> None:
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
        self.gate = AdmissionGate(
            GatePolicy(
                max_concurrency=settings.max_concurrency,
                rate=settings.rate or None,
                burst=settings.burst,
                queue=queue,
            ),
            name=f"upstream {upstream.name}",
        )
        self.single_flight: SingleFlight[tuple[str | None, str, str], types.CallToolResult] = SingleFlight(
            name=f"coalescing for {upstream.name!r}"
        )
        self.raw_flights: SingleFlight[tuple[str, str], tuple[Any, str | None]] = SingleFlight(
            name=f"coalescing of raw calls for {upstream.name!r}"
        )
        """The fast path's flights: (tool, canonical arguments) -> the raw result and its revision."""
        self.batchers: dict[str, DynamicBatcher[BatchItem, types.CallToolResult]] = {}
        for form in upstream.config.batch:
            policy = BatchPolicy(
                max_batch_size=form.max_batch_size, max_delay=form.max_delay, mode=form.mode, max_concurrent_batches=4
            )
            batcher = DynamicBatcher(self._batch_caller(form), policy, name=f"{upstream.name}/{form.batch_tool}")
            self.batchers[form.tool] = batcher

    async def start(self, stack: AsyncExitStack) -> None:
        """Enter the parts that own tasks; they end when `stack` closes."""
        await stack.enter_async_context(self.single_flight)
        await stack.enter_async_context(self.raw_flights)
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
    ) -> types.CallToolResult:
        """Call `tool` (its upstream name) through cache, coalescing, batching and the gate.

        The call's priority is the tool's (`[servers.X.priorities]`) plus the caller's `client_priority`.
        """
        started = time.perf_counter()
        outcome = "error"
        try:
            result = await self._call_tool(tool, arguments, progress, client, client_priority)
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
    ) -> types.CallToolResult:
        plan = self.plan(tool)
        priority = plan.priority + client_priority
        if not plan.shares:
            return await self._send(plan, arguments, progress, priority)
        scope = client if plan.cache is not None and plan.cache.scope == "client" else None
        key = (self.upstream.name, tool, canonical_json(arguments))
        if plan.cache is not None:
            cached = self.cache.get(key, scope=scope)
            if cached is not None:
                return cached
        result = await self.single_flight.call(
            (scope, tool, key[2]), lambda: self._send(plan, arguments, progress, priority)
        )
        if plan.cache is not None and not result.is_error:
            self.cache.put(key, result, scope=scope, ttl=plan.cache.ttl, tags=(self.upstream.name,))
        return result

    async def _send(
        self, plan: CallPlan, arguments: dict[str, Any], progress: ProgressFn | None, priority: int
    ) -> types.CallToolResult:
        form, tool = plan.batch, plan.tool
        if form is not None and form.argument in arguments:
            batcher = self.batchers[tool]
            others = {k: v for k, v in arguments.items() if k != form.argument}
            item = (canonical_json(others), others, arguments[form.argument])
            # The batch call itself runs in the batcher's task, outside this request's log context.
            logger.debug("call joins a %s batch", form.batch_tool)
            return await batcher.submit(item, priority=priority, deadline=self.queue_deadline())
        return await self._gated(tool, arguments, progress, priority, as_task=plan.as_task)

    async def _gated(
        self, tool: str, arguments: dict[str, Any], progress: ProgressFn | None, priority: int, as_task: bool = False
    ) -> types.CallToolResult:
        upstream = self.upstream

        def send(client: Client) -> Awaitable[types.CallToolResult]:
            if as_task:
                return call_as_task(client, upstream.lane, tool, arguments, progress, int(upstream.timeout * 1000))
            return client.call_tool(tool, arguments, progress_callback=progress)

        async with self.slot(priority):
            logger.debug("upstream call sent: %s", tool)
            result: types.CallToolResult = await upstream.request(f"tool {tool!r}", send)
            logger.debug("upstream call answered: %s%s", tool, " (isError)" if result.is_error else "")
            return result

    def slot(self, priority: int) -> AbstractAsyncContextManager[None]:
        """One admission through this upstream's gate (limits, queue) for the body of the `async with`."""
        return self.gate.slot(priority=priority, deadline=self.queue_deadline())

    async def admit(self, priority: int) -> None:
        """Wait for one admission through this upstream's gate, as `slot` does; `gate.release()` gives it back."""
        await self.gate.acquire(priority=priority, deadline=self.queue_deadline())

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
                    merged = await self._gated(form.batch_tool, arguments, None, self.plan(form.batch_tool).priority)
                    parts: Sequence[types.CallToolResult | BaseException] = split_batch_result(
                        merged, len(indices), form
                    )
                except Exception as err:  # the whole group fails together, each caller hears why
                    parts = [err] * len(indices)
                for index, part in zip(indices, parts, strict=True):
                    results[index] = part
            return results

        return call_batch


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
