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
- A 2025 upstream's task is followed: mcpmux asks for its result at once (`tasks/result`, held by
  the upstream until the task ends) in a task of the Mux's, keeps how it ended, and answers
  `tasks/get` from the upstream's `tasks/get` meanwhile, renamed to the extension's fields. The
  upstream's own requests during the task (an elicitation, asked while mcpmux waits) are answered
  as any request of that upstream outside a call is; its `input_required` shows as `working`, as
  mcpmux, not the client, is answering it.

Tasks are kept for the most recent `MAX_TASKS`.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
from anyio.abc import TaskGroup
from cachetools import LRUCache
from mcp import Client
from mcp.shared.exceptions import MCPError

from mcpmux.core.call_plan import CallPlan
from mcpmux.mux.dispatcher import UpstreamDispatcher, created_task
from mcpmux.upstream import task_extension as wire
from mcpmux.upstream.supervisor import Upstream
from mcpmux.upstream.tasks import RELATED_TASK

logger = logging.getLogger(__name__)

MAX_TASKS = 10_000
TTL_MS = 3_600_000
"""How long mcpmux asks a 2025 upstream to keep a task it follows for a 2026 client."""
SETTLE_SECONDS = 5.0
"""How long `tasks/get` waits for how a task that ended upstream ended (its `tasks/result`)."""
SERVER_INFO = "io.modelcontextprotocol/serverInfo"


@dataclass(slots=True)
class _Relayed:
    task_id: str
    """mcpmux's id."""
    upstream: str
    upstream_id: str
    owner: str
    followed: Client | None = None
    """A 2025 upstream's session, where mcpmux follows the task (None: a 2026 upstream's task, relayed)."""
    state: dict[str, Any] = field(default_factory=dict)
    """A followed task's last known state upstream, in the extension's fields."""
    final: dict[str, Any] | None = None
    """How a followed task ended: the DetailedTask `tasks/get` answers with from then on."""
    ended: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)


def _own(answer: dict[str, Any], task_id: str) -> dict[str, Any]:
    """An upstream's task answer as mcpmux's: under mcpmux's id, without the upstream's serverInfo stamp."""
    meta = {key: value for key, value in (answer.get("_meta") or {}).items() if key != SERVER_INFO}
    shaped = {key: value for key, value in answer.items() if key != "_meta"}
    shaped["taskId"] = task_id
    return {**shaped, "_meta": meta} if meta else shaped


def _unrelated(result: dict[str, Any]) -> dict[str, Any]:
    """A 2025 result without its related-task `_meta`, which names the upstream's task (no 2026 field)."""
    meta = {key: value for key, value in (result.get("_meta") or {}).items() if key != RELATED_TASK}
    plain = {key: value for key, value in result.items() if key != "_meta"}
    return {**plain, "_meta": meta} if meta else plain


def _ended(state: dict[str, Any], outcome: dict[str, Any]) -> dict[str, Any]:
    """The DetailedTask of a followed task: its last state upstream, and what `tasks/result` gave."""
    status = state.get("status")
    if status not in wire.TERMINAL:  # the result came first: it says how the task ended
        status = "completed" if "result" in outcome else "failed"
    ended = {**state, "status": status}
    if status == "completed" and "result" in outcome:
        return {**ended, "result": _unrelated(outcome["result"])}
    if status == "failed":
        error = outcome.get("error") or {"code": types.INTERNAL_ERROR, "message": state.get("statusMessage", "failed")}
        return {**ended, "error": error}
    return ended


class ExtensionTasks:
    """The tasks 2026-07-28 clients created through mcpmux, and the requests about them."""

    def __init__(self, upstreams: Mapping[str, Upstream]) -> None:
        self._upstreams = upstreams
        self._tasks: LRUCache[str, _Relayed] = LRUCache(maxsize=MAX_TASKS)
        self._group: TaskGroup | None = None

    def start(self, group: TaskGroup) -> None:
        """Follow 2025 upstreams' tasks in `group` (the Mux's): they end with it."""
        self._group = group

    async def call(
        self, owner: str, upstream: Upstream, dispatcher: UpstreamDispatcher, plan: CallPlan, arguments: dict[str, Any]
    ) -> dict[str, Any] | None:
        """`tools/call` for `owner`, who declared the extension, to a tool that may run as a task: a
        `CreateTaskResult` under mcpmux's id, or the upstream's result when it answered at once.

        None when a 2026 upstream asked for input first (an input-required result): the caller runs
        the call as a plain one, whose rounds reach the client. Raises as `Upstream.request` does.
        """
        if wire.offered(upstream.client):
            return await self._relayed_call(owner, upstream, dispatcher, plan, arguments)
        raw, _version = await dispatcher.run(plan, arguments, None, priority=plan.priority, task={"ttl": TTL_MS})
        if not created_task(raw):
            answer: dict[str, Any] = raw
            return answer  # the upstream ran it at once, as the spec allows
        client = upstream.client
        if self._group is None or client is None:
            raise MCPError(code=types.INTERNAL_ERROR, message="mcpmux is not serving tasks (it is shutting down)")
        task = wire.from_legacy(raw["task"])
        relayed = self._adopt(owner, upstream.name, str(task["taskId"]), client)
        relayed.state = task
        self._group.start_soon(self._follow, relayed, task.get("ttlMs") or TTL_MS)
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
            relayed = self._adopt(owner, upstream.name, str(raw["taskId"]), None)
            return _own(raw, relayed.task_id)
        if raw.get("resultType") == "input_required":
            return None
        checked, _version = await dispatcher.checked(plan, arguments, None, raw, sent[-1].protocol_version)
        answer: dict[str, Any] = checked
        return answer

    def _adopt(self, owner: str, upstream: str, upstream_id: str, followed: Client | None) -> _Relayed:
        relayed = _Relayed(f"{upstream}.{secrets.token_hex(16)}", upstream, upstream_id, owner, followed)
        self._tasks[relayed.task_id] = relayed
        return relayed

    async def get(self, owner: str, task_id: str) -> dict[str, Any]:
        """`tasks/get`: the task as it is now (a DetailedTask, `resultType: "complete"`)."""
        relayed = self._find(owner, task_id)
        if relayed.followed is None:
            answer = await self._ask(relayed, "tasks/get", {"taskId": relayed.upstream_id})
            return _own(answer, task_id)
        if relayed.final is None:
            state = relayed.state = wire.from_legacy(await self._ask_legacy(relayed, "tasks/get"))
            if state.get("status") not in wire.TERMINAL:
                if state.get("status") == "input_required":
                    state["status"] = "working"  # mcpmux is answering the upstream's request itself
                return {"resultType": "complete", **state, "taskId": task_id}
            with anyio.move_on_after(SETTLE_SECONDS):
                await relayed.ended.wait()
            if relayed.final is None:
                return {"resultType": "complete", **state, "taskId": task_id}
        return {"resultType": "complete", **relayed.final, "taskId": task_id}

    async def update(self, owner: str, task_id: str, responses: dict[str, Any]) -> dict[str, Any]:
        """`tasks/update`: the client's answers to the task's `inputRequests`, passed on; an acknowledgement."""
        relayed = self._find(owner, task_id)
        if relayed.followed is None:
            params = {"taskId": relayed.upstream_id, "inputResponses": responses}
            await self._ask(relayed, "tasks/update", params)
        # A followed task never shows inputRequests (mcpmux answers its upstream's requests): nothing to take.
        return {"resultType": "complete"}

    async def cancel(self, owner: str, task_id: str) -> dict[str, Any]:
        """`tasks/cancel`: asked of the upstream; an acknowledgement (the task may still end otherwise)."""
        relayed = self._find(owner, task_id)
        if relayed.followed is None:
            await self._ask(relayed, "tasks/cancel", {"taskId": relayed.upstream_id})
        elif relayed.final is None:
            try:
                state = wire.from_legacy(await self._ask_legacy(relayed, "tasks/cancel"))
            except MCPError as err:
                if err.error.code != types.INVALID_PARAMS:
                    raise
                return {"resultType": "complete"}  # it ended before the cancel reached it: `tasks/get` says how
            if state.get("status") == "cancelled":
                relayed.final = state
                relayed.scope.cancel()
                relayed.ended.set()
        return {"resultType": "complete"}

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

    async def _ask_legacy(self, relayed: _Relayed, method: str) -> dict[str, Any]:
        """A 2025 upstream's answer to `tasks/get` or `tasks/cancel` on a followed task, on its session."""
        upstream = self._upstream(relayed)
        client = relayed.followed
        if client is None or client is not upstream.client:
            raise wire.not_found(relayed.upstream_id)  # the session it lived on is gone, and the task with it

        async def send(client: Client) -> dict[str, Any]:
            return await wire.legacy_request(client, method, {"taskId": relayed.upstream_id})

        answer: dict[str, Any] = await upstream.request(f"{method} for task {relayed.upstream_id!r}", send)
        return answer

    def _upstream(self, relayed: _Relayed) -> Upstream:
        upstream = self._upstreams.get(relayed.upstream)
        if upstream is None:
            gone = f"Failed to retrieve task: Task not found (its upstream {relayed.upstream!r} is gone)"
            raise MCPError(code=types.INVALID_PARAMS, message=gone)
        return upstream

    async def _follow(self, relayed: _Relayed, ttl_ms: int) -> None:
        """Wait for a 2025 upstream's task to end (`tasks/result`), and keep how it ended."""
        client = relayed.followed
        assert client is not None
        params = {"taskId": relayed.upstream_id}
        outcome: dict[str, Any] = {}
        with relayed.scope:
            with anyio.move_on_after(ttl_ms / 1000):
                try:
                    outcome = {"result": await wire.legacy_request(client, "tasks/result", params)}
                except MCPError as err:
                    outcome = {"error": err.error.model_dump(mode="json", exclude_none=True)}
                except Exception as err:  # one task's fault must not end the Mux's task group
                    logger.warning("following task %r of %r failed: %s", relayed.upstream_id, relayed.upstream, err)
                    outcome = {"error": {"code": types.INTERNAL_ERROR, "message": f"mcpmux lost the task: {err}"}}
            state = relayed.state
            try:
                state = wire.from_legacy(await wire.legacy_request(client, "tasks/get", params))
            except Exception as err:
                logger.debug("task %r of %r: no state after it ended: %s", relayed.upstream_id, relayed.upstream, err)
            if not outcome:
                message = f"upstream {relayed.upstream!r} did not end the task within its ttl ({ttl_ms} ms)"
                outcome = {"error": {"code": types.INTERNAL_ERROR, "message": message}}
            relayed.final = _ended(state, outcome)
            relayed.ended.set()
