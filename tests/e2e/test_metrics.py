"""`/metrics` of a real Mux over real HTTP: what a Prometheus scrape sees after real calls to demo upstreams."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mcpmux import Mux
from mcpmux.core.config import config_from_dict
from mcpmux.server.frontend import Frontend, bind
from mcpmux.server.http.edge_policy import EdgePolicy
from tests.e2e.conftest import PY, demo, free_port, stop, text_of, wait_for_port
from tests.inference.tiny_models import build_tiny_model

pytestmark = pytest.mark.anyio

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of a Prometheus text page, keyed by (sample name, its labels)."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample `name` with exactly these labels (KeyError names what is missing)."""
    key = (name, frozenset(labels.items()))
    if key not in samples:
        raise KeyError(f"{name}{labels} not in the scrape; {name} has {[dict(k[1]) for k in samples if k[0] == name]}")
    return samples[key]


@asynccontextmanager
async def served(config: dict[str, Any]) -> AsyncIterator[tuple[Mux, httpx2.AsyncClient]]:
    """A Mux for `config` behind its real HTTP frontend on a free loopback port, and a client for it."""
    async with Mux(config_from_dict(config, source="test")) as mux, anyio.create_task_group() as tasks:
        sock = bind("127.0.0.1", 0)
        stop = anyio.Event()
        tasks.start_soon(Frontend(mux).serve_http, sock, EdgePolicy.load(mux.config, "127.0.0.1"), "/mcp", stop)
        async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{sock.getsockname()[1]}") as http:
            yield mux, http
        stop.set()


async def scrape(http: httpx2.AsyncClient) -> Samples:
    with anyio.fail_after(10):
        while True:
            try:
                response = await http.get("/metrics")
                break
            except httpx2.TransportError:  # uvicorn is still starting
                await anyio.sleep(0.05)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse(response.text)


WEATHER_BATCH = {
    "tool": "get_weather",
    "batch_tool": "get_weather_many",
    "argument": "location",
    "list_argument": "locations",
    "mode": "fixed",  # waits for a full batch (or the delay): three concurrent calls make one batch
    "max_batch_size": 3,
    "max_delay": 2.0,
}


async def test_calls_errors_cache_and_batches_are_counted() -> None:
    beta = {**demo("beta"), "batch": [WEATHER_BATCH], "cache": {"allow": ["lookup"]}}
    async with served({"servers": {"alpha": demo("alpha"), "beta": beta}}) as (mux, http):
        assert text_of(await mux.call_tool("alpha__echo", {"text": "hi"})) == "alpha: hi"
        assert (await mux.call_tool("alpha__fail", {"reason": "no"})).is_error
        for _ in range(2):  # a tool the config caches: the second call is a cache hit
            assert text_of(await mux.call_tool("beta__lookup", {"key": "k"})) == "value of k"
        async with anyio.create_task_group() as calls:
            for city in ("Oslo", "Rome", "Lima"):
                calls.start_soon(mux.call_tool, "beta__get_weather", {"location": city})

        samples = await scrape(http)
        calls_total = "mcpmux_tool_calls_total"
        assert value(samples, calls_total, upstream="alpha", tool="echo", outcome="ok") == 1
        assert value(samples, calls_total, upstream="alpha", tool="fail", outcome="error") == 1
        assert value(samples, calls_total, upstream="beta", tool="lookup", outcome="ok") == 2
        assert value(samples, calls_total, upstream="beta", tool="get_weather", outcome="ok") == 3
        duration = "mcpmux_tool_call_duration_seconds"
        assert value(samples, f"{duration}_count", upstream="alpha", tool="echo") == 1
        assert value(samples, f"{duration}_bucket", upstream="alpha", tool="echo", le="+Inf") == 1
        assert value(samples, f"{duration}_sum", upstream="alpha", tool="echo") > 0
        assert value(samples, "mcpmux_cache_hits_total", cache="tools") == 1
        assert value(samples, "mcpmux_cache_misses_total", cache="tools") >= 1
        assert value(samples, "mcpmux_batch_items_total", upstream="beta", tool="get_weather") == 3
        assert value(samples, "mcpmux_batches_total", upstream="beta", tool="get_weather") == 1
        assert value(samples, "mcpmux_batch_size_count", upstream="beta", tool="get_weather") == 1
        assert value(samples, "mcpmux_batch_size_bucket", upstream="beta", tool="get_weather", le="2.0") == 0
        assert value(samples, "mcpmux_batch_size_bucket", upstream="beta", tool="get_weather", le="4.0") == 1
        for name in ("alpha", "beta"):
            assert value(samples, "mcpmux_upstream_state", upstream=name, state="ready") == 1
            assert value(samples, "mcpmux_upstream_state", upstream=name, state="down") == 0
            assert value(samples, "mcpmux_upstream_in_flight", upstream=name) == 0
            assert value(samples, "mcpmux_upstream_tools", upstream=name) > 5
        assert value(samples, "mcpmux_engine_steps_total", model="smollm2") == 0  # on by default, not loaded


async def test_in_flight_and_rejections_by_reason() -> None:
    limits = {"max_concurrency": 1, "max_queue": 1}
    async with served({"servers": {"alpha": {**demo("alpha"), "limits": limits}}}) as (mux, http):
        results: list[Any] = []

        async def sleep() -> None:
            results.append(await mux.call_tool("alpha__sleep", {"seconds": 1.0}))

        async with anyio.create_task_group() as calls:
            calls.start_soon(sleep)  # holds the one slot
            await anyio.sleep(0.3)
            calls.start_soon(sleep)  # waits in the queue of one
            await anyio.sleep(0.1)
            refused = await mux.call_tool("alpha__sleep", {"seconds": 1.0})  # finds the queue full
            assert refused.is_error
            assert "max_queue=1" in text_of(refused)
            during = await scrape(http)
        after = await scrape(http)
    assert value(during, "mcpmux_upstream_in_flight", upstream="alpha") == 1
    assert value(during, "mcpmux_upstream_queue_depth", upstream="alpha") == 1
    assert value(after, "mcpmux_rejections_total", upstream="alpha", stage="gate", reason="queue_full") == 1
    assert value(after, "mcpmux_tool_calls_total", upstream="alpha", tool="sleep", outcome="rejected") == 1
    assert value(after, "mcpmux_tool_calls_total", upstream="alpha", tool="sleep", outcome="ok") == 2
    assert value(after, "mcpmux_upstream_in_flight", upstream="alpha") == 0


async def test_a_killed_upstream_counts_a_restart() -> None:
    async with served({"servers": {"alpha": demo("alpha")}}) as (mux, http):
        before = await scrape(http)
        assert value(before, "mcpmux_upstream_restarts_total", upstream="alpha") == 0
        pid = int(text_of(await mux.call_tool("alpha__pid", {})))
        os.kill(pid, signal.SIGKILL)
        with anyio.fail_after(20):
            while True:
                samples = await scrape(http)
                restarted = value(samples, "mcpmux_upstream_restarts_total", upstream="alpha") >= 1
                if restarted and value(samples, "mcpmux_upstream_state", upstream="alpha", state="ready") == 1:
                    break
                await anyio.sleep(0.1)
        assert int(text_of(await mux.call_tool("alpha__pid", {}))) != pid


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("llama", tmp_path_factory.mktemp("metrics") / "llama")


def assert_engine_figures(samples: Samples, tokens: int) -> None:
    assert value(samples, "mcpmux_engine_generation_tokens_total", model="tiny") >= tokens
    assert value(samples, "mcpmux_engine_requests_total", model="tiny", outcome="finished") == 1
    assert value(samples, "mcpmux_engine_time_to_first_token_seconds_count", model="tiny") == 1
    assert value(samples, "mcpmux_engine_time_per_output_token_seconds_count", model="tiny") == 1
    assert value(samples, "mcpmux_engine_requests_running", model="tiny") == 0
    assert value(samples, "mcpmux_engine_kv_cache_blocks", model="tiny") > 0
    assert 0 <= value(samples, "mcpmux_engine_kv_cache_usage_ratio", model="tiny") <= 1
    assert value(samples, "mcpmux_engine_generation_tokens_per_second", model="tiny") > 0


async def test_engine_metrics_of_the_local_generate_tool(tiny_model: Path) -> None:
    inference = {"backend": "local", "models": {"tiny": {"model": str(tiny_model), "kv_cache_memory_mb": 4}}}
    async with served({"inference": inference}) as (mux, http):
        arguments = {"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0}
        result = await mux.call_tool("local__generate", arguments)
        assert not result.is_error, text_of(result)
        assert_engine_figures(await scrape(http), 5)


@pytest.mark.slow
async def test_openai_only_server_serves_engine_metrics(tiny_model: Path, tmp_path: Path) -> None:
    config = tmp_path / "mcpmux.toml"
    config.write_text(
        f'[inference]\nbackend = "local"\n[inference.models.tiny]\nmodel = "{tiny_model}"\nkv_cache_memory_mb = 4\n'
    )
    port = free_port()
    command = [PY, "-m", "mcpmux", "serve", "--openai-only", "--config", str(config), "--port", str(port)]
    process = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, process, timeout=120)
        async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            before = await scrape(http)
            assert value(before, "mcpmux_engine_generation_tokens_total", model="tiny") == 0
            body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}
            answer = await http.post("/v1/completions", json=body)
            assert answer.json()["usage"]["completion_tokens"] == 4
            samples = await scrape(http)
        summary = subprocess.run(
            [PY, "-m", "mcpmux", "status", "--url", f"http://127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "COLUMNS": "200"},
        )
    finally:
        stop(process)
    assert summary.returncode == 0, summary.stderr
    assert "Inference engine" in summary.stdout
    assert "Upstreams" not in summary.stdout
    assert any(line.split()[:1] == ["tiny"] for line in summary.stdout.splitlines())  # a row of the engine table
    assert_engine_figures(samples, 4)
    assert not any(name.startswith("mcpmux_tool_") for name, _ in samples)  # no upstreams in this server
