"""Every rule of the call plan, one row each: what is cached, shared in flight, batched, and relayed raw."""

from __future__ import annotations

from typing import Any

import mcp_types as types
import pytest

from mcpmux.core.call_plan import CacheRule, CallPlan, plan_tool
from mcpmux.core.config import MuxSettings, ServerConfig

READ_ONLY_IDEMPOTENT = {"readOnlyHint": True, "idempotentHint": True}
BATCH = {"tool": "get", "batch_tool": "get_many", "argument": "id", "list_argument": "ids"}


def _plan(
    server: dict[str, Any] | None = None,
    annotations: dict[str, Any] | None = None,
    tool: str = "get",
    listed: bool = True,
    input_schema: dict[str, Any] | None = None,
    task_support: str | None = None,
    **mux: Any,
) -> CallPlan:
    config = ServerConfig.model_validate({"command": "srv", **(server or {})})
    tool_def = types.Tool.model_validate(
        {
            "name": tool,
            "inputSchema": input_schema or {"type": "object"},
            **({"annotations": annotations} if annotations is not None else {}),
            **({"execution": {"taskSupport": task_support}} if task_support is not None else {}),
        }
    )
    return plan_tool(tool, tool_def if listed else None, config, MuxSettings.model_validate(mux))


# (case, server config, annotations, expected (cache, coalesce))
SHARING = [
    ("plain tool", {}, None, (None, False)),
    ("read-only alone is no reason to share", {}, {"readOnlyHint": True}, (None, False)),
    ("idempotent alone is no reason to share", {}, {"idempotentHint": True}, (None, False)),
    ("read-only and idempotent: shared in flight, never cached", {}, READ_ONLY_IDEMPOTENT, (None, True)),
    (
        "a destructive hint wins over read-only and idempotent",
        {},
        {**READ_ONLY_IDEMPOTENT, "destructiveHint": True},
        (None, False),
    ),
    ("allow caches a tool without annotations", {"cache": {"allow": ["g*"]}}, None, (CacheRule(30.0, "shared"), True)),
    (
        "allow's ttl and scope are the plan's",
        {"cache": {"allow": ["get"], "ttl": 5, "scope": "client"}},
        None,
        (CacheRule(5.0, "client"), True),
    ),
    ("deny wins over allow", {"cache": {"allow": ["*"], "deny": ["get"]}}, None, (None, False)),
    ("deny stops sharing in flight too", {"cache": {"deny": ["get"]}}, READ_ONLY_IDEMPOTENT, (None, False)),
    (
        "enabled = false turns both off",
        {"cache": {"enabled": False, "allow": ["get"]}},
        READ_ONLY_IDEMPOTENT,
        (None, False),
    ),
    ("an allow glob for another tool", {"cache": {"allow": ["list_*"]}}, None, (None, False)),
]


@pytest.mark.parametrize(
    ("server", "annotations", "expected"), [row[1:] for row in SHARING], ids=[r[0] for r in SHARING]
)
def test_what_is_cached_and_what_is_shared_in_flight(
    server: dict[str, Any], annotations: dict[str, Any] | None, expected: tuple[CacheRule | None, bool]
) -> None:
    plan = _plan(server, annotations)
    assert (plan.cache, plan.coalesce) == expected
    assert plan.shares == (expected[0] is not None or expected[1])


# (case, server config, mux settings, input schema, expected reason fragment or None)
RELAY = [
    ("a plain tool is relayed raw", {}, {}, None, None),
    ("a cached tool is relayed raw", {"cache": {"allow": ["get"]}}, {}, None, None),
    ("a tool with a priority is relayed raw", {"priorities": {"get": 5}}, {}, None, None),
    ("the switch", {}, {"fast_path": False}, None, "fast_path = false"),
    ("client priorities", {}, {"client_priorities": {"cursor*": 3}}, None, "client_priorities"),
    ("a list form", {"batch": [BATCH]}, {}, None, "list form 'get_many'"),
    ("a cache kept per client", {"cache": {"allow": ["get"], "scope": "client"}}, {}, None, "per client"),
    (
        "an argument mirrored into a header",
        {},
        {},
        {"type": "object", "properties": {"region": {"type": "string", "x-mcp-header": "Region"}}},
        "Mcp-Param header",
    ),
]


@pytest.mark.parametrize(
    ("server", "mux", "schema", "reason"), [row[1:] for row in RELAY], ids=[row[0] for row in RELAY]
)
def test_why_a_call_is_or_is_not_relayed_raw(
    server: dict[str, Any], mux: dict[str, Any], schema: dict[str, Any] | None, reason: str | None
) -> None:
    slow = _plan(server, input_schema=schema, **mux).slow
    if reason is None:
        assert slow is None
    else:
        assert slow is not None
        assert reason in slow


def test_priority_batch_form_and_sampling_come_from_the_server_config() -> None:
    plan = _plan({"priorities": {"list_*": 1, "g*": 7}, "batch": [BATCH], "sampling": {"policy": "client"}})
    assert plan.priority == 7
    assert plan.batch is not None
    assert plan.batch.batch_tool == "get_many"
    assert plan.asks_client
    assert not _plan({"sampling": {"policy": "local"}, "elicitation": {"policy": "decline"}}).asks_client
    assert _plan({"sampling": {"policy": "local"}}).asks_client  # the upstream may still ask the client to elicit
    assert _plan({}).asks_client  # the default policy, client-then-local, asks the client first


def test_output_schema_is_checked_only_where_declared() -> None:
    assert _plan().output is None
    tool = types.Tool.model_validate(
        {"name": "get", "inputSchema": {"type": "object"}, "outputSchema": {"type": "object", "required": ["x"]}}
    )
    plan = plan_tool("get", tool, ServerConfig.model_validate({"command": "srv"}), MuxSettings())
    assert plan.output is not None
    assert plan.output.problem({"content": [], "structuredContent": {"x": 1}}) is None
    assert plan.output.problem({"content": [], "structuredContent": {}}) is not None


def test_a_tool_the_upstream_does_not_list_shares_nothing() -> None:
    plan = _plan({}, READ_ONLY_IDEMPOTENT, listed=False)
    assert (plan.cache, plan.coalesce, plan.output) == (None, False, None)


@pytest.mark.parametrize(
    ("support", "as_task"), [(None, False), ("forbidden", False), ("optional", False), ("required", True)]
)
def test_a_tool_the_upstream_runs_only_as_a_task_is_run_as_one(support: str | None, as_task: bool) -> None:
    plan = _plan(task_support=support)
    assert plan.as_task is as_task
    assert (plan.slow is not None and "as a task" in plan.slow) is as_task  # the SDK path creates and awaits it
