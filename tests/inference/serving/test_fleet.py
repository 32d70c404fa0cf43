"""The fleet against real OpenAI-compatible servers (two `mcpmux serve --openai-only` processes over a tiny
model) and the local engine: routing by model and load, concurrency and rate limits, identical greedy
requests sharing one generation, a backend killed mid-load (every request answered once, greedy
streams resumed elsewhere with the same text), taken out and probed back in, and the local engine as
the fallback while every remote is down."""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import anyio
import pytest

from mcpmux.inference.engine.config import SamplingParams
from mcpmux.inference.serving.remote import RemoteError
from mcpmux.inference.serving.service import InferenceService
from mcpmux.inference.serving.settings import BackendSettings, EmbeddingSettings, InferenceSettings, ModelSettings
from tests.inference.serving.openai_server import OpenAIServer

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

GREEDY = SamplingParams(max_tokens=16, temperature=0.0)
LONG = SamplingParams(max_tokens=400, temperature=0.0)
# One intra-op thread and one request at a time: the servers' greedy answers are then the same float
# for float whatever else they serve (a random model's near-tied logits flip with the batch's shape),
# so a stream resumed on the other server continues the very text the first one sent.
SERVER_ENV = {"OMP_NUM_THREADS": "1"}
SERVER_MODEL = "kv_cache_memory_mb = 8\nmax_num_seqs = 1\n"


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def servers(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[OpenAIServer, OpenAIServer]]:
    """Two remote servers, `a` and `b`, each serving the tiny model as "tiny"."""
    config = tmp_path_factory.mktemp("fleet") / "remote.toml"
    config.write_text(
        f'[inference]\nbackend = "local"\n[inference.models.tiny]\nmodel = "{tiny_llama}"\n{SERVER_MODEL}'
        '[inference.embeddings]\nmodel = ""\n'
    )
    a, b = OpenAIServer(config, env=SERVER_ENV), OpenAIServer(config, env=SERVER_ENV)
    a.start()
    b.start()
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


def remote(server: OpenAIServer | str, name: str, **settings: Any) -> BackendSettings:
    url = server if isinstance(server, str) else server.url
    return BackendSettings(name=name, base_url=url, models=settings.pop("models", ["tiny"]), **settings)


def fleet(*backends: BackendSettings, tiny: Path | None = None, **settings: Any) -> InferenceSettings:
    models = {"tiny": ModelSettings(model=str(tiny), kv_cache_memory_mb=8)} if tiny is not None else {}
    return InferenceSettings(backends=list(backends), models=models, embeddings=EmbeddingSettings(model=""), **settings)


@pytest.fixture
async def two(servers: tuple[OpenAIServer, OpenAIServer]) -> AsyncIterator[InferenceService]:
    a, b = servers
    async with await InferenceService.start(fleet(remote(a, "a"), remote(b, "b"))) as svc:
        yield svc


def counts(svc: InferenceService, key: str = "requests") -> dict[str, int]:
    return {name: figures[key] for name, figures in svc.stats()["backends"].items()}


async def test_requests_go_by_model_and_least_outstanding(servers: tuple[OpenAIServer, OpenAIServer]) -> None:
    a, b = servers
    settings = fleet(remote(a, "a", models={"only-a": "tiny", "tiny": "tiny"}), remote(b, "b"))
    async with await InferenceService.start(settings) as svc:
        assert svc.stats()["backend"] == "fleet"
        assert svc.model_names() == ["only-a", "tiny"]
        for i in range(3):
            assert (await svc.complete(f"Only a {i}", GREEDY, model="only-a")).finish_reason in ("stop", "length")
        assert counts(svc) == {"a": 3, "b": 0}
        answers: list[str] = []

        async def one(i: int) -> None:
            answers.append((await svc.complete(f"Request {i}", GREEDY, model="tiny")).finish_reason)

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(one, i)
        assert len(answers) == 8
        assert counts(svc) == {"a": 3 + 4, "b": 4}  # concurrent requests split evenly between equals
        assert counts(svc, "in_flight") == {"a": 0, "b": 0}


async def test_concurrency_and_rate_limits_hold(servers: tuple[OpenAIServer, OpenAIServer]) -> None:
    a, _ = servers
    async with await InferenceService.start(fleet(remote(a, "a", max_concurrency=1))) as svc:
        seen: list[int] = []

        async def watch() -> None:
            while True:
                seen.append(svc.stats()["backends"]["a"]["in_flight"])
                await anyio.sleep(0.002)

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            async with anyio.create_task_group() as requests:
                for i in range(4):
                    requests.start_soon(svc.complete, f"Limited {i}", GREEDY)
            tg.cancel_scope.cancel()
        assert max(seen) == 1
        assert counts(svc) == {"a": 4}
    async with await InferenceService.start(fleet(remote(a, "a", requests_per_second=5, burst=1))) as svc:
        started = time.monotonic()
        async with anyio.create_task_group() as requests:
            for i in range(4):
                requests.start_soon(svc.complete, f"Rated {i}", GREEDY)
        assert time.monotonic() - started >= 3 / 5  # a burst of 1, then one every 0.2 s
        assert counts(svc) == {"a": 4}


async def test_identical_greedy_requests_share_one_generation(two: InferenceService) -> None:
    texts: list[str] = []

    async def one() -> None:
        texts.append((await two.complete("The same question", GREEDY)).text)

    streamed: list[str] = []

    async def stream() -> None:
        streamed.append("".join([d.text async for d in two.stream("The same streamed question", GREEDY)]))

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(one)
            tg.start_soon(stream)
    assert len(set(texts)) == len(set(streamed)) == 1
    assert len(texts) == len(streamed) == 5
    assert sum(counts(two).values()) == 2  # one generation for each set of five
    assert two.stats()["shared"] == 8
    sampled = SamplingParams(max_tokens=8, temperature=1.0)
    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(two.complete, "The same question", sampled)
    assert sum(counts(two).values()) == 2 + 3  # sampled requests are never shared


async def restarted(server: OpenAIServer, svc: InferenceService, name: str) -> None:
    """Start `server` again on its port and wait until the fleet's probe has brought it back in."""
    server.start()
    with anyio.fail_after(30):
        while svc.stats()["backends"][name]["state"] != "up":
            await anyio.sleep(0.05)


async def test_a_stream_cut_mid_answer_resumes_on_another_backend(servers: tuple[OpenAIServer, OpenAIServer]) -> None:
    a, b = servers
    settings = fleet(remote(a, "a", weight=2, down_after=1, probe_interval=0.2), remote(b, "b"))
    async with await InferenceService.start(settings) as svc:
        texts: list[str] = []
        async with aclosing(svc.stream("A long answer", LONG)) as deltas:
            async for delta in deltas:
                texts.append(delta.text)
                if len(texts) == 3:
                    assert counts(svc, "in_flight") == {"a": 1, "b": 0}  # the heavier backend took it
                    a.kill()
        assert delta.finish_reason in ("stop", "length")
        stats = svc.stats()
        assert (stats["moved"], stats["resumed"], stats["backends"]["a"]["state"]) == (1, 1, "down")
        assert "".join(texts) == (await svc.complete("A long answer", LONG)).text  # as if nothing happened
        await restarted(a, svc, "a")


async def test_a_backend_killed_mid_load_loses_no_request(servers: tuple[OpenAIServer, OpenAIServer]) -> None:
    a, b = servers
    settings = fleet(remote(a, "a", down_after=1, probe_interval=0.2), remote(b, "b"))
    results: dict[int, str] = {}
    errors: list[BaseException] = []
    begun: set[int] = set()  # streams that received text
    async with await InferenceService.start(settings) as svc:

        async def one(i: int) -> None:
            prompt = f"Long answer number {i}"
            try:
                if i % 2:
                    done = await svc.complete(prompt, LONG)
                    text, finish = done.text, done.finish_reason
                else:
                    deltas = []
                    async for delta in svc.stream(prompt, LONG):
                        begun.add(i)
                        deltas.append(delta)
                    text, finish = "".join(d.text for d in deltas), deltas[-1].finish_reason
            except Exception as err:
                errors.append(err)
                return
            assert i not in results, "answered twice"
            assert finish in ("stop", "length")
            results[i] = text

        async with anyio.create_task_group() as tg:
            for i in range(12):
                tg.start_soon(one, i)
            with anyio.fail_after(60):  # kill `a` while it is streaming answers
                while len(begun) < 4 or svc.stats()["backends"]["a"]["in_flight"] < 3:
                    await anyio.sleep(0.001)
            a.kill()
        assert errors == []
        assert sorted(results) == list(range(12))
        state = svc.stats()["backends"]
        assert state["a"]["state"] == "down"
        assert state["a"]["failed"] >= 1
        assert svc.stats()["moved"] >= 1
        # Each answer, resumed or moved, is the one an undisturbed request gets.
        again: dict[int, str] = {}

        async def undisturbed(i: int) -> None:
            again[i] = (await svc.complete(f"Long answer number {i}", LONG)).text

        async with anyio.create_task_group() as tg:
            for i in range(12):
                tg.start_soon(undisturbed, i)
        assert again == results
        assert svc.stats()["backends"]["a"]["requests"] == state["a"]["requests"]  # out: nothing sent to it
        await restarted(a, svc, "a")  # on the same port: the probe finds it
        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(svc.complete, f"After the restart {i}", GREEDY)
        assert svc.stats()["backends"]["a"]["requests"] > state["a"]["requests"]


async def test_the_local_engine_serves_while_every_remote_is_down(tiny_llama: Path, tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens there until the server starts below
    url = f"http://127.0.0.1:{port}/v1"
    settings = fleet(
        remote(url, "far", down_after=1, probe_interval=0.2),
        BackendSettings(kind="local", fallback=True),
        tiny=tiny_llama,
    )
    async with await InferenceService.start(settings) as svc:
        local = await svc.complete("Hello", GREEDY)
        assert local.finish_reason in ("stop", "length")
        state = svc.stats()["backends"]
        assert (state["far"]["state"], state["far"]["failed"], state["local"]["requests"]) == ("down", 1, 1)
        await svc.complete("Hello again", GREEDY)
        assert counts(svc) == {"far": 1, "local": 2}  # while it is out, the fallback serves at once
        config = tmp_path / "remote.toml"
        config.write_text(f'[inference]\n[inference.models.tiny]\nmodel = "{tiny_llama}"\n{SERVER_MODEL}')
        server = OpenAIServer(config, port=port, env=SERVER_ENV)
        server.start()
        try:
            with anyio.fail_after(30):
                while svc.stats()["backends"]["far"]["state"] != "up":
                    await anyio.sleep(0.05)
            assert (await svc.complete("Hello", GREEDY)).finish_reason in ("stop", "length")
            assert counts(svc) == {"far": 2, "local": 2}
        finally:
            server.stop()


async def test_with_no_fallback_the_error_says_what_failed(tiny_llama: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}/v1"
    async with await InferenceService.start(fleet(remote(url, "far"), remote(url + "/", "near"))) as svc:
        with pytest.raises(RemoteError, match="could not talk to the remote inference server") as caught:
            await svc.complete("Hello", GREEDY)
        assert "[[inference.backends]]" in str(caught.value)
        assert counts(svc, "failed") == {"far": 1, "near": 1}  # each tried once
