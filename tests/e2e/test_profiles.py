"""`[profiles.NAME]` and `mcpmux serve --profile NAME`: the catalog, search and calls stay inside it."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError

from mcpmux.core.config import config_from_dict
from mcpmux.errors import ConfigError, UnknownToolError
from mcpmux.mux.multiplexer import Mux
from tests.e2e.conftest import demo, text_of

pytestmark = pytest.mark.anyio

PROFILES = {"work": {"servers": ["alpha", "time"], "deny_tools": ["alpha__crash", "alpha__garbage", "local__*"]}}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def _raw() -> dict[str, Any]:
    return {
        "mcpServers": {
            "alpha": demo("alpha"),
            "beta": demo("beta"),
            "time": {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]},
        },
        "profiles": PROFILES,
        "mux": {"tool_search": "on"},
    }


@pytest.fixture(scope="module")
async def client(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Client]:
    config = tmp_path_factory.mktemp("profiles") / "mcp.json"
    config.write_text(json.dumps({**_raw(), "inference": {"backend": "off"}}))
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "mcpmux", "serve", "--config", str(config), "--profile", "work"],
        env={**os.environ, "MCPMUX_HOME": str(config.parent)},
    )
    async with Client(params) as connected:
        yield connected


async def test_a_profile_hides_other_servers_and_denied_tools(client: Client) -> None:
    search = await client.call_tool("mux_search_tools", {"query": "echo the text", "limit": 50})
    names = {item["name"] for item in (search.structured_content or {})["tools"]}
    assert "alpha__echo" in names
    assert not any(name.startswith("beta__") for name in names)
    everything = await client.call_tool("mux_search_tools", {"query": "crash garbage time echo add", "limit": 50})
    found = {item["name"] for item in (everything.structured_content or {})["tools"]}
    assert {"alpha__add", "time__get_current_time"} <= found
    assert not found & {"alpha__crash", "alpha__garbage"}


async def test_a_call_outside_the_profile_is_an_unknown_tool(client: Client) -> None:
    with pytest.raises(MCPError, match="unknown tool 'beta__echo'"):
        await client.call_tool("beta__echo", {"text": "x"})
    with pytest.raises(MCPError, match="unknown tool 'alpha__crash'"):
        await client.call_tool("alpha__crash", {})
    through = await client.call_tool("mux_call_tool", {"tool": "beta__echo", "arguments": {"text": "x"}})
    assert through.is_error
    assert "unknown tool 'beta__echo'" in text_of(through)
    inside = await client.call_tool("alpha__echo", {"text": "hi"})
    assert text_of(inside) == "alpha: hi"


async def test_the_library_takes_a_profile_and_words_an_unknown_one(tmp_path: Path) -> None:
    config = config_from_dict({**_raw(), "inference": {"backend": "local"}, "mux": {"tool_search": "off"}})
    with pytest.raises(ConfigError, match=r"no \[profiles.home\] table \(profiles defined: work\)"):
        Mux(config, profile="home")
    async with Mux(config, profile="work") as mux:
        names = {tool.name for tool in mux.list_tools()}
        assert "alpha__echo" in names
        assert "time__convert_time" in names
        assert not any(name.startswith(("beta__", "local__")) for name in names)  # local__* denied too
        with pytest.raises(UnknownToolError):
            await mux.call_tool("beta__echo", {"text": "x"})
        with pytest.raises(UnknownToolError):
            await mux.call_tool("local__generate", {"prompt": "x"})
    async with Mux(config) as mux:  # no profile: everything
        assert "beta__echo" in {tool.name for tool in mux.list_tools()}
