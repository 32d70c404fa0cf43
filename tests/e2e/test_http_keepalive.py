"""Idle keep-alive connections per client address (`[http] idle_connections_per_client`,
mcpmux.server.http.keepalive): past the limit, the connection answering a fast-path call is retired with
`Connection: close`; every request still gets its answer, pipelined ones included.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from mcp import Client

from mcpmux.server.http.keepalive import STALE_AFTER
from tests.e2e.conftest import mux_over_http, text_of
from tests.e2e.test_fastpath import PROBE
from tests.e2e.test_http_front import connect, echoed, read_responses, request


@pytest.fixture(params=[2, 0], ids=["limit-2", "no-limit"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, int]]:
    limit: int = request.param
    config = tmp_path / "mux.json"
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


def answer(url: str, sock: socket.socket, n: int) -> str | None:
    """Call on `sock`, check the answer, and return its Connection header."""
    sock.sendall(request(url, n, f"call {n}"))
    (response,) = read_responses(sock, 1)
    assert echoed(response) == (200, n, f"call {n}")
    return response[1].get("connection")


def test_a_connection_past_the_limit_is_retired_after_its_answer(served: tuple[str, int]) -> None:
    url, limit = served
    sockets = [connect(url) for _ in range(5)]
    try:
        went_idle = time.monotonic()
        closes = [answer(url, sockets[0], 1), answer(url, sockets[1], 2), answer(url, sockets[2], 3)]
        if time.monotonic() - went_idle < STALE_AFTER:  # as good as always: a surplus idle only briefly stays
            assert closes[2] is None
        time.sleep(STALE_AFTER + 0.05)
        closes += [answer(url, sockets[3], 4), answer(url, sockets[4], 5)]
        if limit == 0:
            assert closes == [None] * 5
            assert all(still_open(sock) for sock in sockets)
            return
        # Three idle (two of them for long enough) when the fourth and fifth answered: both retired.
        assert closes[:2] == [None, None]
        assert closes[3:] == ["close", "close"]
        assert [sockets[3].recv(1), sockets[4].recv(1)] == [b"", b""]  # and they end
        # A connection busy again no longer counts: two others idle (retired), then one (kept).
        assert answer(url, sockets[0], 6) == "close"
        assert answer(url, sockets[1], 7) is None  # now only one other is idle
    finally:
        for sock in sockets:
            sock.close()


def test_a_client_that_connects_anew_rather_than_take_an_idle_connection_is_not_retired_again(
    served: tuple[str, int],
) -> None:
    """A load driver keeps a connection per caller: after a burst, one caller goes on alone and the
    others' connections stay idle. Retiring the busy one made that caller reconnect on every call
    (the idle ones are never taken up); one retirement, then the new connection is kept."""
    url, limit = served
    idle = [connect(url) for _ in range(3)]
    caller = connect(url)
    try:
        for n, sock in enumerate(idle, start=30):
            answer(url, sock, n)
        time.sleep(STALE_AFTER + 0.05)
        closes = [answer(url, caller, 40)]
        if closes[0] == "close":
            caller.close()
            caller = connect(url)  # as a driver does: the caller's own connection, anew
        closes += [answer(url, caller, n) for n in range(41, 45)]
        assert closes == (["close"] + [None] * 4 if limit else [None] * 5)
        assert still_open(caller)
        # Once the client takes up one of its idle connections, surplus connections are retired again.
        assert answer(url, idle[0], 50) == ("close" if limit else None)
    finally:
        for sock in [*idle, caller]:
            sock.close()


def test_closed_connections_no_longer_count(served: tuple[str, int]) -> None:
    url, _ = served
    gone = [connect(url) for _ in range(3)]
    for n, sock in enumerate(gone, start=10):
        answer(url, sock, n)
    time.sleep(STALE_AFTER + 0.05)
    for sock in gone:
        sock.close()
    time.sleep(0.5)  # for mcpmux to read each connection's end
    with connect(url) as sock:
        assert answer(url, sock, 13) is None


def test_a_request_pipelined_behind_is_answered_before_the_connection_is_retired(served: tuple[str, int]) -> None:
    url, limit = served
    idle = [connect(url) for _ in range(3)]
    try:
        for n, sock in enumerate(idle, start=10):
            answer(url, sock, n)
        time.sleep(STALE_AFTER + 0.05)
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
    """Every call answered once, with its own answer, while connections are retired under the clients."""
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
