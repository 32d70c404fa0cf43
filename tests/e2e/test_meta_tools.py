"""Meta-tools through a real MCP client talking to `mcpmux serve` over stdio, with a real upstream."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from mcpmux.core.config import config_from_dict, load_config
from mcpmux.mux.multiplexer import Mux
from tests.e2e.conftest import demo, mux_over_stdio, text_of, write_config

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def client(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Client]:
    """One mcpmux process for the module: starting one costs seconds on a loaded machine."""
    config = write_config(tmp_path_factory.mktemp("meta") / "mcp.json", {"alpha": demo("alpha")})
    async with mux_over_stdio(config) as connected:
        yield connected


async def _count(client: Client, tool: str) -> int:
    return int(text_of(await client.call_tool("alpha__count", {"tool": tool})))


async def _structured(client: Client, tool: str, arguments: dict[str, Any]) -> tuple[bool, dict[str, Any], str]:
    result = await client.call_tool(tool, arguments)
    return bool(result.is_error), result.structured_content or {}, text_of(result)


async def test_meta_tools_are_listed_with_their_input_schemas(client: Client) -> None:
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert tools["mux_parallel"].input_schema["required"] == ["calls"]
    assert tools["mux_batch"].input_schema["required"] == ["tool", "arguments"]
    assert tools["mux_pipeline"].input_schema["required"] == ["steps"]
    assert '{"$ref": "steps.' in (tools["mux_pipeline"].description or "")


async def test_parallel_answers_each_call_in_order_and_failures_stay_alone(client: Client) -> None:
    seen: list[tuple[float, float | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total))

    calls = [
        {"tool": "alpha__echo", "arguments": {"text": "one"}},
        {"tool": "alpha__fail", "arguments": {"reason": "broken on purpose"}},
        {"tool": "alpha__nope", "arguments": {}},
        {"tool": "mux_batch", "arguments": {"tool": "alpha__echo", "arguments": [{"text": "x"}]}},
        {"tool": "alpha__add", "arguments": {"a": 20, "b": 22}},
    ]
    result = await client.call_tool("mux_parallel", {"calls": calls}, progress_callback=on_progress)
    assert not result.is_error  # the request was well formed; failures are per item
    items = (result.structured_content or {})["results"]
    assert [(item["index"], item["tool"], item["ok"]) for item in items] == [
        (0, "alpha__echo", True),
        (1, "alpha__fail", False),
        (2, "alpha__nope", False),
        (3, "mux_batch", False),
        (4, "alpha__add", True),
    ]
    assert items[0]["result"]["text"] == "alpha: one"
    assert items[4]["result"]["structured"] == {"result": 42}
    assert "unknown tool 'alpha__nope'" in items[2]["error"]
    assert "meta-tools cannot call meta-tools" in items[3]["error"]
    assert "[1] alpha__fail failed:" in text_of(result)
    assert seen[-1] == (5, 5)


async def test_batch_of_identical_read_only_calls_costs_one_upstream_call(client: Client) -> None:
    before = await _count(client, "lookup")
    failed, structured, _ = await _structured(
        client, "mux_batch", {"tool": "alpha__lookup", "arguments": [{"key": "shared"}] * 20}
    )
    assert not failed
    assert [item["result"]["text"] for item in structured["results"]] == ["value of shared"] * 20
    # Shared in flight like direct calls: one upstream call; nothing is kept, so a direct call goes out again.
    assert await _count(client, "lookup") == before + 1
    assert text_of(await client.call_tool("alpha__lookup", {"key": "shared"})) == "value of shared"
    assert await _count(client, "lookup") == before + 2


async def test_pipeline_feeds_earlier_results_into_later_steps(client: Client) -> None:
    steps = [
        {"id": "sum", "tool": "alpha__add", "arguments": {"a": 1, "b": 2}},
        {"tool": "alpha__add", "arguments": {"a": {"$ref": "steps.sum.structured.result"}, "b": 10}},
        {"tool": "alpha__echo", "arguments": {"text": {"$ref": ["steps", 1, "text"]}}},
        {"tool": "alpha__add", "arguments": {"a": {"$ref": "steps.1.json"}, "b": {"$ref": "steps.0.json"}}},
    ]
    failed, structured, text = await _structured(client, "mux_pipeline", {"steps": steps})
    assert not failed, text
    assert [step["result"]["text"] for step in structured["steps"]] == ["3", "13", "alpha: 13", "16"]
    assert structured["failed_step"] is None


async def test_pipeline_stops_at_a_bad_reference_and_names_it(client: Client) -> None:
    echoes = await _count(client, "echo")
    steps = [
        {"id": "sum", "tool": "alpha__add", "arguments": {"a": 1, "b": 2}},
        {"tool": "alpha__echo", "arguments": {"text": {"$ref": "steps.sum.structured.missing"}}},
        {"tool": "alpha__echo", "arguments": {"text": "never sent"}},
    ]
    failed, structured, text = await _structured(client, "mux_pipeline", {"steps": steps})
    assert failed
    assert structured["failed_step"] == 1
    assert len(structured["steps"]) == 2
    assert "step 1 (alpha__echo): reference \"steps.sum.structured.missing\": no key 'missing'" in text
    assert await _count(client, "echo") == echoes  # nothing after the failure ran

    # A reference to a later step is refused before anything runs.
    adds = await _count(client, "add")
    steps = [
        {"tool": "alpha__add", "arguments": {"a": 1, "b": 1}},
        {"tool": "alpha__echo", "arguments": {"text": {"$ref": "steps.2.text"}}},
        {"tool": "alpha__add", "arguments": {"a": 1, "b": 1}},
    ]
    failed, _, text = await _structured(client, "mux_pipeline", {"steps": steps})
    assert failed
    assert "step 1 (alpha__echo): reference \"steps.2.text\": step '2' is not an earlier step" in text
    assert await _count(client, "add") == adds


async def test_pipeline_failing_step_stops_it(client: Client) -> None:
    steps = [
        {"tool": "alpha__echo", "arguments": {"text": "first"}},
        {"id": "broken", "tool": "alpha__fail", "arguments": {"reason": "no"}},
        {"tool": "alpha__echo", "arguments": {"text": {"$ref": "steps.broken.text"}}},
    ]
    failed, structured, text = await _structured(client, "mux_pipeline", {"steps": steps})
    assert failed
    assert structured["failed_step"] == 1
    assert structured["completed"] == 1
    assert "stopped at step 1 (alpha__fail)" in text


async def test_malformed_requests_are_errors_that_say_what_is_wrong(client: Client) -> None:
    failed, _, text = await _structured(client, "mux_parallel", {"calls": [{"arguments": {}}]})
    assert failed
    assert "calls.0.tool: Field required" in text
    failed, _, text = await _structured(client, "mux_batch", {"tool": "alpha__echo", "arguments": []})
    assert failed
    assert "arguments: List should have at least 1 item" in text


async def test_meta_tools_can_be_turned_off(tmp_path: Path) -> None:
    config = tmp_path / "mcpmux.toml"
    config.write_text("[mux]\nmeta_tools = false\n")
    assert load_config(config).mux.meta_tools is False
    off = Mux(config_from_dict({"mux": {"meta_tools": False}}))
    on = Mux(config_from_dict({}))
    assert not {tool.name for tool in off.list_tools()} & {"mux_parallel", "mux_batch", "mux_pipeline"}
    assert {"mux_parallel", "mux_batch", "mux_pipeline"} <= {tool.name for tool in on.list_tools()}
