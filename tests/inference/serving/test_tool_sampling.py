"""Upstreams that sample with tools, answered by the local model through mcpmux for clients that cannot
sample, in both protocol eras: `required` always gives one `tool_use` whose input validates against
the tool's inputSchema (a grammar holds even a random model to it), `auto` gives a valid call or plain
text, `none` plain text; earlier calls and results reach the model in the documented form."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from mcpmux import Mux
from mcpmux.inference.engine.config import SamplingParams
from mcpmux.inference.serving.tool_calls import ToolSpec, ToolUse, call_text, result_text
from tests.e2e.conftest import PY, served_in_process, text_of
from tests.inference.serving.tool_sampling_server import ADD, WEATHER

pytestmark = pytest.mark.anyio

SERVER = Path(__file__).with_name("tool_sampling_server.py")
SCHEMAS = {tool.name: tool.input_schema for tool in (WEATHER, ADD)}
ERAS = {"modern": "2026-07-28", "legacy": "2025-11-25"}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def config_text(model: str, kv_cache_memory_mb: int = 16, timeout: int = 60) -> str:
    protocols = {"modern": "auto", "legacy": "legacy"}
    servers = "".join(
        f'[servers.{name}]\ncommand = "{PY}"\nargs = ["{SERVER}"]\nprotocol = "{protocol}"\ntimeout = {timeout}\n'
        for name, protocol in protocols.items()
    )
    return (
        f'[inference]\nbackend = "local"\n[inference.models.tiny]\nmodel = "{model}"\n'
        f"kv_cache_memory_mb = {kv_cache_memory_mb}\n"
        f'[inference.embeddings]\nmodel = ""\n{servers}'
    )


@pytest.fixture(scope="module")
async def served(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[Mux, str]]:
    config = tmp_path_factory.mktemp("tool_sampling") / "mcpmux.toml"
    config.write_text(config_text(str(tiny_llama)))
    async with served_in_process(config) as (mux, _, url):
        assert {s.name: s.protocol_version for s in mux.status()} == ERAS
        yield mux, url


async def plan(
    url: str, upstream: str, prompt: str = "What is the weather in Paris?", **arguments: Any
) -> dict[str, Any]:
    """Call `plan` as a client that declared no sampling (so mcpmux answers with its local model)."""
    async with Client(url, mode="legacy") as client:
        result = await client.call_tool(f"{upstream}__plan", {"prompt": prompt, **arguments})
    assert not result.is_error, text_of(result)
    assert result.structured_content is not None
    return result.structured_content


def assert_valid_call(answer: dict[str, Any]) -> None:
    assert answer["stop_reason"] == "toolUse", answer
    (block,) = answer["content"]
    assert block["type"] == "tool_use"
    assert block["id"]
    jsonschema.validate(block["input"], SCHEMAS[block["name"]])


@pytest.mark.parametrize("upstream", list(ERAS))
async def test_required_gives_one_call_whose_input_validates(served: tuple[Mux, str], upstream: str) -> None:
    _, url = served
    answers = [await plan(url, upstream, choice="required", seed=seed) for seed in range(3)]
    for answer in answers:
        assert answer["model"] == "tiny"
        assert_valid_call(answer)
    assert len({a["content"][0]["id"] for a in answers}) == 3


@pytest.mark.parametrize("upstream", list(ERAS))
async def test_auto_gives_a_valid_call_or_plain_text(served: tuple[Mux, str], upstream: str) -> None:
    _, url = served
    for seed in range(3):
        answer = await plan(url, upstream, choice="auto", seed=seed)
        if answer["stop_reason"] == "toolUse":
            assert_valid_call(answer)
        else:
            (block,) = answer["content"]
            assert block["type"] == "text"
            assert not block["text"].startswith("<")


async def test_none_gives_plain_text(served: tuple[Mux, str]) -> None:
    _, url = served
    answer = await plan(url, "modern", choice="none", max_tokens=8)
    assert answer["stop_reason"] in ("endTurn", "maxTokens")
    assert [block["type"] for block in answer["content"]] == ["text"]


async def test_earlier_calls_and_results_reach_the_model_in_the_documented_form(served: tuple[Mux, str]) -> None:
    """The bridge's conversation equals the one built here from the documented pieces: the same seed
    gives the same call."""
    mux, url = served
    answer = await plan(url, "legacy", choice="required", history=True, seed=3)
    assert_valid_call(answer)
    use = ToolUse(tuple(ToolSpec(t.name, t.description or "", t.input_schema) for t in (WEATHER, ADD)), "required")
    messages = use.with_tools(
        [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": call_text("weather", {"city": "Paris", "days": 2})},
            {"role": "user", "content": result_text("Sunny, 21 C")},
        ]
    )
    assert mux.inference is not None
    params = SamplingParams(max_tokens=96, temperature=1.0, seed=3, grammar=use.grammar)
    direct = use.parse((await mux.inference.complete(messages, params, model="tiny")).text)
    assert direct is not None
    block = answer["content"][0]
    assert (block["name"], block["input"]) == (direct.name, direct.arguments)


async def test_a_schema_the_grammar_cannot_hold_is_refused_naming_the_feature(served: tuple[Mux, str]) -> None:
    _, url = served
    async with Client(url, mode="legacy") as client:
        refused = r"upstream 'modern' asked for sampling with tools whose input schemas"
        with pytest.raises(MCPError, match=refused) as err:
            await client.call_tool("modern__plan", {"prompt": "Tag it.", "tags": True})
    assert "uniqueItems" in str(err.value)


@pytest.mark.slow
async def test_smollm2_calls_the_tool_a_question_needs(
    smollm2_cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The builtin model, held to the call format, picks the right tool and fills in its arguments."""
    monkeypatch.setenv("MCPMUX_CACHE_DIR", str(smollm2_cache_dir))
    config = tmp_path / "mcpmux.toml"
    config.write_text(config_text("builtin:smollm2-135m", kv_cache_memory_mb=64, timeout=600))
    async with served_in_process(config) as (_, _, url):
        prompt = "What is the weather in Paris for the next 3 days?"
        answer = await plan(url, "modern", prompt=prompt, choice="required", temperature=0)
    assert_valid_call(answer)
    assert {k: answer["content"][0][k] for k in ("name", "input")} == {
        "name": "weather",
        "input": {"city": "Paris", "days": 3},
    }
