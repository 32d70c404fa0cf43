"""Tool search (`mux_search_tools`, `mux_call_tool`, search mode) through real clients and real upstreams.

The client tests run `mcpmux serve` over stdio with inference off (BM25 alone: the embedding model
would cost tens of seconds of CPU per process here); the hybrid ranking and the embedding cache are
tested in-process with the real MiniLM, embedded or behind a remote OpenAI-compatible server.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client

from mcpmux.core.config import config_from_dict
from mcpmux.mux.multiplexer import Mux
from tests.e2e.conftest import demo, mux_over_stdio, text_of, write_config
from tests.inference.serving.openai_server import openai_only_server

pytestmark = pytest.mark.anyio

TIME_SERVER = {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}
OWN = {"mux_parallel", "mux_batch", "mux_pipeline", "mux_search_tools", "mux_call_tool"}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """MCPMUX_HOME in a temporary folder, so the embedding cache of one test run starts empty."""
    folder = tmp_path_factory.mktemp("mcpmux-home")
    before = os.environ.get("MCPMUX_HOME")
    os.environ["MCPMUX_HOME"] = str(folder)
    yield folder
    if before is None:
        del os.environ["MCPMUX_HOME"]
    else:
        os.environ["MCPMUX_HOME"] = before


@pytest.fixture(scope="module")
async def client(tmp_path_factory: pytest.TempPathFactory, home: Path) -> AsyncIterator[Client]:
    config = write_config(
        tmp_path_factory.mktemp("search") / "mcp.json",
        {"alpha": demo("alpha"), "beta": demo("beta"), "time": TIME_SERVER},
        tool_search="on",
        pinned_tools=["alpha__ec*"],
    )
    raw = config.read_text().replace('"mux"', '"inference": {"backend": "off"}, "mux"')
    config.write_text(raw)
    async with mux_over_stdio(config) as connected:
        yield connected


def _names(result: Any) -> list[str]:
    return [item["name"] for item in (result.structured_content or {})["tools"]]


async def test_search_mode_lists_only_mcpmuxs_own_tools_and_the_pinned_ones(client: Client) -> None:
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) == OWN | {"alpha__echo"}
    search = tools["mux_search_tools"]
    assert search.output_schema is not None
    assert search.output_schema["properties"]["tools"]["items"]["required"] == [
        "name",
        "description",
        "inputSchema",
        "score",
    ]
    assert search.input_schema["properties"]["limit"]["maximum"] == 50
    assert len(search.description or "") < 700  # short enough to list on every turn


async def test_search_answers_in_the_documented_shape_best_first(client: Client) -> None:
    result = await client.call_tool("mux_search_tools", {"query": "current time in Tokyo", "limit": 3})
    assert not result.is_error
    tools = (result.structured_content or {})["tools"]
    assert len(tools) <= 3
    assert tools[0]["name"] == "time__get_current_time"
    assert set(tools[0]) == {"name", "description", "inputSchema", "score"}  # `_meta` only where a tool has one
    assert "timezone" in tools[0]["inputSchema"]["properties"]
    scores = [item["score"] for item in tools]
    assert scores == sorted(scores, reverse=True)
    text = text_of(result)
    assert "1. time__get_current_time" in text
    assert "mux_call_tool" in text
    assert '"timezone"' in text  # the schema is in the text too, for clients that show only text


async def test_the_search_tool_names_the_servers_behind_it(client: Client) -> None:
    search = {tool.name: tool for tool in (await client.list_tools()).tools}["mux_search_tools"]
    description = search.description or ""
    assert description.startswith("Find tools of the connected servers")
    # Each server, with the words its tools are named by (the server's own name and generic verbs left out).
    servers = description.split("Servers: ", 1)[1]
    assert "alpha (" in servers
    assert "beta (" in servers
    assert "time (current, convert)" in servers
    assert "weather" in servers


async def test_the_answer_says_which_ranking_answered(client: Client) -> None:
    result = await client.call_tool("mux_search_tools", {"query": "current time in Tokyo", "limit": 1})
    structured = result.structured_content or {}
    assert structured["ranking"] == "BM25"
    assert structured["why"].startswith('[inference] backend is "off"')
    assert '(BM25: [inference] backend is "off"' in text_of(result)


async def test_results_carry_each_tools_meta(client: Client) -> None:
    meta = {"ui": {"resourceUri": "ui://alpha/dashboard"}}
    await client.call_tool("alpha__add_tool", {"name": "open_sales_dashboard", "meta": meta})
    with anyio.fail_after(20):
        while True:
            result = await client.call_tool("mux_search_tools", {"query": "open the sales dashboard", "limit": 3})
            tools = (result.structured_content or {})["tools"]
            if tools and tools[0]["name"] == "alpha__open_sales_dashboard":
                break
            await anyio.sleep(0.1)
    # As tools/list shows it: the view's ui:// URI named after its server (docs/guide/protocol.md, MCP Apps).
    assert tools[0]["_meta"] == {"ui": {"resourceUri": "ui://alpha+alpha/dashboard"}}
    assert all("_meta" not in item for item in tools[1:])  # the demo's own tools have none


async def test_a_search_without_a_limit_returns_five_tools(client: Client) -> None:
    result = await client.call_tool("mux_search_tools", {"query": "echo, add or weather"})
    assert len(_names(result)) == 5  # of the 8 tools of alpha and beta these words match


async def test_servers_globs_narrow_the_search(client: Client) -> None:
    everywhere = await client.call_tool("mux_search_tools", {"query": "add two integers", "limit": 10})
    assert {"alpha__add", "beta__add"} <= set(_names(everywhere))
    only_beta = await client.call_tool("mux_search_tools", {"query": "add two integers", "servers": ["be*"]})
    assert _names(only_beta)[0] == "beta__add"
    assert all(name.startswith("beta__") for name in _names(only_beta))


async def test_a_query_matching_nothing_says_what_to_do(client: Client) -> None:
    result = await client.call_tool("mux_search_tools", {"query": "zyxxy quuxifier"})
    assert not result.is_error
    assert (result.structured_content or {})["tools"] == []
    assert "search again with other words" in text_of(result)


async def test_malformed_search_requests_name_the_field(client: Client) -> None:
    result = await client.call_tool("mux_search_tools", {"query": "time", "limit": 0})
    assert result.is_error
    assert "limit" in text_of(result)
    result = await client.call_tool("mux_search_tools", {"limit": 3})
    assert result.is_error
    assert "query" in text_of(result)


async def test_call_tool_calls_an_unlisted_tool_like_a_direct_call(client: Client) -> None:
    through = await client.call_tool("mux_call_tool", {"tool": "alpha__add", "arguments": {"a": 20, "b": 22}})
    direct = await client.call_tool("alpha__add", {"a": 20, "b": 22})
    assert not through.is_error
    assert through.structured_content == direct.structured_content == {"result": 42}
    failed = await client.call_tool("mux_call_tool", {"tool": "alpha__fail", "arguments": {"reason": "on purpose"}})
    assert failed.is_error
    assert text_of(failed) == text_of(await client.call_tool("alpha__fail", {"reason": "on purpose"}))


async def test_call_tool_words_its_refusals(client: Client) -> None:
    unknown = await client.call_tool("mux_call_tool", {"tool": "alpha__ad", "arguments": {}})
    assert unknown.is_error
    assert "unknown tool 'alpha__ad'" in text_of(unknown)
    assert "alpha__add" in text_of(unknown)  # the catalog's suggestion
    assert "mux_search_tools" in text_of(unknown)
    meta = await client.call_tool("mux_call_tool", {"tool": "mux_search_tools", "arguments": {"query": "x"}})
    assert meta.is_error
    assert "call it directly" in text_of(meta)
    bad = await client.call_tool("mux_call_tool", {"arguments": {}})
    assert bad.is_error
    assert "tool" in text_of(bad)


async def test_a_tool_added_upstream_is_found_after_list_changed(client: Client) -> None:
    await client.call_tool("alpha__add_tool", {"name": "reticulate_splines"})
    with anyio.fail_after(20):
        while True:
            result = await client.call_tool("mux_search_tools", {"query": "reticulate splines", "limit": 1})
            if _names(result) == ["alpha__reticulate_splines"]:
                break
            await anyio.sleep(0.1)
    called = await client.call_tool("mux_call_tool", {"tool": "alpha__reticulate_splines"})
    assert text_of(called) == "reticulate_splines works"


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_found_tools_join_a_sessions_listing_when_exposed_as_listing(tmp_path: Path, mode: str) -> None:
    config = tmp_path / "mcp.json"
    raw = {
        "mcpServers": {"alpha": demo("alpha"), "time": TIME_SERVER},
        "inference": {"backend": "off"},
        "mux": {"tool_search": "on", "tool_search_expose": "listing"},
    }
    config.write_text(json.dumps(raw))
    changed = anyio.Event()

    async def on_message(message: object) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async with mux_over_stdio(config, mode=mode, message_handler=on_message) as client:
        assert {tool.name for tool in (await client.list_tools()).tools} == OWN
        found = await client.call_tool("mux_search_tools", {"query": "current time in a timezone", "limit": 2})
        names = set(_names(found))
        assert "time__get_current_time" in names
        listed = {tool.name for tool in (await client.list_tools(cache_mode="refresh")).tools}
        if mode == "legacy":  # a 2025 session: told, and the found tools are listed
            with anyio.fail_after(10):
                await changed.wait()
            assert listed == OWN | names
            again = await client.call_tool("mux_search_tools", {"query": "current time in a timezone", "limit": 2})
            assert set(_names(again)) == names
        else:  # a 2026-07-28 request has no session: the listing stays, found tools are called through mux_call_tool
            assert listed == OWN
            assert not changed.is_set()
        called = await client.call_tool(
            "mux_call_tool", {"tool": "time__get_current_time", "arguments": {"timezone": "UTC"}}
        )
        assert json.loads(text_of(called))["timezone"] == "UTC"


# -- in-process: modes, the real embedding model, the cache ---------------------------------------------


_SEARCH_ON = {"inference": {"backend": "off"}, "mux": {"tool_search": "on"}}


def _config(**mux: Any) -> Any:
    return config_from_dict(
        {"mcpServers": {"alpha": demo("alpha"), "time": TIME_SERVER}, "inference": {"backend": "off"}, "mux": mux}
    )


async def test_auto_mode_turns_on_past_the_threshold(home: Path) -> None:
    async with Mux(_config(tool_search="auto", tool_search_threshold=5)) as mux:
        assert {tool.name for tool in mux.listed_tools()} == OWN
    async with Mux(_config(tool_search="auto")) as mux:  # 40: the demo and time servers list fewer
        listed = {tool.name for tool in mux.listed_tools()}
        assert "alpha__echo" in listed
        assert "time__get_current_time" in listed
        assert not listed & {"mux_search_tools", "mux_call_tool"}
        # Below the threshold the search tools are not listed, yet they still answer.
        result = await mux.call_tool("mux_search_tools", {"query": "current time"})
        assert (result.structured_content or {})["tools"][0]["name"] == "time__get_current_time"


async def test_off_serves_neither_search_tool(home: Path) -> None:
    async with Mux(_config(tool_search="off")) as mux:
        assert mux.tool_search is None
        assert not {tool.name for tool in mux.list_tools()} & {"mux_search_tools", "mux_call_tool"}


async def test_a_reload_brings_the_index_up_to_date(home: Path) -> None:
    async with Mux(config_from_dict({"mcpServers": {"alpha": demo("alpha")}, **_SEARCH_ON})) as mux:
        search = mux.tool_search
        assert search is not None
        query = "current time in a timezone"
        assert all(hit.doc.server == "alpha" for hit in (await search.search(query, 50)).hits)
        await mux.reload(_config(tool_search="on"))  # the time server joins
        with anyio.fail_after(20):
            while (await search.search(query, 1)).hits[0].doc.server != "time":
                await anyio.sleep(0.05)
        assert (await search.search(query, 1)).hits[0].doc.name == "time__get_current_time"


async def test_bm25_alone_is_logged_once_when_embeddings_are_off(home: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="mcpmux.tools.search")
    async with Mux(_config(tool_search="on")) as mux:
        assert mux.tool_search is not None
        with anyio.fail_after(10):
            await mux.tool_search.indexed.wait()
        await mux.tool_search.search("time")
        found = await mux.tool_search.search("echo")
        assert (found.ranking, found.why) == (
            "BM25",
            '[inference] backend is "off" (set it to "local" or "openai" to add embeddings)',
        )
    said = [record.getMessage() for record in caplog.records if "BM25 alone" in record.getMessage()]
    assert len(said) == 1
    assert '[inference] backend is "off"' in said[0]


@pytest.fixture(scope="module")
def remote_minilm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A remote OpenAI-compatible server (a second mcpmux) whose /embeddings runs MiniLM; yields its URL."""
    config = tmp_path_factory.mktemp("remote") / "mcpmux.toml"
    config.write_text('[inference]\nbackend = "local"\n')  # no generation model loads for embeddings
    with openai_only_server(config) as url:
        yield url


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", "openai"])
async def test_hybrid_ranking_with_the_real_minilm_and_a_warm_restart(
    home: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    """MiniLM (embedded, or behind a remote server's /embeddings) embeds the catalog once; a second start
    finds every vector on disk."""
    inference: dict[str, Any] = {"backend": backend}
    if backend == "openai":
        inference["remote"] = {"base_url": request.getfixturevalue("remote_minilm"), "model": "unused"}
    config = config_from_dict(
        {
            "mcpServers": {"alpha": demo("alpha"), "time": TIME_SERVER},
            "inference": inference,
            "mux": {"tool_search": "on"},
        }
    )
    async with Mux(config) as mux:
        search = mux.tool_search
        assert search is not None
        search.query_timeout = 120.0  # the first query may wait for the model on a loaded machine
        # Searched at once, while the model loads: the search waits for the embeddings, never BM25 alone.
        first = await search.search("sum two integers", 3, wait=240)
        assert first.ranking == "BM25 + embeddings", first.why
        assert first.hits[0].doc.name == "alpha__add"
        assert search.index.dense_ready
        texts = {text for doc in search.index.docs for text in doc.dense_texts()}  # each embedded once
        assert search.index.embedded_texts == len(texts) > 2 * len(search.index.docs) > 20

        # Worded away from the descriptions: BM25 alone finds nothing, the embeddings find the tool.
        for query, best in [
            ("is it going to be sunny or rainy in Berlin", "alpha__get_weather"),
            ("plus 3 and 4", "alpha__add"),
        ]:
            assert search.index.search(query, 3, method="bm25") == []
            assert (await search.search(query, 3)).hits[0].doc.name.startswith(best), query
        found = await search.search("sum two integers", 3)
        assert found.ranking == "BM25 + embeddings"
        assert found.hits[0].doc.name == "alpha__add"
        result = await mux.call_tool("mux_search_tools", {"query": "weather forecast for a city", "limit": 2})
        assert (result.structured_content or {})["tools"][0]["name"].startswith("alpha__get_weather")
        assert (result.structured_content or {})["ranking"] == "BM25 + embeddings"
        assert "(BM25 + embeddings)" in text_of(result)
        # Nonsense matches nothing: no keyword, and no tool's meaning close enough.
        nonsense = await mux.call_tool("mux_search_tools", {"query": "zzqqxx flurb"})
        assert (nonsense.structured_content or {}) == {"tools": [], "ranking": "BM25 + embeddings"}
        assert "no tool matches 'zzqqxx flurb'" in text_of(nonsense)
        assert "ranked by BM25 + embeddings" in text_of(nonsense)
    async with Mux(config) as mux:
        search = mux.tool_search
        assert search is not None
        with anyio.fail_after(240):
            await search.indexed.wait()
        assert search.index.dense_ready
        assert search.index.embedded_texts == 0  # all from the disk cache
        precision = await mux.inference.embedding_precision() if mux.inference is not None else "?"
    assert list((home / "cache" / "tool-embeddings").rglob("*.f32"))
    # The vectors' folder names what computed them: a machine whose encoder runs in another precision
    # (bfloat16 on AMX or AVX512-BF16 CPUs, float32 elsewhere) sharing this cache embeds for itself.
    assert (precision == "") if backend == "openai" else (precision in ("float32", "bfloat16"))
    where = inference.get("remote", {}).get("base_url", "")
    folders = (home / "cache" / "tool-embeddings").rglob("model.json")
    assert f"{backend}|{config.inference.embeddings.model}|{where}|{precision}" in [
        json.loads(meta.read_text())["model"] for meta in folders
    ]


def test_the_search_command_prints_ranked_tools(tmp_path: Path, home: Path) -> None:
    config = write_config(tmp_path / "mcp.json", {"alpha": demo("alpha"), "time": TIME_SERVER})
    config.write_text(config.read_text().replace('"mux"', '"inference": {"backend": "off"}, "mux"'))
    command = [sys.executable, "-m", "mcpmux", "search", "--config", str(config)]
    done = subprocess.run(
        [*command, "current time in a timezone", "-n", "2"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2
    score, name, summary = lines[0].split("\t")
    assert name == "time__get_current_time"
    assert float(score) > 0
    assert "timezone" in summary.lower()
    assert "ranked by BM25" in done.stderr
    nothing = subprocess.run([*command, "zyxxy quuxifier"], capture_output=True, text=True, timeout=120)
    assert nothing.returncode == 1
    assert nothing.stdout == ""
    raw = json.loads(config.read_text())
    config.write_text(json.dumps({**raw, "profiles": {"no_time": {"deny_servers": ["time"]}}}))
    profiled = [*command, "current time in a timezone", "--profile", "no_time", "-n", "50"]
    inside = subprocess.run(profiled, capture_output=True, text=True, timeout=120)
    assert "time__" not in inside.stdout
    assert "alpha__" in inside.stdout
    bad = subprocess.run([*command, "time", "--limit", "0"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert "--limit must be between 1 and 50, got 0" in bad.stderr


@pytest.mark.slow
async def test_the_search_command_and_the_search_tool_agree_with_embeddings(tmp_path: Path, home: Path) -> None:
    """`mcpmux search` and `mux_search_tools` rank by the same method, with the same threshold."""
    servers = {"alpha": demo("alpha"), "time": TIME_SERVER}
    config = write_config(tmp_path / "mcp.json", servers, tool_search="on")
    command = [sys.executable, "-m", "mcpmux", "search", "--config", str(config)]
    async with Mux(config_from_dict({"mcpServers": servers, "mux": {"tool_search": "on"}})) as mux:
        assert mux.tool_search is not None
        mux.tool_search.query_timeout = 120.0
        for query in ("is it going to be sunny or rainy in Berlin", "zzqqxx flurb"):
            found = await mux.tool_search.search(query, 3, wait=240)
            done = subprocess.run([*command, query, "-n", "3"], capture_output=True, text=True, timeout=300)
            assert found.ranking == "BM25 + embeddings"
            assert f"ranked by {found.ranking}" in done.stderr
            assert [line.split("\t")[1] for line in done.stdout.splitlines()] == [hit.doc.name for hit in found.hits]
            assert done.returncode == (0 if found.hits else 1)
    assert not found.hits  # the nonsense query: nothing, exit status 1
