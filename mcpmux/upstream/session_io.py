"""Plumbing under `Upstream`: a transport that reports its own end, paginated listing, change listening."""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import anyio
import mcp_types as types
from anyio.abc import TaskGroup, TaskStatus
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from mcpmux.upstream.lane import UpstreamLane, complete_by_default, session_sender
from mcpmux.upstream.task_receiver import Answer, ClientTasks, declare

logger = logging.getLogger(__name__)

MAX_PAGES = 1000  # a paginator that never ends must not hang the listing


@dataclass(slots=True)
class Listing:
    """Everything one upstream offers, as it last reported it."""

    tools: list[types.Tool] = field(default_factory=list)
    resources: list[types.Resource] = field(default_factory=list)
    resource_templates: list[types.ResourceTemplate] = field(default_factory=list)
    prompts: list[types.Prompt] = field(default_factory=list)
    expires_at: float = math.inf
    """When the server's 2026 `ttlMs` says this listing goes stale (anyio clock); inf when it gave none."""
    tools_by_name: dict[str, types.Tool] = field(init=False)

    def __post_init__(self) -> None:
        self.tools_by_name = {tool.name: tool for tool in self.tools}


TaskStatusFn = Callable[[dict[str, Any]], Awaitable[None]]
"""Told the params of each `notifications/tasks/status` an upstream sends."""
TASK_STATUS = "notifications/tasks/status"


class _WatchedReadStream:
    """Delegates to the transport's read stream and sets `ended` when the stream ends.

    Messages that answer a fast-path call are handed to the `lane` instead (see `mcpmux.upstream.lane`);
    on stdio, mcpmux's transport already took them off the wire. `notifications/tasks/status`, which
    the SDK's client session drops (its tables leave it out), goes to `task_status`.
    """

    def __init__(
        self,
        inner: Any,
        ended: anyio.Event,
        lane: UpstreamLane | None = None,
        task_status: TaskStatusFn | None = None,
        tasks: ClientTasks | None = None,
    ) -> None:
        self._inner = inner
        self._ended = ended
        self._lane = lane
        self._task_status = task_status
        self._tasks = tasks

    def __getattr__(self, name: str) -> Any:  # e.g. `last_context`, read by the SDK's dispatcher
        return getattr(self._inner, name)

    async def receive(self) -> Any:
        try:
            while True:
                if self._lane is not None:
                    self._lane.caught_up()
                item = await self._inner.receive()
                if self._lane is not None and self._lane.divert(item):
                    continue
                message = getattr(item, "message", None)
                if isinstance(message, types.JSONRPCResponse) and isinstance(message.result, dict):
                    complete_by_default(message.result)
                if self._task_status is not None and getattr(message, "method", None) == TASK_STATUS:
                    await self._task_status(getattr(message, "params", None) or {})
                    continue
                if self._tasks is not None and isinstance(message, types.JSONRPCRequest):
                    request = {"id": message.id, "method": message.method, "params": message.params}
                    if await self._tasks.take(request):
                        continue
                return item
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._end()
            raise

    def _end(self) -> None:
        self._ended.set()
        if self._lane is not None:
            self._lane.close()

    async def aclose(self) -> None:
        self._end()
        await self._inner.aclose()

    def __aiter__(self) -> _WatchedReadStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _WatchedReadStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class _DeclaringWriteStream:
    """The transport's write stream, with mcpmux's task capability added to the `initialize` it carries."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def send(self, item: SessionMessage) -> None:
        message = item.message
        if isinstance(message, types.JSONRPCRequest) and message.method == "initialize":
            data = declare(message.model_dump(by_alias=True, mode="json", exclude_none=True))
            item = SessionMessage(types.jsonrpc_message_adapter.validate_python(data), metadata=item.metadata)
        await self._inner.send(item)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _DeclaringWriteStream:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        result: bool | None = await self._inner.__aexit__(*exc)
        return result


class WatchedTransport:
    """Wraps an SDK transport so that the end of its read stream (a dead child, a dropped server) is seen.

    With `answer_task`, the session takes sampling and elicitation as tasks (`mcpmux.upstream.task_receiver`).
    """

    def __init__(
        self,
        inner: AbstractAsyncContextManager[Any],
        ended: anyio.Event,
        lane: UpstreamLane | None = None,
        task_status: TaskStatusFn | None = None,
        answer_task: Answer | None = None,
    ) -> None:
        self._inner = inner
        self._ended = ended
        self._lane = lane
        self._task_status = task_status
        self._answer_task = answer_task
        self._group: TaskGroup | None = None

    async def __aenter__(self) -> tuple[Any, Any]:
        read_stream, write_stream = await self._inner.__aenter__()
        if self._lane is not None and self._lane.send is None:  # mcpmux's stdio transport attached its own
            self._lane.attach(session_sender(write_stream))
        tasks = None
        if self._answer_task is not None:
            self._group = anyio.create_task_group()
            await self._group.__aenter__()
            send = session_sender(write_stream)
            tasks = ClientTasks(self._answer_task, lambda message: send(message, None), self._group)
            write_stream = _DeclaringWriteStream(write_stream)
        return _WatchedReadStream(read_stream, self._ended, self._lane, self._task_status, tasks), write_stream

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        self._ended.set()
        if self._lane is not None:
            self._lane.close()
        if self._group is not None:
            self._group.cancel_scope.cancel()
            await self._group.__aexit__(None, None, None)
        return await self._inner.__aexit__(exc_type, exc, tb)


async def _all_pages(fetch: Callable[[str | None], Awaitable[Any]], attr: str, ttls: list[int]) -> list[Any]:
    """Every page of one list; a server that does not implement the list (-32601) has none.

    Each page's `ttlMs`, where the server sent one, is appended to `ttls`.
    """
    items: list[Any] = []
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        try:
            page = await fetch(cursor)
        except MCPError as err:
            if err.error.code == types.METHOD_NOT_FOUND:
                return items
            raise
        if "ttl_ms" in page.model_fields_set:
            ttls.append(page.ttl_ms)
        items.extend(getattr(page, attr))
        cursor = page.next_cursor
        if not cursor:
            break
    return items


async def fetch_listing(client: Client) -> Listing:
    """Every page of tools, resources, templates and prompts the server advertises."""
    caps = client.server_capabilities
    fetched_at = anyio.current_time()
    ttls: list[int] = []
    tools: list[types.Tool] = []
    resources: list[types.Resource] = []
    templates: list[types.ResourceTemplate] = []
    prompts: list[types.Prompt] = []
    if caps.tools is not None:
        tools = await _all_pages(lambda c: client.list_tools(cursor=c, cache_mode="refresh"), "tools", ttls)
    if caps.resources is not None:
        resources = await _all_pages(lambda c: client.list_resources(cursor=c, cache_mode="refresh"), "resources", ttls)
        templates = await _all_pages(
            lambda c: client.list_resource_templates(cursor=c, cache_mode="refresh"), "resource_templates", ttls
        )
    if caps.prompts is not None:
        prompts = await _all_pages(lambda c: client.list_prompts(cursor=c, cache_mode="refresh"), "prompts", ttls)
    expires_at = fetched_at + min(ttls) / 1000 if ttls else math.inf
    return Listing(
        tools=tools, resources=resources, resource_templates=templates, prompts=prompts, expires_at=expires_at
    )


ACK_WAIT = 2.0
"""Seconds an upstream's readiness waits for its `subscriptions/listen` acknowledgement."""


async def listen_for_changes(
    client: Client, refresh: Callable[[], Awaitable[None]], *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    """On a 2026-07-28 session, list changes arrive on a `subscriptions/listen` stream.

    Reports started once the server acknowledged the subscription (or refused it), so a listing
    fetched after that cannot miss a change; but never later than `ACK_WAIT` seconds: an answer that
    never arrives (a server that writes its acknowledgement into an `application/json` body it never
    finishes) must not hold the upstream's readiness. An acknowledgement that comes after that
    refreshes the listing once, for the change that may have fallen between the two.
    """
    acknowledged, gave_up = anyio.Event(), anyio.Event()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(_listen, client, refresh, acknowledged, gave_up)
        with anyio.move_on_after(ACK_WAIT):
            await acknowledged.wait()
        if not acknowledged.is_set():
            gave_up.set()
            logger.debug("upstream has not acknowledged subscriptions/listen in %gs; going on without it", ACK_WAIT)
        task_status.started()


async def _listen(
    client: Client, refresh: Callable[[], Awaitable[None]], acknowledged: anyio.Event, gave_up: anyio.Event
) -> None:
    try:
        async with client.listen(
            tools_list_changed=True, prompts_list_changed=True, resources_list_changed=True
        ) as subscription:
            acknowledged.set()
            if gave_up.is_set():
                await refresh()
            events: AsyncIterator[Any] = subscription.__aiter__()
            async for _event in events:
                await refresh()
    except (MCPError, RuntimeError, TimeoutError) as err:
        # Servers that do not implement listen simply never announce changes; that is their right.
        logger.debug("upstream does not offer subscriptions/listen: %s", err)
    finally:
        acknowledged.set()
