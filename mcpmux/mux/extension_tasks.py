"""Tasks for 2026-07-28 clients (the `io.modelcontextprotocol/tasks` extension): a client that declared
the extension on its `tools/call` may be answered with a task of mcpmux's, which it follows with
`tasks/get`, `tasks/update` and `tasks/cancel`.

mcpmux makes a task where an upstream would: a 2025-11-25 upstream's tool that runs only as a
task (`execution.taskSupport = "required"`), and any tool of a 2026-07-28 upstream that declared
the extension, called declaring it. The upstream's task is adopted under an id of mcpmux's,
`<upstream>.<random>` (128 random bits: the id is as good as a bearer token), owned by the client
that created it (`owner`, the front's word for who a sessionless request is); another owner's id,
or one mcpmux never gave out, is "not found", exactly as an id that never existed.

- A 2026 upstream's task is relayed: each request goes to the upstream under its own id, declaring
  the extension, and its answer comes back under mcpmux's (`inputRequests` and `tasks/update` too).
- A 2025 upstream's task is followed (`mcpmux.mux.followed_task`): mcpmux waits for its result
  itself, and answers `tasks/get`, `tasks/update` and `tasks/cancel` from what it knows and asks.

Tasks are kept for the most recent `MAX_TASKS`.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import mcp_types as types
from anyio.abc import TaskGroup
from cachetools import LRUCache
from mcp import Client
from mcp.shared.exceptions import MCPError

from mcpmux.core.call_plan import CallPlan
from mcpmux.core.inbound import ClientRequest
from mcpmux.errors import UpstreamError
from mcpmux.mux.dispatcher import UpstreamDispatcher, created_task
from mcpmux.mux.followed_task import FollowedTask, related_task
from mcpmux.upstream import task_extension as wire
from mcpmux.upstream.supervisor import Upstream

MAX_TASKS = 10_000
TTL_MS = 3_600_000
"""How long mcpmux asks a 2025 upstream to keep a task it follows for a 2026 client."""
SERVER_INFO = "io.modelcontextprotocol/serverInfo"


class ResultNames(Protocol):
    """Names a server's `ui://` URIs in a tool's result as clients see them (the catalog does)."""

    def name_result(self, server: str, result: types.CallToolResult) -> types.CallToolResult: ...
    def name_raw_result(self, server: str, result: Any) -> None: ...


@dataclass(slots=True)
class _Relayed:
    task_id: str
    """mcpmux's id."""
    upstream: str
    upstream_id: str
    owner: str
    followed: FollowedTask | None = None
    """A 2025 upstream's task, which mcpmux follows (None: a 2026 upstream's, relayed)."""


def _own(answer: dict[str, Any], task_id: str) -> dict[str, Any]:
    """An upstream's task answer as mcpmux's: under mcpmux's id, without the upstream's serverInfo stamp."""
    return {**wire.without_meta(answer, SERVER_INFO), "taskId": task_id}


class ExtensionTasks:
    """The tasks 2026-07-28 clients created through mcpmux, and the requests about them."""

    def __init__(self, upstreams: Mapping[str, Upstream], names: ResultNames) -> None:
        self._upstreams = upstreams
        self._names = names
        self._tasks: LRUCache[str, _Relayed] = LRUCache(maxsize=MAX_TASKS)
        self._following: dict[tuple[str, str], FollowedTask] = {}
        """The followed tasks not ended yet, by upstream and the upstream's id (their requests come so)."""
        self._group: TaskGroup | None = None

    def start(self, group: TaskGroup) -> None:
        """Follow 2025 upstreams' tasks in `group` (the Mux's): they end with it."""
        self._group = group

    async def call(
        self,
        owner: str,
        upstream: Upstream,
        dispatcher: UpstreamDispatcher,
        plan: CallPlan,
        arguments: dict[str, Any],
        asks: types.ClientCapabilities | None = None,
    ) -> dict[str, Any] | None:
        """`tools/call` for `owner`, who declared the extension, to a tool that may run as a task: a
        `CreateTaskResult` under mcpmux's id, or the upstream's result when it answered at once.
        `asks`: what the client declared it can be asked (elicitation, during a followed task).

        None when a 2026 upstream asked for input first (an input-required result): the caller runs
        the call as a plain one, whose rounds reach the client. Raises as `Upstream.request` does.
        """
        if wire.offered(upstream.client):
            return await self._relayed_call(owner, upstream, dispatcher, plan, arguments)
        raw, _version = await dispatcher.run(plan, arguments, None, priority=plan.priority, task={"ttl": TTL_MS})
        if not created_task(raw):
            answer: dict[str, Any] = raw
            self._names.name_raw_result(upstream.name, answer)
            return answer  # the upstream ran it at once, as the spec allows
        client = upstream.client
        if self._group is None or client is None:
            raise MCPError(code=types.INTERNAL_ERROR, message="mcpmux is not serving tasks (it is shutting down)")
        task = wire.from_legacy(raw["task"])
        followed = FollowedTask(upstream, client, task, asks)
        relayed = self._adopt(owner, upstream.name, followed.upstream_id, followed)
        self._group.start_soon(self._follow, followed)
        return {"resultType": "task", **task, "taskId": relayed.task_id}

    async def _relayed_call(
        self, owner: str, upstream: Upstream, dispatcher: UpstreamDispatcher, plan: CallPlan, arguments: dict[str, Any]
    ) -> dict[str, Any] | None:
        sent: list[Client] = []

        async def send(client: Client) -> dict[str, Any]:
            sent.append(client)
            return await wire.request(client, "tools/call", {"name": plan.tool, "arguments": arguments})

        async with dispatcher.slot(plan.priority):
            raw = await upstream.request(f"tool {plan.tool!r}", send)
        if raw.get("resultType") == "task":
            if not isinstance(raw.get("taskId"), str):
                problem = f"upstream {upstream.name!r} answered tool {plan.tool!r} with a task that has no taskId"
                raise UpstreamError(problem, types.INTERNAL_ERROR)
            relayed = self._adopt(owner, upstream.name, raw["taskId"], None)
            return _own(raw, relayed.task_id)
        if raw.get("resultType") == "input_required":
            return None
        checked, _version = await dispatcher.checked(plan, arguments, None, raw, sent[-1].protocol_version)
        answer: dict[str, Any] = checked
        self._names.name_raw_result(upstream.name, answer)
        return answer

    def _adopt(self, owner: str, upstream: str, upstream_id: str, followed: FollowedTask | None) -> _Relayed:
        relayed = _Relayed(f"{upstream}.{secrets.token_hex(16)}", upstream, upstream_id, owner, followed)
        self._tasks[relayed.task_id] = relayed
        return relayed

    async def get(self, owner: str, task_id: str) -> dict[str, Any]:
        """`tasks/get`: the task as it is now (a DetailedTask, `resultType: "complete"`)."""
        relayed = self._find(owner, task_id)
        if relayed.followed is None:
            task = _own(await self._ask(relayed, "tasks/get", {"taskId": relayed.upstream_id}), task_id)
        else:
            task = {"resultType": "complete", **await relayed.followed.get(), "taskId": task_id}
        if isinstance(task.get("result"), dict):  # a completed task's tool result, as its tools/call's
            self._names.name_raw_result(relayed.upstream, task["result"])
        return task

    async def update(self, owner: str, task_id: str, responses: dict[str, Any]) -> dict[str, Any]:
        """`tasks/update`: the client's answers to the task's `inputRequests`; an acknowledgement."""
        relayed = self._find(owner, task_id)
        if relayed.followed is None:
            await self._ask(relayed, "tasks/update", {"taskId": relayed.upstream_id, "inputResponses": responses})
        else:
            relayed.followed.update(responses)
        return {"resultType": "complete"}

    async def cancel(self, owner: str, task_id: str) -> dict[str, Any]:
        """`tasks/cancel`: asked of the upstream; an acknowledgement (the task may still end otherwise)."""
        relayed = self._find(owner, task_id)
        if relayed.followed is None:
            await self._ask(relayed, "tasks/cancel", {"taskId": relayed.upstream_id})
        else:
            await relayed.followed.cancel()
        return {"resultType": "complete"}

    def following(self, upstream: str, request: ClientRequest) -> FollowedTask | None:
        """The followed task an upstream's request is for, if any: only its client may be asked it."""
        upstream_id = related_task(request)
        return self._following.get((upstream, upstream_id)) if upstream_id is not None else None

    def _find(self, owner: str, task_id: str) -> _Relayed:
        relayed = self._tasks.get(task_id)
        if relayed is None or relayed.owner != owner:
            raise wire.not_found(task_id)
        return relayed

    async def _ask(self, relayed: _Relayed, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """A 2026 upstream's answer to one request about a relayed task."""
        upstream = self._upstream(relayed)

        async def send(client: Client) -> dict[str, Any]:
            return await wire.request(client, method, params)

        answer: dict[str, Any] = await upstream.request(f"{method} for task {relayed.upstream_id!r}", send)
        return answer

    def _upstream(self, relayed: _Relayed) -> Upstream:
        upstream = self._upstreams.get(relayed.upstream)
        if upstream is None:
            gone = f"Failed to retrieve task: Task not found (its upstream {relayed.upstream!r} is gone)"
            raise MCPError(code=types.INVALID_PARAMS, message=gone)
        return upstream

    async def _follow(self, followed: FollowedTask) -> None:
        key = (followed.upstream.name, followed.upstream_id)
        self._following[key] = followed
        try:
            await followed.follow()
        finally:
            del self._following[key]
