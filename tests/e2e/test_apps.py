"""MCP Apps through mcpmux (`tests/servers/apps_server.py`, two copies serving the same `ui://` URIs):
views keep URIs of their own server's, the view's own calls by bare names reach their server, and
tools only views may call stay out of the model's reach through mcpmux's own tools."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import Client
from mcp.client.extension import advertise
from mcp.client.stdio import StdioServerParameters
from mcp.server.apps import APP_MIME_TYPE
from mcp.shared.exceptions import MCPError

from mcpmux.errors import UnknownToolError
from mcpmux.mux.multiplexer import Mux
from tests.e2e.conftest import PY, ROOT, demo, mux_over_http, mux_over_stdio, served_in_process, text_of

APPS = ROOT / "tests" / "servers" / "apps_server.py"
UI = "io.modelcontextprotocol/ui"
_CSP = {"ui": {"csp": {"connectDomains": ["https://example.com"]}, "prefersBorder": True}}
pytestmark = pytest.mark.anyio


def apps(name: str) -> dict[str, Any]:
    """An apps_server that shows its views to every client: what reaches the server is not tested here."""
    return {"command": PY, "args": [str(APPS), name], "env": {"APPS_UNGATED": "1"}}


def _config(path: Path, servers: dict[str, dict[str, Any]], **mux: Any) -> Path:
    path.write_text(json.dumps({"mcpServers": servers, "mux": mux, "inference": {"backend": "off"}}))
    return path


def _named(server: str, value: Any) -> Any:
    """`value` (JSON) with its `ui://` URIs as mcpmux names them for `server`."""
    return json.loads(json.dumps(value).replace('"ui://', f'"ui://{server}+'))


def _dump(model: Any) -> Any:
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)


async def _what_a_host_sees(client: Client, prefix: str, index: str, view: str) -> dict[str, Any]:
    """Tools, resources and reads of one apps_server (named with `prefix`), and a call of its view's tool."""
    tools = {tool.name.removeprefix(prefix): tool.meta for tool in (await client.list_tools()).tools}
    listed = [_dump(r) for r in (await client.list_resources()).resources if r.uri.startswith(index[:8])]
    reads = [_dump(item) for uri in (index, view) for item in (await client.read_resource(uri)).contents]
    shown = await client.call_tool(f"{prefix}show_clock", {})
    return {
        "tools": {name: meta for name, meta in tools.items() if name in ("clock_text", "show_clock", "tick")},
        "listed": listed,
        "reads": reads,
        "shown": {"content": [_dump(block) for block in shown.content], "ui": (shown.meta or {}).get("ui")},
    }


@asynccontextmanager
async def _direct(mode: str) -> AsyncIterator[Client]:
    params = StdioServerParameters(command=PY, args=[str(APPS), "a"], env={**os.environ, "APPS_UNGATED": "1"})
    async with Client(params, mode=mode) as client:
        yield client


@pytest.mark.slow
@pytest.mark.parametrize(
    ("front", "mode", "fast_path"),
    [
        ("stdio", "legacy", True),
        ("stdio", "auto", True),
        ("http", "legacy", True),
        ("http", "auto", True),
        ("stdio", "auto", False),
        ("http", "legacy", False),
    ],
    ids=["stdio-2025", "stdio-2026", "http-2025", "http-2026", "stdio-2026-sdk-path", "http-2025-sdk-path"],
)
async def test_two_servers_views_keep_uris_of_their_own_through_mcpmux(
    tmp_path: Path, front: str, mode: str, fast_path: bool
) -> None:
    async with _direct(mode) as client:
        direct = await _what_a_host_sees(client, "", "ui://app/index.html", "ui://clock/view.html")
    config = _config(tmp_path / "c.json", {"a": apps("a"), "b": apps("b")}, fast_path=fast_path)
    if front == "stdio":
        async with mux_over_stdio(config, mode=mode) as client:
            seen = await _through(client)
    else:
        with mux_over_http(config) as url:
            async with Client(url, mode=mode) as client:
                seen = await _through(client)
    # What the host sees of each server is what it sees directly, its ui:// URIs named after the server.
    assert seen["a"] == _named("a", direct)
    assert seen["b"] == _named("b", json.loads(json.dumps(direct).replace("of a<", "of b<").replace("a: ", "b: ")))
    assert seen["a"]["reads"][0]["text"] == "<!doctype html><p>index of a</p>"
    assert seen["b"]["reads"][0]["text"] == "<!doctype html><p>index of b</p>"
    # A view's own call by a bare name two servers share is refused, naming both.
    assert seen["bare tick"] == (
        "tool 'tick' is not listed, and the servers a, b each have a tool of that name ('a__tick', 'b__tick'); "
        "a view calls its server's tools by their own names only where one server has the name: "
        "call it by its full name"
    )
    assert seen["templates"] == ["ui://a+widgets/{id}", "ui://b+widgets/{id}"]
    assert seen["widget"] == [
        {
            "uri": "ui://b+widgets/7",
            "mimeType": "text/html;profile=mcp-app",
            "_meta": _CSP,
            "text": "<p>widget 7 of b</p>",
        }
    ]
    assert seen["completed"] == ["7"]  # the server was asked about its own template
    assert seen["bare view"] == (
        "resource 'ui://clock/view.html' is served by several servers (a, b): read it as "
        "'ui://a+clock/view.html' or 'ui://b+clock/view.html'"
    )


async def _through(client: Client) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for server in ("a", "b"):
        seen[server] = await _what_a_host_sees(
            client, f"{server}__", f"ui://{server}+app/index.html", f"ui://{server}+clock/view.html"
        )
    with pytest.raises(MCPError) as refused:
        await client.call_tool("tick", {})
    seen["bare tick"] = refused.value.error.message
    with pytest.raises(MCPError) as unread:
        await client.read_resource("ui://clock/view.html")
    seen["bare view"] = unread.value.error.message
    templates = (await client.list_resource_templates()).resource_templates
    seen["templates"] = sorted(template.uri_template for template in templates)
    seen["widget"] = [_dump(item) for item in (await client.read_resource("ui://b+widgets/7")).contents]
    reference = types.ResourceTemplateReference(type="ref/resource", uri="ui://b+widgets/{id}")
    seen["completed"] = (await client.complete(reference, {"name": "id", "value": ""})).completion.values
    return seen


async def test_a_views_own_calls_and_reads_by_bare_names_reach_its_server(tmp_path: Path) -> None:
    config = _config(tmp_path / "c.json", {"a": apps("a"), "demo": demo("demo")})
    async with Mux.from_config(config) as mux:
        assert text_of(await mux.call_tool("tick", {})) == "a: tick"  # app-only: the host calls it for a view
        assert text_of(await mux.call_tool("clock_text", {})) == "a: clock_text"
        read = await mux.read_resource("ui://clock/view.html")  # unlisted, named by show_clock
        assert [(item.uri, getattr(item, "text", None)) for item in read.contents] == [
            ("ui://clock/view.html", "<!doctype html><p>clock view of a</p>")
        ]
        for bare in ("model_note", "echo"):  # the model's alone; a server with no views
            with pytest.raises(UnknownToolError, match=f"^unknown tool '{bare}'"):
                await mux.call_tool(bare, {})


async def test_the_model_cannot_reach_app_only_tools_through_mcpmux_tools(tmp_path: Path) -> None:
    config = _config(tmp_path / "c.json", {"a": apps("a")})
    refusal = (
        "tool 'a__tick' is only for its server's views (its _meta.ui.visibility leaves out \"model\"): "
        "the host calls it for them, the model cannot"
    )
    async with Mux.from_config(config) as mux:
        assert "a__tick" in [tool.name for tool in mux.list_tools()]  # listed: the host hides it from the model
        direct = await mux.call_tool("mux_call_tool", {"tool": "a__tick"})
        assert direct.is_error
        assert text_of(direct) == f"mux_call_tool: {refusal}"
        parallel = await mux.call_tool("mux_parallel", {"calls": [{"tool": "a__tick"}, {"tool": "a__clock_text"}]})
        results = (parallel.structured_content or {})["results"]
        assert [(r["ok"], r.get("error")) for r in results] == [(False, refusal), (True, None)]
        bare = await mux.call_tool("mux_batch", {"tool": "tick", "arguments": [{}]})  # a bare name resolves to it
        assert (bare.structured_content or {})["results"][0]["error"] == refusal.replace("'a__tick'", "'tick'")
        pipeline = await mux.call_tool("mux_pipeline", {"steps": [{"tool": "a__tick"}]})
        assert pipeline.is_error
        assert refusal in text_of(pipeline)
        found = await mux.call_tool("mux_search_tools", {"query": "advances the view's clock", "limit": 50})
        names = [tool["name"] for tool in (found.structured_content or {})["tools"]]
        assert "a__show_clock" in names
        assert "a__tick" not in names


async def test_search_mode_lists_the_tools_a_host_needs_for_views(tmp_path: Path) -> None:
    config = _config(tmp_path / "c.json", {"a": apps("a"), "demo": demo("demo")}, tool_search="on")
    async with served_in_process(config) as (_, _, url), Client(url) as client:
        listed = {tool.name: tool.meta for tool in (await client.list_tools()).tools}
    upstream = {name: meta for name, meta in listed.items() if not name.startswith("mux_")}
    assert upstream == {  # a view's tool and a view-only tool; the text tools are found by search
        "a__show_clock": {"ui": {"resourceUri": "ui://a+clock/view.html"}, "ui/resourceUri": "ui://a+clock/view.html"},
        "a__tick": {"ui": {"visibility": ["app"]}},
    }


UI_HOST = [advertise(UI, {"mimeTypes": [APP_MIME_TYPE]})]
"""What a host that renders views declares (ext-apps' `getUiCapability` reads it)."""


async def _tools(client: Client, prefix: str = "") -> set[str]:
    """The names of the tools a client is shown that begin with `prefix`."""
    return {tool.name for tool in (await client.list_tools()).tools if tool.name.startswith(prefix)}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["legacy", "auto"], ids=["2025", "2026"])
@pytest.mark.parametrize("front", ["stdio", "http"])
async def test_a_gated_server_shows_its_views_through_mcpmux_to_the_hosts_it_shows_them_directly(
    tmp_path: Path, front: str, mode: str
) -> None:
    """The server lists its UI tools only to clients that declare the extension: through mcpmux, the
    host that declares it sees them and the client that does not sees the text fallback alone, as each
    does directly (the client's capability reaches the server, on a session of its own)."""
    gated = StdioServerParameters(command=PY, args=[str(APPS), "a"], env=dict(os.environ))
    async with Client(gated, mode=mode, extensions=UI_HOST) as host, Client(gated, mode=mode) as plain:
        direct = {"host": await _tools(host), "plain": await _tools(plain)}
    assert direct == {"host": {"clock_text", "show_clock", "tick", "model_note"}, "plain": {"clock_text"}}
    config = _config(tmp_path / "c.json", {"a": {"command": PY, "args": [str(APPS), "a"]}})
    seen: dict[str, set[str]] = {}
    shown: list[str] = []
    if front == "stdio":  # a stdio front serves one client: one mcpmux each
        async with mux_over_stdio(config, mode=mode, extensions=UI_HOST) as host:
            seen["host"] = await _tools(host, "a__")
            shown.append(text_of(await host.call_tool("a__show_clock", {})))
        async with mux_over_stdio(config, mode=mode) as plain:
            seen["plain"] = await _tools(plain, "a__")
    else:  # one mcpmux, both clients at once
        with mux_over_http(config) as url:
            async with Client(url, mode=mode, extensions=UI_HOST) as host, Client(url, mode=mode) as plain:
                seen = {"host": await _tools(host, "a__"), "plain": await _tools(plain, "a__")}
                shown.append(text_of(await host.call_tool("a__show_clock", {})))
                with pytest.raises(MCPError, match="unknown tool 'a__show_clock'"):
                    await plain.call_tool("a__show_clock", {})
    assert seen == {who: {f"a__{name}" for name in tools} for who, tools in direct.items()}
    assert shown == ["a: show_clock"]
