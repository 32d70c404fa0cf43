"""Graceful shutdown of `mcpmux serve`: SIGTERM lets calls in flight finish within `[mux] shutdown_grace`,
cancels the rest with an error the client sees, ends the children and exits 0."""

from __future__ import annotations

import json
import queue
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Any

import anyio
import pytest
from mcp import Client

from tests.e2e.conftest import PY, demo, free_port, gone, text_of, wait_for_port, write_config

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SHUTDOWN = "mcpmux is shutting down: the call was cancelled after the 2 s grace period"


def _serve(config: Path, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [PY, "-m", "mcpmux", "serve", "--config", str(config), *extra],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _refused(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


async def test_sigterm_over_http_finishes_short_calls_and_cancels_long_ones(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.json", {"alpha": demo("alpha")}, shutdown_grace=2)
    port = free_port()
    process = _serve(config, "--transport", "http", "--port", str(port))
    results: dict[str, Any] = {}
    try:
        wait_for_port(port, process)
        # A 2025 client holds a session (and its SSE stream) open across the shutdown.
        async with Client(f"http://127.0.0.1:{port}/mcp", mode="legacy") as client:
            pid = int(text_of(await client.call_tool("alpha__pid", {})))

            async def call(key: str, seconds: float) -> None:
                results[key] = await client.call_tool("alpha__sleep", {"seconds": seconds})

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(call, "short", 1.0)
                tasks.start_soon(call, "long", 60.0)
                await anyio.sleep(0.5)
                process.send_signal(signal.SIGTERM)
                signalled = time.monotonic()
                await anyio.sleep(0.5)
                refused = _refused(port)
                with anyio.fail_after(15):
                    while len(results) < 2:
                        await anyio.sleep(0.05)
    finally:
        code = process.wait(timeout=30)
        exited = time.monotonic() - signalled
        _, stderr = process.communicate()
    assert code == 0, stderr.decode()
    assert refused, "a new connection was accepted after SIGTERM"
    assert exited < 2 + 6, f"exit took {exited:.1f}s with a 2 s grace"
    assert not results["short"].is_error
    assert text_of(results["short"]) == "slept 1.0"
    assert results["long"].is_error
    assert text_of(results["long"]) == SHUTDOWN
    assert gone(pid)


class _StdioClient:
    """Raw JSON-RPC lines to `mcpmux serve` over stdio, so the test owns the process and its exit code."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self.answers: queue.Queue[dict[str, Any]] = queue.Queue()
        assert process.stdout is not None
        threading.Thread(target=self._read, args=(process.stdout,), daemon=True).start()

        info = {"name": "raw", "version": "0"}
        self.send("initialize", {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": info}, 1)
        self.collect(1, timeout=30)
        self.send("notifications/initialized", {})
        self.send("tools/list", {}, 1)  # answered once the upstreams have connected (see write_config)
        self.collect(1, timeout=90)

    def _read(self, stdout: IO[bytes]) -> None:
        for line in stdout:
            message = json.loads(line)
            if "id" in message:
                self.answers.put(message)

    def send(self, method: str, params: dict[str, Any], id: int | None = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
        if id is not None:
            message["id"] = id
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message).encode() + b"\n")
        self.process.stdin.flush()

    def call(self, id: int, tool: str, arguments: dict[str, Any]) -> None:
        self.send("tools/call", {"name": tool, "arguments": arguments}, id)

    def upstream_pid(self) -> int:
        """The pid of the `alpha` demo upstream (asked with request id 2)."""
        self.call(2, "alpha__pid", {})
        return int(_text(self.collect(1, timeout=30)[2]))

    def collect(self, count: int, timeout: float) -> dict[int, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        got: dict[int, dict[str, Any]] = {}
        while len(got) < count:
            message = self.answers.get(timeout=max(0.01, deadline - time.monotonic()))
            got[message["id"]] = message
        return got


def _text(answer: dict[str, Any]) -> str:
    return "".join(block.get("text", "") for block in answer["result"]["content"])


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "sdk-path"])
def test_sigterm_over_stdio_drains_refuses_new_calls_and_exits_0(tmp_path: Path, fast_path: bool) -> None:
    config = write_config(tmp_path / "c.json", {"alpha": demo("alpha")}, shutdown_grace=2, fast_path=fast_path)
    process = _serve(config)
    try:
        client = _StdioClient(process)
        pid = client.upstream_pid()
        client.call(3, "alpha__sleep", {"seconds": 1.0})
        client.call(4, "alpha__sleep", {"seconds": 60.0})
        time.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        time.sleep(0.3)
        client.call(5, "alpha__echo", {"text": "too late"})
        answers = client.collect(3, timeout=15)
        code = process.wait(timeout=15)
        exited = time.monotonic() - signalled
    finally:
        if process.poll() is None:
            process.kill()
        _, stderr = process.communicate()
    assert code == 0, stderr.decode()
    assert exited < 2 + 6
    assert _text(answers[3]) == "slept 1.0"
    assert not answers[3]["result"].get("isError")
    assert answers[4]["result"]["isError"]
    assert _text(answers[4]) == SHUTDOWN
    assert answers[5]["result"]["isError"]
    assert _text(answers[5]) == "mcpmux is shutting down and accepts no new calls"
    assert b"SIGTERM received: shutting down" in stderr
    assert gone(pid)


def test_a_second_sigint_skips_the_rest_of_the_grace(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.json", {"alpha": demo("alpha")}, shutdown_grace=60)
    process = _serve(config)
    try:
        client = _StdioClient(process)
        client.call(2, "alpha__sleep", {"seconds": 60.0})
        time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        second = time.monotonic()
        answer = client.collect(1, timeout=15)[2]
        code = process.wait(timeout=15)
        exited = time.monotonic() - second
    finally:
        if process.poll() is None:
            process.kill()
        _, stderr = process.communicate()
    assert code == 0, stderr.decode()
    assert exited < 6, f"exit took {exited:.1f}s after the second SIGINT"
    assert answer["result"]["isError"]
    cut_short = "mcpmux is shutting down: the call was cancelled (a second signal cut the grace period short)"
    assert _text(answer) == cut_short
    assert b"SIGINT received: skipping the rest of the grace period" in stderr


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "sdk-path"])
def test_stdin_closing_with_a_call_in_flight_ends_mcpmux_at_once(tmp_path: Path, fast_path: bool) -> None:
    """The client went away: its calls are cancelled, not waited for (the grace is for signals)."""
    config = write_config(tmp_path / "c.json", {"alpha": demo("alpha")}, shutdown_grace=30, fast_path=fast_path)
    process = _serve(config)
    try:
        client = _StdioClient(process)
        pid = client.upstream_pid()
        client.call(3, "alpha__sleep", {"seconds": 60.0})
        time.sleep(0.5)
        assert process.stdin is not None
        process.stdin.close()
        process.stdin = None  # closed: `communicate` below must not flush it
        closed = time.monotonic()
        code = process.wait(timeout=40)
        exited = time.monotonic() - closed
    finally:
        if process.poll() is None:
            process.kill()
        _, stderr = process.communicate()
    assert code == 0, stderr.decode()
    assert exited < 6, f"exit took {exited:.1f}s after stdin closed"
    assert b" WARNING " not in stderr, stderr.decode()  # nothing in flight broke on the way out
    assert b" ERROR " not in stderr, stderr.decode()
    assert gone(pid)


STUBBORN = Path(__file__).resolve().parents[1] / "servers" / "stubborn_server.py"


def _stubborn(term: str) -> dict[str, Any]:
    """A server that outlives its stdin closing (as server-pdf does); `term="ignore"`: SIGTERM too."""
    return {"command": PY, "args": [str(STUBBORN)], "env": {"STUBBORN_TERM": term}}


def _sigterm(process: subprocess.Popen[bytes], child: int) -> tuple[bool, int]:
    """SIGTERM to mcpmux: whether its `child` was gone within 1.8 s (a TypeScript SDK client SIGKILLs
    mcpmux 2 s after its SIGTERM), and mcpmux's exit code."""
    process.send_signal(signal.SIGTERM)
    return gone(child, timeout=1.8), process.wait(timeout=30)


def _close_stdin(process: subprocess.Popen[bytes]) -> None:
    assert process.stdin is not None
    process.stdin.close()
    process.stdin = None  # closed: `communicate` must not flush it


@pytest.mark.parametrize("term", ["", "ignore"], ids=["ends-on-sigterm", "ignores-sigterm"])
def test_a_child_that_ignores_stdin_closing_is_terminated_then_killed(tmp_path: Path, term: str) -> None:
    config = write_config(tmp_path / "c.json", {"alpha": _stubborn(term)})
    process = _serve(config)
    try:
        pid = _StdioClient(process).upstream_pid()
        _close_stdin(process)
        code = process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
        _, stderr = process.communicate()
    assert code == 0, stderr.decode()
    assert gone(pid, timeout=0.5), "mcpmux exited with its child still running"


@pytest.mark.parametrize("term", ["", "ignore"], ids=["ends-on-sigterm", "ignores-sigterm"])
def test_sigterm_while_stopping_after_stdin_closed_ends_the_children_at_once(tmp_path: Path, term: str) -> None:
    """The TypeScript SDK's way to end a server: stdin closed, SIGTERM 2 s later, SIGKILL 2 s after
    that. mcpmux is still waiting for a child that ignores its stdin closing when the SIGTERM comes:
    the child must be gone before the SIGKILL would leave it running with no parent. (The signal
    comes a little sooner here than the SDK's, so that it never races mcpmux's own 2 s.)"""
    config = write_config(tmp_path / "c.json", {"alpha": _stubborn(term)})
    process = _serve(config)
    try:
        pid = _StdioClient(process).upstream_pid()
        _close_stdin(process)
        time.sleep(1.5)  # inside mcpmux's own 2 s wait for the child to exit on its stdin closing
        child_gone, code = _sigterm(process, pid)
    finally:
        if process.poll() is None:
            process.kill()
        _, stderr = process.communicate()
    assert child_gone, "the child outlived the client's 2 s between SIGTERM and SIGKILL"
    assert code == 0, stderr.decode()
    assert b"SIGTERM received while stopping: upstream processes end now" in stderr


async def test_a_second_sigterm_over_http_ends_a_stubborn_child_at_once(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.json", {"alpha": _stubborn("ignore")})
    port = free_port()
    process = _serve(config, "--transport", "http", "--port", str(port))
    try:
        wait_for_port(port, process)
        async with Client(f"http://127.0.0.1:{port}/mcp") as client:
            pid = int(text_of(await client.call_tool("alpha__pid", {})))
        process.send_signal(signal.SIGTERM)
        await anyio.sleep(1.0)  # nothing in flight: mcpmux is stopping its upstreams, waiting on this one
        child_gone, code = _sigterm(process, pid)
    finally:
        if process.poll() is None:
            process.kill()
        _, stderr = process.communicate()
    assert child_gone, "the child outlived the second SIGTERM by more than the hurry grace"
    assert code == 0, stderr.decode()


def test_a_child_that_ignores_every_signal_but_sigkill_dies_with_a_killed_mcpmux(tmp_path: Path) -> None:
    """SIGKILL gives mcpmux no time to end anything: the kernel ends its children (Linux)."""
    config = write_config(tmp_path / "c.json", {"alpha": _stubborn("ignore")})
    process = _serve(config)
    try:
        pid = _StdioClient(process).upstream_pid()
        process.kill()
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()
    assert gone(pid, timeout=5), "the child outlived a SIGKILLed mcpmux"
