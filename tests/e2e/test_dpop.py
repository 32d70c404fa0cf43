"""DPoP-bound upstream tokens (RFC 9449) end to end, against `tests/servers/dpop_server.py`: an MCP
server and authorization server on loopback that take DPoP-bound tokens only, each demanding its
own nonce and changing it as it goes. `mcpmux login` and `mcpmux call` run as a user runs them; the
server's `refusals` tool says what it refused, so a client that never met a challenge, or answered
one wrongly, shows.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from mcpmux.mux.multiplexer import Mux
from mcpmux.upstream.oauth.dpop import DpopKey
from tests.e2e.conftest import PY, ROOT, free_port, stop, text_of, wait_for_port

SERVER = ROOT / "tests" / "servers" / "dpop_server.py"
TTL = 3
"""Seconds the server's access tokens live: long enough to log in and call, short enough to lapse here."""


@contextmanager
def _serving(*mode: str) -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen([PY, str(SERVER), str(port), str(TTL), *mode], stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, process)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(process)


@pytest.fixture
def dpop_server() -> Iterator[str]:
    with _serving() as url:
        yield url


@pytest.fixture
def bearer_server() -> Iterator[str]:
    """The same servers without DPoP: nothing in their metadata advertises it."""
    with _serving("bearer") as url:
        yield url


def _mcpmux(*args: str, home: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "MCPMUX_HOME": str(home)}
    return subprocess.Popen(
        [PY, "-m", "mcpmux", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def _log_in(config: Path, home: Path) -> tuple[Path, dict[str, Any]]:
    """`mcpmux login d --no-browser`, approved as a browser would (the server approves at once)."""
    login = _mcpmux("login", "d", "--config", str(config), "--no-browser", home=home)
    assert login.stderr is not None
    url = next(line.strip() for line in login.stderr if line.startswith("http"))
    location = httpx2.get(url, follow_redirects=False, timeout=10).headers["location"]
    httpx2.get(location, timeout=10)
    out, err = login.communicate(timeout=60)
    assert login.returncode == 0, err
    assert "logged in to d" in out
    [record] = list((home / "oauth").glob("d-*.json"))
    return record, json.loads(record.read_text())


def _refusals(text: str) -> dict[str, int]:
    return dict(json.loads(text))


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_dpop_bound_login_calls_with_proofs_nonces_and_refreshes(
    dpop_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    config = tmp_path / "mcpmux.toml"
    config.write_text(f'[inference]\nbackend = "off"\n\n[servers.d]\nurl = "{dpop_server}"\n')
    record, stored = _log_in(config, home)
    assert stat.S_IMODE(record.stat().st_mode) == 0o600  # the private key is stored with the tokens
    assert stored["token_type"] == "DPoP"
    assert stored["dpop_key"].startswith("-----BEGIN PRIVATE KEY-----")

    called = _mcpmux("call", "--config", str(config), "d__echo", '{"text": "bound"}', home=home)
    out, err = called.communicate(timeout=60)
    assert called.returncode == 0, err
    assert "bound" in out

    monkeypatch.setenv("MCPMUX_HOME", str(home))
    async with Mux.from_config(config) as mux:
        for n in range(7):  # the server's nonce changes every 3 proofs: mcpmux takes each new one
            assert text_of(await mux.call_tool("d__echo", {"text": str(n)})) == str(n)
        await anyio.sleep(max(0.0, json.loads(record.read_text())["expires_at"] - time.time()))
        # Lapsed: refreshed (the refresh token is bound to the same key), then the call goes out.
        assert text_of(await mux.call_tool("d__echo", {"text": "after"})) == "after"
        refused = _refusals(text_of(await mux.call_tool("d__refusals", {})))
    refreshed = json.loads(record.read_text())
    assert refreshed["token"]["access_token"] != stored["token"]["access_token"]
    assert (refreshed["token_type"], refreshed["dpop_key"]) == ("DPoP", stored["dpop_key"])
    # Challenged for each nonce, never for a proof: no other refusal than the first unauthenticated request.
    assert refused.pop("token: use_dpop_nonce") >= 2  # the login's, and the refresh's
    assert refused.pop("mcp: use_dpop_nonce") >= 3
    assert set(refused) <= {"mcp: no token"}, refused


@pytest.mark.slow
@pytest.mark.anyio
async def test_an_authorization_server_that_does_not_advertise_dpop_gets_no_proof(
    bearer_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No `dpop_signing_alg_values_supported` in its metadata: the login, the refresh and every MCP
    request go without a `DPoP` header (the servers count what they received), with a bearer token."""
    home = tmp_path / "home"
    config = tmp_path / "mcpmux.toml"
    config.write_text(f'[inference]\nbackend = "off"\n\n[servers.d]\nurl = "{bearer_server}"\n')
    record, stored = _log_in(config, home)
    assert (stored["token_type"], stored["dpop_key"]) == ("Bearer", None)

    monkeypatch.setenv("MCPMUX_HOME", str(home))
    async with Mux.from_config(config) as mux:
        assert text_of(await mux.call_tool("d__echo", {"text": "plain"})) == "plain"
        await anyio.sleep(max(0.0, json.loads(record.read_text())["expires_at"] - time.time()))
        assert text_of(await mux.call_tool("d__echo", {"text": "after"})) == "after"  # refreshed first
        received = json.loads(text_of(await mux.call_tool("d__proofs", {})))
    refreshed = json.loads(record.read_text())
    assert refreshed["token"]["access_token"] != stored["token"]["access_token"]
    assert received == {"token": 0, "mcp": 0}  # both reached (the login's and the refresh's token requests), no proof


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("advertised", [True, False], ids=["dpop", "bearer"])
async def test_the_client_credentials_grant_uses_dpop_only_where_advertised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, advertised: bool
) -> None:
    """A machine client (no login): its token request and calls carry proofs, answered nonces
    included, where the authorization server advertises DPoP, and none where it does not."""
    monkeypatch.setenv("D_SECRET", "machine-secret")
    with _serving(*([] if advertised else ["bearer"])) as url:
        config = tmp_path / "mcpmux.toml"
        config.write_text(
            f'[inference]\nbackend = "off"\n\n[servers.d]\nurl = "{url}"\n\n'
            '[servers.d.oauth]\ngrant = "client_credentials"\nclient_id = "machine"\nclient_secret_env = "D_SECRET"\n'
        )
        monkeypatch.setenv("MCPMUX_HOME", str(tmp_path / "home"))
        async with Mux.from_config(config) as mux:
            for n in range(4):  # the DPoP server's nonce changes every 3 proofs
                assert text_of(await mux.call_tool("d__echo", {"text": str(n)})) == str(n)
            received = json.loads(text_of(await mux.call_tool("d__proofs", {})))
            refused = _refusals(text_of(await mux.call_tool("d__refusals", {})))
    if advertised:
        assert received["token"] >= 1, received
        assert received["mcp"] >= 5, received
        assert set(refused) <= {"mcp: no token", "token: use_dpop_nonce", "mcp: use_dpop_nonce"}, refused
    else:
        assert received == {"token": 0, "mcp": 0}


@pytest.mark.slow
@pytest.mark.anyio
async def test_the_server_refuses_a_proof_without_the_right_ath_nonce_or_key(dpop_server: str, tmp_path: Path) -> None:
    """What the test above relies on: this server refuses the token sent any other way."""
    home = tmp_path / "home"
    config = tmp_path / "mcpmux.toml"
    config.write_text(f'[inference]\nbackend = "off"\n\n[servers.d]\nurl = "{dpop_server}"\n')
    _, stored = _log_in(config, home)
    token = stored["token"]["access_token"]
    key = DpopKey.from_pem(stored["dpop_key"])
    assert key is not None
    hello = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}

    async def post(scheme: str, proof: str | None) -> httpx2.Response:
        sent = {**headers, "Authorization": f"{scheme} {token}", **({"DPoP": proof} if proof else {})}
        async with httpx2.AsyncClient(timeout=10) as http:
            return await http.post(dpop_server, json=hello, headers=sent)

    no_nonce = await post("DPoP", key.proof("POST", dpop_server, access_token=token))
    assert no_nonce.status_code == 401
    assert 'error="use_dpop_nonce"' in no_nonce.headers["www-authenticate"]
    key.nonces["http://" + httpx2.URL(dpop_server).netloc.decode()] = no_nonce.headers["dpop-nonce"]
    wrong_ath = await post("DPoP", key.proof("POST", dpop_server, access_token=token + "x"))
    assert "ath does not match" in wrong_ath.json()["error"]
    other_key = await post("DPoP", DpopKey.generate().proof("POST", dpop_server, access_token=token))
    assert "another key" in other_key.json()["error"]
    bearer = await post("Bearer", None)
    assert (bearer.status_code, bearer.json()["error"]) == (401, "invalid_token")
    no_proof = await post("DPoP", None)
    assert "no DPoP proof" in no_proof.json()["error"]
    right = await post("DPoP", key.proof("POST", dpop_server, access_token=token))
    assert right.status_code == 200  # the same request, signed as mcpmux signs it
