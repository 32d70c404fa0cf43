"""`QuietServer` and `DatedProtocol` (mcpmux.server.http.quiet_server), serving real HTTP on loopback.

The server has no timer of its own: what uvicorn's ten wake-ups a second did must still happen when
it matters. The `Date` header says the second the response was made, and setting `should_exit`
ends the server at once.
"""

from __future__ import annotations

import time
from email.utils import parsedate_to_datetime

import anyio
import httpx2
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from mcpmux.server.frontend import bind
from mcpmux.server.http.quiet_server import DatedProtocol, QuietServer

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # uvicorn runs on asyncio only


async def hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


async def test_the_date_header_is_the_second_of_each_answer_and_exit_is_at_once() -> None:
    sock = bind("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/"
    config = uvicorn.Config(Starlette(routes=[Route("/", hello)]), http=DatedProtocol, log_level="warning")
    server = QuietServer(config)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(server.serve, [sock])
        async with httpx2.AsyncClient() as client:
            while not server.started:
                await anyio.sleep(0.01)
            dates = []
            for pause in (1.1, 0):  # idle past a second between the two: nothing ticks meanwhile
                before = int(time.time())
                answer = await client.get(url)
                after = time.time()
                assert answer.text == "hello"
                date = parsedate_to_datetime(answer.headers["date"]).timestamp()
                assert before <= date <= after
                dates.append(date)
                await anyio.sleep(pause)
            assert dates[1] > dates[0]
        stopped = time.monotonic()
        server.should_exit = True  # nothing polls it: setting it ends the server's wait
    assert time.monotonic() - stopped < 2
