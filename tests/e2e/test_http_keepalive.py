"""Idle keep-alive connections per client address (`[http] idle_connections_per_client`,
mcpmux.http_keepalive): past the limit, the connection answering a fast-path call is retired with
`Connection: close`; every request still gets its answer, pipelined ones included.
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator

import anyio
import pytest
from mcp import Client

from tests.e2e.conftest import mux_over_http, text_of
from tests.e2e.test_fastpath import PROBE
from tests.e2e.test_http_front import connect, echoed, read_responses, request


@pytest.fixture(scope="module", params=[2, 0], ids=["limit-2", "no-limit"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    limit: int = request.param
    config = tmp_path_factory.mktemp("keepalive") / "mux.json"
    probe = {"command": sys.executable, "args": [str(PROBE)]}
    config.write_text(json.dumps({"mcpServers": {"probe": probe}, "http": {"idle_connections_per_client": limit}}))
    with mux_over_http(config) as url:
        yield url, limit


def still_open(sock: socket.socket) -> bool:
    """Whether the server left the connection open (nothing to read, no end of stream)."""
    sock.setblocking(False)
    try:
        return bool(sock.recv(1, socket.MSG_PEEK))
    except BlockingIOError:
        return True
    finally:
        sock.setblocking(True)


def test_a_connection_past_the_limit_is_retired_after_its_answer(served: tuple[str, int]) -> None:
    url, limit = served
    sockets = [connect(url) for _ in range(4)]
    try:
        answers = []
        for n, sock in enumerate(sockets, start=1):  # each answered in turn: the earlier ones then sit idle
            sock.sendall(request(url, n, f"call {n}"))
            (response,) = read_responses(sock, 1)
            answers.append((echoed(response), response[1].get("connection")))
        assert [answer for answer, _ in answers] == [(200, n, f"call {n}") for n in range(1, 5)]
        if limit == 0:
            assert [close for _, close in answers] == [None] * 4
            assert all(still_open(sock) for sock in sockets)
            return
        # Two idle besides it when the third answered: it and the fourth are retired, not the first two.
        assert [close for _, close in answers] == [None, None, "close", "close"]
        assert [sockets[2].recv(1), sockets[3].recv(1)] == [b"", b""]  # and they end
        sockets[0].sendall(request(url, 5, "again"))  # a kept one serves on
        assert echoed(read_responses(sockets[0], 1)[0]) == (200, 5, "again")
    finally:
        for sock in sockets:
            sock.close()


def test_a_request_pipelined_behind_is_answered_before_the_connection_is_retired(served: tuple[str, int]) -> None:
    url, limit = served
    idle = [connect(url) for _ in range(3)]
    try:
        for n, sock in enumerate(idle, start=10):
            sock.sendall(request(url, n, "idle"))
            read_responses(sock, 1)
        with connect(url) as sock:
            sock.sendall(b"".join(request(url, n, f"piped {n}") for n in (20, 21, 22)))
            responses = read_responses(sock, 3)
            assert [echoed(response) for response in responses] == [(200, n, f"piped {n}") for n in (20, 21, 22)]
            closes = [response[1].get("connection") for response in responses]
            assert closes[:2] == [None, None]  # never with another request behind it on the wire
            assert closes[2] == ("close" if limit else None)
    finally:
        for sock in idle:
            sock.close()


@pytest.mark.anyio
async def test_clients_calling_concurrently_lose_nothing_to_retired_connections(served: tuple[str, int]) -> None:
    url, _ = served
    results: dict[int, str] = {}
    async with Client(url) as first, Client(url) as second:

        async def call(client: Client, n: int) -> None:
            result = await client.call_tool("probe__whoami", {"text": f"call {n}"})
            results[n] = json.loads(text_of(result))["text"]

        for _ in range(3):  # bursts: pools grow, then idle connections pile up past the limit
            async with anyio.create_task_group() as tasks:
                for n in range(64):
                    tasks.start_soon(call, first if n % 2 else second, n)
            assert results == {n: f"call {n}" for n in range(64)}
            results.clear()
