"""Hot reload: rewrite the config file of a running `mcpmux serve` (or send SIGHUP) and the catalog
follows; unchanged upstreams keep their process and their calls in flight; a bad file changes nothing."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client

from mcpmux import Mux
from mcpmux.core.config import config_from_dict, load_config
from mcpmux.mux.reload import ConfigReloader
from tests.e2e.conftest import PY, demo, free_port, gone, text_of, wait_for_port, write_config

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


def _serve_http(config: Path, port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [PY, "-m", "mcpmux", "serve", "--config", str(config), "--transport", "http", "--port", str(port)],
        stderr=subprocess.PIPE,
    )


def _ended(process: subprocess.Popen[bytes]) -> str:
    """SIGTERM, the exit code checked, stderr returned."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr.decode()
    return stderr.decode()


async def _pid(client: Client, upstream: str) -> int:
    return int(text_of(await client.call_tool(f"{upstream}__pid", {})))


async def _upstreams(client: Client) -> set[str]:
    return {tool.name.split("__")[0] for tool in (await client.list_tools()).tools if tool.name.endswith("__pid")}


async def test_rewritten_file_is_applied_without_touching_unchanged_upstreams(tmp_path: Path) -> None:
    servers = {"alpha": demo("alpha"), "beta": demo("beta"), "gamma": demo("gamma")}
    config = write_config(tmp_path / "mcp.json", servers, tool_search="off")  # every tool listed
    port = free_port()
    process = _serve_http(config, port)
    changed = anyio.Event()
    slow: dict[str, Any] = {}

    async def on_message(message: object) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    try:
        wait_for_port(port, process)
        async with Client(f"http://127.0.0.1:{port}/mcp", mode="legacy", message_handler=on_message) as client:
            assert await _upstreams(client) == {"alpha", "beta", "gamma"}
            pids = {name: await _pid(client, name) for name in servers}

            async def slow_call() -> None:
                slow["result"] = await client.call_tool("alpha__sleep", {"seconds": 6.0})

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(slow_call)
                await anyio.sleep(0.3)
                # alpha unchanged, beta changed (one more env var), gamma removed, delta added.
                beta = {**demo("beta"), "env": {"RELOADED": "1"}}
                write_config(config, {"alpha": demo("alpha"), "beta": beta, "delta": demo("delta")}, tool_search="off")
                with anyio.fail_after(10):
                    while not gone(pids["gamma"], timeout=0.01):
                        await anyio.sleep(0.05)
                reloading_while_in_flight = "result" not in slow
                with anyio.fail_after(20):
                    await changed.wait()
            assert await _upstreams(client) == {"alpha", "beta", "delta"}
            assert await _pid(client, "alpha") == pids["alpha"]
            assert await _pid(client, "beta") != pids["beta"]
            assert text_of(await client.call_tool("delta__echo", {"text": "new"})) == "delta: new"
        assert reloading_while_in_flight, "the reload did not stop gamma while the slow call was in flight"
        assert not slow["result"].is_error
        assert text_of(slow["result"]) == "slept 6.0"
        assert gone(pids["beta"])
    finally:
        stderr = _ended(process)
    assert "config reloaded from" in stderr
    assert "added delta; removed gamma; restarted beta" in stderr


async def test_invalid_file_keeps_the_running_config_and_sighup_reloads(tmp_path: Path) -> None:
    # reload = false: no watcher, so only SIGHUP reads the file (and the test knows when).
    config = write_config(tmp_path / "mcp.json", {"alpha": demo("alpha")}, reload=False)
    port = free_port()
    process = _serve_http(config, port)
    try:
        wait_for_port(port, process)
        async with Client(f"http://127.0.0.1:{port}/mcp", mode="legacy") as client:
            assert await _upstreams(client) == {"alpha"}  # serving the file: a SIGHUP from here reads it
            # A typo in mcpmux's own table (a client's own keys in a JSON file would be skipped).
            config.write_text(json.dumps({"mcpServers": {"alpha": demo("alpha")}, "mux": {"call_timout": 5}}))
            process.send_signal(signal.SIGHUP)
            await anyio.sleep(1.5)
            assert await _upstreams(client) == {"alpha"}
            assert text_of(await client.call_tool("alpha__echo", {"text": "still"})) == "alpha: still"

            write_config(config, {"alpha": demo("alpha"), "beta": demo("beta")}, reload=False)
            process.send_signal(signal.SIGHUP)
            with anyio.fail_after(20):
                while await _upstreams(client) != {"alpha", "beta"}:
                    await anyio.sleep(0.2)
            assert text_of(await client.call_tool("beta__echo", {"text": "hup"})) == "beta: hup"
    finally:
        stderr = _ended(process)
    assert f"config reload failed, keeping the running configuration: {config}: invalid configuration" in stderr
    assert "mux.call_timout: unknown key" in stderr
    assert "SIGHUP received: reloading" in stderr


async def test_mux_reload_in_process_reports_and_announces_once(tmp_path: Path) -> None:
    first = config_from_dict({"servers": {"alpha": demo("alpha"), "beta": demo("beta")}})
    async with Mux(first) as mux:
        announced: list[float] = []

        async def on_change() -> None:
            announced.append(time.monotonic())

        mux.on_catalog_changed(on_change)
        alpha, beta = mux.upstreams["alpha"], mux.upstreams["beta"]
        calls: dict[str, types.CallToolResult] = {}

        async def call(name: str) -> None:
            calls[name] = await mux.call_tool(f"{name}__sleep", {"seconds": 3.0})

        second = config_from_dict(
            {
                "servers": {"alpha": demo("alpha"), "gamma": demo("gamma")},
                "mux": {"call_timeout": 30, "page_size": 7},
                "http": {"port": 9999},
            }
        )
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(call, "alpha")
            tasks.start_soon(call, "beta")
            await anyio.sleep(0.3)
            report = await mux.reload(second)
        assert (report.added, report.removed, report.changed, report.unchanged) == (
            ("gamma",),
            ("beta",),
            (),
            ("alpha",),
        )
        assert report.applied == ("mux.call_timeout",)
        assert report.needs_restart == ("mux.page_size", "http.port")
        assert mux.upstreams["alpha"] is alpha
        assert "beta" not in mux.upstreams
        assert beta.state.value == "stopped"
        assert mux.config.mux.call_timeout == 30
        assert mux.config.mux.page_size == 500
        assert alpha.timeout == 30
        assert text_of(calls["alpha"]) == "slept 3.0"
        assert calls["beta"].is_error
        assert text_of(calls["beta"]) == "upstream 'beta' was removed by a config reload; the call was cancelled"
        assert len(announced) == 1
        assert {t.name for t in mux.list_tools()} >= {"alpha__echo", "gamma__echo"}
        assert not any(t.name.startswith("beta__") for t in mux.list_tools())
        assert text_of(await mux.call_tool("gamma__echo", {"text": "hi"})) == "gamma: hi"


async def test_watcher_reads_a_file_once_it_has_stopped_changing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_config(tmp_path / "mcp.json", {})
    async with Mux(load_config(path)) as mux, anyio.create_task_group() as tasks:
        reloader = ConfigReloader(mux, path, interval=0.5)
        tasks.start_soon(reloader.watch)
        full = json.dumps({"mcpServers": {}, "mux": {"call_timeout": 5}})
        await anyio.sleep(0.35)
        path.write_text(full[:20])  # an editor midway through writing, just before the first poll sees it
        await anyio.sleep(0.25)
        path.write_text(full)
        with anyio.fail_after(10):
            while mux.config.mux.call_timeout != 5:
                await anyio.sleep(0.05)
        await anyio.sleep(1.2)  # no second read of an unchanged file
        tasks.cancel_scope.cancel()
    assert "config reload failed" not in caplog.text
    assert caplog.text.count("config reloaded from") == 1
