"""The capability-gated MCP Apps test server (`tests/servers/apps_server.py`) gates, directly (no mcpmux):
a client that declares `io.modelcontextprotocol/ui` sees its views, one that does not sees the text
fallback alone, in both eras and over both transports."""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from mcp import Client
from mcp.client.extension import advertise
from mcp.client.stdio import StdioServerParameters
from mcp.server.apps import APP_MIME_TYPE, EXTENSION_ID
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from tests.e2e.conftest import PY, ROOT, free_port, stop, wait_for_port

APPS = ROOT / "tests" / "servers" / "apps_server.py"
UI = advertise(EXTENSION_ID, {"mimeTypes": [APP_MIME_TYPE]})

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # a server and two clients each: ~6 s


@asynccontextmanager
async def apps_client(transport: str, mode: str, declares: bool) -> AsyncIterator[Client]:
    extensions = [UI] if declares else None
    if transport == "stdio":
        params = StdioServerParameters(command=PY, args=[str(APPS), "gated"], env=dict(os.environ))
        async with Client(params, mode=mode, extensions=extensions) as client:
            yield client
        return
    port = free_port()
    process = subprocess.Popen([PY, str(APPS), "gated", "http", str(port)], stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, process)
        async with Client(f"http://127.0.0.1:{port}/mcp", mode=mode, extensions=extensions) as client:
            yield client
    finally:
        stop(process)


@pytest.mark.parametrize("transport", ["stdio", "http"])
@pytest.mark.parametrize("mode", ["legacy", "auto"], ids=["2025", "2026"])
async def test_the_apps_server_lists_its_views_only_to_a_client_that_declares_the_extension(
    transport: str, mode: str
) -> None:
    async with apps_client(transport, mode, declares=True) as host:
        era = host.protocol_version
        shown = {tool.name: tool.meta for tool in (await host.list_tools()).tools}
    async with apps_client(transport, mode, declares=False) as plain:
        unshown = [tool.name for tool in (await plain.list_tools()).tools]
    assert (era in MODERN_PROTOCOL_VERSIONS) == (mode == "auto")  # 2026: capabilities ride every request
    assert shown == {
        "clock_text": None,
        "show_clock": {"ui": {"resourceUri": "ui://clock/view.html"}, "ui/resourceUri": "ui://clock/view.html"},
        "tick": {"ui": {"visibility": ["app"]}},
        "model_note": {"ui": {"visibility": ["model"]}},
    }
    assert unshown == ["clock_text"]
