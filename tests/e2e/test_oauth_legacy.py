"""A 2025-03-26 OAuth server (no protected-resource metadata; its authorization server on its own
origin) against `tests/servers/legacy_oauth_server.py`: an issuer on the server's own origin is
taken, one anywhere else is still refused."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import httpx2
import pytest

from mcpmux.core.config import load_config
from mcpmux.mux.multiplexer import Mux
from mcpmux.upstream.oauth.login_flow import LoginError, log_in
from mcpmux.upstream.oauth.upstream_auth import token_store
from tests.e2e.conftest import PY, ROOT, free_port, stop, text_of, wait_for_port

SERVER = ROOT / "tests" / "servers" / "legacy_oauth_server.py"


@contextmanager
def _legacy_server(issuer: str) -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen([PY, str(SERVER), str(port), issuer], stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, process)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(process)


def _approve(url: str) -> None:
    location = httpx2.get(url, follow_redirects=False, timeout=10).headers["location"]
    httpx2.get(location, timeout=10)


async def _log_in(config: Path) -> None:
    async with anyio.create_task_group() as tasks:

        async def show(url: str) -> None:
            tasks.start_soon(anyio.to_thread.run_sync, _approve, url)

        await log_in("old", load_config(config).servers["old"], token_store(), show)


def _config(path: Path, url: str) -> Path:
    path.write_text(f'[inference]\nbackend = "off"\n\n[servers.old]\nurl = "{url}"\n')
    return path


@pytest.mark.anyio
async def test_an_issuer_on_the_servers_own_origin_is_its_authorization_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MCPMUX_HOME", str(tmp_path / "home"))
    with _legacy_server("{origin}/oauth") as url:
        config = _config(tmp_path / "mcpmux.toml", url)
        await _log_in(config)
        async with Mux.from_config(config) as mux:
            assert text_of(await mux.call_tool("old__echo", {"text": "2025-03-26"})) == "2025-03-26"


@pytest.mark.anyio
async def test_an_issuer_on_another_origin_is_still_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCPMUX_HOME", str(tmp_path / "home"))
    refused = pytest.RaisesExc(LoginError, match="issuer mismatch: http://127.0.0.1:1/oauth != http://127.0.0.1:")
    with _legacy_server("http://127.0.0.1:1/oauth") as url, pytest.RaisesGroup(refused):  # another port: origin
        await _log_in(_config(tmp_path / "mcpmux.toml", url))
    assert list((tmp_path / "home").rglob("*.json")) == []  # nothing stored
