"""Tasks (2025-11-25) relayed between clients and upstreams: the client sees mcpmux's task ids only.

A client's task-augmented `tools/call` goes to the tool's upstream as it came, raw (the fast path:
the SDK's server would refuse a `CreateTaskResult` where a `CallToolResult` belongs), and the task
the upstream created is adopted here under a new id, `<upstream>.<random>`, owned by the client
that created it. `tasks/get`, `tasks/result` and `tasks/cancel` name that id and are passed on to
the upstream under its own; `tasks/list` lists the caller's tasks. Another client's task id, or
one mcpmux never gave out, is "not found", exactly as an id that never existed: nothing tells a
client that another's task exists. An upstream's `notifications/tasks/status` goes to the task's
owner alone, under mcpmux's id (`listener`, set by the front that can reach the owner). Ids are
kept for the most recent `MAX_TASKS` tasks.

2026-07-28 clients' tasks (the tasks extension) are `extension`'s (`mcpmux.mux.extension_tasks`).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from anyio.abc import TaskGroup
from cachetools import LRUCache
from mcp.shared.exceptions import MCPError

from mcpmux.errors import MuxError
from mcpmux.mux.extension_tasks import ExtensionTasks, ResultNames
from mcpmux.upstream.supervisor import Upstream
from mcpmux.upstream.tasks import with_related_task

logger = logging.getLogger(__name__)

MAX_TASKS = 10_000

StatusListener = Callable[[str, dict[str, Any]], Awaitable[None]]
"""Sends `notifications/tasks/status` with these params to the client that owns the task (its owner id)."""


@dataclass(frozen=True, slots=True)
class _Adopted:
    upstream: str
    upstream_id: str
    owner: str


class TaskRelay:
    """The tasks clients created through mcpmux, and the requests about them."""

    def __init__(self, upstreams: Mapping[str, Upstream], names: ResultNames) -> None:
        self._upstreams = upstreams
        self._names = names
        self._tasks: LRUCache[str, _Adopted] = LRUCache(maxsize=MAX_TASKS)
        self._ids: LRUCache[tuple[str, str], str] = LRUCache(maxsize=MAX_TASKS)
        """mcpmux's id for each (upstream, the upstream's task id)."""
        self.listener: StatusListener | None = None
        self.extension = ExtensionTasks(upstreams, names)
        """The tasks 2026-07-28 clients created (the `io.modelcontextprotocol/tasks` extension)."""

    def start(self, group: TaskGroup) -> None:
        """Run what follows tasks in `group` (the Mux's task group): it ends with the Mux."""
        self.extension.start(group)

    def adopt(self, upstream: str, created: dict[str, Any], owner: str) -> dict[str, Any]:
        """An upstream's raw `CreateTaskResult` for `owner`'s call, as the client gets it: under mcpmux's id."""
        task = dict(created["task"])
        task_id = f"{upstream}.{secrets.token_hex(12)}"
        self._tasks[task_id] = _Adopted(upstream, str(task["taskId"]), owner)
        self._ids[(upstream, str(task["taskId"]))] = task_id
        task["taskId"] = task_id
        return {**created, "task": task}

    async def status(self, upstream: str, params: dict[str, Any]) -> None:
        """An upstream's `notifications/tasks/status`: to the task's owner under mcpmux's id, if it is a client's."""
        task_id = self._ids.get((upstream, str(params.get("taskId"))))
        adopted = self._tasks.get(task_id) if task_id is not None else None
        if adopted is None or self.listener is None:
            # Not a task a client created through mcpmux (one mcpmux runs for a "required" tool, say).
            logger.debug("upstream %r: status of task %r, which no client owns", upstream, params.get("taskId"))
            return
        await self.listener(adopted.owner, {**params, "taskId": task_id})

    async def get(self, owner: str, task_id: str) -> types.GetTaskResult:
        adopted = self._find(owner, task_id)
        request = types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=adopted.upstream_id))
        result = await self._ask(adopted, request, types.GetTaskResult)
        return result.model_copy(update={"task_id": task_id})

    async def result(self, owner: str, task_id: str) -> types.CallToolResult:
        """The tool's result once its task ends (the upstream holds the request until then)."""
        adopted = self._find(owner, task_id)
        request = types.GetTaskPayloadRequest(params=types.GetTaskPayloadRequestParams(task_id=adopted.upstream_id))
        result: types.CallToolResult = await self._ask(adopted, request, types.CallToolResult)
        return with_related_task(self._names.name_result(adopted.upstream, result), task_id)

    async def cancel(self, owner: str, task_id: str) -> types.CancelTaskResult:
        adopted = self._find(owner, task_id)
        request = types.CancelTaskRequest(params=types.CancelTaskRequestParams(task_id=adopted.upstream_id))
        result = await self._ask(adopted, request, types.CancelTaskResult)
        return result.model_copy(update={"task_id": task_id})

    async def list(self, owner: str) -> types.ListTasksResult:
        """The caller's tasks that their upstreams still know, newest last."""
        tasks: list[types.Task] = []
        for task_id, adopted in list(self._tasks.items()):
            if adopted.owner != owner:
                continue
            try:
                found = await self.get(owner, task_id)
            except (MCPError, MuxError):
                continue  # expired upstream (its ttl ran out) or gone with its upstream
            tasks.append(types.Task.model_validate(found.model_dump(by_alias=True, exclude={"meta"})))
        return types.ListTasksResult(tasks=tasks)

    def _find(self, owner: str, task_id: str) -> _Adopted:
        adopted = self._tasks.get(task_id)
        if adopted is None or adopted.owner != owner:
            raise MCPError(code=types.INVALID_PARAMS, message=f"Task not found: {task_id}")
        return adopted

    async def _ask(self, adopted: _Adopted, request: Any, result_type: type[Any]) -> Any:
        upstream = self._upstreams.get(adopted.upstream)
        if upstream is None:
            gone = f"Task not found: its upstream {adopted.upstream!r} is gone"
            raise MCPError(code=types.INVALID_PARAMS, message=gone)
        return await upstream.request(
            f"{request.method} for task {adopted.upstream_id!r}",
            lambda client: client.session.send_request(request, result_type),
        )
