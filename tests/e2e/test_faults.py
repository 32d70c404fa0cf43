"""Broken upstreams: each fault gives its documented error and mcpmux keeps serving the rest."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import anyio
import pytest

from mcpmux.core.config import config_from_dict
from mcpmux.mux.multiplexer import Mux
from mcpmux.upstream.supervisor import UpstreamState
from tests.e2e.conftest import DEMO, PY, alive, demo, free_port, stop, text_of, wait_for_port

pytestmark = pytest.mark.anyio


def _mux(servers: dict[str, dict[str, object]], **mux: object) -> Mux:
    return Mux(config_from_dict({"servers": servers, "mux": {"startup_timeout": 20, **mux}}))


async def _wait_ready(mux: Mux, name: str, timeout: float = 20) -> None:
    with anyio.fail_after(timeout):
        while mux.upstreams[name].state != UpstreamState.READY:
            await anyio.sleep(0.05)


async def test_crash_mid_call_fails_that_call_and_the_upstream_comes_back() -> None:
    async with _mux({"alpha": demo("alpha"), "beta": demo("beta")}) as mux:
        first_pid = int(text_of(await mux.call_tool("alpha__pid")))
        crashed = await mux.call_tool("alpha__crash")
        assert crashed.is_error
        assert "upstream 'alpha' lost its connection during tool 'crash'" in text_of(crashed)
        # While it is down: fail fast with a clear error, tools still listed, the other upstream unaffected.
        assert "alpha__echo" in {tool.name for tool in mux.list_tools()}
        assert text_of(await mux.call_tool("beta__echo", {"text": "still here"})) == "beta: still here"
        started = time.monotonic()
        down = await mux.call_tool("alpha__echo", {"text": "x"})
        if down.is_error:
            assert "upstream 'alpha' is" in text_of(down)
            assert time.monotonic() - started < 1.0
        await _wait_ready(mux, "alpha")
        assert text_of(await mux.call_tool("alpha__echo", {"text": "back"})) == "alpha: back"
        assert int(text_of(await mux.call_tool("alpha__pid"))) != first_pid
        assert mux.upstreams["alpha"].status().restarts >= 1


async def test_hanging_upstream_times_out_with_a_message_naming_it() -> None:
    async with _mux({"slow": {**demo("slow"), "timeout": 1}, "beta": demo("beta")}) as mux:
        started = time.monotonic()
        result = await mux.call_tool("slow__sleep", {"seconds": 30})
        elapsed = time.monotonic() - started
        assert result.is_error
        assert text_of(result).startswith("upstream 'slow' did not answer tool 'sleep' within 1s")
        assert 0.9 < elapsed < 5
        assert text_of(await mux.call_tool("beta__add", {"a": 1, "b": 1})) == "2"
        # The timed-out request was cancelled upstream, and the upstream still serves.
        with anyio.fail_after(10):
            while text_of(await mux.call_tool("slow__count", {"tool": "sleep_cancelled"})) != "1":
                await anyio.sleep(0.1)


async def test_garbage_on_stdout_does_not_break_the_session() -> None:
    async with _mux({"alpha": demo("alpha")}) as mux:
        assert text_of(await mux.call_tool("alpha__garbage")) == "after garbage"
        assert text_of(await mux.call_tool("alpha__echo", {"text": "ok"})) == "alpha: ok"


async def test_missing_command_and_unreachable_url_do_not_stop_the_others() -> None:
    servers = {
        "ghost": {"command": "mcpmux-no-such-command"},
        "offline": {"url": f"http://127.0.0.1:{free_port()}/mcp"},
        "beta": demo("beta"),
    }
    started = time.monotonic()
    async with _mux(servers) as mux:
        assert time.monotonic() - started < 15  # the broken ones did not hold up startup
        status = {s.name: s for s in mux.status()}
        assert status["beta"].state == UpstreamState.READY
        assert status["ghost"].state == UpstreamState.DOWN
        assert "cannot run command 'mcpmux-no-such-command'" in (status["ghost"].last_error or "")
        assert status["offline"].state == UpstreamState.DOWN
        assert "connect" in (status["offline"].last_error or "").lower()
        assert text_of(await mux.call_tool("beta__echo", {"text": "fine"})) == "beta: fine"
        upstream_tools = [tool.name for tool in mux.list_tools() if tool.name not in mux.local_tools]
        assert {name.split("__")[0] for name in upstream_tools} == {"beta"}


async def test_expired_http_session_is_reinitialized_transparently() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    command = [PY, str(DEMO), "web", "http", str(port)]
    server = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, server)
        async with _mux({"web": {"url": url, "protocol": "legacy"}}) as mux:
            assert mux.upstreams["web"].status().protocol_version == "2025-11-25"
            first_pid = int(text_of(await mux.call_tool("web__pid")))
            # The server restarts and forgets every session: the next call meets a 404 ...
            stop(server)
            server = subprocess.Popen(command, stderr=subprocess.DEVNULL)
            wait_for_port(port, server)
            # ... which mcpmux answers by initializing a new session and sending the call again.
            result = await mux.call_tool("web__pid")
            assert not result.is_error, text_of(result)
            assert int(text_of(result)) == server.pid != first_pid
            assert text_of(await mux.call_tool("web__echo", {"text": "again"})) == "web: again"
    finally:
        stop(server)


async def test_closing_the_mux_ends_children_tasks_and_files() -> None:
    fds_before = len(os.listdir("/proc/self/fd"))
    tasks_before = asyncio.all_tasks()
    async with _mux({"alpha": demo("alpha"), "beta": demo("beta")}) as mux:
        pids = [int(text_of(await mux.call_tool(f"{name}__pid"))) for name in ("alpha", "beta")]
        assert all(alive(pid) for pid in pids)
    assert not any(alive(pid) for pid in pids)
    assert asyncio.all_tasks() - tasks_before == set()
    assert len(os.listdir("/proc/self/fd")) <= fds_before


def _group(leader: int) -> list[int]:
    """The live processes in `leader`'s process group."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().split(")")[-1].split()
            except OSError:
                continue  # exited meanwhile
            if int(fields[2]) == leader and fields[0] != "Z":
                members.append(int(entry.name))
    return members


async def test_closing_the_mux_also_ends_what_a_stdio_upstream_left_running() -> None:
    # Launched through a shell that leaves a helper behind, as wrapper scripts and launchers do.
    launcher = {"command": "sh", "args": ["-c", f'sleep 300 & exec "{PY}" "{DEMO}" alpha']}
    async with _mux({"alpha": launcher}) as mux:
        leader = int(text_of(await mux.call_tool("alpha__pid")))
        group = _group(leader)
        assert len(group) == 2, group  # the server and the helper it left running
    assert not any(alive(pid) for pid in group)


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
async def test_http_upstream_that_goes_away_gives_a_clear_error_and_comes_back(protocol: str) -> None:
    port = free_port()
    command = [PY, str(DEMO), "web", "http", str(port)]
    server = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, server)
        servers = {"web": {"url": f"http://127.0.0.1:{port}/mcp", "protocol": protocol, "timeout": 5}}
        async with _mux(servers) as mux:
            assert text_of(await mux.call_tool("web__echo", {"text": "up"})) == "web: up"
            stop(server)
            started = time.monotonic()
            down = await mux.call_tool("web__echo", {"text": "down"})
            assert down.is_error
            assert "upstream 'web'" in text_of(down)
            assert time.monotonic() - started < 6
            server = subprocess.Popen(command, stderr=subprocess.DEVNULL)
            wait_for_port(port, server)
            with anyio.fail_after(30):
                while (result := await mux.call_tool("web__echo", {"text": "back"})).is_error:
                    await anyio.sleep(0.2)
            assert text_of(result) == "web: back"
    finally:
        stop(server)
