"""The call plan: what a call to one upstream tool means, decided in one place, once per listing.

Every front and both ways of serving a call (the SDK path's `UpstreamDispatcher`, the raw relay's
`FastPath`) read a tool's `CallPlan`; no other code re-derives "is this call special":

- **cache**: results are kept only where `[servers.X.cache] allow` names the tool (and `deny` does
  not). Annotations never make a result cacheable: `readOnlyHint` says a tool changes nothing, not
  that its answer is stable (a clock, a search index, a file being edited all read differently a
  second later).
- **coalesce**: identical concurrent calls share one upstream call, in flight only: a cached tool's,
  and a tool annotated both `readOnlyHint` and `idempotentHint` (and not `destructiveHint`), whose
  second identical call could not have been answered differently had it gone out on its own. `deny`
  globs and `[servers.X.cache] enabled = false` turn both off.
- **batch**: the list form (`[[servers.X.batch]]`) it merges into, if any.
- **priority**: its `[servers.X.priorities]` entry.
- **asks_client**: whether its upstream may ask the calling client for sampling or elicitation; the
  call then goes where that request can be answered.
- **as_task**: the upstream runs the tool only as a task (2025-11-25 `execution.taskSupport =
  "required"`): mcpmux creates the task and waits for its result (`mcpmux.upstream.tasks`), so any
  client gets a plain result.
- **param_headers**: an argument is mirrored into an `Mcp-Param` header (2026-07-28 `x-mcp-header`),
  which only the SDK's client writes: the upstream request goes through it.
- **result_limit**: bytes of its result's text a model is given, beyond which the text is cut and
  the whole kept as a resource (`mcpmux.core.result_limit`); 0 for none, and always 0 for an
  app-only tool (`_meta.ui.visibility == ["app"]`, MCP Apps), whose result a view asked for.
- **slow**: why it cannot be relayed raw (None: it can); such a call is served through the SDK.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

import mcp_types as types

from mcpmux.core.output_schema import OutputCheck
from mcpmux.core.server_policy import BatchForm, priority_for, result_limit_for

if TYPE_CHECKING:
    from mcpmux.core.config import MuxSettings, ServerConfig


@dataclass(frozen=True, slots=True)
class CacheRule:
    """How long a result lives in the cache, and who may be served it."""

    ttl: float
    scope: Literal["shared", "client"]


@dataclass(frozen=True, slots=True)
class CallPlan:
    """What a call of one tool (its name on its upstream) takes: see the module's docstring."""

    tool: str
    output: OutputCheck | None
    cache: CacheRule | None
    coalesce: bool
    batch: BatchForm | None
    priority: int
    asks_client: bool
    as_task: bool
    param_headers: bool
    result_limit: int
    slow: str | None
    """Why the call cannot be relayed raw (None: it can): a sentence for logs and tests."""

    @property
    def shares(self) -> bool:
        """Whether a call may be answered by another's upstream call (from the cache, or in flight)."""
        return self.cache is not None or self.coalesce


def plan_tool(tool: str, listed: types.Tool | None, server: ServerConfig, mux: MuxSettings) -> CallPlan:
    """The plan of `tool` on an upstream configured as `server`, as its listing (`listed`) describes it."""
    cache_settings = server.cache
    denied = not cache_settings.enabled or _matches(cache_settings.deny, tool)
    cache = None
    if not denied and _matches(cache_settings.allow, tool):
        cache = CacheRule(ttl=cache_settings.ttl, scope=cache_settings.scope)
    hints = listed.annotations if listed is not None else None
    repeatable = (
        hints is not None and bool(hints.read_only_hint) and bool(hints.idempotent_hint) and not hints.destructive_hint
    )
    batch = next((form for form in server.batch if form.tool == tool), None)
    schema = listed.output_schema if listed is not None else None
    execution = listed.execution if listed is not None else None
    plan = CallPlan(
        tool=tool,
        output=None if schema is None else OutputCheck(schema),
        cache=cache,
        coalesce=cache is not None or (repeatable and not denied),
        batch=batch,
        priority=priority_for(server.priorities, tool),
        asks_client=server.sampling.asks_client or server.elicitation.policy == "client",
        as_task=execution is not None and execution.task_support == "required",
        param_headers=listed is not None and "x-mcp-header" in json.dumps(listed.input_schema),
        result_limit=0 if _app_only(listed) else result_limit_for(server.max_result_bytes, tool, mux.max_result_bytes),
        slow=None,
    )
    slow = _slow_reason(plan, mux)
    return plan if slow is None else replace(plan, slow=slow)


def _slow_reason(plan: CallPlan, mux: MuxSettings) -> str | None:
    if not mux.fast_path:
        return "[mux] fast_path = false"
    if mux.client_priorities:
        return "[mux] client_priorities weigh the caller's name, which only the SDK path knows"
    if plan.batch is not None:
        return f"it merges into the list form {plan.batch.batch_tool!r}"
    if plan.as_task:
        return "the upstream runs it only as a task, which mcpmux creates and waits for"
    if plan.cache is not None and plan.cache.scope == "client":
        return 'its results are cached per client (scope = "client"), and only the SDK path knows the client'
    if plan.param_headers:
        return "an argument is mirrored into an Mcp-Param header"
    return None


def _app_only(listed: types.Tool | None) -> bool:
    """Whether only an MCP App's view calls the tool (`_meta.ui.visibility == ["app"]`): no model reads it."""
    ui = (listed.meta or {}).get("ui") if listed is not None else None
    return isinstance(ui, dict) and ui.get("visibility") == ["app"]


def _matches(globs: list[str], tool: str) -> bool:
    return any(fnmatch.fnmatchcase(tool, glob) for glob in globs)
