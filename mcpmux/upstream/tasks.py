"""Tools an upstream runs only as tasks (2025-11-25 `execution.taskSupport = "required"`), called as
plain tools, so that a client that knows nothing of tasks can still use them.

The call goes out task-augmented (`tools/call` with `task`); the upstream answers at once with its
task (`CreateTaskResult`), and `tasks/result`, which the spec has block until the task ends, brings
the tool's result (or its error). A caller that gives up (cancelled, or past the upstream's
timeout) has the task cancelled upstream (`tasks/cancel`), so no work is left running for nobody.
An upstream that ran the call directly instead is answered with its plain result.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import anyio
import mcp_types as types
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import CONNECTION_CLOSED

from mcpmux.upstream.lane import ProgressFn, UpstreamLane

logger = logging.getLogger(__name__)

CANCEL_WAIT = 5.0
"""Seconds a `tasks/cancel` for an abandoned task may take (it is sent shielded, as the caller leaves)."""
RELATED_TASK = "io.modelcontextprotocol/related-task"


def with_related_task(result: types.CallToolResult, task_id: str | None) -> types.CallToolResult:
    """`result` with its `_meta` related-task naming `task_id` (None: naming none), never the upstream's id."""
    meta = dict(result.meta or {})
    if RELATED_TASK not in meta:
        return result
    if task_id is None:
        del meta[RELATED_TASK]
    else:
        meta[RELATED_TASK] = {"taskId": task_id}
    return result.model_copy(update={"meta": meta or None})


async def call_as_task(
    client: Client,
    lane: UpstreamLane | None,
    tool: str,
    arguments: dict[str, Any],
    progress: ProgressFn | None,
    ttl_ms: int,
) -> types.CallToolResult:
    """Run `tool` as a task on the upstream behind `client` and return its result once it ends.

    `ttl_ms`: how long the upstream keeps the task (the call's own timeout: past it, mcpmux has
    given up and cancelled it). Raises `MCPError` for the upstream's errors, as `Client.call_tool` does.
    """
    if lane is None:  # the connection is closing under us
        raise MCPError(code=CONNECTION_CLOSED, message="Connection closed")
    created = await lane.call(client, tool, arguments, progress, task={"ttl": ttl_ms})
    if not isinstance(created, dict) or "task" not in created:
        return types.CallToolResult.model_validate(created)
    task_id = types.CreateTaskResult.model_validate(created).task.task_id
    logger.debug("tool %r runs as task %r upstream", tool, task_id)
    fetch = types.GetTaskPayloadRequest(params=types.GetTaskPayloadRequestParams(task_id=task_id))
    try:
        result = await client.session.send_request(fetch, types.CallToolResult)
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_WAIT), contextlib.suppress(Exception):
            cancel = types.CancelTaskRequest(params=types.CancelTaskRequestParams(task_id=task_id))
            await client.session.send_request(cancel, types.CancelTaskResult)
        raise
    return with_related_task(result, None)  # the caller made no task: nothing to relate the result to
