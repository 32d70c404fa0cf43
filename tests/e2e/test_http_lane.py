"""Fast-path calls to streamable HTTP upstreams, over mcpmux's own HTTP client (mcpmux.upstream.http_lane).

The probe upstream (tests/e2e/test_fastpath.py) reports the JSON-RPC id each call reached it with:
a lane id (`mux.N`) says the call took the fast path, and so went out on mcpmux's own connections.
Progress and cancellation through HTTP upstreams are in test_fastpath.py, beside stdio's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client

from tests.e2e.conftest import free_port, http_upstream, mux_over_stdio, stop, text_of, wait_for_port, write_config
from tests.e2e.test_fastpath import PROBE, probe_over_http, sent_by_mcpmux_http_client

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
                assert sent_by_mcpmux_http_client(result)


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
            assert sent_by_mcpmux_http_client(await client.call_tool("web__whoami", {}))
            stop(server)
            server = subprocess.Popen(command, stderr=subprocess.DEVNULL)
            wait_for_port(port, server)
            result = await client.call_tool("web__whoami", {"text": "again"})
            assert not result.is_error, text_of(result)
            assert sent_by_mcpmux_http_client(result)
    finally:
        stop(server)


@contextmanager
def raw_http_server(*options: str) -> Iterator[str]:
    """tests/servers/raw_http_server.py on loopback; yields its URL."""
    port = free_port()
    server = subprocess.Popen([sys.executable, str(RAW_HTTP_SERVER), str(port), *options], stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, server)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(server)


async def whoami(client: Client) -> dict[str, Any]:
    result = await client.call_tool("raw__whoami", {})
    assert not result.is_error, text_of(result)
    seen: dict[str, Any] = json.loads(text_of(result))
    assert str(seen["id"]).startswith("mux.")
    assert seen["encoding"] is None  # mcpmux's own client (httpx asks for gzip)
    return seen


@pytest.mark.parametrize("era", ERAS)
async def test_a_request_the_upstream_drops_unread_on_a_reused_connection_is_sent_again(
    tmp_path: Path, era: str
) -> None:
    """An idle connection the upstream closes just as a call goes out on it costs that call nothing.

    A 2026 call from this stdio client is sent from the code that read it, and sent again from a
    task of the HTTP lane's; a 2025 one is sent, and sent again, by its call's task.
    """
    with raw_http_server("drop") as url:
        config = write_config(tmp_path / "mux.json", {"raw": {"url": url, "protocol": era}})
        async with mux_over_stdio(config) as client:
            for _ in range(4):
                await whoami(client)
            seen = await whoami(client)
            assert seen["dropped"] == 4  # every call after the first met a dropped connection first
            assert seen["ran"] == {"whoami": 5}


@pytest.mark.parametrize("era", ERAS)
async def test_a_call_the_upstream_may_have_acted_on_is_never_sent_twice(tmp_path: Path, era: str) -> None:
    """Cancelled, timed out, or its connection lost mid-call: the upstream ran the tool once, whatever the era."""
    with raw_http_server() as url:
        config = write_config(tmp_path / "mux.json", {"raw": {"url": url, "protocol": era, "timeout": 0.5}})
        async with mux_over_stdio(config) as client:
            await whoami(client)  # leaves an idle connection: the next call goes out on it
            with anyio.move_on_after(0.3):  # the client cancels
                await client.call_tool("raw__slow", {})
            timed_out = await client.call_tool("raw__slow", {})  # mcpmux's timeout (0.5 s) ends it
            assert timed_out.is_error
            assert "did not answer tool 'slow' within 0.5s" in text_of(timed_out)
            vanished = await client.call_tool("raw__vanish", {})  # the server read it, then dropped the connection
            assert vanished.is_error
            assert "lost its connection during tool 'vanish', before answering" in text_of(vanished)
            await anyio.sleep(1.2)  # anything sent again would have arrived by now
            # One call's connection is not the session: the next call needs no reconnection.
            assert (await whoami(client))["ran"] == {"whoami": 2, "slow": 2, "vanish": 1}


async def test_what_the_sdks_client_sends_the_fast_path_sends_too(tmp_path: Path) -> None:
    """A Host header from the config, and cookies the server set (a load balancer's affinity), reach the server."""
    with raw_http_server("vhost") as url:
        entry = {"url": url, "protocol": "legacy", "headers": {"Host": "mcp.example"}}
        async with mux_over_stdio(write_config(tmp_path / "vhost.json", {"raw": entry})) as client:
            await whoami(client)
    with raw_http_server("cookie") as url:
        for era in ERAS:
            config = write_config(tmp_path / f"cookie-{era}.json", {"raw": {"url": url, "protocol": era}})
            async with mux_over_stdio(config) as client:
                for _ in range(3):
                    result = await client.call_tool("raw__whoami", {})
                    assert not result.is_error, text_of(result)
                    # The SDK's client keeps cookies: such calls go out through it, on the fast path still.
                    assert str(json.loads(text_of(result))["id"]).startswith("mux.")


@pytest.mark.parametrize("fast_path", [True, False])
async def test_a_session_the_upstream_forgot_is_opened_again_under_a_call_sent_at_once(
    tmp_path: Path, fast_path: bool
) -> None:
    """A 2025 upstream forgets its session between two calls: the next call, sent from the code that
    read it on an idle connection, meets a 404, and is sent again on a new session; it succeeds."""
    with raw_http_server() as url:
        config = write_config(tmp_path / "mux.json", {"raw": {"url": url, "protocol": "legacy"}}, fast_path=fast_path)
        async with mux_over_stdio(config) as client:
            for _ in range(3):
                assert not (await client.call_tool("raw__whoami", {})).is_error
                assert not (await client.call_tool("raw__forget", {})).is_error
                result = await client.call_tool("raw__whoami", {})
                assert not result.is_error, text_of(result)
                assert str(json.loads(text_of(result))["id"]).startswith("mux.") == fast_path


@pytest.mark.parametrize("fast_path", [True, False], ids=["lane", "sdk"])
async def test_a_2026_result_that_names_no_result_type_is_complete(tmp_path: Path, fast_path: bool) -> None:
    """SEP-2322: a client MUST assume `complete` where a result names no `resultType` (the SDK's 2026
    models require the field: mcpmux answered such a call "with an invalid result")."""
    with raw_http_server() as url:
        config = write_config(tmp_path / "mux.json", {"raw": {"url": url}}, fast_path=fast_path)
        for calls, mode in enumerate(("auto", "legacy"), start=1):
            async with mux_over_stdio(config, mode=mode) as client:
                result = await client.call_tool("raw__bare", {})
                assert not result.is_error, text_of(result)
                assert json.loads(text_of(result))["ran"]["bare"] == calls
