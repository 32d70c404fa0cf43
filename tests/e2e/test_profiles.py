"""`[profiles.NAME]`, chosen by `mcpmux serve --profile NAME`, by HTTP path `/mcp/NAME` or by bearer token:
the catalog, search and calls stay inside it, all profiles served by one Mux."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError

from mcpmux.core.config import config_from_dict
from mcpmux.errors import ConfigError, UnknownToolError
from mcpmux.mux.multiplexer import Mux
from mcpmux.mux.reload import ConfigReloader
from mcpmux.server.http.edge_policy import EdgePolicy
from tests.e2e.conftest import bearer_client, demo, served_in_process, text_of

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


# -- over HTTP: one Mux, a profile per path or per token --------------------------------------------

ANY_TOKEN = "profiles-test-token-for-every-profile-0123"
B_TOKEN = "profiles-test-token-bound-to-b-0123456789"
MODES = ("legacy", "2026-07-28")


@pytest.fixture(scope="module")
async def http_url(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    config = tmp_path_factory.mktemp("http-profiles") / "mcp.json"
    raw = {
        "mcpServers": {"alpha": demo("alpha"), "beta": demo("beta")},
        "profiles": {"a": {"servers": ["alpha"]}, "b": {"servers": ["beta"], "auth_token_env": "PROFILES_TEST_B"}},
        "http": {"auth_token_env": "PROFILES_TEST_ANY"},
        "mux": {"tool_search": "on", "pinned_tools": ["*__echo"]},
        "inference": {"backend": "off"},
    }
    config.write_text(json.dumps(raw))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PROFILES_TEST_ANY", ANY_TOKEN)
        env.setenv("PROFILES_TEST_B", B_TOKEN)
        env.setenv("MCPMUX_HOME", str(config.parent))
        async with served_in_process(config) as (_, _, url):
            yield url


async def _listed(client: Client) -> set[str]:
    return {tool.name for tool in (await client.list_tools()).tools if not tool.name.startswith("mux_")}


async def _searched(client: Client) -> int:
    """How many tools a search that matches nothing says it searched."""
    missed = await client.call_tool("mux_search_tools", {"query": "qqqzzzx"})
    said = re.search(r"\((\d+) tools searched\)", text_of(missed))
    assert said is not None, text_of(missed)
    return int(said.group(1))


@pytest.mark.parametrize("mode", MODES)
async def test_each_path_lists_searches_and_calls_its_own_profile(http_url: str, mode: str) -> None:
    async with bearer_client(http_url, ANY_TOKEN, mode) as everything:
        assert await _listed(everything) == {"alpha__echo", "beta__echo"}
        all_searched = await _searched(everything)
    async with bearer_client(f"{http_url}/a", ANY_TOKEN, mode) as client:
        assert await _listed(client) == {"alpha__echo"}
        prompts = {prompt.name for prompt in (await client.list_prompts()).prompts}
        assert prompts == {"alpha__summarize"}
        with pytest.raises(MCPError, match="unknown prompt 'beta__summarize'"):
            await client.get_prompt("beta__summarize", {"topic": "x"})
        templates = (await client.list_resource_templates()).resource_templates
        assert [template.uri_template for template in templates] == ["demo://{server}/greeting"]  # alpha's only
        found = await client.call_tool("mux_search_tools", {"query": "echo the text back", "limit": 50})
        names = {item["name"] for item in (found.structured_content or {})["tools"]}
        assert "alpha__echo" in names
        assert all(name.startswith("alpha__") for name in names), names
        assert await _searched(client) * 2 == all_searched  # alpha and beta are the same server: half
        assert text_of(await client.call_tool("alpha__echo", {"text": "hi"})) == "alpha: hi"
        assert text_of(await client.call_tool("alpha__add", {"a": 2, "b": 3})) == "5"  # found, not listed
        # Outside the profile a tool is unknown, worded as a name nobody serves is (suggestions from inside).
        with pytest.raises(MCPError) as outside:
            await client.call_tool("beta__echo", {"text": "x"})
        with pytest.raises(MCPError) as nowhere:
            await client.call_tool("gamma__echo", {"text": "x"})
        assert str(outside.value) == str(nowhere.value).replace("gamma__echo", "beta__echo")
        assert "beta__" not in str(outside.value).replace("'beta__echo'", "", 1)
        through = await client.call_tool("mux_call_tool", {"tool": "beta__echo", "arguments": {"text": "x"}})
        assert through.is_error
        assert "unknown tool 'beta__echo'" in text_of(through)
        fanned = await client.call_tool("mux_parallel", {"calls": [{"tool": "beta__echo", "arguments": {"text": "x"}}]})
        assert "unknown tool 'beta__echo'" in text_of(fanned)


@pytest.mark.parametrize("mode", MODES)
async def test_a_token_bound_to_a_profile_sees_only_it(http_url: str, mode: str) -> None:
    for url in (http_url, f"{http_url}/b"):
        async with bearer_client(url, B_TOKEN, mode) as client:
            assert await _listed(client) == {"beta__echo"}
            assert text_of(await client.call_tool("beta__echo", {"text": "hi"})) == "beta: hi"
            # alpha lists the same template first; inside profile b the URI is beta's
            read = await client.read_resource("demo://x/greeting")
            assert [getattr(part, "text", None) for part in read.contents] == ["hello from x"]
            with pytest.raises(MCPError, match="unknown tool 'alpha__echo'"):
                await client.call_tool("alpha__echo", {"text": "x"})
            found = await client.call_tool("mux_search_tools", {"query": "echo the text back", "limit": 50})
            assert all(item["name"].startswith("beta__") for item in (found.structured_content or {})["tools"])


HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}


async def test_wrong_paths_are_refused_with_what_to_do(http_url: str) -> None:
    async with httpx2.AsyncClient(timeout=30.0) as http:
        bound = {**HEADERS, "authorization": f"Bearer {B_TOKEN}"}
        other = await http.post(f"{http_url}/a", headers=bound, json=INITIALIZE)
        assert other.status_code == 403
        assert "bound to profile 'b'" in other.json()["error"]["message"]
        anyone = {**HEADERS, "authorization": f"Bearer {ANY_TOKEN}"}
        unknown = await http.post(f"{http_url}/nope", headers=anyone, json=INITIALIZE)
        assert unknown.status_code == 404
        assert "no profile 'nope' is defined (profiles defined: a, b)" in unknown.json()["error"]["message"]
        opened = await http.post(f"{http_url}/a", headers=anyone, json=INITIALIZE)
        assert opened.status_code == 200
        session = {**anyone, "mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        assert (await http.post(f"{http_url}/b", headers=session, json=listing)).status_code == 404  # a's session
        assert (await http.post(http_url, headers=session, json=listing)).status_code == 404
        call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "beta__echo", "arguments": {}}}
        assert (await http.post(http_url, headers=session, json=call)).status_code == 404  # the fast path's too
        assert (await http.post(f"{http_url}/a", headers=session, json=listing)).status_code == 200


def test_profile_tokens_are_read_like_http_ones_and_one_token_has_one_profile() -> None:
    raw = {"http": {"auth_token_env": "ANY"}, "profiles": {"p": {"auth_token_env": "P_TOKENS"}}}
    config = config_from_dict(raw)
    policy = EdgePolicy.load(config, "127.0.0.1", environ={"ANY": "t1", "P_TOKENS": "t2, t3"})
    assert policy.token_profiles == (None, "p", "p")
    assert policy.client_of("Bearer t3") == 2
    with pytest.raises(ConfigError, match=r"profiles\.p\.auth_token_env: environment variable P_TOKENS is not set"):
        EdgePolicy.load(config, "127.0.0.1", environ={"ANY": "t1"})
    with pytest.raises(ConfigError, match=r"profiles\.p: one of its tokens is also one of http.s"):
        EdgePolicy.load(config, "127.0.0.1", environ={"ANY": "same", "P_TOKENS": "same"})
    with pytest.raises(ConfigError, match="profile name 'a b' must be 1-64 characters"):
        config_from_dict({"profiles": {"a b": {}}})


def test_a_reload_that_cannot_read_profile_tokens_accepts_none_of_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tokens = tmp_path / "p.tokens"
    tokens.write_text("profile-token\n")
    config = config_from_dict({"http": {"auth_token_env": "ANY"}, "profiles": {"p": {"auth_token_file": str(tokens)}}})
    policy = EdgePolicy.load(config, "127.0.0.1", environ={"ANY": "t1"})
    assert policy.client_of("Bearer profile-token") == 1
    tokens.unlink()
    reloaded = policy.reloaded(config, environ={"ANY": "t1"})
    assert reloaded.client_of("Bearer profile-token") is None
    assert reloaded.client_of("Bearer t1") == 0  # [http]'s tokens stay as loaded at start
    assert f"profiles.p.auth_token_file: cannot read {tokens}" in caplog.text
    assert "no [profiles] token is accepted" in caplog.text


async def test_a_profile_a_reload_removed_fails_closed_with_its_name(tmp_path: Path) -> None:
    config = tmp_path / "mcp.json"
    raw = {"mcpServers": {"alpha": demo("alpha")}, "profiles": {"a": {}}, "inference": {"backend": "off"}}
    config.write_text(json.dumps(raw))
    async with served_in_process(config) as (mux, _, url), Client(f"{url}/a", mode="legacy") as client:
        assert text_of(await client.call_tool("alpha__echo", {"text": "hi"})) == "alpha: hi"
        await mux.reload(config_from_dict({**raw, "profiles": {}}))
        # The edge follows the reload: the path of a removed profile is one no profile serves.
        with pytest.raises(MCPError, match=r"no profile 'a' is defined \(profiles defined: none\)"):
            await client.call_tool("alpha__echo", {"text": "hi"})
        with pytest.raises(MCPError, match=r"no profile 'a' is defined"):
            await client.list_tools()


async def test_a_subscription_outside_the_profile_is_an_unknown_resource(tmp_path: Path) -> None:
    config = tmp_path / "mcp.json"
    paged = {"command": sys.executable, "args": [str(Path(__file__).parents[1] / "servers" / "paged_server.py")]}
    raw = {
        "mcpServers": {"alpha": demo("alpha"), "paged": paged},
        "profiles": {"a": {"servers": ["alpha"]}},
        "inference": {"backend": "off"},
    }
    config.write_text(json.dumps(raw))
    async with served_in_process(config) as (_, _, url):
        async with Client(f"{url}/a", mode="legacy") as client:
            await client.subscribe_resource("demo://x/greeting")  # alpha's: inside the profile
            with pytest.raises(MCPError) as outside:
                await client.subscribe_resource("paged://public")
            with pytest.raises(MCPError) as nowhere:
                await client.subscribe_resource("nowhere://public")
            assert str(outside.value) == str(nowhere.value).replace("nowhere://", "paged://")
            assert "paged://public" in str(outside.value)
        async with Client(url, mode="legacy") as everything:
            await everything.subscribe_resource("paged://public")  # outside no profile, it is known


async def test_a_reload_rereads_profile_tokens_and_keeps_sessions_of_tokens_it_kept(tmp_path: Path) -> None:
    kept, dropped, added, for_b = (f"reload-test-{name}-token-0123456789" for name in ("kept", "dropped", "added", "b"))
    a_file, b_file = tmp_path / "a.tokens", tmp_path / "b.tokens"
    a_file.write_text(f"{kept}\n{dropped}\n")
    b_file.write_text(f"{for_b}\n")
    config = tmp_path / "mcp.json"
    raw: dict[str, Any] = {
        "mcpServers": {"alpha": demo("alpha"), "beta": demo("beta")},
        "profiles": {"a": {"servers": ["alpha"], "auth_token_file": str(a_file)}},
        "inference": {"backend": "off"},
    }
    config.write_text(json.dumps(raw))
    async with served_in_process(config) as (mux, _, url), bearer_client(url, kept, "legacy") as before:
        assert text_of(await before.call_tool("alpha__echo", {"text": "hi"})) == "alpha: hi"
        a_file.write_text(f"{kept}\n{added}\n")  # `dropped` revoked, `added` new
        raw["profiles"]["b"] = {"servers": ["beta"], "auth_token_file": str(b_file)}
        await mux.reload(config_from_dict(raw))
        # The session opened with a token the reload kept goes on, inside its profile.
        assert text_of(await before.call_tool("alpha__echo", {"text": "still"})) == "alpha: still"
        async with httpx2.AsyncClient(timeout=30.0) as http:
            revoked = await http.post(url, headers={**HEADERS, "authorization": f"Bearer {dropped}"}, json=INITIALIZE)
            assert revoked.status_code == 401
        async with bearer_client(url, added, "legacy") as client:
            assert text_of(await client.call_tool("alpha__echo", {"text": "new"})) == "alpha: new"
            with pytest.raises(MCPError, match="unknown tool 'beta__echo'"):
                await client.call_tool("beta__echo", {"text": "x"})
        async with bearer_client(f"{url}/b", for_b, "legacy") as client:  # a profile the reload added
            assert text_of(await client.call_tool("beta__echo", {"text": "b"})) == "beta: b"
            with pytest.raises(MCPError, match="unknown tool 'alpha__echo'"):
                await client.call_tool("alpha__echo", {"text": "x"})


async def test_a_token_file_changed_alone_is_read_again_by_the_watcher(tmp_path: Path) -> None:
    """Rotating a profile's token in its file, the config untouched, takes effect without a SIGHUP."""
    old, new = "rotation-test-old-token-0123456789", "rotation-test-new-token-0123456789"
    tokens = tmp_path / "a.tokens"
    tokens.write_text(f"{old}\n")
    config = tmp_path / "mcp.json"
    raw = {
        "mcpServers": {"alpha": demo("alpha")},
        "profiles": {"a": {"servers": ["alpha"], "auth_token_file": "a.tokens"}},  # beside the config
        "inference": {"backend": "off"},
    }
    config.write_text(json.dumps(raw))
    async with served_in_process(config) as (mux, _, url), anyio.create_task_group() as tasks:
        tasks.start_soon(ConfigReloader(mux, config, interval=0.2).watch)
        async with httpx2.AsyncClient(timeout=30.0) as http:

            async def status(token: str) -> int:
                headers = {**HEADERS, "authorization": f"Bearer {token}"}
                return (await http.post(url, headers=headers, json=INITIALIZE)).status_code

            assert (await status(old), await status(new)) == (200, 401)
            tokens.write_text(f"{new}\n")
            with anyio.fail_after(10):
                while await status(new) != 200:
                    await anyio.sleep(0.1)
            assert await status(old) == 401
        tasks.cancel_scope.cancel()
