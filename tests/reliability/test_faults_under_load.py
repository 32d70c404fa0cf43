"""Faults under load: while clients hammer mcpmux, upstreams are killed and restarted, one hangs, one is
slow, one writes garbage. Healthy upstreams answer every call; broken ones give the documented error
within their timeout; afterwards nothing is left behind (processes, descriptors, threads, tasks) and
memory is back near its baseline."""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import subprocess
import time
import uuid
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import pytest
from mcp import Client

from mcpmux.core.config import config_from_dict
from mcpmux.mux.multiplexer import Mux
from tests.e2e.conftest import PY, free_port, stop, text_of, wait_for_port
from tests.reliability.conftest import (
    FAULT,
    RUN_ENV,
    ProcStats,
    http_mux,
    http_server,
    pooled_sockets,
    proc_stats,
    stdio_upstream,
    tagged_env,
    tagged_pids,
    write_config,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

HEALTHY = ("alpha", "slow", "garbage")  # slow is the HTTP one: slow, but within its timeout
KILLED = ("flaky", "webflaky")
HANG_TIMEOUT = 1.0
FLAKY_TIMEOUT = 5.0
# The documented errors (README "Behaviour", mcpmux/upstream/supervisor.py) a call to a killed upstream may get.
DOWN = re.compile(
    r"^upstream '(flaky|webflaky)' (lost its connection during tool 'echo'|is (starting|down|restarting|failed)"
    r"|did not answer tool 'echo' within 5s)"
)
HUNG = re.compile(r"^upstream 'hang' did not answer tool 'echo' within 1s")
# After the load: descriptors and threads must come back to the baseline, allowing anyio's idle worker
# threads (they exit 10 s after their last job) a moment; RSS may stay up to this much above it, since
# CPython keeps freed arenas and the allocator's high-water mark (a per-call leak over thousands of
# calls would blow past it).
RSS_MARGIN_KIB = 48 * 1024
# Every call must end within its upstream's timeout; one still open this long was lost by mcpmux.
CLIENT_PATIENCE = 20.0


@dataclass(slots=True)
class Outcomes:
    """Every call's fate, by upstream."""

    right: dict[str, int] = field(default_factory=dict)
    errors: list[tuple[str, float, str]] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)

    def ok(self, upstream: str) -> None:
        self.right[upstream] = self.right.get(upstream, 0) + 1


def _port_of(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None, url
    return port


def _fault_servers(webflaky_url: str, slow_url: str) -> dict[str, dict[str, object]]:
    return {
        "alpha": stdio_upstream("alpha"),
        "flaky": {
            **stdio_upstream("flaky", FAULT, FAULT_MODE="exit", FAULT_EXIT_PROB="0.01"),
            "timeout": FLAKY_TIMEOUT,
        },
        "hang": {**stdio_upstream("hang", FAULT, FAULT_MODE="hang"), "timeout": HANG_TIMEOUT},
        "garbage": stdio_upstream("garbage", FAULT, FAULT_MODE="garbage"),
        "slow": {"url": slow_url, "timeout": 5},
        "webflaky": {"url": webflaky_url, "timeout": FLAKY_TIMEOUT},
    }


async def _call(client: Client, upstream: str, outcomes: Outcomes) -> None:
    token = uuid.uuid4().hex
    started = time.monotonic()
    with anyio.move_on_after(CLIENT_PATIENCE):
        result = await client.call_tool(f"{upstream}__echo", {"text": token})
    if time.monotonic() - started >= CLIENT_PATIENCE:
        outcomes.wrong.append(f"{upstream}: no answer at all within {CLIENT_PATIENCE}s")
        return
    elapsed, text = time.monotonic() - started, text_of(result)
    if not result.is_error and text == f"{upstream}: {token}":
        outcomes.ok(upstream)
    elif result.is_error:
        outcomes.errors.append((upstream, elapsed, text))
    else:
        outcomes.wrong.append(f"{upstream}: sent {token}, got {text!r}")


def _flaky_child(run_id: str) -> int | None:
    """The pid of the `flaky` stdio upstream mcpmux is running now."""
    for pid in tagged_pids(run_id):
        with suppress(OSError):
            if b"flaky" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                return pid
    return None


class WebFlaky:
    """The `webflaky` HTTP upstream on a fixed port, which the chaos task kills and starts again."""

    def __init__(self, run_id: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.command = [PY, str(FAULT), "webflaky", "http", str(self.port)]
        self.env = tagged_env(run_id)
        self.process = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.command, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    async def restart(self) -> None:
        self.process.kill()
        self.process.wait()
        self.process = self._start()
        await anyio.to_thread.run_sync(wait_for_port, self.port, self.process)

    def close(self) -> None:
        stop(self.process)


async def _chaos(run_id: str, webflaky: WebFlaky, stop_event: anyio.Event, kills: list[str]) -> None:
    """Until `stop_event`: every 0.3-1.5 s, SIGKILL the flaky stdio child, or restart the HTTP one."""
    rng = random.Random(7)
    while not stop_event.is_set():
        with anyio.move_on_after(rng.uniform(0.3, 1.5)):
            await stop_event.wait()
        if stop_event.is_set():
            return
        if rng.random() < 0.75:
            pid = _flaky_child(run_id)
            if pid is not None:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    kills.append(f"flaky {pid}")
        else:
            await webflaky.restart()
            kills.append("webflaky")


async def _settled(pid: int, baseline: ProcStats, timeout: float = 30) -> ProcStats:
    """The mux's stats once descriptors and threads are back at the baseline (or when `timeout` ends)."""
    deadline = time.monotonic() + timeout
    while True:
        now = proc_stats(pid)
        if (now.fds <= baseline.fds and now.threads <= baseline.threads) or time.monotonic() > deadline:
            return now
        await anyio.sleep(0.5)


async def _client_load(url: str, client: int, rounds: int, outcomes: Outcomes) -> None:
    """Rounds of one call to every upstream at once; `hang` only every fifth round (each costs a second)."""
    async with Client(url, mode="legacy" if client % 2 else "auto") as session:
        for round_index in range(rounds):
            upstreams = [*HEALTHY, *KILLED] + (["hang"] if round_index % 5 == client % 5 else [])
            async with anyio.create_task_group() as calls:
                for upstream in upstreams:
                    calls.start_soon(_call, session, upstream, outcomes)


async def test_faults_under_load_hurt_only_the_broken_upstreams_and_leave_nothing_behind(
    tmp_path: Path, run_id: str
) -> None:
    clients, rounds = 6, 8
    webflaky = WebFlaky(run_id)
    try:
        with http_server(FAULT, "slow", run_id, FAULT_MODE="slow", FAULT_DELAY="0.3") as slow:
            wait_for_port(webflaky.port, webflaky.process)
            config = write_config(tmp_path / "mux.json", _fault_servers(webflaky.url, slow.url))
            with http_mux(config, run_id, tmp_path / "mux.log") as mux:
                warmup = Outcomes()
                await _client_load(mux.url, 0, 2, warmup)  # every code path once before the baseline
                assert not warmup.wrong, warmup.wrong
                await anyio.sleep(1)
                baseline = proc_stats(mux.process.pid)

                outcomes, stop_event = Outcomes(), anyio.Event()
                kills: list[str] = []
                with anyio.fail_after(240):
                    async with anyio.create_task_group() as tasks:
                        tasks.start_soon(_chaos, run_id, webflaky, stop_event, kills)
                        async with anyio.create_task_group() as load:
                            for client in range(clients):
                                load.start_soon(_client_load, mux.url, client, rounds, outcomes)
                        stop_event.set()
                peak = proc_stats(mux.process.pid)

                # Both killed upstreams come back and answer again.
                with anyio.fail_after(30):
                    async with Client(mux.url) as session:
                        for upstream in KILLED:
                            while (await session.call_tool(f"{upstream}__echo", {"text": "back"})).is_error:
                                await anyio.sleep(0.2)
                after = await _settled(mux.process.pid, baseline)
                pooled = pooled_sockets(mux.process.pid, {webflaky.port, _port_of(slow.url)})
                mux_pid = mux.process.pid
            assert mux.process.returncode == 0, (tmp_path / "mux.log").read_text()[-2000:]
    finally:
        webflaky.close()

    assert not outcomes.wrong, f"answers with the wrong content: {outcomes.wrong[:3]}"
    for upstream in HEALTHY:
        assert outcomes.right.get(upstream) == clients * rounds, f"{upstream}: {outcomes.right.get(upstream)} right"
    for upstream, elapsed, text in outcomes.errors:
        if upstream == "hang":
            assert HUNG.match(text), text
            assert HANG_TIMEOUT * 0.9 < elapsed < HANG_TIMEOUT + 4, elapsed
        else:
            assert upstream in KILLED, f"{upstream}: {text}"
            assert DOWN.match(text), f"{upstream}: {text}"
            assert elapsed < FLAKY_TIMEOUT + 4, elapsed
    hung = [error for error in outcomes.errors if error[0] == "hang"]
    hang_calls = sum(1 for c in range(clients) for r in range(rounds) if r % 5 == c % 5)
    assert len(hung) == hang_calls, "every call to the hanging upstream got its timeout error"
    assert len([k for k in kills if k.startswith("flaky")]) >= 3, kills
    assert outcomes.right.get("flaky", 0) > 0, "the flaky upstream answered between its deaths"
    assert outcomes.right.get("webflaky", 0) > 0, "the webflaky upstream answered between its deaths"
    assert pooled <= 2 * 20, f"{pooled} sockets to the HTTP upstreams: more than two keep-alive pools hold"
    assert after.fds - pooled <= baseline.fds, (
        f"descriptors: {baseline.fds} before, {after.fds} after ({pooled} in HTTP keep-alive pools; peak {peak.fds})"
    )
    assert after.threads <= baseline.threads, f"threads: {baseline.threads} before, {after.threads} after"
    assert after.rss_kib <= baseline.rss_kib + RSS_MARGIN_KIB, f"RSS {baseline.rss_kib} -> {after.rss_kib} KiB"
    assert not tagged_pids(run_id), "mcpmux left processes behind"
    print(f"kills {len(kills)}, errors {len(outcomes.errors)}, mux {mux_pid}: {baseline} -> {peak} -> {after}")


async def test_in_process_mux_tasks_return_to_baseline_after_faults(run_id: str) -> None:
    """The same faults against an in-process Mux: after the storm its task count is back where it was,
    and closing it leaves no task, child or descriptor."""
    fds_before, tasks_before = len(os.listdir("/proc/self/fd")), asyncio.all_tasks()
    servers = {
        "alpha": stdio_upstream("alpha"),
        "flaky": stdio_upstream("flaky", FAULT, FAULT_MODE="exit", FAULT_EXIT_PROB="0.05", FAULT_SEED="3"),
        "hang": {**stdio_upstream("hang", FAULT, FAULT_MODE="hang"), "timeout": 0.5},
        "garbage": stdio_upstream("garbage", FAULT, FAULT_MODE="garbage"),
    }
    for server in servers.values():
        server["env"] = {**server["env"], RUN_ENV: run_id}  # the in-process Mux passes its own env on untagged
    config = config_from_dict({"servers": servers, "mux": {"startup_timeout": 30, "restart_initial_backoff": 0.1}})
    async with Mux(config) as mux:
        await mux.call_tool("alpha__echo", {"text": "warm"})
        baseline = len(asyncio.all_tasks())
        errors: list[str] = []

        async def one(i: int) -> None:
            upstream = "hang" if i % 20 == 0 else ("alpha", "flaky", "garbage")[i % 3]
            result = await mux.call_tool(f"{upstream}__echo", {"text": str(i)})
            if upstream in ("alpha", "garbage") and text_of(result) != f"{upstream}: {i}":
                errors.append(f"{upstream} {i}: {text_of(result)}")
            if upstream == "hang" and not text_of(result).startswith("upstream 'hang' did not answer"):
                errors.append(f"hang {i}: {text_of(result)}")

        limiter = anyio.CapacityLimiter(20)

        async def limited(i: int) -> None:
            async with limiter:
                await one(i)

        with anyio.fail_after(120):
            async with anyio.create_task_group() as calls:
                for i in range(400):
                    calls.start_soon(limited, i)
        assert not errors, errors[:3]
        with anyio.fail_after(10):
            while len(asyncio.all_tasks()) > baseline:
                await anyio.sleep(0.1)
    assert asyncio.all_tasks() - tasks_before == set()
    assert not tagged_pids(run_id)
    assert len(os.listdir("/proc/self/fd")) <= fds_before


async def test_invalid_utf8_from_an_upstream_costs_only_that_line(tmp_path: Path, run_id: str) -> None:
    servers = {
        "alpha": stdio_upstream("alpha"),
        "binary": {**stdio_upstream("binary", FAULT, FAULT_MODE="binary"), "timeout": 2},
    }
    config = write_config(tmp_path / "mux.json", servers)
    with http_mux(config, run_id, tmp_path / "mux.log") as mux:
        async with Client(mux.url) as session:
            outcomes = Outcomes()
            with anyio.fail_after(30):
                async with anyio.create_task_group() as calls:
                    for upstream in ("binary", "alpha", "binary", "alpha"):
                        calls.start_soon(_call, session, upstream, outcomes)
    assert not outcomes.wrong, outcomes.wrong
    assert outcomes.right == {"alpha": 2, "binary": 2}, outcomes.errors
