"""mcpmux's own inference tools, `generate` and `embed`, called by a real client through mcpmux."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from mcpmux import Mux
from mcpmux.inference.engine.async_engine import Engine
from mcpmux.inference.engine.config import EngineConfig, SamplingParams
from tests.e2e.conftest import demo, mux_over_stdio, text_of
from tests.inference.tiny_models import build_tiny_model

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("llama", tmp_path_factory.mktemp("local_tools") / "llama")


def config_text(model: Path, namespace: str | None = None, embeddings: bool = False) -> str:
    names = f'namespace = "{namespace}"\n' if namespace else ""
    embedding = '"builtin:all-minilm-l6-v2"' if embeddings else '""'
    return (
        f'[inference]\nbackend = "local"\n{names}'
        f'[inference.models.tiny]\nmodel = "{model}"\nkv_cache_memory_mb = 16\n'
        f"[inference.embeddings]\nmodel = {embedding}\n"
    )


async def engine_text(model: Path, prompt: Any, max_tokens: int) -> str:
    """The same request on an engine of our own: what the tool must return."""
    async with await Engine.start(EngineConfig(model=str(model), kv_cache_memory_mb=16)) as engine:
        return (await engine.complete(prompt, SamplingParams(max_tokens=max_tokens, temperature=0))).text


@pytest.fixture(scope="module")
async def client(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Client]:
    """mcpmux over stdio with no upstreams, its tools under the `llm` namespace, embeddings on."""
    config = tmp_path_factory.mktemp("local_tools_mux") / "mcpmux.toml"
    config.write_text(config_text(tiny_model, namespace="llm", embeddings=True))
    async with mux_over_stdio(config, mode="legacy") as connected:
        yield connected


async def test_generate_streams_the_text_so_far_as_progress(client: Client, tiny_model: Path) -> None:
    names = {tool.name for tool in (await client.list_tools()).tools}
    assert {"llm__generate", "llm__embed"} <= names
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    arguments = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}
    result = await client.call_tool("llm__generate", arguments, progress_callback=on_progress)
    assert not result.is_error, text_of(result)
    text = text_of(result)
    assert text == await engine_text(tiny_model, "Once upon a time", 12)
    assert result.structured_content is not None
    assert result.structured_content["model"] == "tiny"
    assert result.structured_content["usage"]["completion_tokens"] == 12
    assert len(seen) >= 2
    assert [p for p, _, _ in seen] == sorted({p for p, _, _ in seen})
    assert {total for _, total, _ in seen} == {12}
    messages = [m or "" for _, _, m in seen]
    assert all(text.startswith(m) for m in messages)
    assert messages[-1] == text


async def test_generate_explains_bad_arguments(client: Client) -> None:
    both = await client.call_tool("llm__generate", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]})
    assert both.is_error
    assert "give exactly one of 'prompt' (plain text) or 'messages' (chat)" in text_of(both)
    unknown = await client.call_tool("llm__generate", {"prompt": "a", "model": "gpt-9"})
    assert unknown.is_error
    assert "unknown model 'gpt-9'; configured models: tiny" in text_of(unknown)
    negative = await client.call_tool("llm__generate", {"prompt": "a", "max_tokens": -1})
    assert negative.is_error
    assert "max_tokens" in text_of(negative)


async def test_embed_returns_normalized_vectors_that_rank_by_meaning(client: Client) -> None:
    texts = ["A cat sat on the mat.", "A kitten rested on the rug.", "The quarterly tax filing is due in April."]
    result = await client.call_tool("llm__embed", {"texts": texts})
    assert not result.is_error, text_of(result)
    assert result.structured_content is not None
    assert result.structured_content["dimensions"] == 384
    cat, kitten, tax = result.structured_content["embeddings"]
    assert all(math.isclose(math.fsum(x * x for x in v), 1.0, abs_tol=1e-4) for v in (cat, kitten, tax))

    def dot(a: list[float], b: list[float]) -> float:
        return math.fsum(x * y for x, y in zip(a, b, strict=True))

    assert dot(cat, kitten) > dot(cat, tax) + 0.2


async def test_default_namespace_and_chat_messages_in_the_library(tiny_model: Path, tmp_path: Path) -> None:
    config = tmp_path / "mcpmux.toml"
    config.write_text(config_text(tiny_model))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    async with Mux.from_config(config) as mux:
        assert {"local__generate", "local__embed"} <= {tool.name for tool in mux.list_tools()}
        result = await mux.call_tool("local__generate", {"messages": messages, "max_tokens": 6, "temperature": 0})
        off = await mux.call_tool("local__embed", {"texts": ["x"]})
    assert text_of(result) == await engine_text(tiny_model, messages, 6)
    assert off.is_error
    assert "embeddings are off" in text_of(off)


async def test_other_calls_are_answered_while_the_first_model_loads(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The first `generate` brings torch in and loads the model; nothing else waits for that."""
    config = tmp_path_factory.mktemp("first_load") / "mcpmux.toml"
    python, script = demo("alpha")["command"], demo("alpha")["args"][0]
    alpha = f'[servers.alpha]\ncommand = "{python}"\nargs = ["{script}", "alpha"]\n'
    config.write_text(config_text(tiny_model) + alpha)
    echo_seconds: list[float] = []
    async with mux_over_stdio(config, mode="legacy") as session:
        assert text_of(await session.call_tool("alpha__echo", {"text": "warm"})) == "alpha: warm"
        loading = anyio.Event()

        async def first_generate() -> None:
            started = time.monotonic()
            result = await session.call_tool("local__generate", {"prompt": "hi", "max_tokens": 2})
            assert not result.is_error, text_of(result)
            echo_seconds.append(time.monotonic() - started)  # last: the whole first generate
            loading.set()

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(first_generate)
            await anyio.sleep(0.3)
            while not loading.is_set():
                started = time.monotonic()
                assert text_of(await session.call_tool("alpha__echo", {"text": "x"})) == "alpha: x"
                echo_seconds.insert(0, time.monotonic() - started)
                await anyio.sleep(0.1)
    *echoes, generate = echo_seconds
    assert len(echoes) >= 2, f"the first generate took {generate:.1f}s and only {len(echoes)} echo ran meanwhile"
    assert max(echoes) < generate / 4, f"an echo waited {max(echoes):.1f}s of the first generate's {generate:.1f}s"
