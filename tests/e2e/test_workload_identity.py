"""Workload identity federation (`grant = "workload_identity"`, RFC 7523 jwt-bearer) end to end,
against `tests/servers/workload_server.py`: an MCP server whose authorization server takes only
the workload's own JWT, signed by its platform's key, from a public client with no secret.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from mcpmux.mux.multiplexer import Mux
from mcpmux.upstream.supervisor import UpstreamState
from tests.e2e.conftest import PY, ROOT, free_port, stop, text_of, wait_for_port

SERVER = ROOT / "tests" / "servers" / "workload_server.py"
TTL = 2
"""Seconds the server's tokens live: a second token is fetched within the test."""

PLATFORM_KEY = ec.generate_private_key(ec.SECP256R1())
"""The workload platform's signing key (what issues a Kubernetes service account token, say)."""


def _workload_jwt(audience: str, subject: str) -> str:
    now = int(time.time())
    claims = {"iss": "https://platform.test", "sub": subject, "aud": audience, "iat": now, "exp": now + 300}
    return jwt.encode(claims, PLATFORM_KEY, algorithm="ES256")


@pytest.fixture
def workload_server() -> Iterator[str]:
    port = free_port()
    public = PLATFORM_KEY.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    env = {**os.environ, "WORKLOAD_PUBLIC_KEY": public.decode()}
    process = subprocess.Popen([PY, str(SERVER), str(port), str(TTL)], env=env, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, process)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(process)


def _config(path: Path, server: str, oauth: str) -> Path:
    path.write_text(
        f'[inference]\nbackend = "off"\n\n[servers.w]\nurl = "{server}/mcp"\n\n'
        f'[servers.w.oauth]\ngrant = "workload_identity"\nclient_id = "workload"\n{oauth}'
    )
    return path


@pytest.mark.slow
@pytest.mark.anyio
async def test_the_workloads_jwt_from_a_file_gets_tokens_and_is_read_again_for_each(
    workload_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MCPMUX_HOME", str(tmp_path / "home"))
    token_file = tmp_path / "token"
    token_file.write_text(_workload_jwt(workload_server, "first") + "\n")
    config = _config(tmp_path / "mcpmux.toml", workload_server, f'assertion_file = "{token_file}"\n')
    async with Mux.from_config(config) as mux:
        assert mux.status()[0].auth == "oauth, workload identity"
        assert text_of(await mux.call_tool("w__echo", {"text": "hi"})) == "hi"
        token_file.write_text(_workload_jwt(workload_server, "rotated"))  # the platform rotates it
        await anyio.sleep(TTL + 0.2)  # the access token lapses: the server answers 401
        assert text_of(await mux.call_tool("w__echo", {"text": "again"})) == "again"
        granted = json.loads(text_of(await mux.call_tool("w__grants", {})))
    assert granted == ["first", "rotated"]


@pytest.mark.anyio
async def test_a_refused_jwt_is_a_clear_error(
    workload_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MCPMUX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WORKLOAD_JWT", _workload_jwt("https://elsewhere.test", "lost"))  # another audience
    config = _config(tmp_path / "mcpmux.toml", workload_server, 'assertion_env = "WORKLOAD_JWT"\n')
    async with Mux.from_config(config) as mux:
        [status] = mux.status()
    assert status.state != UpstreamState.READY
    assert "invalid_grant" in (status.last_error or "")
