"""Fast-path calls to streamable HTTP upstreams, over mcpmux's own HTTP client (mcpmux.http_lane).

The probe upstream (tests/e2e/test_fastpath.py) reports the JSON-RPC id each call reached it with:
a lane id (`mux.N`) says the call took the fast path, and so went out on mcpmux's own connections.
Progress and cancellation through HTTP upstreams are in test_fastpath.py, beside stdio's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest

from tests.e2e.conftest import free_port, http_upstream, mux_over_stdio, stop, text_of, wait_for_port, write_config
from tests.e2e.test_fastpath import PROBE, probe_over_http, seen_id

pytestmark = pytest.mark.anyio

RAW_HTTP_SERVER = Path(__file__).resolve().parents[1] / "servers" / "raw_http_server.py"

ERAS = ["auto", "legacy"]


@pytest.mark.parametrize("era", ERAS)
async def test_an_http_upstreams_logs_reach_the_caller_before_the_result(tmp_path: Path, era: str) -> None:
    received: list[Any] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        received.append(params.data)

    with http_upstream("web") as url:
        config = write_config(tmp_path / "mux.json", {"web": {"url": url, "protocol": era}})
        async with mux_over_stdio(config, mode="legacy", logging_callback=on_log, log_level="debug") as client:
            for n in range(10):
                assert text_of(await client.call_tool("web__log", {"message": f"line {n}"})) == "logged"
                assert received == [f"line {i}" for i in range(n + 1)]


@pytest.mark.parametrize("era", ERAS)
async def test_connections_the_upstream_closes_when_idle_cost_no_call(tmp_path: Path, era: str) -> None:
    """The upstream drops idle connections after 0.2 s; calls spaced around that all succeed on the fast path."""
    with probe_over_http(keep_alive=0.2) as url:
        config = write_config(tmp_path / "mux.json", {"web": {"url": url, "protocol": era}})
        async with mux_over_stdio(config) as client:
            for pause in (0.0, 0.19, 0.2, 0.21, 0.25, 0.3, 0.18, 0.22, 0.5, 0.0):
                await anyio.sleep(pause)
                result = await client.call_tool("web__whoami", {})
                assert not result.is_error, text_of(result)
                assert str(seen_id(result)).startswith("mux.")


async def test_an_expired_session_is_reinitialized_and_the_call_sent_again(tmp_path: Path) -> None:
    """A 2025 upstream restarts and forgets its sessions: the fast path's next call meets a 404, and succeeds."""
    port = free_port()
    command = [sys.executable, str(PROBE), "http", str(port)]
    server = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, server)
        upstream = {"url": f"http://127.0.0.1:{port}/mcp", "protocol": "legacy"}
        config = write_config(tmp_path / "mux.json", {"web": upstream})
        async with mux_over_stdio(config) as client:
            assert str(seen_id(await client.call_tool("web__whoami", {}))).startswith("mux.")
            stop(server)
            server = subprocess.Popen(command, stderr=subprocess.DEVNULL)
            wait_for_port(port, server)
            result = await client.call_tool("web__whoami", {"text": "again"})
            assert not result.is_error, text_of(result)
            assert str(seen_id(result)).startswith("mux.")
    finally:
        stop(server)


@pytest.mark.parametrize("era", ERAS)
async def test_a_request_the_upstream_drops_unread_on_a_reused_connection_is_sent_again(
    tmp_path: Path, era: str
) -> None:
    """An idle connection the upstream closes just as a call goes out on it costs that call nothing.

    A 2026 call from this stdio client is sent from the code that read it, and sent again from a
    task of the HTTP lane's; a 2025 one is sent, and sent again, by its call's task.
    """
    port = free_port()
    server = subprocess.Popen([sys.executable, str(RAW_HTTP_SERVER), str(port)], stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, server)
        upstream = {"url": f"http://127.0.0.1:{port}/mcp", "protocol": era}
        config = write_config(tmp_path / "mux.json", {"raw": upstream})
        async with mux_over_stdio(config) as client:
            for _ in range(5):
                result = await client.call_tool("raw__whoami", {})
                assert not result.is_error, text_of(result)
            seen = json.loads(text_of(result))
            assert str(seen["id"]).startswith("mux.")
            assert seen["dropped"] == 4  # every call after the first met a dropped connection first
    finally:
        stop(server)
