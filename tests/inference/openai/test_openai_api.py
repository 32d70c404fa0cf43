"""The OpenAI-compatible API on a real uvicorn server on loopback, driven by the official `openai` client,
over a tiny random Llama: chat and text completions, streamed and whole, stop sequences, seeds, n,
logprobs, usage with cached tokens, embeddings, response_format (JSON schema, JSON object), and bad
requests in OpenAI's error shape."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx2 as httpx
import jsonschema
import openai
import pytest
import uvicorn

from mcpmux.inference.openai.routes import openai_app
from mcpmux.inference.serving.service import InferenceService
from mcpmux.inference.serving.settings import EmbeddingSettings, InferenceSettings, ModelSettings

pytestmark = pytest.mark.anyio

CHAT = [{"role": "user", "content": "The capital of France is"}]


@asynccontextmanager
async def serve(settings: InferenceSettings) -> AsyncIterator[tuple[str, InferenceService]]:
    """The service behind `/v1` on a free loopback port; yields (base_url, service)."""
    async with await InferenceService.start(settings) as service, anyio.create_task_group() as tg:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(openai_app(service), log_level="warning", lifespan="off"))
        tg.start_soon(lambda: server.serve(sockets=[sock]))
        with anyio.fail_after(10):
            while not server.started:
                await anyio.sleep(0.01)
        try:
            yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1", service
        finally:
            server.should_exit = True


def tiny_settings(model: Path, **overrides: int) -> InferenceSettings:
    return InferenceSettings(
        backend="local",
        models={"tiny": ModelSettings(model=str(model), kv_cache_memory_mb=4, **overrides)},  # type: ignore[arg-type]
        embeddings=EmbeddingSettings(max_delay=0.01),
    )


@pytest.fixture
async def api(tiny_llama: Path) -> AsyncIterator[tuple[openai.AsyncOpenAI, InferenceService]]:
    async with (
        serve(tiny_settings(tiny_llama)) as (url, service),
        openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0) as client,
    ):
        yield client, service


async def test_models_lists_the_configured_models_and_the_embedder(api: tuple[openai.AsyncOpenAI, object]) -> None:
    client, _ = api
    ids = [m.id async for m in client.models.list()]
    assert ids == ["tiny", "builtin:all-minilm-l6-v2"]


async def test_chat_completion_whole_and_streamed_agree(api: tuple[openai.AsyncOpenAI, InferenceService]) -> None:
    client, _ = api
    whole = await client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12, temperature=0)  # type: ignore[arg-type]
    (choice,) = whole.choices
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason == "length"
    assert whole.usage is not None
    assert whole.usage.completion_tokens == 12
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 12
    stream = await client.chat.completions.create(
        model="tiny",
        messages=CHAT,  # type: ignore[arg-type]
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.completion_tokens == 12
    # The same prompt again: its full KV blocks come from the prefix cache, and usage says so.
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens > 0


async def test_raw_stream_is_sse_ending_with_done(api: tuple[openai.AsyncOpenAI, InferenceService]) -> None:
    client, _ = api
    body = {"model": "tiny", "prompt": "Hello", "max_tokens": 4, "temperature": 0, "stream": True}
    async with httpx.AsyncClient() as http:
        response = await http.post(f"{client.base_url}completions", json=body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [line for line in response.text.split("\n\n") if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"


async def test_stop_sequences_cut_the_text_before_the_match(api: tuple[openai.AsyncOpenAI, InferenceService]) -> None:
    client, _ = api
    free = await client.completions.create(model="tiny", prompt="Hello, world!", max_tokens=24, temperature=0)
    full = free.choices[0].text
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    assert stop.strip(), f"pick a visible stop string from {full!r}"
    expected = full[: full.index(stop)]
    cut = await client.completions.create(
        model="tiny", prompt="Hello, world!", max_tokens=24, temperature=0, stop=[stop]
    )
    assert cut.choices[0].text == expected
    assert cut.choices[0].finish_reason == "stop"
    streamed = await client.completions.create(
        model="tiny", prompt="Hello, world!", max_tokens=24, temperature=0, stop=stop, stream=True
    )
    assert "".join([c.choices[0].text async for c in streamed if c.choices]) == expected


async def test_seed_makes_sampling_reproducible_and_n_gives_distinct_choices(
    api: tuple[openai.AsyncOpenAI, InferenceService],
) -> None:
    client, _ = api

    async def sample(seed: int, n: int = 1) -> list[str]:
        out = await client.chat.completions.create(
            model="tiny",
            messages=CHAT,  # type: ignore[arg-type]
            max_tokens=16,
            temperature=1.0,
            seed=seed,
            n=n,
        )
        return [c.message.content or "" for c in sorted(out.choices, key=lambda c: c.index)]

    first = await sample(7)
    assert first == await sample(7)
    assert first != await sample(8)
    both = await sample(7, n=2)
    assert len(both) == 2
    assert both[0] == first[0]
    assert both[0] != both[1]


async def test_logprobs_come_per_token_with_alternatives(api: tuple[openai.AsyncOpenAI, InferenceService]) -> None:
    client, _ = api
    out = await client.chat.completions.create(
        model="tiny",
        messages=CHAT,  # type: ignore[arg-type]
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    logprobs = out.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.content is not None
    assert len(logprobs.content) == 5
    for entry in logprobs.content:
        assert entry.logprob <= 0
        assert len(entry.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert entry.logprob == pytest.approx(max(t.logprob for t in entry.top_logprobs), abs=1e-5)
    assert "".join(e.token for e in logprobs.content) == out.choices[0].message.content


async def test_embeddings_match_the_service(api: tuple[openai.AsyncOpenAI, InferenceService]) -> None:
    client, service = api
    texts = ["hello", "continuous batching lets requests join and leave at every step"]
    out = await client.embeddings.create(model="builtin:all-minilm-l6-v2", input=texts)  # base64 on the wire
    direct = await service.embed(texts)
    assert [d.index for d in out.data] == [0, 1]
    for got, want in zip(out.data, direct, strict=True):
        assert len(got.embedding) == 384
        assert got.embedding == pytest.approx(want, abs=1e-6)
    assert out.usage.prompt_tokens > len(texts)
    floats = await client.embeddings.create(model="all-minilm-l6-v2", input="hello", encoding_format="float")
    assert floats.data[0].embedding == pytest.approx(direct[0], abs=1e-6)


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"model": "tiny"}, "messages", None),
        ({"model": "tiny", "messages": []}, "messages", None),
        ({"model": "tiny", "messages": CHAT, "max_tokens": -1}, "max_tokens", None),
        ({"model": "tiny", "messages": CHAT, "temperature": 5}, "temperature", None),
        ({"model": "gpt-9", "messages": CHAT}, "model", "model_not_found"),
        ({"model": "tiny", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, None, None),
    ],
)
async def test_bad_requests_get_400_in_openai_error_shape(
    api: tuple[openai.AsyncOpenAI, InferenceService], body: dict[str, object], param: str | None, code: str | None
) -> None:
    client, _ = api
    with pytest.raises(openai.BadRequestError) as caught:
        await client.post("/chat/completions", body=body, cast_to=object)
    error = caught.value.response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["message"]
    if param is not None:
        assert error["param"] == param
    assert error["code"] == code
    if code == "model_not_found":
        assert "tiny" in error["message"]  # it lists what is configured


async def test_bad_json_and_bad_embedding_model_are_400(api: tuple[openai.AsyncOpenAI, InferenceService]) -> None:
    client, _ = api
    async with httpx.AsyncClient() as http:
        response = await http.post(f"{client.base_url}completions", content=b"{not json")
    assert response.status_code == 400
    assert "not valid JSON" in response.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="all-minilm"):
        await client.embeddings.create(model="text-embedding-3-small", input="x")


async def test_a_full_queue_answers_503(tiny_llama: Path) -> None:
    settings = tiny_settings(tiny_llama, max_num_seqs=1, max_waiting=1)
    async with serve(settings) as (url, _), openai.AsyncOpenAI(base_url=url, api_key="-", max_retries=0) as client:
        statuses: list[int] = []
        refusals: list[dict[str, str]] = []

        async def one(i: int) -> None:  # distinct prompts: identical greedy requests would share one
            try:
                await client.completions.create(model="tiny", prompt=f"Hello {i}", max_tokens=48, temperature=0)
                statuses.append(200)
            except openai.APIStatusError as exc:
                refusals.append(exc.response.json()["error"])
                statuses.append(exc.status_code)

        async with anyio.create_task_group() as tg:
            for i in range(6):
                tg.start_soon(one, i)
    assert 200 in statuses
    assert 503 in statuses
    assert set(statuses) == {200, 503}
    assert all(r["code"] == "queue_full" and "max_waiting" in r["message"] for r in refusals)


@pytest.mark.parametrize("openai_api", [True, False])
async def test_the_mcp_http_server_mounts_v1_when_asked(tiny_llama: Path, openai_api: bool) -> None:
    from mcpmux.core.config import config_from_dict
    from mcpmux.mux.multiplexer import Mux
    from mcpmux.server.frontend import Frontend, bind
    from mcpmux.server.http.edge_policy import EdgePolicy

    inference = {
        "backend": "local",
        "openai_api": openai_api,
        "models": {"tiny": {"model": str(tiny_llama), "kv_cache_memory_mb": 4}},
    }
    config = config_from_dict({"inference": inference}, source="test")
    async with Mux(config) as mux, anyio.create_task_group() as tg:
        sock = bind("127.0.0.1", 0)
        stop = anyio.Event()
        tg.start_soon(Frontend(mux).serve_http, sock, EdgePolicy.load(config, "127.0.0.1"), "/mcp", stop)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        async with httpx.AsyncClient(base_url=url) as http:
            with anyio.fail_after(10):
                while True:
                    try:
                        models = await http.get("/v1/models")
                        break
                    except httpx.TransportError:
                        await anyio.sleep(0.05)
            if openai_api:
                assert models.json()["data"][0]["id"] == "tiny"
                body = {"model": "tiny", "messages": CHAT, "max_tokens": 3, "temperature": 0}
                answer = await http.post("/v1/chat/completions", json=body)
                assert answer.json()["usage"]["completion_tokens"] == 3
            else:
                assert models.status_code == 404
        stop.set()


async def test_a_client_that_hangs_up_aborts_its_stream(api: tuple[openai.AsyncOpenAI, InferenceService]) -> None:
    client, service = api
    body = {"model": "tiny", "prompt": "Hello", "max_tokens": 900, "temperature": 0, "stream": True}
    async with httpx.AsyncClient() as http, http.stream("POST", f"{client.base_url}completions", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                break  # one token arrived: hang up
    with anyio.fail_after(10):
        while service.stats()["models"]["tiny"]["requests_aborted"] < 1:
            await anyio.sleep(0.02)
    stats = service.stats()["models"]["tiny"]
    assert stats["running"] == 0
    assert stats["generated_tokens"] < 900


@pytest.mark.slow
async def test_smollm2_answers_through_the_openai_client(
    smollm2_cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MCPMUX_CACHE_DIR", str(smollm2_cache_dir))
    settings = InferenceSettings(
        backend="local", models={"smollm2": ModelSettings(model="builtin:smollm2-135m", kv_cache_memory_mb=64)}
    )
    async with serve(settings) as (url, _), openai.AsyncOpenAI(base_url=url, api_key="-", max_retries=0) as client:
        question = [{"role": "user", "content": "What is the capital of France?"}]
        answer = await client.chat.completions.create(
            model="smollm2",
            messages=question,  # type: ignore[arg-type]
            max_tokens=24,
            temperature=0,
        )
        assert "Paris" in (answer.choices[0].message.content or "")
        assert answer.choices[0].finish_reason in ("stop", "length")


ANSWER = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Lyon"]}, "sure": {"type": "boolean"}},
    "required": ["city", "sure"],
    "additionalProperties": False,
}


async def test_response_format_holds_the_answer_to_a_json_schema(api: tuple[openai.AsyncOpenAI, object]) -> None:
    client, _ = api
    schema_format = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}}
    whole = await client.chat.completions.create(
        model="tiny",
        messages=CHAT,  # type: ignore[arg-type]
        max_tokens=100,
        temperature=1.0,
        seed=3,
        n=2,
        response_format=schema_format,  # type: ignore[arg-type]
    )
    for choice in whole.choices:  # choice 1 runs with seed 4: the grammar travels with the seed change
        jsonschema.validate(json.loads(choice.message.content or ""), ANSWER)
        assert choice.finish_reason == "stop"
    streamed = await client.chat.completions.create(
        model="tiny",
        messages=CHAT,  # type: ignore[arg-type]
        max_tokens=100,
        temperature=0,
        stream=True,
        response_format=schema_format,  # type: ignore[arg-type]
    )
    text = "".join([chunk.choices[0].delta.content or "" async for chunk in streamed if chunk.choices])
    jsonschema.validate(json.loads(text), ANSWER)
    anything = await client.completions.create(
        model="tiny",
        prompt="Data:",
        max_tokens=100,
        temperature=0,
        extra_body={"response_format": {"type": "json_object"}},
    )
    # Any object: a random model may write keys until max_tokens, but what it writes is an object's start.
    (choice,) = anything.choices
    assert choice.text.startswith("{")
    assert choice.finish_reason == "length" or isinstance(json.loads(choice.text), dict)


async def test_bad_response_formats_are_400s(api: tuple[openai.AsyncOpenAI, object]) -> None:
    client, _ = api
    with pytest.raises(openai.BadRequestError, match=r"response_format\.type must be"):
        await client.chat.completions.create(
            model="tiny",
            messages=CHAT,
            response_format={"type": "xml"},  # type: ignore[arg-type,typeddict-item]
        )
    unusable = {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "object", "minProperties": "many"}},
    }
    with pytest.raises(openai.BadRequestError, match="json_schema grammar cannot be used"):
        await client.chat.completions.create(model="tiny", messages=CHAT, response_format=unusable)  # type: ignore[arg-type]
