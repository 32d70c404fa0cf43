"""The remote backend against a second mcpmux process (`mcpmux serve --openai-only` over a tiny model):
completions, streams, seeds, stops and embeddings match the local engine, a stream left early stops on
the server, and failures (unknown model, timeout, nothing listening, missing API key) name the URL and
say what happened."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from pathlib import Path

import anyio
import httpx2
import pytest

from mcpmux.inference.engine.config import SamplingParams
from mcpmux.inference.serving.remote import RemoteError
from mcpmux.inference.serving.service import InferenceService
from mcpmux.inference.serving.settings import EmbeddingSettings, InferenceSettings, ModelSettings, RemoteSettings
from tests.inference.serving.openai_server import openai_only_server

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

GREEDY = SamplingParams(max_tokens=12, temperature=0.0)
MCPMUX = [sys.executable, "-m", "mcpmux"]


@pytest.fixture(scope="module")
def remote_url(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`mcpmux serve --openai-only` in a child process on a free port; yields its /v1 URL."""
    config = tmp_path_factory.mktemp("remote") / "mcpmux.toml"
    config.write_text(
        f'[inference]\nbackend = "local"\n[inference.models.tiny]\nmodel = "{tiny_llama}"\nkv_cache_memory_mb = 4\n'
    )
    with openai_only_server(config) as url:
        yield url


def remote_settings(url: str, model: str = "tiny", timeout: float = 30.0) -> InferenceSettings:
    return InferenceSettings(backend="openai", remote=RemoteSettings(base_url=url, model=model, timeout=timeout))


@pytest.fixture
async def remote(remote_url: str) -> AsyncIterator[InferenceService]:
    async with await InferenceService.start(remote_settings(remote_url)) as svc:
        yield svc


@pytest.fixture
async def local(tiny_llama: Path) -> AsyncIterator[InferenceService]:
    models = {"tiny": ModelSettings(model=str(tiny_llama), kv_cache_memory_mb=4)}
    async with await InferenceService.start(InferenceSettings(backend="local", models=models)) as svc:
        yield svc


async def test_remote_completions_match_the_local_engine(remote: InferenceService, local: InferenceService) -> None:
    assert remote.model_names() == ["tiny"]
    for prompt in ("The capital of France is", [{"role": "user", "content": "Hello there"}]):
        want = await local.complete(prompt, GREEDY)
        got = await remote.complete(prompt, GREEDY)
        assert got.text == want.text
        assert got.finish_reason == want.finish_reason
        assert (got.prompt_tokens, got.completion_tokens) == (want.prompt_tokens, want.completion_tokens)
        deltas = [d async for d in remote.stream(prompt, GREEDY)]
        assert "".join(d.text for d in deltas) == want.text
        assert deltas[-1].finish_reason == want.finish_reason
        assert deltas[-1].completion_tokens == want.completion_tokens


async def test_seed_and_stop_travel_to_the_remote(remote: InferenceService, local: InferenceService) -> None:
    seeded = SamplingParams(max_tokens=16, temperature=1.0, seed=11)
    assert (await remote.complete("Hello", seeded)).text == (await local.complete("Hello", seeded)).text
    full = (await local.complete("Hello", SamplingParams(max_tokens=24, temperature=0.0))).text
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    cut = await remote.complete("Hello", SamplingParams(max_tokens=24, temperature=0.0, stop=(stop,)))
    assert cut.text == full[: full.index(stop)]
    assert cut.finish_reason == "stop"


async def aborted_on(url: str) -> float:
    """How many requests the remote mcpmux server at `url` has aborted (its /metrics)."""
    async with httpx2.AsyncClient() as http:
        text = (await http.get(url.removesuffix("/v1") + "/metrics")).text
    found = re.search(r'mcpmux_engine_requests_total\{model="tiny",outcome="aborted"\} (\S+)', text)
    assert found is not None, text
    return float(found.group(1))


async def test_leaving_a_remote_stream_early_stops_it_on_the_server(remote: InferenceService, remote_url: str) -> None:
    before = await aborted_on(remote_url)
    async with aclosing(remote.stream("Hello", SamplingParams(max_tokens=300, temperature=0.0))) as deltas:
        async for _ in deltas:
            break  # one delta arrived: leave
    with anyio.fail_after(10):
        while await aborted_on(remote_url) == before:  # the connection was closed: the server stopped generating
            await anyio.sleep(0.05)
    streamed = "".join([d.text async for d in remote.stream("Hi there", GREEDY)])
    assert streamed == (await remote.complete("Hi there", GREEDY)).text  # the next stream is whole


async def test_remote_embeddings_match_local_ones(remote: InferenceService, local: InferenceService) -> None:
    texts = ["hello", "a longer sentence about batching embeddings together"]
    got, want = await remote.embed(texts), await local.embed(texts)
    for a, b in zip(got, want, strict=True):
        assert a == pytest.approx(b, abs=1e-5)


async def test_upstream_errors_name_the_url_status_and_message(remote_url: str) -> None:
    async with await InferenceService.start(remote_settings(remote_url, model="llama-70b")) as svc:
        with pytest.raises(RemoteError) as caught:
            await svc.complete("hi", GREEDY)
        message = str(caught.value)
        assert f"{remote_url}/completions" in message
        assert "HTTP 400" in message
        assert "unknown model 'llama-70b'" in message  # the server's own words
        assert caught.value.status == 400
        with pytest.raises(RemoteError, match="HTTP 400"):
            [d async for d in svc.stream([{"role": "user", "content": "hi"}], GREEDY)]
        (backend,) = svc.stats()["backends"].values()
        assert (backend["state"], backend["errors"], backend["sent"]["errors"]) == ("up", 2, 2)  # not its fault


async def test_a_silent_server_times_out_with_the_url_and_limit() -> None:
    with socket.socket() as silent:  # accepts connections (backlog) but never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/v1"
        async with await InferenceService.start(remote_settings(url, timeout=0.5)) as svc:
            with pytest.raises(RemoteError, match=r"did not answer within 0\.5 s") as caught:
                await svc.complete("hi", GREEDY)
            assert url in str(caught.value)
            with pytest.raises(RemoteError, match="did not answer"):
                [d async for d in svc.stream("hi", GREEDY)]


async def test_nothing_listening_and_missing_key_are_explained() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again below: nothing listens there
    url = f"http://127.0.0.1:{port}/v1"
    async with await InferenceService.start(remote_settings(url)) as svc:
        with pytest.raises(RemoteError, match="could not talk to the remote inference server") as caught:
            await svc.embed(["x"])
        assert url in str(caught.value)
        with pytest.raises(RemoteError, match="could not talk to the remote inference server") as caught:
            [d async for d in svc.stream("hi", GREEDY)]
        assert f"{url}/completions" in str(caught.value)
    os.environ.pop("MCPMUX_TEST_MISSING_KEY", None)
    settings = InferenceSettings(
        backend="openai",
        remote=RemoteSettings(base_url=url, model="m", api_key_env="MCPMUX_TEST_MISSING_KEY"),
        embeddings=EmbeddingSettings(model=""),
    )
    with pytest.raises(RemoteError, match="MCPMUX_TEST_MISSING_KEY"):
        await InferenceService.start(settings)


def test_openai_only_refuses_a_config_without_inference(tmp_path: Path) -> None:
    config = tmp_path / "mcpmux.toml"
    config.write_text('[inference]\nbackend = "off"\n')
    done = subprocess.run(
        [*MCPMUX, "serve", "--openai-only", "--config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert '--openai-only needs [inference] backend = "local" or "openai"' in done.stderr
