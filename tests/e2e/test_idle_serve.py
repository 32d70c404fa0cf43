"""An idle `mcpmux serve --transport http` has no timer (mcpmux.server.http.quiet_server): what a client
still sees is that each answer's `Date` says the second it was made, on both the fast front and ASGI,
after the server sat idle, and that SIGTERM ends it straight away with exit status 0."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request
from email.utils import parsedate_to_datetime
from pathlib import Path

import pytest

from tests.e2e.conftest import PY, free_port, wait_for_port, write_config
from tests.e2e.test_fastpath import PROBE
from tests.e2e.test_http_front import echoed, read_responses, request

pytestmark = pytest.mark.slow


def _dated(date: str, sent: float, received: float) -> bool:
    """The header names a second between the request's sending and its answer's arrival."""
    second = parsedate_to_datetime(date).timestamp()
    return int(sent) <= second <= received


def test_date_is_each_answers_second_after_idle_and_sigterm_ends_the_server(tmp_path: Path) -> None:
    config = write_config(tmp_path / "mux.json", {"probe": {"command": sys.executable, "args": [str(PROBE)]}})
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    process = subprocess.Popen(
        [PY, "-m", "mcpmux", "serve", "--config", str(config), "--transport", "http", "--port", str(port)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for_port(port, process)
        with socket.create_connection(("127.0.0.1", port)) as sock:
            dates = []
            for n in range(3):  # the fast front answers; between answers the server sits idle
                sent = time.time()
                sock.sendall(request(url, n, f"call {n}"))
                (response,) = read_responses(sock, 1)
                received = time.time()
                assert echoed(response) == (200, n, f"call {n}")
                assert _dated(response[1]["date"], sent, received), (response[1]["date"], sent, received)
                dates.append(response[1]["date"])
                time.sleep(1.5)
            assert len(set(dates)) == 3  # a new second each time, not the first one repeated
        sent = time.time()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as metrics:  # an ASGI route
            assert metrics.status == 200
            assert _dated(metrics.headers["date"], sent, time.time())
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        assert process.stderr is not None
        process.stderr.close()
