"""Inbound JSON-RPC batch arrays from a real 2025-03-26 session, over stdio and streamable HTTP.

The clients here are raw: JSON lines on `mcpmux serve`'s stdin/stdout, and plain HTTP POSTs on
loopback, because no SDK client sends arrays.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.e2e.conftest import PY, demo, mux_over_http, stop, write_config

HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
NOTIFICATION = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": "t", "progress": 1}}


def _initialize(version: str) -> dict[str, Any]:
    params = {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}
    return {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params}


def _call(request_id: object, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    params = {"name": tool, "arguments": arguments}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def _batch() -> list[dict[str, Any]]:
    """Three requests and a notification, ids of both JSON types."""
    return [
        _call("first", "alpha__echo", {"text": "batched"}),
        NOTIFICATION,
        {"jsonrpc": "2.0", "id": 2, "method": "ping"},
        _call(3, "alpha__add", {"a": 40, "b": 2}),
    ]


def _check_batch_answer(answer: Any) -> None:
    assert isinstance(answer, list)
    assert [response["id"] for response in answer] == ["first", 2, 3]  # one each, in request order
    assert answer[0]["result"]["content"][0]["text"] == "alpha: batched"
    assert answer[1]["result"] == {}
    assert answer[2]["result"]["structuredContent"] == {"result": 42}


class RawStdio:
    """`mcpmux serve` on stdio with a client that writes and reads JSON lines itself."""

    def __init__(self, config: Path) -> None:
        self.process = subprocess.Popen(
            [PY, "-m", "mcpmux", "serve", "--config", str(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=dict(os.environ),
        )
        self.lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)

    def send(self, message: object) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message).encode() + b"\n")
        self.process.stdin.flush()

    def receive(self, timeout: float = 60.0) -> Any:
        """The next response, past the list_changed notifications an upstream coming up sends meanwhile."""
        while True:
            message = json.loads(self.lines.get(timeout=timeout))
            if not (isinstance(message, dict) and str(message.get("method", "")).endswith("/list_changed")):
                return message

    def start(self, version: str) -> None:
        self.send(_initialize(version))
        assert self.receive()["result"]["protocolVersion"] == version
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        # mcpmux serves before its upstreams connect: a list waits for them, and the list_changed
        # their arrival causes comes before its answer. Past it, every line answers a request.
        self.send({"jsonrpc": "2.0", "id": "listed", "method": "tools/list"})
        while self.receive().get("id") != "listed":
            pass

    def close(self) -> None:
        """End the session the way MCP clients do: close stdin, then wait, then signal."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            stop(self.process)

    def ping_is_next(self, request_id: str) -> None:
        """Nothing else is waiting on stdout: the next line answers this ping."""
        self.send({"jsonrpc": "2.0", "id": request_id, "method": "ping"})
        assert self.receive() == {"jsonrpc": "2.0", "id": request_id, "result": {}}


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return write_config(tmp_path / "mcp.json", {"alpha": demo("alpha")})


@pytest.fixture
def raw_stdio(config: Path) -> Iterator[RawStdio]:
    raw = RawStdio(config)
    try:
        yield raw
    finally:
        raw.close()


@pytest.mark.slow
def test_stdio_batch_on_a_2025_03_26_session(raw_stdio: RawStdio) -> None:
    raw_stdio.start("2025-03-26")
    raw_stdio.send(_batch())
    _check_batch_answer(raw_stdio.receive())
    raw_stdio.ping_is_next("after-batch")  # each request was answered once, inside the array only

    raw_stdio.send([])
    empty = raw_stdio.receive()
    assert empty["id"] is None
    assert empty["error"]["code"] == -32600

    # Notifications only: no answer at all. A bad element gets its own error in the array.
    raw_stdio.send(
        [{"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": 1, "progress": 1}}]
    )
    raw_stdio.ping_is_next("after-notifications")
    raw_stdio.send([{"jsonrpc": "2.0", "id": 7, "method": "ping"}, {"id": 8, "no": "method"}])
    answer = raw_stdio.receive()
    assert answer[0] == {"jsonrpc": "2.0", "id": 7, "result": {}}
    assert answer[1]["id"] == 8
    assert answer[1]["error"]["code"] == -32600


@pytest.mark.slow
def test_stdio_batch_refused_on_later_revisions(tmp_path: Path) -> None:
    raw = RawStdio(write_config(tmp_path / "empty.json", {}))  # no upstream needed: starts faster
    try:
        _check_refusals(raw)
        # The edge's stdin reader never holds up shutdown: SIGTERM ends the server with stdin still open.
        raw.process.terminate()
        assert raw.process.wait(timeout=20) == 0
    finally:
        raw.close()


def _check_refusals(raw_stdio: RawStdio) -> None:
    raw_stdio.send([{"jsonrpc": "2.0", "id": 1, "method": "ping"}])  # before initialize
    assert raw_stdio.receive()["error"]["code"] == -32600
    raw_stdio.start("2025-11-25")
    raw_stdio.send([{"jsonrpc": "2.0", "id": 1, "method": "ping"}])
    refused = raw_stdio.receive()
    assert refused["id"] is None
    assert refused["error"]["code"] == -32600
    assert "negotiated 2025-11-25" in refused["error"]["message"]
    raw_stdio.ping_is_next("still-serving")


def _open_session(client: httpx2.Client, url: str, version: str) -> dict[str, str]:
    response = client.post(url, headers=HEADERS, json=_initialize(version))
    assert response.status_code == 200
    headers = {**HEADERS, "mcp-session-id": response.headers["mcp-session-id"]}
    initialized = client.post(url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert initialized.status_code == 202
    return headers


@pytest.mark.slow
def test_http_batch_on_a_2025_03_26_session(config: Path) -> None:
    with mux_over_http(config) as url, httpx2.Client(timeout=60) as client:
        session = _open_session(client, url, "2025-03-26")
        response = client.post(url, headers=session, json=_batch())
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/json"
        _check_batch_answer(response.json())
        # The upstream saw the echo exactly once.
        count = client.post(url, headers=session, json=[_call(9, "alpha__count", {"tool": "echo"})]).json()
        assert count[0]["result"]["structuredContent"] == {"result": 1}

        empty = client.post(url, headers=session, json=[])
        assert empty.status_code == 400
        assert empty.json()["error"]["code"] == -32600

        notification = {
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": {"progressToken": 1, "progress": 1},
        }
        only_notifications = client.post(url, headers=session, json=[notification])
        assert only_notifications.status_code == 202
        assert only_notifications.content == b""

        later = _open_session(client, url, "2025-11-25")
        refused = client.post(url, headers=later, json=[{"jsonrpc": "2.0", "id": 1, "method": "ping"}])
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == -32600
        assert "negotiated 2025-11-25" in refused.json()["error"]["message"]

        no_session = client.post(url, headers=HEADERS, json=[{"jsonrpc": "2.0", "id": 1, "method": "ping"}])
        assert no_session.json()["error"]["code"] == -32600

        # Single messages on the same session are untouched by all this.
        single = client.post(url, headers=session, json={"jsonrpc": "2.0", "id": "one", "method": "ping"})
        assert single.status_code == 200
