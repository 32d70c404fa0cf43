"""Real parts for the reliability suite: tagged mcpmux and upstream processes, /proc readings, raw pipes
and a raw HTTP session.

Every process a test starts carries `MCPMUX_RELIABILITY_RUN=<id>` in its environment, and mcpmux
passes its environment on to its stdio children, so after a run any process still carrying the tag
is a leak, whoever started it.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx2
import pytest

from tests.e2e.conftest import DEMO, PY, ROOT, alive, free_port, stop, wait_for_port, wait_for_upstreams

FAULT = ROOT / "tests" / "servers" / "fault_server.py"
RUN_ENV = "MCPMUX_RELIABILITY_RUN"
HTTP_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def run_id() -> Iterator[str]:
    """A fresh tag for this test's processes; any still alive at the end fail the test (and are killed)."""
    tag = uuid.uuid4().hex
    yield tag
    leaked = tagged_pids(tag)
    for pid in leaked:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not leaked, f"processes left running after the test: {leaked}"


def tagged_env(run_id: str, **extra: str) -> dict[str, str]:
    """This process's environment plus the run tag (and `extra`)."""
    return {**os.environ, RUN_ENV: run_id, **extra}


def tagged_pids(run_id: str) -> list[int]:
    """Live processes (zombies excluded) other than this one whose environment carries the run tag."""
    marker = f"{RUN_ENV}={run_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with suppress(OSError):
            if marker in (entry / "environ").read_bytes().split(b"\0") and alive(int(entry.name)):
                found.append(int(entry.name))
    return found


@dataclass(frozen=True, slots=True)
class ProcStats:
    """What a process holds: open descriptors, OS threads, resident memory."""

    fds: int
    threads: int
    rss_kib: int


def proc_stats(pid: int) -> ProcStats:
    """Read `pid`'s open descriptors and its thread count and RSS from /proc."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return ProcStats(
        fds=len(os.listdir(f"/proc/{pid}/fd")),
        threads=int(status["Threads"]),
        rss_kib=int(status["VmRSS"].split()[0]),
    )


def pooled_sockets(pid: int, ports: set[int]) -> int:
    """`pid`'s TCP sockets to the loopback `ports` of HTTP upstreams: its HTTP client's keep-alive pool.

    An idle pooled connection the server closed sits in CLOSE_WAIT until the pool next touches it, so
    the pool may hold more descriptors after a load than before it; it is bounded (httpx: 20 per client)
    and is counted apart from leaked descriptors.
    """
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes and int(fields[2].rsplit(":", 1)[1], 16) in ports:
                count += 1
    return count


def stdio_upstream(name: str, script: Path = DEMO, **env: str) -> dict[str, Any]:
    """Config entry for a test server over stdio (`env` e.g. FAULT_MODE for the fault server)."""
    return {"command": PY, "args": [str(script), name], "env": env}


def write_config(path: Path, servers: dict[str, dict[str, Any]], model: Path | None = None, **mux: Any) -> Path:
    """A JSON config: the servers, `[mux]` settings, and the local engine on `model` if given."""
    # A list waits for upstreams still starting this long (mcpmux serves before they connect).
    raw: dict[str, Any] = {"mcpServers": servers, "mux": {"startup_timeout": 30, "startup_list_wait": 60, **mux}}
    if model is not None:
        raw["inference"] = {
            "backend": "local",
            "models": {"tiny": {"model": str(model), "kv_cache_memory_mb": 16}},
            "embeddings": {"model": ""},
        }
    path.write_text(json.dumps(raw))
    return path


@dataclass(slots=True)
class Served:
    """A process listening on loopback: the Popen and its URL."""

    process: subprocess.Popen[bytes]
    url: str


@contextmanager
def http_server(script: Path, name: str, run_id: str, port: int | None = None, **env: str) -> Iterator[Served]:
    """A test server (demo or fault) over streamable HTTP, tagged; yields it with its MCP URL."""
    port = port or free_port()
    command = [PY, str(script), name, "http", str(port)]
    process = subprocess.Popen(
        command, env=tagged_env(run_id, **env), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for_port(port, process)
        yield Served(process, f"http://127.0.0.1:{port}/mcp")
    finally:
        stop(process)


@contextmanager
def http_mux(config: Path, run_id: str, log: Path) -> Iterator[Served]:
    """`mcpmux serve --transport http` on a free loopback port, tagged, stderr to `log`."""
    port = free_port()
    command = [PY, "-m", "mcpmux", "serve", "--config", str(config), "--transport", "http", "--port", str(port)]
    with log.open("wb") as stderr:
        process = subprocess.Popen(command, env=tagged_env(run_id), stderr=stderr, cwd=ROOT)
        try:
            wait_for_port(port, process, timeout=90)
            wait_for_upstreams(log, process)
            yield Served(process, f"http://127.0.0.1:{port}/mcp")
        finally:
            stop(process)


class RawStdio:
    """mcpmux over stdio driven through raw pipes: bytes in, decoded JSON lines out."""

    def __init__(self, config: Path, run_id: str, log: IO[bytes]) -> None:
        command = [PY, "-m", "mcpmux", "serve", "--config", str(config)]
        self.process = subprocess.Popen(
            command, env=tagged_env(run_id), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, cwd=ROOT
        )
        self.lines: queue.Queue[Any] = queue.Queue()
        threading.Thread(target=self._read, name="raw stdio reader", daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            try:
                self.lines.put(json.loads(line))
            except json.JSONDecodeError:
                self.lines.put(("not json", line))
        self.lines.put(("eof", b""))

    def send(self, data: bytes) -> None:
        """Write bytes as they are (add the newline yourself)."""
        assert self.process.stdin is not None
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def send_json(self, message: Any) -> None:
        self.send(json.dumps(message).encode() + b"\n")

    def receive(self, timeout: float) -> Any:
        """The next line from mcpmux, decoded; raises `queue.Empty` after `timeout` seconds."""
        return self.lines.get(timeout=timeout)

    def request(self, message: dict[str, Any], timeout: float = 30) -> dict[str, Any]:
        """Send one request and return its response (lines for other ids are discarded)."""
        self.send_json(message)
        while True:
            line = self.receive(timeout)
            if isinstance(line, dict) and line.get("id") == message["id"] and "method" not in line:
                return line

    def initialize(self, version: str = "2025-11-25") -> dict[str, Any]:
        """The 2025 handshake: initialize, then notifications/initialized."""
        params = {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}
        response = self.request({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": params}, 90)
        self.send_json({"jsonrpc": "2.0", "method": "notifications/initialized"})
        # mcpmux serves before its upstreams connect: a list waits for them, and the list_changed
        # their arrival causes comes (and is discarded here) before its answer.
        self.request({"jsonrpc": "2.0", "id": "init-list", "method": "tools/list"}, 90)
        return response

    def close(self) -> int:
        """Close stdin (mcpmux's cue to shut down) and wait for the exit code."""
        with suppress(BrokenPipeError):
            assert self.process.stdin is not None
            self.process.stdin.close()
        try:
            return self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            stop(self.process)
            raise


@dataclass(slots=True)
class Exchange:
    """What a front answered to one message: HTTP status (0 on stdio) and the JSON-RPC messages."""

    status: int
    messages: list[Any]


class HttpFront:
    """One initialized 2025-11-25 session over raw HTTP (by default declaring no capabilities at all)."""

    def __init__(self, url: str, timeout: float, capabilities: dict[str, Any] | None = None) -> None:
        self.url = url
        self.http = httpx2.Client(timeout=timeout)
        params = {
            "protocolVersion": "2025-11-25",
            "capabilities": capabilities or {},
            "clientInfo": {"name": "raw", "version": "0"},
        }
        opened = self.http.post(
            url, headers=HTTP_HEADERS, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params}
        )
        opened.raise_for_status()
        self.headers = {
            **HTTP_HEADERS,
            "mcp-session-id": opened.headers["mcp-session-id"],
            "mcp-protocol-version": "2025-11-25",
        }
        self.http.post(url, headers=self.headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})

    def close(self) -> None:
        self.http.close()

    def exchange(self, data: bytes, request_id: object) -> Exchange:
        """POST `data` on the session; the answer is the HTTP response itself."""
        response = self.http.post(self.url, headers=self.headers, content=data)
        return Exchange(response.status_code, messages_of(response))


def messages_of(response: httpx2.Response) -> list[Any]:
    """The JSON-RPC messages of a response body: one JSON document, or the data of SSE events."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        events = response.text.replace("\r\n", "\n").split("\n\n")
        datas = ["\n".join(line[5:].lstrip() for line in e.split("\n") if line.startswith("data:")) for e in events]
        return [json.loads(data) for data in datas if data]
    if not response.content:
        return []
    decoded = json.loads(response.content)
    return decoded if isinstance(decoded, list) else [decoded]
