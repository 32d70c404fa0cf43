"""`mcpmux status --url ...` against a live `mcpmux serve --transport http`, as a user runs both."""

from __future__ import annotations

import io
import json
import os
import subprocess
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from prometheus_client import generate_latest
from rich.console import Console

from mcpmux.cli.status import Scrape, bucket_quantile, metrics_url, render
from mcpmux.mux.multiplexer import Mux
from tests.e2e.conftest import PY, demo, free_port, mux_over_http, text_of, write_config


def status(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}  # wide enough that rich never wraps a row of the tables
    return subprocess.run([PY, "-m", "mcpmux", "status", *args], capture_output=True, text=True, timeout=60, env=env)


def row(output: str, *cells: str) -> bool:
    """Whether one line of `output` holds these cells, in this order, as whole words."""
    for line in output.splitlines():
        words = line.replace("│", " ").replace("┃", " ").split()
        position = 0
        for word in words:
            if position < len(cells) and word == cells[position]:
                position += 1
        if position == len(cells):
            return True
    return False


@pytest.mark.slow
@pytest.mark.anyio
async def test_status_prints_upstreams_tools_and_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCPMUX_STATUS_TEST_TOKEN", "s3cret-token-for-the-status-test")  # the server reads it too
    config = tmp_path / "mcp.json"
    servers = {"alpha": demo("alpha"), "beta": {**demo("beta"), "cache": {"allow": ["lookup"]}}}
    config.write_text(json.dumps({"mcpServers": servers, "http": {"auth_token_env": "MCPMUX_STATUS_TEST_TOKEN"}}))
    with mux_over_http(config) as url:
        headers = {"Authorization": "Bearer s3cret-token-for-the-status-test"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=None)) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):
            for word in ("a", "b", "c"):
                assert text_of(await client.call_tool("alpha__echo", {"text": word})) == f"alpha: {word}"
            assert (await client.call_tool("beta__fail", {"reason": "no"})).is_error
            for _ in range(2):
                await client.call_tool("beta__lookup", {"key": "k"})
        refused = await anyio.to_thread.run_sync(lambda: status("--url", url))
        done = await anyio.to_thread.run_sync(lambda: status("--url", url, "--token-env", "MCPMUX_STATUS_TEST_TOKEN"))
    assert refused.returncode == 1
    assert "refused the request (401)" in refused.stderr
    assert "--token-env" in refused.stderr
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "Upstreams" in out
    # upstream, state, auth, tools, calls, errors
    assert row(out, "alpha", "ready", "none", "13", "3", "0")
    assert row(out, "beta", "ready", "none", "13", "3", "1")
    assert row(out, "alpha", "echo", "3", "0")  # top tools: upstream, tool, calls, errors
    assert row(out, "beta", "fail", "1", "1")
    assert row(out, "tools", "1", "1", "50%")  # cache: hits, misses, hit rate
    assert row(out, "smollm2", "0", "0", "0%")  # inference is on by default, idle: nothing asked for a model
    assert "s3cret" not in done.stdout + done.stderr + refused.stderr


def test_unreachable_server_is_one_clear_line_and_exit_1() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = status("--url", url)
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert f"no mcpmux server answered at {url}/metrics" in lines[0]


def test_missing_token_variable_is_named() -> None:
    done = status("--url", "http://127.0.0.1:1", "--token-env", "MCPMUX_TEST_TOKEN_THAT_IS_NOT_SET")
    assert done.returncode == 1
    assert "MCPMUX_TEST_TOKEN_THAT_IS_NOT_SET" in done.stderr
    assert "not set" in done.stderr


def test_metrics_url_and_quantiles() -> None:
    assert metrics_url("http://127.0.0.1:8765") == "http://127.0.0.1:8765/metrics"
    assert metrics_url("http://127.0.0.1:8765/mcp") == "http://127.0.0.1:8765/metrics"
    assert metrics_url("127.0.0.1:9000") == "http://127.0.0.1:9000/metrics"
    buckets = [(0.1, 0.0), (0.2, 10.0), (0.5, 10.0), (float("inf"), 10.0)]
    assert bucket_quantile(buckets, 0.5) == pytest.approx(0.15)  # halfway through the (0.1, 0.2] bucket
    assert bucket_quantile([(1.0, 1.0), (float("inf"), 4.0)], 0.99) == 1.0  # overflow: the top finite bound
    assert bucket_quantile([(1.0, 0.0), (float("inf"), 0.0)], 0.5) is None


@pytest.mark.anyio
async def test_status_keeps_names_whole_in_80_columns(tmp_path: Path) -> None:
    """The tables of a real Mux's metrics, at a terminal's usual width: names whole, figures squeezed."""
    servers = {name: demo(name) for name in ("everything", "summarizer", "time")}
    config = write_config(tmp_path / "c.json", servers)
    async with Mux.from_config(config) as mux:
        for name in servers:
            await mux.call_tool(f"{name}__echo", {"text": "x"})
        scrape = Scrape.parse(generate_latest(mux.metrics.registry).decode())
    out = io.StringIO()
    render(scrape, Console(file=out, width=80))
    for name in servers:
        assert row(out.getvalue(), name, "ready", "none"), out.getvalue()
    assert max(len(line) for line in out.getvalue().splitlines()) <= 80
    assert "…" not in out.getvalue(), out.getvalue()
