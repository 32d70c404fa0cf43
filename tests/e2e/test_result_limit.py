"""Results that fit a model's context, through mcpmux as clients use it: cut, linked, and read back whole.

The same calls go through the fast path (raw relay) and the SDK path (`fast_path = false`), over
stdio and HTTP, in both protocol eras: the answers must read the same.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from mcpmux.core.config import DEFAULT_MAX_RESULT_BYTES
from tests.e2e.conftest import EVERYTHING, PY, ROOT, everything_available, mux_over_http, mux_over_stdio, text_of
from tests.servers.big_server import log_text

BIG = ROOT / "tests" / "servers" / "big_server.py"
FILESYSTEM = EVERYTHING.parents[2] / "server-filesystem" / "dist" / "index.js"

pytestmark = pytest.mark.anyio


def write(path: Path, fast_path: bool = True, **servers: dict[str, Any]) -> Path:
    big = {"command": PY, "args": [str(BIG)], "max_result_bytes": {"log": 2000, "*": 4000}}
    config = {"mcpServers": {"big": big, **servers}, "mux": {"fast_path": fast_path}, "inference": {"backend": "off"}}
    path.write_text(json.dumps(config))
    return path


@asynccontextmanager
async def connected(config: Path, transport: str, mode: str) -> AsyncIterator[Client]:
    if transport == "stdio":
        async with mux_over_stdio(config, mode=mode) as client:
            yield client
    else:
        with mux_over_http(config) as url:
            async with Client(url, mode=mode) as client:
                yield client


def link_of(result: Any) -> Any:
    (link,) = [block for block in result.content if block.type == "resource_link"]
    return link


@pytest.mark.slow
@pytest.mark.parametrize(
    ("transport", "mode", "fast_path"),
    [("stdio", "auto", True), ("stdio", "legacy", True), ("http", "auto", True), ("stdio", "auto", False)],
)
async def test_a_result_over_its_limit_is_cut_and_read_back_whole(
    tmp_path: Path, transport: str, mode: str, fast_path: bool
) -> None:
    config = write(tmp_path / "c.json", fast_path)
    async with connected(config, transport, mode) as client:
        whole = log_text(5000)
        result = await client.call_tool("big__log", {"lines": 5000})
        shown, note = (block.text for block in result.content if block.type == "text")
        assert whole.startswith(shown)
        assert shown.endswith("\n")  # a clean boundary: whole lines
        assert 1900 < len(shown.encode()) <= 2000
        assert f"answered {len(whole):,} bytes of text, more than its limit of 2,000" in note
        link = link_of(result)
        assert link.uri.startswith("mcpmux://results/")
        assert link.size == len(whole)
        assert link.uri in note
        read = await client.read_resource(link.uri)
        assert [item.text for item in read.contents] == [whole]

        small = await client.call_tool("big__log", {"lines": 10})
        assert text_of(small) == log_text(10)  # within the limit: untouched
        assert all(block.type == "text" for block in small.content)

        # Its outputSchema validates structuredContent: the client checks it, so it stays whole.
        report = await client.call_tool("big__report", {"rows": 500})
        assert not report.is_error
        assert report.structured_content is not None
        assert len(report.structured_content["rows"]) == 500
        assert len(report.content[0].text.encode()) <= 4000

        # No outputSchema: a model may read structuredContent, so it counts and, over, is left out.
        table = await client.call_tool("big__table", {"rows": 500})
        assert table.structured_content is None
        contents = (await client.read_resource(link_of(table).uri)).contents
        assert json.loads(contents[-1].text)["rows"][499] == {"id": 499, "name": "item 499"}

        # An app-only tool's result is for the view that asked: never cut.
        chart = await client.call_tool("big__chart_data", {"points": 2000})
        assert len(json.loads(text_of(chart))) == 2000

        with pytest.raises(MCPError, match="is not kept"):
            await client.read_resource("mcpmux://results/never-given")


@pytest.mark.slow
@pytest.mark.skipif(not everything_available(), reason="node or the npm servers are not installed (make setup)")
async def test_a_large_file_from_the_reference_filesystem_server_fits_by_default(tmp_path: Path) -> None:
    files = tmp_path / "files"
    files.mkdir()
    big = files / "app.log"
    big.write_text(log_text(20_000))  # about 700 KB
    server = {"command": "node", "args": [str(FILESYSTEM), str(files)]}
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"mcpServers": {"fs": server}, "inference": {"backend": "off"}}))
    async with mux_over_stdio(config) as client:
        result = await client.call_tool("fs__read_text_file", {"path": str(big)})
        shown = result.content[0].text
        assert len(shown.encode()) <= DEFAULT_MAX_RESULT_BYTES < big.stat().st_size
        read = await client.read_resource(link_of(result).uri)
        assert read.contents[0].text == big.read_text()


@pytest.mark.slow
async def test_mcpmux_own_tools_fit_their_results_too(tmp_path: Path) -> None:
    """`mux_parallel` gathers several results: together they fit `[mux] max_result_bytes` as one
    tool's would, the whole kept; `mux_call_tool` relays one result, cut once, to its tool's own limit."""
    config = write(tmp_path / "c.json")
    raw = json.loads(config.read_text())
    raw["mux"].update(max_result_bytes=3000, tool_search="on")
    config.write_text(json.dumps(raw))
    async with mux_over_stdio(config) as client:
        calls = [{"tool": "big__log", "arguments": {"lines": 5000}} for _ in range(3)]
        gathered = await client.call_tool("mux_parallel", {"calls": calls})
        shown = "".join(block.text for block in gathered.content if block.type == "text")
        assert "more than its limit of 3,000" in shown
        whole = (await client.read_resource(link_of(gathered).uri)).contents
        outcomes = json.loads(whole[-1].text)["results"]
        assert [outcome["ok"] for outcome in outcomes] == [True, True, True]
        assert all(len(outcome["result"]["text"].encode()) > 2000 for outcome in outcomes)  # each cut once

        relayed = await client.call_tool("mux_call_tool", {"tool": "big__log", "arguments": {"lines": 5000}})
        assert [link_of(relayed).size] == [len(log_text(5000))]  # one link: the tool's own whole
        read = await client.read_resource(link_of(relayed).uri)
        assert [item.text for item in read.contents] == [log_text(5000)]
