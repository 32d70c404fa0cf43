"""The HTTP edge as an attacker and a user meet it: a real `mcpmux serve --transport http` on loopback.

One server (tokens from a file, a small body limit, a rate limit, extra allowed Host/Origin) serves
most tests; each test uses its own token so one test's requests never count against another's rate
limit. Other servers take their token from the environment: one leaves /metrics open, one is
`--openai-only` (slow: it imports torch).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.e2e.conftest import DEMO, PY, free_port, stop, text_of, wait_for_port

TOKENS = {name: f"{name}-s3cr3t-{index}-ZmFrZQ" for index, name in enumerate(["alice", "bob", "carol", "dave", "erin"])}
ENV_TOKEN = "env-s3cr3t-0d2f9c"
LIMIT = 64 * 1024
LEGACY = "2025-11-25"
RATE_BURST = 40


@dataclass(frozen=True, slots=True)
class Served:
    base: str
    stderr: Path

    @property
    def mcp(self) -> str:
        return f"{self.base}/mcp"


@contextmanager
def serving(config: Path, stderr: Path, env: dict[str, str] | None = None, *extra: str) -> Iterator[Served]:
    """`mcpmux serve --transport http` on a free loopback port, logging at debug level into `stderr`."""
    port = free_port()
    command = [PY, "-m", "mcpmux", "--log-level", "debug", "serve", "--config", str(config), *extra]
    with stderr.open("wb") as log:
        process = subprocess.Popen(
            [*command, "--transport", "http", "--port", str(port)], stderr=log, env={**os.environ, **(env or {})}
        )
        try:
            wait_for_port(port, process, timeout=120)
            yield Served(f"http://127.0.0.1:{port}", stderr)
        finally:
            stop(process)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("edge")
    (folder / "tokens.txt").write_text("# one token a line\n" + "\n".join(TOKENS.values()) + "\n")
    config = {
        "servers": {"demo": {"command": PY, "args": [str(DEMO), "demo"]}},
        "http": {
            "auth_token_file": "tokens.txt",  # relative to the config file's folder
            "max_body_bytes": LIMIT,
            "rate_limit": 1.0,
            "rate_burst": RATE_BURST,
            "allowed_hosts": ["mcp.example.test"],
            "allowed_origins": ["https://app.example.test"],
        },
    }
    (folder / "mcpmux.json").write_text(json.dumps(config))
    with serving(folder / "mcpmux.json", folder / "stderr.log") as served:
        yield served


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[name]}"}


def initialize() -> dict[str, Any]:
    params = {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "edge-test", "version": "1"}}
    return {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params}


MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def post_mcp(url: str, headers: dict[str, str], body: Any = None, **kwargs: Any) -> httpx2.Response:
    content = kwargs.pop("content", None)
    if content is None:
        content = json.dumps(initialize() if body is None else body).encode()
    return httpx2.post(url, headers={**MCP_HEADERS, **headers}, content=content, timeout=30, **kwargs)


def test_missing_token_is_401_with_a_bearer_challenge(server: Served) -> None:
    response = post_mcp(server.mcp, {})
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith('Bearer realm="mcpmux"')
    error = response.json()["error"]
    assert error["code"] == -32600
    assert "Authorization: Bearer" in error["message"]


def test_wrong_token_is_401(server: Served) -> None:
    for header in (f"Bearer {TOKENS['alice']}x", f"Bearer {TOKENS['alice'][:-1]}", "Basic YWxpY2U6cHc=", "Bearer"):
        response = post_mcp(server.mcp, {"Authorization": header})
        assert response.status_code == 401, header
        assert 'error="invalid_token"' in response.headers["www-authenticate"]
        assert TOKENS["alice"][:-1] not in response.text


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_right_token_works_with_a_real_client(server: Served, mode: str) -> None:
    async with (
        httpx2.AsyncClient(headers=auth("alice"), timeout=httpx2.Timeout(30.0, read=None)) as http,
        Client(streamable_http_client(server.mcp, http_client=http), mode=mode) as client,
    ):
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert "demo__echo" in names
        result = await client.call_tool("demo__echo", {"text": "through the edge"})
        assert text_of(result) == "demo: through the edge"


def test_forged_origin_is_403(server: Served) -> None:
    refused = post_mcp(server.mcp, {**auth("bob"), "Origin": "http://evil.example"})
    assert refused.status_code == 403
    assert "Origin" in refused.json()["error"]["message"]
    for allowed in ("https://app.example.test", "http://localhost:3000", f"{server.base}"):
        response = post_mcp(server.mcp, {**auth("bob"), "Origin": allowed})
        assert response.status_code == 200, allowed


def test_forged_host_is_403(server: Served) -> None:
    refused = post_mcp(server.mcp, {**auth("bob"), "Host": "evil.example"})
    assert refused.status_code == 403
    assert "Host" in refused.json()["error"]["message"]
    # DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1, token or not.
    assert httpx2.get(f"{server.base}/v1/models", headers={"Host": "evil.example:80"}).status_code == 403
    assert post_mcp(server.mcp, {**auth("bob"), "Host": "mcp.example.test:8443"}).status_code == 200


def test_oversized_bodies_are_413_declared_or_chunked(server: Served) -> None:
    declared = post_mcp(server.mcp, auth("carol"), content=b" " * (LIMIT + 1))
    assert declared.status_code == 413
    assert str(LIMIT) in declared.json()["error"]["message"]

    def chunks(total: int) -> Iterator[bytes]:  # an iterator body goes out chunked, with no Content-Length
        for _ in range(total // 4096):
            yield b" " * 4096

    chunked = post_mcp(server.mcp, auth("carol"), content=chunks(LIMIT + 8192))
    assert chunked.status_code == 413
    openai = httpx2.post(f"{server.base}/v1/chat/completions", headers=auth("carol"), content=chunks(LIMIT + 8192))
    assert openai.status_code == 413
    assert openai.json()["error"]["code"] == "request_too_large"
    # A chunked body under the limit goes through: the session opens.
    small = post_mcp(server.mcp, auth("carol"), content=iter([json.dumps(initialize()).encode()]))
    assert small.status_code == 200
    assert small.headers.get("mcp-session-id")


def test_rate_limit_is_429_with_retry_after_then_recovers(server: Served) -> None:
    with httpx2.Client(base_url=server.base, headers=auth("dave"), timeout=30) as http:
        statuses = []
        for _ in range(RATE_BURST * 2):
            response = http.get("/metrics")
            statuses.append(response.status_code)
            if response.status_code == 429:
                break
        assert statuses[0] == 200, statuses
        assert statuses[-1] == 429, statuses
        assert "[http] rate_limit" in response.json()["error"]
        wait = int(response.headers["retry-after"])
        assert wait >= 1
        time.sleep(wait)
        assert http.get("/metrics").status_code == 200
    # Another client's budget is its own.
    assert httpx2.get(f"{server.base}/metrics", headers=auth("erin")).status_code == 200


def test_another_clients_session_id_is_refused(server: Served) -> None:
    opened = post_mcp(server.mcp, auth("alice"))
    session = opened.headers["mcp-session-id"]
    assert len(session) >= 32  # the SDK's uuid4().hex: 122 random bits
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    stolen = post_mcp(server.mcp, {**auth("bob"), "mcp-session-id": session}, initialized)
    unknown = post_mcp(server.mcp, {**auth("bob"), "mcp-session-id": "0" * 32}, initialized)
    assert stolen.status_code == unknown.status_code == 404
    assert stolen.content == unknown.content  # nothing tells bob the session exists
    owner = {**auth("alice"), "mcp-session-id": session, "mcp-protocol-version": LEGACY}
    assert post_mcp(server.mcp, owner, initialized).status_code == 202
    assert post_mcp(server.mcp, owner, listing).status_code == 200
    assert post_mcp(server.mcp, {**auth("bob"), "mcp-session-id": session}, listing).status_code == 404


def test_v1_and_metrics_are_covered(server: Served) -> None:
    for path in ("/v1/models", "/metrics"):
        assert httpx2.get(f"{server.base}{path}").status_code == 401, path
        assert httpx2.get(f"{server.base}{path}", headers={"Origin": "http://evil.example"}).status_code == 403
    models = httpx2.get(f"{server.base}/v1/models", headers={"Authorization": "Bearer nope"})
    assert models.json()["error"]["code"] == "invalid_api_key"  # OpenAI's shape, for OpenAI clients
    metrics = httpx2.get(f"{server.base}/metrics", headers=auth("erin"))
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")


def test_no_token_reaches_the_logs(server: Served) -> None:
    post_mcp(server.mcp, {"Authorization": f"Bearer {TOKENS['alice']}-wrong"})
    post_mcp(server.mcp, auth("erin"))
    logged = server.stderr.read_text(errors="replace")
    assert "refused POST /mcp: HTTP 401" in logged  # the log is there, and names the refusal
    for token in TOKENS.values():
        assert token not in logged


@pytest.mark.anyio
async def test_env_token_and_open_metrics(tmp_path: Path) -> None:
    config = tmp_path / "mcpmux.toml"
    config.write_text('[http]\nauth_token_env = "EDGE_TEST_TOKEN"\nmetrics_auth = false\n')
    with serving(config, tmp_path / "stderr.log", {"EDGE_TEST_TOKEN": ENV_TOKEN}) as served:
        assert httpx2.get(f"{served.base}/metrics").status_code == 200  # scrapers need no token
        assert post_mcp(served.mcp, {}).status_code == 401  # the rest still does
        headers = {"Authorization": f"Bearer {ENV_TOKEN}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=None)) as http,
            Client(streamable_http_client(served.mcp, http_client=http), mode="legacy") as client,
        ):
            assert (await client.list_tools()).tools is not None
    assert ENV_TOKEN not in (tmp_path / "stderr.log").read_text(errors="replace")


@pytest.mark.parametrize("extra", [[], ["--openai-only"]])
def test_non_loopback_bind_without_auth_is_refused(tmp_path: Path, extra: list[str]) -> None:
    marker = tmp_path / "upstream-started"
    config = tmp_path / "mcpmux.json"
    config.write_text(
        json.dumps(
            {
                "servers": {"probe": {"command": PY, "args": ["-c", f"open({str(marker)!r}, 'w').close()"]}},
                "inference": {"backend": "openai", "remote": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}},
            }
        )
    )
    command = [PY, "-m", "mcpmux", "serve", "--config", str(config), "--transport", "http", "--host", "0.0.0.0"]
    done = subprocess.run([*command, *extra], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "refusing to serve HTTP on 0.0.0.0 without authentication" in done.stderr
    assert "--allow-unauthenticated-remote" in done.stderr
    assert "auth_token_env" in done.stderr
    assert "Traceback" not in done.stderr
    assert not marker.exists()  # refused before any upstream (or the engine) started


@pytest.mark.slow
def test_openai_only_server_is_covered(tmp_path: Path) -> None:
    config = tmp_path / "mcpmux.toml"
    config.write_text(
        '[http]\nauth_token_env = "EDGE_TEST_TOKEN"\n'
        '[inference]\nbackend = "openai"\n[inference.remote]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "far"\n'
        '[inference.embeddings]\nmodel = ""\n'
    )
    env = {"EDGE_TEST_TOKEN": ENV_TOKEN}
    with serving(config, tmp_path / "stderr.log", env, "--openai-only") as served:
        refused = httpx2.get(f"{served.base}/v1/models")
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "invalid_api_key"
        headers = {"Authorization": f"Bearer {ENV_TOKEN}"}
        assert httpx2.get(f"{served.base}/v1/models", headers={**headers, "Host": "evil.example"}).status_code == 403
        models = httpx2.get(f"{served.base}/v1/models", headers=headers)
        assert models.status_code == 200
        assert [model["id"] for model in models.json()["data"]] == ["far"]
        assert httpx2.get(f"{served.base}/metrics").status_code == 401
