"""Real parts for end-to-end tests: upstream servers as subprocesses, mcpmux as a subprocess, real clients."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from mcpmux.mux.multiplexer import Mux
from mcpmux.server.frontend import Frontend, bind
from mcpmux.server.http.edge_policy import EdgePolicy

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "tests" / "servers" / "demo_server.py"
EVERYTHING = ROOT / ".npm" / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
PY = sys.executable


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def demo(name: str) -> dict[str, Any]:
    """Config entry for the demo server over stdio."""
    return {"command": PY, "args": [str(DEMO), name]}


def everything_available() -> bool:
    return EVERYTHING.exists() and shutil.which("node") is not None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode} before listening on {port}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listened on port {port} within {timeout}s")


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for its parent to reap it does not, nor one that vanishes as it is read)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def gone(pid: int, timeout: float = 10.0) -> bool:
    """Wait up to `timeout` seconds for `pid` to end; whether it did."""
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def http_upstream(name: str, port: int | None = None) -> Iterator[str]:
    """The demo server over streamable HTTP on loopback; yields its URL."""
    port = port or free_port()
    process = subprocess.Popen([PY, str(DEMO), name, "http", str(port)], stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, process)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(process)


def write_config(path: Path, servers: dict[str, dict[str, Any]], **mux: Any) -> Path:
    """A client-format JSON config (mcpmux accepts it unchanged), plus optional [mux] settings.

    A list request waits for every upstream still starting (`startup_list_wait`, 10 s by default,
    raised here for a loaded CI host): `mux_over_stdio`'s first list is where a test knows its
    upstreams are connected, as it knew when mcpmux served only once they were."""
    mux.setdefault("startup_list_wait", STARTUP_WAIT)
    path.write_text(json.dumps({"mcpServers": servers, "mux": mux}))
    return path


STARTUP_WAIT = 60.0
"""Seconds a test waits for mcpmux's upstreams to connect before it starts (they take 1-5 s here)."""


@asynccontextmanager
async def mux_over_stdio(config: Path, mode: str = "auto", **client: Any) -> AsyncIterator[Client]:
    """mcpmux launched the way Claude Desktop launches it, with a real client on its stdio."""
    params = StdioServerParameters(
        command=PY, args=["-m", "mcpmux", "serve", "--config", str(config)], env=dict(os.environ)
    )
    async with Client(params, mode=mode, **client) as connected:
        await connected.list_tools()  # answered once the upstreams have connected (or failed): see write_config
        yield connected


@contextmanager
def mux_over_http(config: Path) -> Iterator[str]:
    """`mcpmux serve --transport http` as a subprocess; yields the MCP endpoint URL once its upstreams
    have connected (or failed), as a test expects them to be (mcpmux itself serves before)."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="mcpmux-http-") as folder:
        log = Path(folder) / "stderr.log"
        with log.open("wb") as stderr:
            process = subprocess.Popen(
                [PY, "-m", "mcpmux", "serve", "--config", str(config), "--transport", "http", "--port", str(port)],
                stderr=stderr,
            )
        try:
            wait_for_port(port, process)
            wait_for_upstreams(log, process)
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            stop(process)


_STARTING = re.compile(rb": (\d+) upstream\(s\) starting")
_SETTLED = re.compile(rb"^upstream \S+: ", re.MULTILINE)


def wait_for_upstreams(log: Path, process: subprocess.Popen[bytes], timeout: float = STARTUP_WAIT) -> None:
    """Until `mcpmux serve --transport http`, whose stderr goes to `log`, has said of each of its
    upstreams that it is ready or down (its banner counts them; one line each as it settles)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        said = log.read_bytes()
        starting = _STARTING.search(said)
        if starting is not None and len(_SETTLED.findall(said)) >= int(starting.group(1)):
            return
        if process.poll() is not None:
            raise RuntimeError(f"mcpmux exited with {process.returncode}; it said:\n{said.decode(errors='replace')}")
        time.sleep(0.1)
    raise TimeoutError(f"mcpmux's upstreams were still starting after {timeout} s")


@asynccontextmanager
async def bearer_client(url: str, token: str, mode: str = "auto") -> AsyncIterator[Client]:
    """A real client of mcpmux's HTTP front at `url`, sending `Authorization: Bearer <token>`."""
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=None)) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode) as connected,
    ):
        yield connected


def text_of(result: Any) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


@asynccontextmanager
async def served_in_process(
    config: Path, prepare: Callable[[Frontend], None] | None = None
) -> AsyncIterator[tuple[Mux, Frontend, str]]:
    """A `Mux` and its HTTP front in this process, on a free loopback port: (mux, frontend, MCP URL).

    `prepare` adjusts the frontend before it serves (a shorter round timeout, say)."""
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    stop = anyio.Event()
    async with Mux.from_config(config) as mux, anyio.create_task_group() as tasks:
        frontend = Frontend(mux)
        if prepare is not None:
            prepare(frontend)
        tasks.start_soon(frontend.serve_http, sock, EdgePolicy.load(mux.config, "127.0.0.1"), "/mcp", stop)
        with anyio.fail_after(30):
            while not _listening(port):
                await anyio.sleep(0.05)
        yield mux, frontend, f"http://127.0.0.1:{port}/mcp"
        stop.set()


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0
