"""Fast-path POSTs answered inside mcpmux's HTTP protocol, below ASGI (mcpmux.server.http.fast_front).

Raw HTTP/1.1 on a socket, as a client may write it: pipelined requests, `Connection: close`,
`Expect: 100-continue`, bodies too big to hold, proxy headers. Each request gets its own answer,
in order, from whichever path serves it.
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.e2e.conftest import mux_over_http, write_config
from tests.e2e.test_fastpath import PROBE

META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
    "io.modelcontextprotocol/clientCapabilities": {},
}


def request(url: str, request_id: int, text: str, *extra: str) -> bytes:
    """A 2026 `tools/call` of the probe's `whoami` as raw HTTP/1.1 bytes."""
    params = {"name": "probe__whoami", "arguments": {"text": text}, "_meta": META}
    body = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}).encode()
    parts = urlsplit(url)
    head = [
        f"POST {parts.path} HTTP/1.1",
        f"Host: {parts.netloc}",
        "Accept: application/json, text/event-stream",
        "Content-Type: application/json",
        "MCP-Protocol-Version: 2026-07-28",
        "Mcp-Method: tools/call",
        "Mcp-Name: probe__whoami",
        f"Content-Length: {len(body)}",
        *extra,
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def read_responses(sock: socket.socket, count: int) -> list[tuple[int, dict[str, str], Any]]:
    """`count` HTTP responses with a Content-Length body, in order: status, headers, JSON body."""
    buffer, responses = b"", []
    while len(responses) < count:
        while b"\r\n\r\n" not in buffer:
            chunk = sock.recv(65536)
            assert chunk, f"the connection closed after {len(responses)} responses"
            buffer += chunk
        head, _, buffer = buffer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers["content-length"])
        while len(buffer) < length:
            buffer += sock.recv(65536)
        body, buffer = buffer[:length], buffer[length:]
        responses.append((int(lines[0].split(" ")[1]), headers, json.loads(body)))
    return responses


def echoed(response: tuple[int, dict[str, str], Any]) -> tuple[int, Any, str]:
    status, _, message = response
    seen = json.loads(message["result"]["content"][0]["text"])
    return status, message["id"], seen["text"]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    probe = {"command": sys.executable, "args": [str(PROBE)]}
    # The probe echoes 100 kB whole: what is timed here is HTTP, not results cut to fit a context.
    config = write_config(tmp_path_factory.mktemp("front") / "mux.json", {"probe": probe}, max_result_bytes=0)
    with mux_over_http(config) as served:
        yield served


def connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    return socket.create_connection((parts.hostname, parts.port), timeout=30)


def test_pipelined_requests_are_answered_in_order(url: str) -> None:
    with connect(url) as sock:
        sock.sendall(b"".join(request(url, n, f"call {n}") for n in range(1, 6)))
        answers = [echoed(response) for response in read_responses(sock, 5)]
    assert answers == [(200, n, f"call {n}") for n in range(1, 6)]


def test_connection_close_is_honoured(url: str) -> None:
    with connect(url) as sock:
        sock.sendall(request(url, 1, "last", "Connection: close"))
        (response,) = read_responses(sock, 1)
        assert echoed(response) == (200, 1, "last")
        assert response[1].get("connection") == "close"
        assert sock.recv(1) == b""  # and the connection ends


@pytest.mark.parametrize(
    "extra",
    [
        ("X-Forwarded-For: 10.1.2.3",),  # the edge reads the client's address from it
        ("Expect: 100-continue",),
        (),  # the same connection, a body too big to hold (below)
    ],
)
def test_requests_the_protocol_does_not_hold_are_served_all_the_same(url: str, extra: tuple[str, ...]) -> None:
    text = "x" * 100_000 if not extra else "fine"
    with connect(url) as sock:
        data = request(url, 7, text, *extra)
        if extra == ("Expect: 100-continue",):  # the body goes once the server asks for it
            head, _, body = data.partition(b"\r\n\r\n")
            sock.sendall(head + b"\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 100 Continue")
            data = body
        sock.sendall(data)
        (response,) = read_responses(sock, 1)
        assert echoed(response) == (200, 7, text)
        sock.sendall(request(url, 8, "again"))  # and the connection serves the next request
        assert echoed(read_responses(sock, 1)[0]) == (200, 8, "again")


def test_an_error_keeps_its_status_and_the_connection(url: str) -> None:
    with connect(url) as sock:
        body = request(url, 9, "x").replace(b"probe__whoami", b"probe__unkno1")  # the same length
        sock.sendall(body + request(url, 10, "after"))
        refused, after = read_responses(sock, 2)
        assert refused[2]["id"] == 9
        assert "error" in refused[2] or refused[2]["result"]["isError"]
        assert echoed(after) == (200, 10, "after")


def test_what_the_edge_refuses_on_headers_is_refused_before_the_body(url: str) -> None:
    """A request from a foreign Host is refused at once, not held until a body that never comes."""
    with connect(url) as sock:
        head, _, _body = request(url, 11, "x").partition(b"\r\n\r\n")
        host = f"Host: {urlsplit(url).netloc}".encode()
        sock.sendall(head.replace(host, b"Host: evil.example") + b"\r\n\r\n")
        (response,) = read_responses(sock, 1)
        assert response[0] == 403


def test_two_session_ids_are_refused(url: str) -> None:
    """The SDK reads the first `Mcp-Session-Id`, session binding read the last: such a request is refused."""
    with connect(url) as sock:
        sock.sendall(request(url, 12, "x", "Mcp-Session-Id: a", "Mcp-Session-Id: b"))
        (response,) = read_responses(sock, 1)
        assert response[0] == 400
        assert "more than one Mcp-Session-Id header" in response[2]["error"]["message"]
