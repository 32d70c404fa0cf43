"""A keep-alive connection of the fast path's HTTP client (mcpmux.upstream.http_connection), on real loopback sockets.

When an answer frees a slot at an upstream's gate, the call waiting for that slot is sent from the
code the answer reached: the connection that carried the answer must already be idle then, or that
call finds no connection and needs a task to open one.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mcpmux.upstream.http_connection import Connection
from mcpmux.wire.json_texts import several_messages

pytestmark = pytest.mark.anyio

JSON = b'{"jsonrpc":"2.0","id":"%s","result":{}}'


def json_response(request_id: bytes) -> bytes:
    body = JSON % request_id
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


def sse_response(request_id: bytes) -> bytes:
    event = b"event: message\r\ndata: " + JSON % request_id + b"\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    return head + b"%x\r\n%s\r\n0\r\n\r\n" % (len(event), event)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the connection is an asyncio protocol


class ChainingPool:
    """Records what its connection tells it; each answer starts the next request on the idle connection."""

    session_id: str | None = None

    def __init__(self, requests: int) -> None:
        self.events: list[str] = []
        self.idle: list[Connection] = []
        self.left = requests
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def deliver(self, message: dict[str, Any], request_id: str | None = None) -> None:
        self.events.append(f"answer {message['id']}")
        self.left -= 1
        if not self.left:
            self.done.set_result(None)
        elif self.idle:
            self.idle.pop().start(f"r{self.left}", request(f"r{self.left}"))
        else:
            self.done.set_exception(AssertionError("the answered connection was not idle yet"))

    def several(self, body: bytes) -> list[Any] | None:
        return several_messages(body)

    def carrying(self, request_id: str, connection: Connection | None) -> None:
        pass

    def rest(self, connection: Connection) -> None:
        self.events.append("rest")
        self.idle.append(connection)

    def forget(self, connection: Connection) -> None:
        pass

    def resend(self, request_id: str, data: bytes) -> None:
        pass


def request(request_id: str) -> bytes:
    return b"POST /mcp HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s" % (len(request_id), request_id.encode())


@pytest.mark.parametrize("respond", [json_response, sse_response])
async def test_an_answers_connection_is_idle_when_the_answer_is_handed_on(respond: Any) -> None:
    """Each answer starts the next request from its own callback, on the connection it came on."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
            writer.write(respond(await reader.readexactly(length)))  # the whole response in one write

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        pool = ChainingPool(requests=3)
        _, connection = await asyncio.get_running_loop().create_connection(lambda: Connection(pool), "127.0.0.1", port)
        connection.start("r3", request("r3"))
        await asyncio.wait_for(pool.done, 5)
        connection.drop()
    assert pool.events == ["rest", "answer r3", "rest", "answer r2", "rest", "answer r1"]
