"""2025 resource subscriptions through mcpmux, on npm server-everything (2025-11-25).

Real parts: server-everything as mcpmux's stdio upstream, mcpmux in this process over real HTTP,
real `mcp.Client`s in legacy mode. server-everything's `toggle-subscriber-updates` sends
`notifications/resources/updated` for the subscribed URIs at once, then every 5 s.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import psutil
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError

from mcpmux import Mux
from mcpmux.upstream.supervisor import UpstreamState
from tests.e2e.conftest import EVERYTHING, everything_available, served_in_process

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not everything_available(), reason="server-everything is not installed"),
]
TOGGLE = "toggle-subscriber-updates"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Updates:
    """A client's message handler that keeps the URIs of `notifications/resources/updated`."""

    def __init__(self) -> None:
        self.uris: list[str] = []

    async def __call__(self, message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            self.uris.append(str(message.params.uri))

    async def wait_for(self, count: int, limit: float = 8.0) -> None:
        with anyio.fail_after(limit):
            while len(self.uris) < count:
                await anyio.sleep(0.02)


@pytest.fixture
async def mcpmux_url(tmp_path: Path) -> AsyncIterator[tuple[Mux, str]]:
    config = tmp_path / "mcpmux.toml"
    config.write_text(
        f'[inference]\nbackend = "off"\n[mux]\nrestart_initial_backoff = 0.1\n'
        f'[servers.everything]\ncommand = "node"\nargs = ["{EVERYTHING}", "stdio"]\n'
    )
    async with served_in_process(config) as (mux, _frontend, url):
        yield mux, url


async def _a_document(client: Client) -> str:
    resources = (await client.list_resources()).resources
    return next(str(r.uri) for r in resources if "document" in str(r.uri))


async def test_direct_subscription_is_what_mcpmux_must_match() -> None:
    updates = Updates()
    params = StdioServerParameters(command="node", args=[str(EVERYTHING), "stdio"], env=dict(os.environ))
    async with Client(params, message_handler=updates) as client:
        assert client.server_capabilities.resources is not None
        assert client.server_capabilities.resources.subscribe
        uri = await _a_document(client)
        await client.subscribe_resource(uri)
        await client.call_tool(TOGGLE, {})
        await updates.wait_for(1)
    assert updates.uris[0] == uri


async def test_updates_reach_only_subscribers_and_survive_a_restart(mcpmux_url: tuple[Mux, str]) -> None:
    mux, url = mcpmux_url
    subscribed, other = Updates(), Updates()
    async with (
        Client(url, mode="legacy", message_handler=subscribed) as client,
        Client(url, mode="legacy", message_handler=other) as bystander,
    ):
        assert client.server_capabilities.resources is not None
        assert client.server_capabilities.resources.subscribe
        uri = await _a_document(client)
        await client.subscribe_resource(uri)
        await client.call_tool(f"everything__{TOGGLE}", {})
        await subscribed.wait_for(1)
        assert subscribed.uris == [uri]

        # The upstream dies; mcpmux restarts it and subscribes again, without the client asking.
        upstream = mux.upstreams["everything"]
        restarts = upstream.restarts
        node = [p for p in psutil.Process().children(recursive=True) if str(EVERYTHING) in " ".join(p.cmdline())]
        assert len(node) == 1
        node[0].kill()
        with anyio.fail_after(20):
            while upstream.restarts == restarts or upstream.state != UpstreamState.READY:
                await anyio.sleep(0.05)
        assert uri in upstream.subscriptions
        await client.call_tool(f"everything__{TOGGLE}", {})  # the new process starts sending at once
        await subscribed.wait_for(2)
        assert subscribed.uris[1] == uri

        await client.unsubscribe_resource(uri)
        assert uri not in upstream.subscriptions
        await bystander.call_tool(f"everything__{TOGGLE}", {})
        await anyio.sleep(0.5)
    assert other.uris == []  # never subscribed: never told


async def test_subscribing_to_an_unknown_uri_is_the_clients_error(mcpmux_url: tuple[Mux, str]) -> None:
    _, url = mcpmux_url
    async with Client(url, mode="legacy") as client:
        with pytest.raises(MCPError) as raised:
            await client.subscribe_resource("demo://nothing/here")
    assert raised.value.error.code == types.INVALID_PARAMS
    assert "no upstream offers resource" in raised.value.error.message


async def test_a_2026_client_listens_to_a_resource_of_a_2025_upstream(mcpmux_url: tuple[Mux, str]) -> None:
    mux, url = mcpmux_url
    upstream = mux.upstreams["everything"]
    async with Client(url, mode="auto") as client:
        assert client.protocol_version == "2026-07-28"
        uri = await _a_document(client)
        async with client.listen(resource_subscriptions=[uri]) as stream:
            assert uri in upstream.subscriptions  # subscribed upstream while the stream is open
            await client.call_tool(f"everything__{TOGGLE}", {})
            with anyio.fail_after(8):
                event = await anext(aiter(stream))
        assert getattr(event, "uri", None) == uri, event
        with anyio.fail_after(5):
            while uri in upstream.subscriptions:  # the stream closed: unsubscribed upstream
                await anyio.sleep(0.02)
