"""mcpmux's own inference tools, `generate` and `embed`, called by a real client through mcpmux."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from mcpmux import Mux
from mcpmux.inference.engine.async_engine import Engine
from mcpmux.inference.engine.config import EngineConfig, SamplingParams
from tests.e2e.conftest import mux_over_stdio, text_of
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
