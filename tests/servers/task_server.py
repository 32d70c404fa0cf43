"""A 2026-07-28 server that runs tool calls as tasks (the `io.modelcontextprotocol/tasks` extension,
SEP-2663): `python task_server.py [stdio|http PORT]`.

The receiver side, minimally, with the SDK's own extension mechanism (`mcp.server.extension`): a
client that declares the extension on its `tools/call` is answered with a `CreateTaskResult`
(`resultType: "task"`), and `tasks/get`, `tasks/update` and `tasks/cancel` follow it; a client that
does not is answered as any server answers, or, for `report_only_as_task`, refused with -32021.
A task's state is read off the clock when asked (no background work), so the server holds no task
group: `report` and `report_only_as_task` are "working" for `WORK_SECONDS`, then "completed";
`greet` is "input_required" (an elicitation for a name) until `tasks/update` answers it; `fail`
ends "failed" with a JSON-RPC error; `view` links a `ui://` view in its result; `plain` never makes a task.
"""

from __future__ import annotations

import datetime
import secrets
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from mcp.server.context import CallNext, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.server import require_client_extension
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, CallToolRequestParams, RequestParams, ResourceLink, TextContent
from pydantic import Field

EXTENSION = "io.modelcontextprotocol/tasks"
WORK_SECONDS = 0.6
POLL_MS = 100
TTL_MS = 60_000
GREETING = {
    "method": "elicitation/create",
    "params": {
        "mode": "form",
        "message": "Please enter your name.",
        "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    },
}


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


@dataclass
class _Task:
    tool: str
    outcome: dict[str, Any]
    """`result` or `error`, as the task ends."""
    task_id: str = field(default_factory=lambda: f"t-{secrets.token_hex(8)}")
    started: float = field(default_factory=time.monotonic)
    created_at: str = field(default_factory=_now)
    cancelled: bool = False
    answered: dict[str, Any] | None = None
    """`greet`'s input response, once `tasks/update` brought it."""

    def state(self) -> dict[str, Any]:
        """The task as `tasks/get` shows it now: a DetailedTask."""
        task: dict[str, Any] = {
            "taskId": self.task_id,
            "createdAt": self.created_at,
            "lastUpdatedAt": _now(),
            "ttlMs": TTL_MS,
            "pollIntervalMs": POLL_MS,
        }
        if self.cancelled:
            return {**task, "status": "cancelled", "statusMessage": "cancelled by the client"}
        if self.tool == "greet":
            if self.answered is None:
                return {**task, "status": "input_required", "inputRequests": {"name-1": GREETING}}
            name = (self.answered.get("content") or {}).get("name", "nobody")
            result = {"content": [{"type": "text", "text": f"Hello, {name}!"}], "isError": False}
            return {**task, "status": "completed", "result": result}
        if time.monotonic() - self.started < WORK_SECONDS:
            return {**task, "status": "working", "statusMessage": "working on it"}
        if "error" in self.outcome:
            return {**task, "status": "failed", "statusMessage": self.outcome["error"]["message"], **self.outcome}
        return {**task, "status": "completed", **self.outcome}


TASKS: dict[str, _Task] = {}


class TaskIdParams(RequestParams):
    task_id: str = Field(alias="taskId")


class UpdateParams(TaskIdParams):
    input_responses: dict[str, Any] = Field(alias="inputResponses")


def _task(ctx: ServerRequestContext[Any, Any], task_id: str) -> _Task:
    require_client_extension(ctx, EXTENSION)
    task = TASKS.get(task_id)
    if task is None:
        raise MCPError(code=INVALID_PARAMS, message=f"Failed to retrieve task: Task not found ({task_id})")
    return task


async def get_task(ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> dict[str, Any]:
    return {"resultType": "complete", **_task(ctx, params.task_id).state()}


async def update_task(ctx: ServerRequestContext[Any, Any], params: UpdateParams) -> dict[str, Any]:
    task = _task(ctx, params.task_id)
    if "name-1" in params.input_responses and task.answered is None:  # other keys are ignored, as the spec asks
        task.answered = params.input_responses["name-1"]
    return {"resultType": "complete"}


async def cancel_task(ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> dict[str, Any]:
    task = _task(ctx, params.task_id)
    if task.state()["status"] in ("working", "input_required"):
        task.cancelled = True
    return {"resultType": "complete"}


class Tasks(Extension):
    identifier = EXTENSION

    def methods(self) -> list[MethodBinding]:
        return [
            MethodBinding("tasks/get", TaskIdParams, get_task),
            MethodBinding("tasks/update", UpdateParams, update_task),
            MethodBinding("tasks/cancel", TaskIdParams, cancel_task),
        ]

    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> Any:
        capabilities = ctx.session.client_capabilities
        declared = EXTENSION in ((capabilities.extensions or {}) if capabilities else {})
        if params.name == "report_only_as_task" and not declared:
            require_client_extension(ctx, EXTENSION)  # -32021, naming the extension
        if not declared or params.name == "plain":
            return await call_next(ctx)
        if params.name == "fail":
            outcome: dict[str, Any] = {"error": {"code": -32603, "message": "the upstream API is rate limited"}}
        else:
            done = await call_next(ctx)
            outcome = {"result": done.model_dump(by_alias=True, mode="json", exclude_none=True)}
        task = _Task(params.name, outcome)
        TASKS[task.task_id] = task
        state = task.state()
        state.pop("inputRequests", None)  # a created task is only its handle
        return {"resultType": "task", **state, "status": "working"}


server = MCPServer("tasks", extensions=[Tasks()])


@server.tool()
def report(topic: str) -> str:
    """A report on `topic`: a task for a client that declares the tasks extension."""
    return f"report on {topic}"


@server.tool()
def report_only_as_task(topic: str) -> str:
    """A report on `topic`, for clients that declare the tasks extension only (others: -32021)."""
    return f"report on {topic}"


@server.tool()
def greet() -> str:
    """Greets whoever answers the task's elicitation."""
    return "Hello!"


@server.tool()
def fail() -> str:
    """As a task: fails with a JSON-RPC error."""
    return "did not fail"


@server.tool(structured_output=False)  # content alone: structured data is the tool's own, never renamed
def view() -> list[Any]:
    """A report with a view of its own (MCP Apps): its result links a `ui://` resource."""
    link = ResourceLink(type="resource_link", uri="ui://report/view.html", name="view", mime_type="text/html")
    return [TextContent(type="text", text="a report to view"), link]


@server.tool()
def plain(text: str) -> str:
    """Never a task."""
    return f"plain {text}"


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
