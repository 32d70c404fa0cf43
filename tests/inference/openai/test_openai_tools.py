"""Tool calls through `/v1/chat/completions` with the official `openai` client, over a tiny random Llama:
whatever the weights, a grammar holds the model to calls whose arguments validate, whole and streamed
(id and name first, then argument fragments), for `required`, a named function, `auto` and `none`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from tests.inference.openai.test_openai_api import serve, tiny_settings
from tests.inference.serving.tool_sampling_server import ADD, WEATHER

pytestmark = pytest.mark.anyio

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.input_schema}}
    for t in (WEATHER, ADD)
]
SCHEMAS = {tool.name: tool.input_schema for tool in (WEATHER, ADD)}


@pytest.fixture
async def client(tiny_llama: Path) -> AsyncIterator[openai.AsyncOpenAI]:
    async with (
        serve(tiny_settings(tiny_llama)) as (url, _),
        openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0) as opened,
    ):
        yield opened


async def ask(client: openai.AsyncOpenAI, **options: Any) -> Any:
    options = {"messages": ASK, "tools": TOOLS, "max_tokens": 96, "temperature": 1.0} | options
    return await client.chat.completions.create(model="tiny", **options)


def assert_valid(name: str, arguments: str) -> None:
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


async def test_required_gives_a_call_whose_arguments_validate_whole_and_streamed(client: openai.AsyncOpenAI) -> None:
    whole = await ask(client, tool_choice="required", seed=5)
    (choice,) = whole.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function"
    assert call.id.startswith("call_")
    assert_valid(call.function.name, call.function.arguments)

    chunks = [chunk async for chunk in await ask(client, tool_choice="required", seed=5, stream=True)]
    deltas = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    first, rest = deltas[0], deltas[1:]
    assert (first.index, first.type, first.function.arguments) == (0, "function", "")
    assert first.function.name == call.function.name
    assert first.id.startswith("call_")
    assert all(d.id is None and d.function.name is None and d.index == 0 for d in rest)
    assert len(rest) > 1, "the arguments should come in several fragments"
    # The same seed gives the same call: the fragments add up to the whole answer's arguments.
    assert "".join(d.function.arguments for d in rest) == call.function.arguments
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


async def test_a_named_function_is_the_one_called(client: openai.AsyncOpenAI) -> None:
    for seed in range(3):
        whole = await ask(client, tool_choice={"type": "function", "function": {"name": "add"}}, seed=seed)
        (call,) = whole.choices[0].message.tool_calls
        assert call.function.name == "add"
        assert_valid("add", call.function.arguments)


async def test_auto_gives_a_call_or_plain_text_and_none_gives_text(client: openai.AsyncOpenAI) -> None:
    for seed in range(3):
        (choice,) = (await ask(client, tool_choice="auto", seed=seed)).choices
        if choice.finish_reason == "tool_calls":
            (call,) = choice.message.tool_calls
            assert_valid(call.function.name, call.function.arguments)
        else:
            assert choice.message.tool_calls is None
            assert not (choice.message.content or "").startswith("<")
    (choice,) = (await ask(client, tool_choice="none", max_tokens=8)).choices
    assert choice.message.tool_calls is None
    assert choice.finish_reason in ("stop", "length")
    streamed = [c async for c in await ask(client, tool_choice="none", max_tokens=8, stream=True, seed=1)]
    assert not any(c.choices and c.choices[0].delta.tool_calls for c in streamed)


async def test_a_follow_up_turn_carries_the_call_and_its_result(client: openai.AsyncOpenAI) -> None:
    first = (await ask(client, tool_choice="required", seed=2)).choices[0].message
    call = first.tool_calls[0]
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"},
    ]
    answer = await ask(client, messages=history, tool_choice="required", seed=2)
    (again,) = answer.choices[0].message.tool_calls
    assert_valid(again.function.name, again.function.arguments)
    assert answer.usage.prompt_tokens > (await ask(client, tool_choice="required", seed=2)).usage.prompt_tokens


async def test_bad_tool_requests_are_400s_naming_the_field(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="tool choice names 'lookup', which is not among the tools") as err:
        await ask(client, tool_choice={"type": "function", "function": {"name": "lookup"}})
    assert err.value.body["param"] == "tool_choice"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="response_format cannot be combined with tools"):
        await ask(client, response_format={"type": "json_object"})
    with pytest.raises(openai.BadRequestError, match=r"tools\[0\] must be"):
        await ask(client, tools=[{"type": "function"}])
    odd = [{"type": "function", "function": {"name": "f", "parameters": {"type": "array", "uniqueItems": True}}}]
    with pytest.raises(openai.BadRequestError, match="uniqueItems"):
        await ask(client, tools=odd, tool_choice="required")
