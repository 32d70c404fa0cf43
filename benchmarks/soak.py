"""Soak: mcpmux over HTTP under steady load for N minutes while an upstream is killed at random.

    python benchmarks/soak.py --minutes 5 [--clients 8] [--lanes 2] [--kill-every 3]

Setup: `mcpmux serve --transport http` with three upstreams: `alpha` (tests/servers/demo_server.py
over stdio), `web` (the demo server over streamable HTTP) and `flaky` (tests/servers/fault_server.py
over stdio, which exits on its own now and then and is SIGKILLed by this script every ~`--kill-every`
seconds). `--clients` real MCP clients (both protocol eras) each keep `--lanes` echo calls in flight,
every call carrying a unique token that the answer must repeat.

Prints a table and writes `benchmarks/results/soak.json`: requests served, errors by kind, p50/p99
latency, restarts of `flaky` survived, leaked processes / descriptors / threads (must be 0; the
HTTP client's keep-alive connections to `web`, a bounded pool, are counted apart), peak RSS
of the mcpmux process. Every process started here carries MCPMUX_SOAK_RUN=<id> in its environment;
any still alive after mcpmux exits is a leak (reported, then killed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))  # run as a script: the repository's packages come first

from tests.reliability.conftest import pooled_sockets  # noqa: E402

DEMO = ROOT / "tests" / "servers" / "demo_server.py"
FAULT = ROOT / "tests" / "servers" / "fault_server.py"
RUN_ID = uuid.uuid4().hex[:12]
TAG = "MCPMUX_SOAK_RUN"
UPSTREAMS = ("alpha", "web", "flaky")
ERROR_KINDS = [
    ("connection lost", re.compile(r"lost its connection")),
    ("upstream down", re.compile(r"^upstream '\w+' is (starting|down|restarting|failed)")),
    ("timeout", re.compile(r"did not answer .* within")),
]


@dataclass(slots=True)
class Tally:
    """Everything the clients saw."""

    ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    errors_by_upstream: Counter[str] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)


@dataclass(slots=True)
class Report:
    """The figures written to JSON."""

    minutes: float
    clients: int
    lanes: int
    requests: int
    served_ok: int
    errors_by_kind: dict[str, int]
    errors_by_upstream: dict[str, int]
    calls_per_s: float
    p50_ms: float
    p99_ms: float
    kills: int
    restarts_survived: int
    leaked_processes: int
    leaked_fds: int
    leaked_threads: int
    baseline_rss_mib: float
    end_rss_mib: float
    peak_rss_mib: float
    fds_before_after: dict[str, dict[str, int]]
    upstream_pool_before_after: tuple[int, int]
    """Keep-alive connections to the HTTP upstream: a bounded pool, so not counted as leaked descriptors."""
    meta: dict[str, Any]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, TAG: RUN_ID, **extra}


def _tagged() -> list[int]:
    marker = f"{TAG}={RUN_ID}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
                    if state != "Z":
                        found.append(int(entry.name))
    return found


def _flaky_pids() -> list[int]:
    pids = []
    for pid in _tagged():
        with contextlib.suppress(OSError):
            if b"flaky" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                pids.append(pid)
    return pids


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, value in (line.split(":", 1) for line in lines if ":" in line)}


def _holdings(pid: int) -> tuple[int, int, float]:
    """Open descriptors, threads, RSS in MiB."""
    status = _status(pid)
    return len(os.listdir(f"/proc/{pid}/fd")), int(status["Threads"]), int(status["VmRSS"].split()[0]) / 1024


def _fd_kinds(pid: int) -> dict[str, int]:
    """Open descriptors by kind (socket, pipe, anon_inode, file), to say what leaked."""
    kinds: Counter[str] = Counter()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            kinds[target.split(":")[0] if ":" in target else "file"] += 1
    return dict(kinds)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_port(port: int, process: subprocess.Popen[bytes], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode} before listening on {port}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listened on port {port} within {timeout}s")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def _lane(session: Client, lane: int, until: float, tally: Tally) -> None:
    n = 0
    while time.monotonic() < until:
        upstream = UPSTREAMS[(lane + n) % len(UPSTREAMS)]
        n += 1
        token = uuid.uuid4().hex
        started = time.perf_counter()
        try:
            result = await session.call_tool(f"{upstream}__echo", {"text": token})
        except Exception as err:  # a protocol-level failure is a finding to count, not to stop the soak on
            tally.errors[f"exception {type(err).__name__}"] += 1
            tally.errors_by_upstream[upstream] += 1
            continue
        tally.latencies_ms.append((time.perf_counter() - started) * 1000)
        text = "".join(getattr(block, "text", "") for block in result.content)
        if not result.is_error and text == f"{upstream}: {token}":
            tally.ok += 1
            continue
        kind = (
            "wrong answer"
            if not result.is_error
            else next((name for name, pattern in ERROR_KINDS if pattern.search(text)), "other error")
        )
        tally.errors[kind] += 1
        tally.errors_by_upstream[upstream] += 1


async def _client(url: str, index: int, lanes: int, until: float, tally: Tally) -> None:
    async with Client(url, mode="legacy" if index % 2 else "auto") as session, anyio.create_task_group() as tasks:
        for lane in range(lanes):
            tasks.start_soon(_lane, session, index * lanes + lane, until, tally)


async def _chaos(until: float, kill_every: float, seen: set[int]) -> int:
    """SIGKILL the flaky upstream's process at random; note every flaky pid ever seen. Returns kills."""
    rng, kills = random.Random(RUN_ID), 0
    next_kill = time.monotonic() + rng.uniform(0.5, 1.5) * kill_every
    while time.monotonic() < until:
        pids = _flaky_pids()
        seen.update(pids)
        if time.monotonic() >= next_kill and pids:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            kills += 1
            next_kill = time.monotonic() + rng.uniform(0.5, 1.5) * kill_every
        await anyio.sleep(0.1)
    return kills


async def _soak(args: argparse.Namespace, url: str, mux: subprocess.Popen[bytes], web_port: int) -> Report:
    # Warm up at full concurrency, so connection pools (e.g. to the HTTP upstream) are at their steady
    # size before the baseline: a pool is bounded, a leak grows with time and kills.
    warm, warm_until = Tally(), time.monotonic() + 5
    async with anyio.create_task_group() as tasks:
        for index in range(args.clients):
            tasks.start_soon(_client, url, index, args.lanes, warm_until, warm)
    await anyio.sleep(1)
    base_fds, base_threads, base_rss = _holdings(mux.pid)
    base_pool = pooled_sockets(mux.pid, {web_port})
    base_fds -= base_pool
    base_kinds = _fd_kinds(mux.pid)
    tally, seen = Tally(), set(_flaky_pids())
    started = time.monotonic()
    until = started + args.minutes * 60
    kills = 0

    async def chaos() -> None:
        nonlocal kills
        kills = await _chaos(until, args.kill_every, seen)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(chaos)
        for index in range(args.clients):
            tasks.start_soon(_client, url, index, args.lanes, until, tally)
    elapsed = time.monotonic() - started
    # flaky must answer again after the last kill; then descriptors and threads must settle back.
    with anyio.fail_after(60):
        async with Client(url) as session:
            while (await session.call_tool("flaky__echo", {"text": "back"})).is_error:
                await anyio.sleep(0.2)
    seen.update(_flaky_pids())
    deadline = time.monotonic() + 20
    while True:
        fds, threads, rss = _holdings(mux.pid)
        pool = pooled_sockets(mux.pid, {web_port})
        fds -= pool
        if (fds <= base_fds and threads <= base_threads) or time.monotonic() > deadline:
            break
        await anyio.sleep(0.5)
    peak = int(_status(mux.pid)["VmHWM"].split()[0]) / 1024
    latencies = sorted(tally.latencies_ms) or [0.0]
    requests = tally.ok + sum(tally.errors.values())
    return Report(
        minutes=args.minutes,
        clients=args.clients,
        lanes=args.lanes,
        requests=requests,
        served_ok=tally.ok,
        errors_by_kind=dict(tally.errors),
        errors_by_upstream=dict(tally.errors_by_upstream),
        calls_per_s=round(requests / elapsed, 1),
        p50_ms=round(statistics.median(latencies), 2),
        p99_ms=round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 2),
        kills=kills,
        restarts_survived=max(0, len(seen) - 1),
        leaked_processes=0,
        leaked_fds=max(0, fds - base_fds),
        leaked_threads=max(0, threads - base_threads),
        baseline_rss_mib=round(base_rss, 1),
        end_rss_mib=round(rss, 1),
        peak_rss_mib=round(peak, 1),
        fds_before_after={"before": base_kinds, "after": _fd_kinds(mux.pid)},
        upstream_pool_before_after=(base_pool, pool),
        meta={"python": platform.python_version(), "cpus": os.cpu_count(), "machine": platform.machine()},
    )


def run(args: argparse.Namespace, workdir: Path) -> Report:
    web_port, mux_port = _free_port(), _free_port()
    web = subprocess.Popen(
        [sys.executable, str(DEMO), "web", "http", str(web_port)],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    mux: subprocess.Popen[bytes] | None = None
    try:
        _wait_port(web_port, web)
        flaky = {"FAULT_MODE": "exit", "FAULT_EXIT_PROB": "0.002"}
        config = {
            "mcpServers": {
                "alpha": {"command": sys.executable, "args": [str(DEMO), "alpha"]},
                "web": {"url": f"http://127.0.0.1:{web_port}/mcp"},
                "flaky": {"command": sys.executable, "args": [str(FAULT), "flaky"], "env": flaky, "timeout": 5},
            },
            "mux": {"restart_initial_backoff": 0.1, "restart_max_backoff": 1.0},
        }
        (workdir / "soak.json").write_text(json.dumps(config))
        command = [sys.executable, "-m", "mcpmux", "serve", "--config", str(workdir / "soak.json")]
        with (workdir / "mux.log").open("wb") as log:
            mux = subprocess.Popen(
                [*command, "--transport", "http", "--port", str(mux_port)], env=_env(), stderr=log, cwd=ROOT
            )
        _wait_port(mux_port, mux)
        report = anyio.run(_soak, args, f"http://127.0.0.1:{mux_port}/mcp", mux, web_port)
        _stop(mux)
        if mux.returncode != 0:
            print(f"mcpmux exited with {mux.returncode}; its log: {workdir / 'mux.log'}", file=sys.stderr)
    finally:
        if mux is not None:
            _stop(mux)
        _stop(web)
        leaked = _tagged()
        for pid in leaked:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    report.leaked_processes = len(leaked)
    return report


def _print(report: Report) -> None:
    rows = [
        ("duration", f"{report.minutes:g} min, {report.clients} clients x {report.lanes} in flight"),
        ("requests", f"{report.requests} ({report.calls_per_s} calls/s)"),
        ("served right", str(report.served_ok)),
        ("errors by kind", json.dumps(report.errors_by_kind) or "{}"),
        ("errors by upstream", json.dumps(report.errors_by_upstream) or "{}"),
        ("latency p50 / p99", f"{report.p50_ms} ms / {report.p99_ms} ms"),
        ("kills / restarts survived", f"{report.kills} / {report.restarts_survived}"),
        ("leaked processes/fds/threads", f"{report.leaked_processes} / {report.leaked_fds} / {report.leaked_threads}"),
        ("pool to `web` before/after", " / ".join(map(str, report.upstream_pool_before_after))),
        ("RSS baseline / end / peak", f"{report.baseline_rss_mib} / {report.end_rss_mib} / {report.peak_rss_mib} MiB"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--lanes", type=int, default=2, help="calls each client keeps in flight")
    parser.add_argument("--kill-every", type=float, default=3.0, help="mean seconds between kills of flaky")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "soak.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mcpmux-soak-") as workdir:
        report = run(args, Path(workdir))
    _print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(asdict(report), indent=2))
    print(f"wrote {args.out}")
    leaks = report.leaked_processes + report.leaked_fds + report.leaked_threads
    return 1 if leaks or report.errors_by_kind.get("wrong answer") else 0


if __name__ == "__main__":
    sys.exit(main())
