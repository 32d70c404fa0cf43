"""Read-only tools answer fresh: annotations describe side effects, not stable results.

mcp-server-time annotates `get_current_time` `readOnlyHint` and `idempotentHint`; a clock read a
second later must read a second later, whichever way mcpmux serves the call. Caching is opt-in.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from mcpmux.core.config import config_from_dict
from mcpmux.mux.multiplexer import Mux
from tests.e2e.conftest import PY, bearer_client, mux_over_http, mux_over_stdio, text_of, write_config

pytestmark = pytest.mark.anyio

TIME = {"command": str(Path(PY).parent / "mcp-server-time")}
NOW = "time__get_current_time"


async def _three_readings(call: Callable[[], Awaitable[Any]]) -> list[str]:
    """The clock's reading, three times a little over a second apart (it reads whole seconds)."""
    readings = []
    for index in range(3):
        if index:
            await anyio.sleep(1.1)
        readings.append(json.loads(text_of(await call()))["datetime"])
    return readings


async def test_a_clock_reads_fresh_through_the_library() -> None:
    async with Mux(config_from_dict({"servers": {"time": TIME}})) as mux:
        readings = await _three_readings(lambda: mux.call_tool(NOW, {"timezone": "UTC"}))
    assert len(set(readings)) == 3, readings


async def test_a_clock_reads_fresh_over_stdio_and_http(tmp_path: Path) -> None:
    config = write_config(tmp_path / "mux.json", {"time": TIME})
    async with mux_over_stdio(config) as client:
        readings = await _three_readings(lambda: client.call_tool(NOW, {"timezone": "UTC"}))
    assert len(set(readings)) == 3, readings
    with mux_over_http(config) as url:
        async with Client(url) as client:
            readings = await _three_readings(lambda: client.call_tool(NOW, {"timezone": "UTC"}))
    assert len(set(readings)) == 3, readings


async def test_a_tool_the_config_allows_is_cached_for_its_ttl(tmp_path: Path) -> None:
    servers = {"time": {**TIME, "cache": {"allow": ["get_current_time"], "ttl": 60}}}
    config = write_config(tmp_path / "mux.json", servers)
    async with mux_over_stdio(config) as client:
        readings = await _three_readings(lambda: client.call_tool(NOW, {"timezone": "UTC"}))
        other_zone = json.loads(text_of(await client.call_tool(NOW, {"timezone": "Asia/Tokyo"})))
    assert len(set(readings)) == 1, readings  # asked for: served from the cache
    assert other_zone["timezone"] == "Asia/Tokyo"  # other arguments, another entry


TOKENS = ("freshness-token-alpha-0123456789", "freshness-token-beta-0123456789")


async def test_a_client_scoped_entry_is_served_to_its_client_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`scope = "client"`: a 2025 client is its session; a 2026-07-28 client is its stdio process or its
    bearer token (it has no session), so its second call is a hit and another client's is not."""
    monkeypatch.setenv("FRESHNESS_TOKENS", " ".join(TOKENS))
    servers = {"time": {**TIME, "cache": {"allow": ["get_current_time"], "ttl": 60, "scope": "client"}}}
    config = tmp_path / "mux.json"
    config.write_text(json.dumps({"mcpServers": servers, "http": {"auth_token_env": "FRESHNESS_TOKENS"}}))

    async def read(client: Client) -> str:
        return json.loads(text_of(await client.call_tool(NOW, {"timezone": "UTC"})))["datetime"]

    for mode in ("legacy", "2026-07-28"):
        async with mux_over_stdio(config, mode=mode) as client:
            first = await read(client)
            await anyio.sleep(1.1)
            assert await read(client) == first, mode
    with mux_over_http(config) as url:
        for mode in ("legacy", "2026-07-28"):
            async with (
                bearer_client(url, TOKENS[0], mode) as alpha,
                bearer_client(url, TOKENS[0], mode) as alpha_again,
                bearer_client(url, TOKENS[1], mode) as beta,
            ):
                first = await read(alpha)
                await anyio.sleep(1.1)
                assert await read(alpha) == first, mode
                assert await read(beta) != first, mode  # another token is another client
                # Two sessions are two 2025 clients; without sessions, one token is one client.
                assert (await read(alpha_again) == first) is (mode != "legacy"), mode
