"""npm's server-filesystem through mcpmux: the directories it may touch are the calling client's roots.

server-filesystem started without directories serves only what its client's `roots/list` names,
and asks again on `notifications/roots/list_changed`. Through mcpmux its client is mcpmux, started
before any client connected: the roots must still be the connected client's (or, for a client
without roots, the config's), on stdio and over HTTP.
"""

from __future__ import annotations

import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client

from tests.e2e.conftest import ROOT, mux_over_http, mux_over_stdio, text_of, write_config

FILESYSTEM = ROOT / ".npm" / "node_modules" / "@modelcontextprotocol" / "server-filesystem" / "dist" / "index.js"
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(
        not FILESYSTEM.exists() or shutil.which("node") is None, reason="server-filesystem is not installed"
    ),
]


def _folders(tmp_path: Path) -> tuple[Path, Path]:
    mine, other = tmp_path / "mine", tmp_path / "other"
    for folder, text in ((mine, "my notes"), (other, "someone else's")):
        folder.mkdir()
        (folder / "note.txt").write_text(text)
    return mine.resolve(), other.resolve()


def _roots_of(folder: Path) -> Callable[[Any], Awaitable[types.ListRootsResult]]:
    async def roots(context: Any) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri=folder.as_uri(), name=folder.name)])  # type: ignore[arg-type]

    return roots


async def _allowed(client: Client, expected: Path) -> str:
    """server-filesystem's allowed directories, once the roots have reached it (they arrive after connecting;
    on a loaded host node's start alone has taken over 10 s)."""
    with anyio.fail_after(40):
        while True:
            listed = text_of(await client.call_tool("fs__list_allowed_directories", {}))
            if str(expected) in listed:
                return listed
            await anyio.sleep(0.1)


async def _reads_only_inside(client: Client, mine: Path, other: Path) -> None:
    inside = await client.call_tool("fs__read_text_file", {"path": str(mine / "note.txt")})
    assert not inside.is_error
    assert text_of(inside) == "my notes"
    outside = await client.call_tool("fs__read_text_file", {"path": str(other / "note.txt")})
    assert outside.is_error
    assert "outside allowed directories" in text_of(outside)


@pytest.mark.parametrize("front", ["stdio", "http"])
async def test_the_client_roots_are_what_server_filesystem_may_touch(tmp_path: Path, front: str) -> None:
    mine, other = _folders(tmp_path)
    config = write_config(tmp_path / "mux.json", {"fs": {"command": "node", "args": [str(FILESYSTEM)]}})
    if front == "stdio":
        async with mux_over_stdio(config, mode="legacy", list_roots_callback=_roots_of(mine)) as client:
            assert str(other) not in await _allowed(client, mine)
            await _reads_only_inside(client, mine, other)
        return
    with mux_over_http(config) as url:
        async with Client(url, mode="legacy", list_roots_callback=_roots_of(mine)) as client:
            assert str(other) not in await _allowed(client, mine)
            await _reads_only_inside(client, mine, other)


async def test_a_client_without_roots_gets_the_configured_ones(tmp_path: Path) -> None:
    mine, other = _folders(tmp_path)
    servers = {"fs": {"command": "node", "args": [str(FILESYSTEM)], "roots": [str(mine)]}}
    async with mux_over_stdio(write_config(tmp_path / "mux.json", servers), mode="legacy") as client:
        assert str(other) not in await _allowed(client, mine)
        await _reads_only_inside(client, mine, other)
