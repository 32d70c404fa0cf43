"""OAuth upstreams end to end, against real OAuth-protected MCP servers on loopback: the TypeScript
SDK's example (`simpleStreamableHttp.js --oauth`; no refresh tokens, an invalid token answers 500)
and an SDK 2.3 Python server protected with `mcp.server.auth` (`tests/servers/oauth_server.py`:
short-lived tokens, rotating refresh tokens, a revocation hook).

A login is completed as a browser would: the authorization server approves at once, so the test
follows `/authorize`'s redirect to mcpmux's loopback callback itself.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import shutil
import socket
import stat
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientMetadata
from pydantic import AnyUrl

from mcpmux.cli.login import logout_main
from mcpmux.core.config import load_config
from mcpmux.errors import UnlistedToolError, UpstreamUnavailableError
from mcpmux.mux.multiplexer import Mux
from mcpmux.server.frontend import Frontend, bind
from mcpmux.server.http.edge_policy import EdgePolicy
from mcpmux.upstream.oauth.login_flow import LoginError, MemoryTokenStorage, log_in
from mcpmux.upstream.oauth.token_store import TokenStore
from mcpmux.upstream.oauth.upstream_auth import login_command, token_store
from mcpmux.upstream.supervisor import UpstreamState
from tests.e2e.conftest import PY, ROOT, bearer_client, free_port, stop, text_of, wait_for_port

TS_EXAMPLE = ROOT / ".npm/node_modules/@modelcontextprotocol/sdk/dist/esm/examples/server/simpleStreamableHttp.js"
PY_SERVER = ROOT / "tests" / "servers" / "oauth_server.py"
TTL = 2
"""Seconds the Python server's access tokens live (mcpmux refreshes them a tenth of that early)."""


def _config(path: Path, name: str, url: str, extra: str = "") -> Path:
    path.write_text(f'[inference]\nbackend = "off"\n\n[servers.{name}]\nurl = "{url}"\n{extra}')
    return path


def _approve(url: str) -> str:
    """What a browser does: `/authorize` (approved at once) redirects to the callback, which answers."""
    location = httpx2.get(url, follow_redirects=False, timeout=10).headers["location"]
    return httpx2.get(location, timeout=10).text


def _cli(*args: str, home: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "MCPMUX_HOME": str(home)}
    return subprocess.Popen(
        [PY, "-m", "mcpmux", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def _url_line(process: subprocess.Popen[str]) -> str:
    assert process.stderr is not None
    for line in process.stderr:
        if line.startswith("http"):
            return line.strip()
    raise AssertionError(f"no authorization URL on stderr (exit {process.wait(10)})")


@pytest.fixture(scope="module")
def ts_server() -> Iterator[str]:
    if shutil.which("node") is None or not TS_EXAMPLE.exists():
        pytest.skip("node or the TypeScript SDK's example is missing (make setup installs it)")
    port, auth_port = free_port(), free_port()
    env = {**os.environ, "MCP_PORT": str(port), "MCP_AUTH_PORT": str(auth_port)}
    process = subprocess.Popen(["node", str(TS_EXAMPLE), "--oauth"], env=env, stdout=subprocess.DEVNULL)
    try:
        wait_for_port(port, process)
        wait_for_port(auth_port, process)
        yield f"http://localhost:{port}/mcp"
    finally:
        stop(process)


@pytest.fixture(scope="module")
def ts_login(ts_server: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`mcpmux login demo --no-browser`, with a forged callback (wrong `state`) arriving before the real one."""
    folder = tmp_path_factory.mktemp("ts")
    config = _config(folder / "mcpmux.toml", "demo", ts_server)
    home = folder / "home"
    process = _cli("login", "demo", "--config", str(config), "--no-browser", home=home)
    url = _url_line(process)
    redirect_uri = httpx2.URL(url).params["redirect_uri"]
    forged = httpx2.get(f"{redirect_uri}?code=stolen&state=not-the-one", timeout=10)
    page = _approve(url)
    out, err = process.communicate(timeout=60)
    # `out` and `err`: what the command wrote after the URL line.
    result = {"server": ts_server, "config": config, "home": home, "url": url, "forged": forged, "page": page}
    return result | {"out": out, "err": err, "rc": process.returncode}


@pytest.mark.slow
@pytest.mark.anyio
async def test_login_stores_a_token_that_calls_then_use(
    ts_login: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert ts_login["rc"] == 0, ts_login["err"]
    assert "logged in to demo" in ts_login["out"]
    query = httpx2.URL(ts_login["url"]).params
    assert query["code_challenge_method"] == "S256"
    assert query["resource"] == ts_login["server"]  # RFC 8707: the token is asked for this server
    assert ts_login["forged"].status_code == 400  # a callback whose state is not the login's is refused
    assert "state does not match" in ts_login["forged"].text
    assert "Logged in" in ts_login["page"]
    monkeypatch.setenv("MCPMUX_HOME", str(ts_login["home"]))
    [record] = list((ts_login["home"] / "oauth").glob("demo-*.json"))
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    token = json.loads(record.read_text())["token"]["access_token"]
    assert token not in ts_login["out"] + ts_login["err"]
    async with Mux.from_config(ts_login["config"]) as mux:
        [status] = mux.status()
        assert (status.state, status.auth.startswith("oauth, logged in")) == (UpstreamState.READY, True)
        result = await mux.call_tool("demo__greet", {"name": "oauth"})
    assert text_of(result) == "Hello, oauth!"


@pytest.mark.anyio
async def test_without_a_login_calls_fail_fast_naming_the_command(
    ts_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MCPMUX_HOME", str(tmp_path / "home"))
    config = load_config(_config(tmp_path / "mcpmux.toml", "demo", ts_server))
    async with Mux(config) as mux:
        [status] = mux.status()
        assert status.state == UpstreamState.NEEDS_LOGIN
        needs = f"upstream demo needs login: run `{login_command('demo')}`"
        assert status.last_error == needs
        upstream = mux.upstreams["demo"]
        started = time.monotonic()
        with pytest.raises(UpstreamUnavailableError) as refused:
            await upstream.request("tools/call", lambda client: client.list_tools())
        assert time.monotonic() - started < 0.5
        with pytest.raises(UnlistedToolError) as unlisted:  # what `mcpmux call` prints, on one line
            await mux.call_tool("demo__greet", {"name": "Ada"})
    assert str(refused.value) == needs
    assert str(unlisted.value) == f"tool 'demo__greet' is not listed: {needs}"


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_lapsed_token_with_no_refresh_token_needs_login(
    ts_login: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    shutil.copytree(ts_login["home"], home)
    [record] = list((home / "oauth").glob("demo-*.json"))
    data = json.loads(record.read_text())
    record.write_text(json.dumps({**data, "expires_at": time.time() - 5}))
    monkeypatch.setenv("MCPMUX_HOME", str(home))
    async with Mux.from_config(ts_login["config"]) as mux:
        [status] = mux.status()
    assert (status.state, status.auth) == (UpstreamState.NEEDS_LOGIN, "oauth, needs login")


@pytest.mark.anyio
async def test_a_busy_callback_port_is_one_line(ts_server: str, tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        path = _config(tmp_path / "mcpmux.toml", "demo", ts_server, f"oauth = {{ redirect_port = {port} }}\n")
        with pytest.raises(LoginError) as refused:
            await log_in("demo", load_config(path).servers["demo"], TokenStore(tmp_path), _never_shown)
    assert str(refused.value) == (
        f"the login callback port {port} ([servers.demo.oauth] redirect_port) is in use "
        "(Address already in use): stop what holds it, or choose another redirect_port"
    )
    assert os.listdir(tmp_path) == [path.name]  # nothing stored


async def _never_shown(url: str) -> None:
    raise AssertionError(f"no authorization URL should be shown: {url}")


@contextmanager
def _py_server(ttl: int, refresh_delay: float = 0.0, env: dict[str, str] | None = None) -> Iterator[str]:
    port = free_port()
    args = [PY, str(PY_SERVER), str(port), str(ttl), str(refresh_delay)]
    process = subprocess.Popen(args, stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    try:
        wait_for_port(port, process)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(process)


@pytest.fixture(scope="module")
def py_server() -> Iterator[str]:
    with _py_server(TTL) as url:
        yield url


async def _log_in(config_path: Path) -> None:
    """The login flow of `mcpmux login`, in this process, approved as a browser would."""
    config = load_config(config_path)
    async with anyio.create_task_group() as tasks:

        async def show(url: str) -> None:
            tasks.start_soon(anyio.to_thread.run_sync, _approve, url)

        await log_in("py", config.servers["py"], token_store(), show)


def _record(home: Path) -> tuple[Path, dict[str, Any]]:
    [record] = list((home / "oauth").glob("py-*.json"))
    return record, json.loads(record.read_text())


async def _refreshes(mux: Mux) -> int:
    return int(text_of(await mux.call_tool("py__refreshes", {})))


@pytest.mark.anyio
async def test_a_client_metadata_url_falls_back_to_registering_where_the_server_takes_none(
    py_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK's authorization server here does not advertise client ID metadata documents: with
    `client_metadata_url` set, mcpmux registers itself as it would without it, and the login works."""
    monkeypatch.setenv("MCPMUX_HOME", str(tmp_path / "home"))
    document = "https://example.com/mcpmux/client.json"
    oauth = f'[servers.py.oauth]\nclient_metadata_url = "{document}"\n'
    await _log_in(_config(tmp_path / "mcpmux.toml", "py", py_server, oauth))
    _, stored = _record(tmp_path / "home")
    assert stored["client"]["client_id"] != document  # a registered client
    assert stored["token"]["access_token"]


@pytest.mark.anyio
async def test_a_client_metadata_url_is_the_client_id_where_the_server_takes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MCPMUX_HOME", str(tmp_path / "home"))
    document, port = "https://example.com/mcpmux/client.json", free_port()
    callback = {"CIMD_CLIENT": document, "CIMD_REDIRECT": f"http://127.0.0.1:{port}/callback"}
    with _py_server(TTL, env=callback) as url:
        oauth = f'[servers.py.oauth]\nclient_metadata_url = "{document}"\nredirect_port = {port}\n'
        config = _config(tmp_path / "mcpmux.toml", "py", url, oauth)
        await _log_in(config)
        _, stored = _record(tmp_path / "home")
        assert stored["client"]["client_id"] == document  # no registration: the URL is the client
        async with Mux.from_config(config) as mux:
            assert text_of(await mux.call_tool("py__echo", {"text": "hi"})) == "hi"


@pytest.mark.anyio
async def test_a_lapsing_token_is_refreshed_and_a_refused_one_after_its_401(
    py_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MCPMUX_HOME", str(tmp_path / "home"))
    config = _config(tmp_path / "mcpmux.toml", "py", py_server)
    await _log_in(config)
    record, _ = _record(tmp_path / "home")
    async with Mux.from_config(config) as mux:
        before = await _refreshes(mux)
        _, current = _record(tmp_path / "home")  # refreshed already if starting took most of its life
        # Into the last tenth of its life (the margin mcpmux refreshes within): refreshed before it is sent.
        await anyio.sleep(max(0.0, current["expires_at"] - TTL / 20 - time.time()))
        assert await _refreshes(mux) == before + 1
        _, second = _record(tmp_path / "home")
        assert second["token"]["access_token"] != current["token"]["access_token"]
        assert stat.S_IMODE(record.stat().st_mode) == 0o600
        # A token the server no longer takes (401): refreshed with the stored refresh token, sent again.
        record.write_text(json.dumps({**second, "token": {**second["token"], "access_token": "refused"}}))
        assert await _refreshes(mux) == before + 2


@pytest.mark.anyio
async def test_a_revoked_login_needs_a_new_one(py_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCPMUX_HOME", str(tmp_path / "home"))
    config = _config(tmp_path / "mcpmux.toml", "py", py_server)
    await _log_in(config)
    async with Mux.from_config(config) as mux:
        assert text_of(await mux.call_tool("py__echo", {"text": "before"})) == "before"
        assert httpx2.post(py_server.replace("/mcp", "/testing/revoke")).status_code == 200
        refused = await mux.call_tool("py__echo", {"text": "after"})
        assert (refused.is_error, text_of(refused)) == (True, f"upstream py needs login: run `{login_command('py')}`")
        with anyio.fail_after(5):
            while mux.status()[0].state != UpstreamState.NEEDS_LOGIN:
                await anyio.sleep(0.05)
        await _log_in(config)  # the running upstream notices the new login and reconnects
        with anyio.fail_after(10):
            while mux.status()[0].state != UpstreamState.READY:
                await anyio.sleep(0.1)
        assert text_of(await mux.call_tool("py__echo", {"text": "again"})) == "again"


@pytest.mark.slow
@pytest.mark.anyio
async def test_two_processes_with_a_lapsed_token_refresh_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("MCPMUX_HOME", str(home))
    # Tokens outlive both processes, so a second refresh would be a double; a refresh takes 4 s, so
    # that both processes, started together, want one while the first is under way.
    with _py_server(ttl=600, refresh_delay=4) as url:
        config = _config(tmp_path / "mcpmux.toml", "py", url)
        await _log_in(config)
        record, data = _record(home)
        record.write_text(json.dumps({**data, "expires_at": time.time() - 1}))
        # Refresh tokens rotate: had both refreshed, the second would have spent a used one and need a login.
        calls = [_cli("call", "--config", str(config), "py__refreshes", home=home) for _ in range(2)]
        answers = [call.communicate(timeout=120) for call in calls]
    assert [call.returncode for call in calls] == [0, 0], [err for _, err in answers]
    assert [json.loads(out)["content"][0]["text"] for out, _ in answers] == ["1", "1"]
    _, after = _record(home)
    assert after["token"]["access_token"] != data["token"]["access_token"]


@pytest.mark.slow
@pytest.mark.anyio
async def test_logout_forgets_the_login_and_tools_shows_needs_login(
    py_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("MCPMUX_HOME", str(home))
    path = _config(tmp_path / "mcpmux.toml", "py", py_server)
    await _log_in(path)
    async with Mux.from_config(path) as mux:
        assert mux.status()[0].auth.startswith("oauth, logged in (token expires in")
    assert await logout_main(argparse.Namespace(name="py"), load_config(path)) == 0
    assert list((home / "oauth").glob("py-*.json")) == []
    tools = _cli("tools", "--config", str(path), home=home)
    out, _ = tools.communicate(timeout=120)
    assert tools.returncode == 1
    needs = f"upstream py needs login: run `mcpmux login py --config {path}`"
    assert out.splitlines()[0] == f"# py: needs login, http, -, auth: oauth, needs login  ({needs})"


@pytest.mark.anyio
async def test_a_preregistered_client_logs_in_and_refreshes_with_its_secret_from_the_environment(
    py_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    registered = httpx2.post(
        py_server.replace("/mcp", "/register"),
        json={
            "redirect_uris": [f"http://127.0.0.1:{port}/callback"],
            "token_endpoint_auth_method": "client_secret_post",
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
        },
    ).json()
    monkeypatch.setenv("MCPMUX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PY_CLIENT_SECRET", registered["client_secret"])
    settings = f'client_id = "{registered["client_id"]}", client_secret_env = "PY_CLIENT_SECRET"'
    config = _config(tmp_path / "mcpmux.toml", "py", py_server, f"oauth = {{ {settings}, redirect_port = {port} }}\n")
    await _log_in(config)
    record, data = _record(tmp_path / "home")
    assert data["client"]["client_id"] == registered["client_id"]
    assert registered["client_secret"] not in record.read_text()  # it stays in its variable
    # A refused token makes mcpmux refresh, which the server grants only with the client's secret.
    record.write_text(json.dumps({**data, "token": {**data["token"], "access_token": "refused"}}))
    async with Mux.from_config(config) as mux:
        assert text_of(await mux.call_tool("py__echo", {"text": "with secret"})) == "with secret"


@asynccontextmanager
async def _front(config: Path, port: int) -> AsyncIterator[str]:
    """mcpmux's HTTP front in this process on `port` (its `[http.oauth] audience` names it)."""
    stopping = anyio.Event()
    async with Mux.from_config(config) as mux, anyio.create_task_group() as tasks:
        policy = EdgePolicy.load(mux.config, "127.0.0.1")
        tasks.start_soon(Frontend(mux).serve_http, bind("127.0.0.1", port), policy, "/mcp", stopping)
        with anyio.fail_after(30):
            while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
                await anyio.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
        stopping.set()


@pytest.mark.anyio
async def test_a_client_token_is_never_passed_on_to_an_upstream(
    py_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client's bearer token is for mcpmux alone (the spec forbids passing it through): the upstream
    gets mcpmux's own token, from its login."""
    monkeypatch.setenv("MCPMUX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FRONT_TOKEN", "the-client-token-for-mcpmux-only")
    config = _config(tmp_path / "mcpmux.toml", "py", py_server, '\n[http]\nauth_token_env = "FRONT_TOKEN"\n')
    await _log_in(config)
    _, stored = _record(tmp_path / "home")
    async with _front(config, free_port()) as url, bearer_client(url, "the-client-token-for-mcpmux-only") as client:
        seen = text_of(await client.call_tool("py__bearer", {}))
    assert seen == stored["token"]["access_token"]


class _Browser:
    """What a person's browser does for an SDK client logging in: follow `/authorize` to the callback."""

    def __init__(self) -> None:
        self.callback = ""

    async def open(self, url: str) -> None:
        async with httpx2.AsyncClient() as http:
            self.callback = (await http.get(url)).headers["location"]

    async def answer(self) -> AuthorizationCodeResult:
        query = httpx2.URL(self.callback).params
        return AuthorizationCodeResult(code=query["code"], state=query.get("state"))


@pytest.mark.slow
@pytest.mark.anyio
async def test_the_http_front_as_a_resource_server(
    ts_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An SDK client finds the front's authorization server from its 401, logs in there and calls
    through; a token issued for another server (the upstream's own) and an unknown token are refused;
    the static tokens still work."""
    monkeypatch.setenv("MCPMUX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FRONT_TOKEN", "static-front-token")
    auth_server = str(
        httpx2.get(ts_server.replace("/mcp", "/.well-known/oauth-protected-resource/mcp")).json()[
            "authorization_servers"
        ][0]
    )
    port = free_port()
    audience = f"http://127.0.0.1:{port}/mcp"
    config = tmp_path / "mcpmux.toml"
    config.write_text(
        '[inference]\nbackend = "off"\n\n[http]\nauth_token_env = "FRONT_TOKEN"\n\n'
        f'[http.oauth]\nissuer = "{auth_server}"\naudience = "{audience}"\n'
        f'introspection_endpoint = "{auth_server.rstrip("/")}/introspect"\n\n'
        f'[servers.demo]\ncommand = "{PY}"\nargs = ["{ROOT / "tests" / "servers" / "demo_server.py"}", "demo"]\n'
    )
    upstream_config = _config(tmp_path / "upstream.toml", "ts", ts_server)
    async with anyio.create_task_group() as tasks:

        async def show(url: str) -> None:
            tasks.start_soon(anyio.to_thread.run_sync, _approve, url)

        other = await log_in("ts", load_config(upstream_config).servers["ts"], token_store(), show)
    async with _front(config, port) as url, httpx2.AsyncClient(timeout=30) as plain:
        bare = await plain.post(url, json={})
        assert bare.status_code == 401
        metadata_url = f"http://127.0.0.1:{port}/.well-known/oauth-protected-resource/mcp"
        assert bare.headers["www-authenticate"] == f'Bearer resource_metadata="{metadata_url}"'
        metadata = (await plain.get(metadata_url)).json()
        assert (metadata["resource"], metadata["authorization_servers"]) == (audience, [auth_server])
        for refused in (other.token.access_token, "made-up"):  # issued for the upstream; unknown
            answer = await plain.post(url, json={}, headers={"Authorization": f"Bearer {refused}"})
            assert answer.status_code == 401
            assert 'error="invalid_token"' in answer.headers["www-authenticate"]
        browser = _Browser()
        callback = AnyUrl("http://127.0.0.1:1/callback")  # never listened on: `_Browser` reads the redirect
        client_metadata = OAuthClientMetadata(redirect_uris=[callback], token_endpoint_auth_method="none")
        oauth = OAuthClientProvider(url, client_metadata, MemoryTokenStorage(), browser.open, browser.answer)
        async with (
            httpx2.AsyncClient(auth=oauth, timeout=30) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):
            assert text_of(await client.call_tool("demo__echo", {"text": "hi"})) == "demo: hi"
        async with bearer_client(url, "static-front-token") as client:
            assert text_of(await client.call_tool("demo__echo", {"text": "static"})) == "demo: static"


@pytest.mark.anyio
async def test_an_unreachable_server_is_one_line(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    path = _config(tmp_path / "mcpmux.toml", "gone", f"http://127.0.0.1:{port}/mcp")
    with pytest.raises(LoginError) as failed:
        await log_in("gone", load_config(path).servers["gone"], TokenStore(tmp_path / "store"), _never_shown)
    assert str(failed.value).startswith(f"cannot reach http://127.0.0.1:{port}/mcp for upstream gone (")


@pytest.mark.anyio
async def test_a_login_the_person_refuses_says_so(ts_server: str, tmp_path: Path) -> None:
    path = _config(tmp_path / "mcpmux.toml", "demo", ts_server)
    store = TokenStore(tmp_path / "store")

    async def refuse(url: str) -> None:  # the person clicks "deny": the callback gets an error, with the state
        query = httpx2.URL(url).params
        denied = f"{query['redirect_uri']}?error=access_denied&error_description=denied&state={query['state']}"
        async with httpx2.AsyncClient() as http:
            assert (await http.get(denied)).status_code == 400

    with pytest.raises(LoginError) as failed:
        await log_in("demo", load_config(path).servers["demo"], store, refuse)
    assert str(failed.value) == "the authorization server refused the login: access_denied (denied)"
    assert store.load("demo", ts_server) is None


@contextmanager
def _jwks_server(jwks: dict[str, Any]) -> Iterator[str]:
    """An issuer's key set on loopback, as its `jwks_uri` serves it (a thread: the test's loop is the front's)."""
    body = json.dumps(jwks).encode()

    class Keys(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Keys)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/jwks.json"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.slow
@pytest.mark.anyio
async def test_the_http_front_takes_jwt_access_tokens_signed_by_the_issuers_keys(tmp_path: Path) -> None:
    issuer, port = "https://auth.example.com", free_port()
    audience = f"http://127.0.0.1:{port}/mcp"
    key, stranger = (rsa.generate_private_key(public_exponent=65537, key_size=2048) for _ in range(2))
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    now = int(time.time())

    def token(signer: rsa.RSAPrivateKey = key, **claims: Any) -> str:
        payload = {"iss": issuer, "aud": audience, "exp": now + 300, "sub": "someone", **claims}
        return jwt.encode(payload, signer, algorithm="RS256", headers={"kid": "k1"})

    with _jwks_server({"keys": [{**public, "kid": "k1", "use": "sig", "alg": "RS256"}]}) as jwks_uri:
        config = tmp_path / "mcpmux.toml"
        config.write_text(
            f'[inference]\nbackend = "off"\n\n[http.oauth]\nissuer = "{issuer}"\naudience = "{audience}"\n'
            f'jwks_uri = "{jwks_uri}"\nscopes = ["mcp:tools"]\n\n'
            f'[servers.demo]\ncommand = "{PY}"\nargs = ["{ROOT / "tests" / "servers" / "demo_server.py"}", "demo"]\n'
        )
        async with _front(config, port) as url, httpx2.AsyncClient(timeout=30) as plain:
            async with bearer_client(url, token(scope="mcp:tools other")) as client:
                assert text_of(await client.call_tool("demo__echo", {"text": "jwt"})) == "demo: jwt"
            refused = {
                "another audience": token(aud="http://elsewhere.example.com/mcp", scope="mcp:tools"),
                "another issuer": token(iss="https://evil.example.com", scope="mcp:tools"),
                "expired": token(exp=now - 60, scope="mcp:tools"),
                "a scope missing": token(scope="other"),
                "another key": token(signer=stranger, scope="mcp:tools"),
                "no signature": jwt.encode({"iss": issuer, "aud": audience, "exp": now + 300}, None, algorithm="none"),
            }
            for why, presented in refused.items():
                answer = await plain.post(url, json={}, headers={"Authorization": f"Bearer {presented}"})
                assert answer.status_code == 401, why
