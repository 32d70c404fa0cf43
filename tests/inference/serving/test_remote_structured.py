"""Structured output and tool calls through a remote OpenAI-compatible server (a second mcpmux over a tiny
random model, which holds answers to `response_format` `json_schema`): asked once whether it takes
the schema, sent it, and checked on return; an answer that does not match is an error, never passed
on. End to end: an upstream's sampling with tools, `local__generate`'s `schema`, and `/v1` tools,
`response_format` and `/metrics` + `mcpmux status` of an mcpmux in front of a fleet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import jsonschema
import openai
import pytest
from mcp import Client

from mcpmux.inference.engine.config import Grammar, SamplingParams
from mcpmux.inference.errors import EngineError
from mcpmux.inference.serving.remote import InvalidAnswerError
from mcpmux.inference.serving.service import InferenceService
from mcpmux.inference.serving.settings import BackendSettings, EmbeddingSettings, InferenceSettings, RemoteSettings
from mcpmux.inference.serving.tool_calls import ToolSpec, ToolUse
from tests.e2e.conftest import PY, served_in_process, text_of
from tests.inference.serving.openai_server import OpenAIServer
from tests.inference.serving.tool_sampling_server import ADD, WEATHER

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

ORDER = {
    "type": "object",
    "properties": {
        "item": {"enum": ["tea", "coffee", "cake"]},
        "count": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["item", "count"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = tuple(ToolSpec(t.name, t.description or "", t.input_schema) for t in (WEATHER, ADD))
SCHEMAS = {tool.name: tool.schema for tool in TOOLS}
SAMPLED = SamplingParams(max_tokens=96, temperature=1.0, seed=3)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def remote_url(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = tmp_path_factory.mktemp("remote_structured") / "remote.toml"
    config.write_text(
        f'[inference]\n[inference.models.tiny]\nmodel = "{tiny_llama}"\nkv_cache_memory_mb = 16\n'
        '[inference.embeddings]\nmodel = ""\n'
    )
    server = OpenAIServer(config)
    try:
        yield server.start()
    finally:
        server.stop()


def one_remote(url: str, **backend: Any) -> InferenceSettings:
    if not backend:  # the short form
        return InferenceSettings(
            backend="openai", remote=RemoteSettings(base_url=url, model="tiny"), embeddings=EmbeddingSettings(model="")
        )
    far = BackendSettings(name="far", base_url=url, models=["tiny"], **backend)
    return InferenceSettings(backends=[far], embeddings=EmbeddingSettings(model=""))


@pytest.fixture
async def svc(remote_url: str) -> AsyncIterator[InferenceService]:
    async with await InferenceService.start(one_remote(remote_url)) as started:
        yield started


def the_backend(svc: InferenceService) -> dict[str, Any]:
    (backend,) = svc.stats()["backends"].values()
    return backend  # type: ignore[no-any-return]


async def test_a_json_schema_is_sent_and_the_answer_checked(svc: InferenceService) -> None:
    assert the_backend(svc)["json_schema"] is None  # nothing asked before the first structured request
    params = SamplingParams(max_tokens=64, temperature=1.0, seed=1, grammar=Grammar("json_schema", json.dumps(ORDER)))
    done = await svc.complete("Order:", params)
    jsonschema.validate(json.loads(done.text), ORDER)
    assert the_backend(svc)["json_schema"] is True  # it was asked once, and holds answers to the schema
    deltas = [d async for d in svc.stream("Another order:", params)]
    assert [d.finish_reason for d in deltas] == [None, "stop"]  # checked whole, then handed out whole
    jsonschema.validate(json.loads(deltas[0].text), ORDER)
    with pytest.raises(EngineError, match="a regex or Lark grammar needs a local backend"):
        await svc.complete("Digits:", SamplingParams(grammar=Grammar("regex", "[0-9]+")))


async def test_tool_calls_come_back_as_calls_whose_arguments_validate(svc: InferenceService) -> None:
    for mode, forced in (("required", None), ("required", "add")):
        use = ToolUse(TOOLS, mode, forced)  # type: ignore[arg-type]
        call = use.parse((await svc.complete(ASK, SAMPLED, tools=use)).text)
        assert call is not None
        assert forced in (None, call.name)
        jsonschema.validate(call.arguments, SCHEMAS[call.name])
    auto = ToolUse(TOOLS, "auto")
    for seed in range(3):
        text = (await svc.complete(ASK, SamplingParams(max_tokens=96, seed=seed), tools=auto)).text
        call = auto.parse(text)
        if call is not None:
            jsonschema.validate(call.arguments, SCHEMAS[call.name])
        else:  # plain text, unwrapped from the JSON form (also when max_tokens cut it)
            assert not text.startswith(("{", "<tool_call>")), text


async def test_an_answer_that_does_not_match_is_an_error_never_passed_on(remote_url: str) -> None:
    """Asked in the prompt only, a random model writes anything: that is refused, whole."""
    async with await InferenceService.start(one_remote(remote_url, structured_output="prompt")) as svc:
        # Ended by a stop string, so the answer counts as finished (one cut by max_tokens is not checked).
        params = SamplingParams(
            max_tokens=64, seed=2, stop=(" ", "e"), grammar=Grammar("json_schema", json.dumps(ORDER))
        )
        with pytest.raises(
            InvalidAnswerError, match=r"asked in the prompt .* answered wrongly: the answer is not JSON"
        ):
            await svc.complete("Order:", params)
        seen: list[Any] = []
        with pytest.raises(InvalidAnswerError):
            await anext_all(svc, params, seen)
        assert seen == []
        use = ToolUse(TOOLS, "required")
        with pytest.raises(InvalidAnswerError, match="answered wrongly"):
            await svc.complete(ASK, SamplingParams(max_tokens=64, seed=2, stop=(" ", "e")), tools=use)
        backend = the_backend(svc)
        assert (backend["json_schema"], backend["sent"]["invalid answers"], backend["state"]) == (False, 3, "up")


async def anext_all(svc: InferenceService, params: SamplingParams, seen: list[Any]) -> None:
    async for delta in svc.stream("Order:", params):
        seen.append(delta)


async def test_priorities_travel_once_the_server_accepts_them(svc: InferenceService) -> None:
    assert the_backend(svc)["priority"] is None
    await svc.complete("Urgent", SamplingParams(max_tokens=4, temperature=0.0), priority=5)
    assert the_backend(svc)["priority"] is True
    off = one_remote(svc.settings.remote.base_url if svc.settings.remote else "", forward_priority=False)
    async with await InferenceService.start(off) as quiet:
        await quiet.complete("Urgent", SamplingParams(max_tokens=4, temperature=0.0), priority=5)
        assert the_backend(quiet)["priority"] is None  # never asked


async def test_upstream_sampling_with_tools_and_local_generate_schema_use_the_remote(
    remote_url: str, tmp_path: Path
) -> None:
    server = Path(__file__).with_name("tool_sampling_server.py")
    config = tmp_path / "mcpmux.toml"
    config.write_text(
        f'[inference]\nbackend = "openai"\n[inference.remote]\nbase_url = "{remote_url}"\nmodel = "tiny"\n'
        f'[inference.embeddings]\nmodel = ""\n[servers.modern]\ncommand = "{PY}"\nargs = ["{server}"]\n'
    )
    async with served_in_process(config) as (mux, _, url):
        async with Client(url, mode="legacy") as client:  # declares no sampling: mcpmux's model answers
            result = await client.call_tool("modern__plan", {"prompt": "Weather in Paris?", "choice": "required"})
        assert not result.is_error, text_of(result)
        answer = result.structured_content or {}
        assert answer["stop_reason"] == "toolUse"
        (block,) = answer["content"]
        jsonschema.validate(block["input"], SCHEMAS[block["name"]])
        generated = await mux.call_tool("local__generate", {"prompt": "Order:", "schema": ORDER, "max_tokens": 64})
        assert not generated.is_error, text_of(generated)
        jsonschema.validate((generated.structured_content or {})["value"], ORDER)
        assert mux.inference is not None
        assert the_backend(mux.inference)["requests"] >= 2


async def test_v1_of_an_mcpmux_in_front_of_a_fleet(remote_url: str, tiny_llama: Path, tmp_path: Path) -> None:
    config = tmp_path / "front.toml"
    config.write_text(
        f'[inference]\n[inference.models.tiny]\nmodel = "{tiny_llama}"\nkv_cache_memory_mb = 16\n'
        '[inference.embeddings]\nmodel = ""\n'
        f'[[inference.backends]]\nname = "far"\nbase_url = "{remote_url}"\nmodels = ["tiny"]\n'
        '[[inference.backends]]\nkind = "local"\nfallback = true\n'
    )
    front = OpenAIServer(config)
    url = front.start()
    try:
        async with openai.AsyncOpenAI(base_url=url, api_key="-", max_retries=0) as client:
            tools: Any = [{"type": "function", "function": {"name": t.name, "parameters": t.schema}} for t in TOOLS]
            answer = await client.chat.completions.create(
                model="tiny",
                messages=ASK,
                tools=tools,
                tool_choice="required",
                max_tokens=96,
                seed=1,  # type: ignore[arg-type]
            )
            (call,) = answer.choices[0].message.tool_calls or []
            assert answer.choices[0].finish_reason == "tool_calls"
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])  # type: ignore[union-attr]
            chunks = [
                c
                async for c in await client.chat.completions.create(
                    model="tiny",
                    messages=ASK,
                    tools=tools,
                    tool_choice="required",
                    max_tokens=96,
                    seed=1,
                    stream=True,  # type: ignore[arg-type]
                )
            ]
            streamed = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices and c.choices[0].delta.tool_calls]
            assert streamed[0].function.name == call.function.name  # type: ignore[union-attr]
            assert "".join(d.function.arguments or "" for d in streamed) == call.function.arguments  # type: ignore[union-attr]
            strict: Any = {"type": "json_schema", "json_schema": {"name": "order", "schema": ORDER, "strict": True}}
            ordered = await client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "Order"}], response_format=strict, max_tokens=64
            )
            jsonschema.validate(json.loads(ordered.choices[0].message.content or ""), ORDER)
        metrics = httpx2.get(url.removesuffix("/v1") + "/metrics").text
        assert 'mcpmux_inference_backend_up{backend="far"} 1.0' in metrics
        (info,) = [
            line for line in metrics.splitlines() if line.startswith('mcpmux_inference_backend_info{backend="far"')
        ]
        assert 'json_schema="yes"' in info
        assert 'kind="openai"' in info
        summary = subprocess.run(
            [sys.executable, "-m", "mcpmux", "status", "--url", url],
            capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"},
        )  # fmt: skip
    finally:
        front.stop()
    assert summary.returncode == 0, summary.stderr
    assert "Inference backends" in summary.stdout
    rows = {
        line.split()[0]: line.split()
        for line in summary.stdout.splitlines()
        if line.split()[:1] in (["far"], ["local"])
    }
    assert rows["far"][1:3] == ["openai", "up"]
    assert rows["local"][1:4] == ["local,", "fallback", "up"]
