"""A 2026-07-28 client of the tasks extension (`io.modelcontextprotocol/tasks`), on `mcp.Client`.

The SDK has no task types, but its client extensions (`mcp.client.extension`) let a client declare
the extension and claim the `resultType: "task"` shape of `tools/call`: `TasksExtension` does, and
resolves a task by polling `tasks/get` until it ends, as a task-aware host would. The requests of
the extension go out through the session, stamped as any other (`Mcp-Name` is the task id).
"""

from __future__ import annotations

from typing import Any, Literal

import anyio
import mcp_types as types
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError
from pydantic import ConfigDict, Field, TypeAdapter

EXTENSION = "io.modelcontextprotocol/tasks"
TERMINAL = ("completed", "failed", "cancelled")
_ANY: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])


class CreateTaskResult(types.Result):
    """The task handle a server answers in lieu of a `CallToolResult` (the schema's `CreateTaskResult`)."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = Field(alias="resultType")
    task_id: str = Field(alias="taskId")
    status: str
    created_at: str = Field(alias="createdAt")
    last_updated_at: str = Field(alias="lastUpdatedAt")
    ttl_ms: int | None = Field(alias="ttlMs")
    poll_interval_ms: int | None = Field(default=None, alias="pollIntervalMs")
    status_message: str | None = Field(default=None, alias="statusMessage")


class _TaskIdParams(types.RequestParams):
    task_id: str = Field(serialization_alias="taskId")


class _UpdateParams(_TaskIdParams):
    input_responses: dict[str, Any] = Field(serialization_alias="inputResponses")


class _GetTask(types.Request[_TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    name_param = "taskId"


class _UpdateTask(types.Request[_UpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    name_param = "taskId"


class _CancelTask(types.Request[_TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    name_param = "taskId"


class _Named(types.Request[_TaskIdParams, str]):
    """Any other method naming a task (`tasks/result`, `tasks/list`: removed in 2026-07-28)."""

    name_param = "taskId"


async def get_task(session: ClientSession, task_id: str) -> dict[str, Any]:
    """`tasks/get`: the task's state (a DetailedTask, `resultType: "complete"`)."""
    return await session.send_request(_GetTask(params=_TaskIdParams(task_id=task_id)), _ANY)  # type: ignore[type-var]


async def update_task(session: ClientSession, task_id: str, responses: dict[str, Any]) -> dict[str, Any]:
    """`tasks/update` with `inputResponses`: an empty acknowledgement."""
    params = _UpdateParams(task_id=task_id, input_responses=responses)
    return await session.send_request(_UpdateTask(params=params), _ANY)  # type: ignore[type-var]


async def cancel_task(session: ClientSession, task_id: str) -> dict[str, Any]:
    """`tasks/cancel`: an empty acknowledgement."""
    return await session.send_request(_CancelTask(params=_TaskIdParams(task_id=task_id)), _ANY)  # type: ignore[type-var]


async def ask(session: ClientSession, method: str, task_id: str) -> dict[str, Any]:
    """Any `method` with `{"taskId": task_id}`."""
    request = _Named(method=method, params=_TaskIdParams(task_id=task_id))
    return await session.send_request(request, _ANY)  # type: ignore[type-var]


async def wait_for(session: ClientSession, task_id: str, until: tuple[str, ...] = TERMINAL) -> dict[str, Any]:
    """Poll `tasks/get` (at the task's `pollIntervalMs`) until its status is one of `until`."""
    with anyio.fail_after(30):
        while True:
            state = await get_task(session, task_id)
            if state["status"] in until:
                return state
            await anyio.sleep(state.get("pollIntervalMs", 100) / 1000)


async def _resolve(created: CreateTaskResult, ctx: ClaimContext) -> types.CallToolResult:
    state = await wait_for(ctx.session, created.task_id)
    if state["status"] == "completed":
        return types.CallToolResult.model_validate(state["result"])
    if state["status"] == "failed":
        raise MCPError(code=state["error"]["code"], message=state["error"]["message"])
    raise MCPError(code=-1, message=f"task {created.task_id} was cancelled")


class TasksExtension(ClientExtension):
    """Declares the tasks extension; `call_tool` resolves a task by polling it to its end."""

    identifier = EXTENSION

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreateTaskResult, resolve=_resolve)]
