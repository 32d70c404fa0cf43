"""The tasks extension of 2026-07-28 (`io.modelcontextprotocol/tasks`, SEP-2663) on the wire.

In 2026-07-28 a server may answer a `tools/call` with a task handle (`resultType: "task"`, the
task's fields flat beside it) instead of its result, but only to a request that declared the
extension in its `_meta` client capabilities; the requester then follows the task with `tasks/get`
(its state, and the result or error inline once it ends), `tasks/update` (answers to the task's
`inputRequests`) and `tasks/cancel`, and every one of them must declare the extension too, with the
task id as `Mcp-Name` over HTTP. A 2025-11-25 task reads the same once renamed (`ttl` is `ttlMs`,
`pollInterval` is `pollIntervalMs`).

The SDK's client session knows none of this: `request` sends one such request on an upstream's
session, stamped as the session stamps its own, with the extension added to the capabilities.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_NAME_HEADER, encode_header_value
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

EXTENSION = "io.modelcontextprotocol/tasks"
TERMINAL = frozenset({"completed", "failed", "cancelled"})
"""Statuses a task never leaves."""
TASK_FIELDS = ("taskId", "status", "statusMessage", "createdAt", "lastUpdatedAt", "ttlMs", "pollIntervalMs")
"""A `Task`'s own fields (a DetailedTask adds `result`, `error` or `inputRequests`)."""


def declared(capabilities: types.ClientCapabilities | dict[str, Any] | None) -> bool:
    """Whether client capabilities (a request's, on 2026-07-28) declare the tasks extension."""
    if isinstance(capabilities, dict):
        extensions = capabilities.get("extensions")
    else:
        extensions = capabilities.extensions if capabilities is not None else None
    return isinstance(extensions, dict) and EXTENSION in extensions


def offered(client: Client | None) -> bool:
    """Whether an upstream's session is 2026-07-28 and its server declared the tasks extension."""
    if client is None or client.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    return EXTENSION in (client.server_capabilities.extensions or {})


def missing() -> MCPError:
    """-32021 for a request that needs the extension from a client that did not declare it."""
    data = types.MissingRequiredClientCapabilityErrorData(
        required_capabilities=types.ClientCapabilities(extensions={EXTENSION: {}})
    )
    return MCPError(
        code=types.MISSING_REQUIRED_CLIENT_CAPABILITY,
        message=f"Missing required client capability: declare the {EXTENSION} extension to use tasks",
        data=data.model_dump(by_alias=True, mode="json", exclude_none=True),
    )


def not_found(task_id: str) -> MCPError:
    """The schema's answer to a task id the requester cannot see (-32602)."""
    return MCPError(code=types.INVALID_PARAMS, message=f"Failed to retrieve task: Task not found ({task_id})")


def from_legacy(task: dict[str, Any]) -> dict[str, Any]:
    """A 2025-11-25 `Task` as the extension's `Task` (the same states; `ttl` and `pollInterval` renamed)."""
    renamed = {"ttl": "ttlMs", "pollInterval": "pollIntervalMs"}
    shaped = {renamed.get(key, key): value for key, value in task.items() if renamed.get(key, key) in TASK_FIELDS}
    shaped.setdefault("ttlMs", None)
    return shaped


def without_meta(answer: dict[str, Any], key: str) -> dict[str, Any]:
    """`answer` without `_meta[key]` (and without `_meta` once empty): a stamp or a link that names
    the upstream, where mcpmux answers in its own name."""
    meta = {name: value for name, value in (answer.get("_meta") or {}).items() if name != key}
    plain = {name: value for name, value in answer.items() if name != "_meta"}
    return {**plain, "_meta": meta} if meta else plain


async def request(client: Client, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """Send `method` on `client`'s 2026-07-28 session declaring the tasks extension; its raw result.

    `tasks/*` requests carry their task id as `Mcp-Name`. Raises `MCPError` for an error response
    and a lost connection, as the SDK's session does.
    """
    data: dict[str, Any] = {"method": method, "params": dict(params)}
    opts: dict[str, Any] = {}
    session = client.session
    session._stamp(data, opts)  # type: ignore[arg-type]  # the session's own envelope and headers
    meta = data["params"]["_meta"]
    capabilities = dict(meta.get(types.CLIENT_CAPABILITIES_META_KEY) or {})  # the stamp's dict is shared
    capabilities["extensions"] = {**(capabilities.get("extensions") or {}), EXTENSION: {}}
    meta[types.CLIENT_CAPABILITIES_META_KEY] = capabilities
    task_id = params.get("taskId")
    if method.startswith("tasks/") and isinstance(task_id, str):
        opts.setdefault("headers", {})[MCP_NAME_HEADER] = encode_header_value(task_id)
    result: dict[str, Any] = await session._dispatcher.send_raw_request(method, data["params"], opts)  # type: ignore[arg-type]
    return result


async def legacy_request(client: Client, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """Send a 2025-11-25 `tasks/*` request on `client`'s session; its raw result (or `MCPError`)."""
    data: dict[str, Any] = {"method": method, "params": dict(params)}
    opts: dict[str, Any] = {}
    client.session._stamp(data, opts)  # type: ignore[arg-type]
    result: dict[str, Any] = await client.session._dispatcher.send_raw_request(method, data["params"], opts)  # type: ignore[arg-type]
    return result
