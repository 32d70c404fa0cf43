"""The catalog: every page of every upstream, filtered by globs, refreshed on list_changed."""

from __future__ import annotations

from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from mcpmux.core.config import config_from_dict
from mcpmux.mux.multiplexer import Mux
from tests.e2e.conftest import PY, ROOT, demo, mux_over_stdio, text_of, write_config

pytestmark = pytest.mark.anyio
PAGED = {"command": PY, "args": [str(ROOT / "tests" / "servers" / "paged_server.py")]}


async def test_pagination_on_both_sides(tmp_path: Path) -> None:
    servers = {"paged": PAGED, "alpha": demo("alpha")}
    config = write_config(tmp_path / "c.json", servers, page_size=25, tool_search="off")  # every tool listed
    async with mux_over_stdio(config, mode="legacy") as client:
        names: list[str] = []
        cursor: str | None = None
        pages = 0
        while True:
            page = await client.list_tools(cursor=cursor)
            names += [tool.name for tool in page.tools]
            pages += 1
            cursor = page.next_cursor
            if cursor is None:
                break
        assert len(names) == len(set(names))
        assert pages == -(-len(names) // 25)  # every page full but the last
        paged = [name for name in names if name.startswith("paged__")]
        assert paged[:3] == ["paged__tool_000", "paged__tool_001", "paged__tool_002"]
        assert len(paged) == 120
        assert text_of(await client.call_tool("paged__tool_119", {})) == "tool_119"


async def test_allow_and_deny_globs_filter_tools() -> None:
    servers = {"alpha": {**demo("alpha"), "allow_tools": ["e*", "a*", "c*"], "deny_tools": ["crash", "add_*"]}}
    async with Mux(config_from_dict({"servers": servers})) as mux:
        upstream_tools = sorted(tool.name for tool in mux.list_tools() if tool.name not in mux.local_tools)
        assert upstream_tools == ["alpha__add", "alpha__count", "alpha__echo"]
        denied = mux.catalog.resolve_tool
        with pytest.raises(Exception, match="unknown tool 'alpha__crash'"):
            denied("alpha__crash")


async def test_no_prefix_for_a_single_upstream_when_asked() -> None:
    config = config_from_dict({"servers": {"alpha": demo("alpha")}, "mux": {"prefix_single": False}})
    async with Mux(config) as mux:
        assert "echo" in {tool.name for tool in mux.list_tools()}
        assert text_of(await mux.call_tool("echo", {"text": "bare"})) == "alpha: bare"


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
async def test_list_changed_refreshes_only_that_upstream(protocol: str) -> None:
    servers = {"alpha": {**demo("alpha"), "protocol": protocol}, "beta": demo("beta")}
    async with Mux(config_from_dict({"servers": servers})) as mux:
        changed = anyio.Event()

        async def on_change() -> None:
            changed.set()

        mux.on_catalog_changed(on_change)
        await mux.call_tool("alpha__add_tool", {"name": "fresh"})
        with anyio.fail_after(10):
            while "alpha__fresh" not in {tool.name for tool in mux.list_tools()}:
                await changed.wait()
                changed = anyio.Event()
        assert text_of(await mux.call_tool("alpha__fresh", {})) == "fresh works"
        assert "beta__fresh" not in {tool.name for tool in mux.list_tools()}


async def test_upstream_json_rpc_errors_and_completions_pass_through(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.json", {"paged": PAGED, "alpha": demo("alpha")})
    async with mux_over_stdio(config) as client:
        with pytest.raises(MCPError) as caught:
            await client.call_tool("paged__tool_000", {})
        assert caught.value.error.code == -32042
        assert caught.value.error.message == "tool_000 always refuses"
        assert caught.value.error.data == {"why": "by design"}
        prompt = await client.complete(
            types.PromptReference(type="ref/prompt", name="alpha__summarize"), {"name": "topic", "value": "ca"}
        )
        assert prompt.completion.values == ["ca-alpha-1", "ca-alpha-2"]
        template = await client.complete(
            types.ResourceTemplateReference(type="ref/resource", uri="demo://{server}/greeting"),
            {"name": "server", "value": "x"},
        )
        assert template.completion.values == ["x-alpha-1", "x-alpha-2"]


@pytest.mark.slow
async def test_a_completion_during_start_up_waits_for_the_upstream_that_lists_its_prompt() -> None:
    """mcpmux serves before its upstreams have listed anything: a completion naming a prompt or template
    of one still starting waits for it (as `prompts/get` does) instead of answering "unknown prompt"."""
    late = {
        "command": "sh",
        "args": ["-c", f"sleep 1.5; exec {PY} {ROOT / 'tests' / 'servers' / 'demo_server.py'} alpha"],
    }
    for ref in (
        types.PromptReference(type="ref/prompt", name="alpha__summarize"),
        types.ResourceTemplateReference(type="ref/resource", uri="demo://{server}/greeting"),
    ):
        async with Mux(config_from_dict({"servers": {"alpha": late}}), wait_for_upstreams=False) as mux:
            assert mux.upstreams["alpha"].state.value == "starting"
            with anyio.fail_after(30):
                completed = await mux.complete(ref, {"name": "topic", "value": "ca"})
        assert completed.completion.values == ["ca-alpha-1", "ca-alpha-2"]


async def test_resource_reads_honour_ttl_and_cache_scope() -> None:
    async with Mux(config_from_dict({"servers": {"paged": PAGED}})) as mux:

        async def read(uri: str, client: str | None) -> str:
            result = await mux.read_resource(uri, client=client)
            return result.contents[0].text  # type: ignore[union-attr]

        first = await read("paged://public", "a")
        assert await read("paged://public", "b") == first  # public: shared by every client
        mine = await read("paged://private", "a")
        assert await read("paged://private", "a") == mine  # private: cached for the same client ...
        assert await read("paged://private", "b") != mine  # ... never served to another


async def test_listings_are_refetched_when_their_ttl_runs_out() -> None:
    growing = {**PAGED, "env": {"PAGED_GROWING": "1"}}
    only_paged = {"servers": {"paged": growing}, "mux": {"meta_tools": False}, "inference": {"backend": "off"}}
    async with Mux(config_from_dict(only_paged)) as mux:
        first = [t.name for t in mux.catalog.tools]
        assert first
        await mux.refresh_stale_listings()  # still fresh (ttlMs = 300): nothing refetched
        assert [t.name for t in mux.catalog.tools] == first
        await anyio.sleep(0.4)
        await mux.refresh_stale_listings()  # stale: refetched, and the server's new tool is listed
        assert [t.name for t in mux.catalog.tools] == [*first, f"paged__grown_{len(first)}"]
