"""Tasks mcpmux runs as a client (2025-11-25): an upstream's task-augmented sampling or elicitation.

mcpmux declares upstream, on a 2025-11-25 session, that it takes `sampling/createMessage` and
`elicitation/create` as tasks (with `tasks/list` and `tasks/cancel`), so a server can ask for
either as a task and poll for it (server-everything's `-async` tools, hidden from a client that
does not declare it). The SDK's client session knows no task request, so they are answered here,
on the transport, before the session reads them:

- a request with `task` is answered at once with a `CreateTaskResult`; its work, the same answer an
  ordinary request gets (the calling client, or the upstream's fallback), runs in the background;
- `tasks/get`, `tasks/result` (held until the task ends: its result, or the error the request would
  have got), `tasks/list` and `tasks/cancel` on those tasks are answered here; an id this session
  never gave out is "not found";
- `notifications/tasks/status` tells the upstream when a task ends.

Tasks are kept for their ttl (at most `MAX_TTL_MS`) and at most `MAX_TASKS` at a time.
"""

from __future__ import annotations

import datetime
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
from anyio.abc import TaskGroup
from cachetools import TTLCache

logger = logging.getLogger(__name__)

MAX_TASKS = 1000
MAX_TTL_MS = 3_600_000
POLL_INTERVAL_MS = 500
CAPABILITY: dict[str, Any] = {
    "list": {},
    "cancel": {},
    "requests": {"sampling": {"createMessage": {}}, "elicitation": {"create": {}}},
}
"""`capabilities.tasks` as mcpmux declares it upstream."""
TASK_VERSION = "2025-11-25"
RELATED_TASK = "io.modelcontextprotocol/related-task"

Answer = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
"""Answers one request (method, params without `task`): its result, or raises `TaskFailed`."""
Write = Callable[[dict[str, Any]], Awaitable[None]]


class TaskFailed(Exception):
    """The request a task ran was answered with a JSON-RPC error."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error.get("message"))
        self.error = error


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


@dataclass(slots=True)
class _Task:
    task_id: str
    ttl: int
    created_at: str = field(default_factory=_now)
    last_updated_at: str = ""
    status: str = "working"
    status_message: str | None = None
    outcome: dict[str, Any] | None = None
    """The JSON-RPC `result` or `error` member tasks/result answers with."""
    done: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)

    def __post_init__(self) -> None:
        self.last_updated_at = self.created_at

    def describe(self) -> dict[str, Any]:
        state = {
            "taskId": self.task_id,
            "status": self.status,
            "createdAt": self.created_at,
            "lastUpdatedAt": self.last_updated_at,
            "ttl": self.ttl,
            "pollInterval": POLL_INTERVAL_MS,
        }
        if self.status_message is not None:
            state["statusMessage"] = self.status_message
        return state

    def end(self, status: str, outcome: dict[str, Any], message: str | None = None) -> None:
        self.status, self.outcome, self.status_message = status, outcome, message
        self.last_updated_at = _now()
        self.done.set()


def declare(message: dict[str, Any]) -> dict[str, Any]:
    """An outgoing `initialize` at 2025-11-25, with mcpmux's `capabilities.tasks` added."""
    params = message.get("params") or {}
    if message.get("method") != "initialize" or params.get("protocolVersion") != TASK_VERSION:
        return message
    capabilities = {**params.get("capabilities", {}), "tasks": CAPABILITY}
    return {**message, "params": {**params, "capabilities": capabilities}}


class ClientTasks:
    """The tasks one upstream session asked mcpmux to run (see the module's docstring)."""

    def __init__(self, answer: Answer, write: Write, group: TaskGroup) -> None:
        self._answer = answer
        self._write = write
        self._group = group
        self._tasks: TTLCache[str, _Task] = TTLCache(maxsize=MAX_TASKS, ttl=MAX_TTL_MS / 1000)

    async def take(self, message: dict[str, Any]) -> bool:
        """Answer `message` here if it is a task request of this module's; True when it was."""
        method, params, request_id = message.get("method"), message.get("params") or {}, message.get("id")
        if request_id is None or not isinstance(params, dict):
            return False
        if method in ("sampling/createMessage", "elicitation/create") and isinstance(params.get("task"), dict):
            await self._create(request_id, method, params)
        elif method == "tasks/get":
            await self._reply(request_id, lambda task: task.describe(), params)
        elif method == "tasks/cancel":
            await self._reply(request_id, self._cancel, params)
        elif method == "tasks/result":
            task = self._tasks.get(str(params.get("taskId")))
            if task is None:
                return False  # not ours: the session answers (-32601), as it does without tasks
            self._group.start_soon(self._result, request_id, task)
        elif method == "tasks/list":
            tasks = [task.describe() for task in list(self._tasks.values())]
            await self._respond(request_id, {"result": {"tasks": tasks}})
        else:
            return False
        return True

    async def _create(self, request_id: types.RequestId, method: str, params: dict[str, Any]) -> None:
        requested = params["task"].get("ttl")
        ttl = min(requested, MAX_TTL_MS) if isinstance(requested, int) and requested > 0 else MAX_TTL_MS
        task = _Task(f"mcpmux-{secrets.token_hex(12)}", ttl)
        self._tasks[task.task_id] = task
        await self._respond(request_id, {"result": {"task": task.describe()}})
        work = {key: value for key, value in params.items() if key != "task"}
        self._group.start_soon(self._run, task, method, work)

    async def _run(self, task: _Task, method: str, params: dict[str, Any]) -> None:
        with task.scope:
            try:
                result = await self._answer(method, params)
            except TaskFailed as failed:
                task.end("failed", {"error": failed.error}, failed.error.get("message"))
            except Exception as err:  # one task's failure must not end the session's transport
                logger.exception("task %s (%s) failed", task.task_id, method)
                message = f"mcpmux could not run the {method} task: {err}"
                task.end("failed", {"error": {"code": types.INTERNAL_ERROR, "message": message}}, message)
            else:
                meta = {**result.get("_meta", {}), RELATED_TASK: {"taskId": task.task_id}}
                task.end("completed", {"result": {**result, "_meta": meta}})
        if task.scope.cancelled_caught:
            return  # tasks/cancel ended it, and said so
        await self._notify(task)

    def _cancel(self, task: _Task) -> dict[str, Any]:
        if task.done.is_set():
            raise TaskFailed({"code": types.INVALID_PARAMS, "message": f"Task {task.task_id} already {task.status}"})
        task.scope.cancel()
        task.end("cancelled", {"error": {"code": types.INVALID_REQUEST, "message": "the task was cancelled"}})
        return task.describe()

    async def _result(self, request_id: types.RequestId, task: _Task) -> None:
        await task.done.wait()
        assert task.outcome is not None
        await self._respond(request_id, task.outcome)

    async def _reply(
        self, request_id: types.RequestId, reply: Callable[[_Task], dict[str, Any]], params: dict[str, Any]
    ) -> None:
        task = self._tasks.get(str(params.get("taskId")))
        if task is None:
            missing = {"code": types.INVALID_PARAMS, "message": f"Task not found: {params.get('taskId')}"}
            await self._respond(request_id, {"error": missing})
            return
        try:
            await self._respond(request_id, {"result": reply(task)})
        except TaskFailed as failed:
            await self._respond(request_id, {"error": failed.error})

    async def _notify(self, task: _Task) -> None:
        await self._write({"jsonrpc": "2.0", "method": "notifications/tasks/status", "params": task.describe()})

    async def _respond(self, request_id: types.RequestId, member: dict[str, Any]) -> None:
        await self._write({"jsonrpc": "2.0", "id": request_id, **member})
