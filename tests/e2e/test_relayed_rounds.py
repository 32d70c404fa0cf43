"""A 2026-07-28 upstream's input-required rounds (SEP-2322) reach a 2026-07-28 client as the upstream wrote them.

mcpmux (in process, over real HTTP on loopback) fronts `tests/servers/rounds_server.py`, a real
2026 upstream run as a subprocess, whose rounds carry keys and `requestState`s of its own. Real
`mcp.Client`s call through mcpmux, driving the rounds by hand (`allow_input_required=True`) or
letting the SDK drive them with their callbacks: each round's keys and state are the upstream's, the
retry goes back to it with the client's answers, a prompt's round is relayed as a tool's is, and a
client that cannot answer is never handed a round. A 2026 request tells the upstream the capabilities
that can serve it: sampling only where the client (or mcpmux's own model) can answer it (SEP-2575).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.e2e.conftest import ROOT, served_in_process, text_of, write_config
from tests.servers import rounds_server

pytestmark = pytest.mark.anyio
SERVER = ROOT / "tests" / "servers" / "rounds_server.py"


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def url(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    folder = tmp_path_factory.mktemp("rounds")
    # Sampling only by the calling client: mcpmux then declares it upstream only for clients that declared it.
    rounds = {"command": sys.executable, "args": [str(SERVER)], "sampling": {"policy": "client"}}
    config = write_config(folder / "mcpmux.json", {"rounds": rounds})
    async with served_in_process(config) as (_, _, served):
        yield served


def answers(reply: dict[str, str]) -> Any:
    """An elicitation callback that accepts with the field its question asks for, from `reply`."""

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestFormParams)
        field = next(iter(params.requested_schema["properties"]))
        return types.ElicitResult(action="accept", content={field: reply[field]})

    return elicit


def accept(**content: str) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content=dict(content))


async def test_each_round_and_its_state_are_the_upstreams_own(url: str) -> None:
    async with Client(url, mode="auto", elicitation_callback=answers({})) as client:
        assert client.protocol_version == "2026-07-28"
        first = await client.session.call_tool("rounds__greet", {}, allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult)
        assert list(first.input_requests or {}) == ["user_name"]
        assert first.request_state == "greet:1"
        second = await client.session.call_tool(
            "rounds__greet",
            {},
            input_responses={"user_name": accept(name="Alice")},
            request_state=first.request_state,
            allow_input_required=True,
        )
        assert isinstance(second, types.InputRequiredResult)
        assert list(second.input_requests or {}) == ["color"]
        assert second.request_state == "greet:2:Alice"
        last = await client.session.call_tool(
            "rounds__greet",
            {},
            input_responses={"color": accept(color="blue")},
            request_state=second.request_state,
            allow_input_required=True,
        )
        assert isinstance(last, types.CallToolResult)
        assert text_of(last) == "Alice likes blue"
        seen = text_of(await client.call_tool("rounds__seen", {}))
    # The upstream got each retry as the client wrote it: one request per round, nothing answered for it.
    assert seen.endswith(
        "{'answers': [], 'state': None}, {'answers': ['user_name'], 'state': 'greet:1'}, "
        "{'answers': ['color'], 'state': 'greet:2:Alice'}]"
    )
    # Each relayed round is counted as such, not as a failed call.
    async with httpx2.AsyncClient() as http:
        scraped = (await http.get(url.replace("/mcp", "/metrics"))).text
    counted = re.findall(r"mcpmux_tool_calls_total\{([^}]*)\} (\S+)", scraped)
    by_outcome = {labels: float(n) for labels, n in counted if 'tool="greet"' in labels}
    assert any('outcome="input_required"' in labels and n >= 2 for labels, n in by_outcome.items()), by_outcome
    assert not any('outcome="error"' in labels for labels in by_outcome), by_outcome


async def test_the_sdk_client_drives_the_relayed_rounds_and_two_clients_answer_their_own(url: str) -> None:
    results: dict[str, str] = {}

    async def greet(name: str, color: str) -> None:
        async with Client(url, mode="auto", elicitation_callback=answers({"name": name, "color": color})) as client:
            results[name] = text_of(await client.call_tool("rounds__greet", {}))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(greet, "Ada", "green")
        tasks.start_soon(greet, "Bob", "red")
    assert results == {"Ada": "Ada likes green", "Bob": "Bob likes red"}


async def test_a_prompts_round_is_relayed_too(url: str) -> None:
    async with Client(url, mode="auto", elicitation_callback=answers({"topic": "tides"})) as client:
        first = await client.session.get_prompt("rounds__briefing", allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult)
        assert list(first.input_requests or {}) == ["topic"]
        retried = await client.session.get_prompt(
            "rounds__briefing", input_responses={"topic": accept(topic="MCP")}, allow_input_required=True
        )
        assert isinstance(retried, types.GetPromptResult)
        assert retried.messages[0].content == types.TextContent(type="text", text="Brief me on MCP.")
        driven = await client.get_prompt("rounds__briefing")
        assert driven.messages[0].content == types.TextContent(type="text", text="Brief me on tides.")


async def test_a_client_that_cannot_answer_is_never_handed_a_round(url: str) -> None:
    """No elicitation declared: mcpmux answers the round itself (declined), and the upstream refuses the call."""
    async with Client(url, mode="auto") as client:
        with pytest.raises(MCPError, match="no accepted answer under 'user_name'"):
            await client.session.call_tool("rounds__greet", {}, allow_input_required=True)


async def test_an_upstream_refuses_what_needs_sampling_nobody_behind_the_request_can_answer(url: str) -> None:
    """SEP-2575: without sampling declared (and no local model under policy "client"), the upstream sees
    none declared and refuses with -32021, relayed as it is; a client that can sample is served."""
    async with Client(url, mode="auto") as client:
        with pytest.raises(MCPError, match="MissingRequiredClientCapabilityError") as refused:
            await client.call_tool("rounds__sampler", {})
    assert refused.value.error.code == -32021
    assert refused.value.error.data == {"requiredCapabilities": {"sampling": {}}}

    async def sample(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        raise AssertionError("the tool does not sample")

    async with Client(url, mode="auto", sampling_callback=sample) as client:
        assert text_of(await client.call_tool("rounds__sampler", {})) == "the client can sample"


async def test_a_round_inside_mcpmuxs_own_tool_is_not_handed_to_the_client(url: str) -> None:
    """`mux_batch`'s inner call cannot be retried by the client (its retry would name `mux_batch`): mcpmux
    answers that round itself (declined here, as the client is asked only in its own rounds)."""
    async with Client(url, mode="auto", elicitation_callback=answers({"name": "Ada"})) as client:
        result = await client.session.call_tool(
            "mux_batch", {"tool": "rounds__greet", "arguments": [{}]}, allow_input_required=True
        )
    assert isinstance(result, types.CallToolResult)
    assert "no accepted answer under 'user_name'" in text_of(result)


async def test_a_2025_client_is_asked_each_request_of_a_round_as_the_upstream_wrote_it(url: str) -> None:
    """A 2025 client has no rounds: mcpmux asks it each of the round's requests as an ordinary
    server→client request during its call (sampling, a SEP-1034 form of defaults, SEP-1330's enum
    shapes, exactly as the upstream wrote them) and sends the answers back on the retry."""
    sampled: list[types.CreateMessageRequestParams] = []
    forms: dict[str, types.ElicitRequestFormParams] = {}

    async def sample(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        sampled.append(params)
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="a reply"), model="m", stop_reason="endTurn"
        )

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestFormParams)
        forms[params.message] = params
        fields = params.requested_schema["properties"]
        if all("default" in field for field in fields.values()):  # the person keeps every default
            return types.ElicitResult(action="accept", content={k: field["default"] for k, field in fields.items()})
        return types.ElicitResult(action="accept", content={"untitledSingle": "option2", "titledMulti": ["value3"]})

    async with Client(url, mode="legacy", sampling_callback=sample, elicitation_callback=elicit) as client:
        assert client.protocol_version == "2025-11-25"
        result = await client.call_tool("rounds__survey", {})
    assert not result.is_error, text_of(result)
    assert [(p.messages, p.max_tokens) for p in sampled] == [
        ([types.SamplingMessage(role="user", content=types.TextContent(type="text", text="Test prompt"))], 100)
    ]
    assert forms["Review the defaults"].requested_schema == rounds_server.DEFAULTS
    assert forms["Pick from the enums"].requested_schema == rounds_server.ENUMS
    # The retry carried each answer under the upstream's own key: the tool echoes them in its order.
    llm, defaults, enums = (json.loads(getattr(block, "text", "")) for block in result.content)
    assert llm["content"] == {"type": "text", "text": "a reply"}
    assert defaults == {
        "action": "accept",
        "content": {"name": "John Doe", "age": 30, "score": 95.5, "status": "active", "verified": True},
    }
    assert enums == {"action": "accept", "content": {"untitledSingle": "option2", "titledMulti": ["value3"]}}
