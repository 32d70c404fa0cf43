"""`logging/setLevel` reaches the upstreams: each logs at the most verbose level any client asked for,
while each client hears only its own level and above (tests/e2e/test_client_requests.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mcp import Client

from tests.e2e.conftest import served_in_process, text_of, write_config
from tests.e2e.test_http_lane import raw_http_server

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def levels_asked(client: Client) -> list[str]:
    levels: list[str] = json.loads(text_of(await client.call_tool("raw__whoami", {})))["levels"]
    return levels


async def test_an_upstream_logs_at_the_most_verbose_level_its_clients_asked_for(tmp_path: Path) -> None:
    with raw_http_server() as upstream:
        config = write_config(tmp_path / "mux.json", {"raw": {"url": upstream, "protocol": "legacy"}})
        async with (
            served_in_process(config) as (_, _, url),
            Client(url, mode="legacy") as quiet,
            Client(url, mode="legacy") as chatty,
        ):
            assert await levels_asked(quiet) == []  # nobody asked: the server keeps its own
            await quiet.set_logging_level("warning")
            assert await levels_asked(quiet) == ["warning"]
            await chatty.set_logging_level("debug")
            assert await levels_asked(chatty) == ["warning", "debug"]
            await quiet.set_logging_level("error")  # chatty still wants debug
            assert await levels_asked(quiet) == ["warning", "debug", "debug"]
