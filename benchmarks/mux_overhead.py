"""What a multiplexer costs per call: echo tools direct to an upstream vs through mcpmux and its peers.

    .venv/bin/python benchmarks/mux_overhead.py            # full run (stdio, HTTP, HTTP under the raw driver)
    .venv/bin/python benchmarks/mux_overhead.py --quick    # fewer calls, for a smoke run
    .venv/bin/python benchmarks/mux_overhead.py --tree ../head  # mcpmux run from another source tree
    .venv/bin/python benchmarks/mux_overhead.py --floor    # also a do-nothing relay in the middle, for reference
    .venv/bin/python benchmarks/mux_overhead.py --sdk-path # also mcpmux with `[mux] fast_path = false`
    .venv/bin/python benchmarks/mux_overhead.py --idle-per-client 0  # mcpmux retiring no idle connection
    .venv/bin/python benchmarks/mux_overhead.py --base ../base  # also mcpmux from another tree (A/B in one run)
    .venv/bin/python benchmarks/mux_overhead.py --driver raw    # HTTP under the raw driver only
    .venv/bin/python benchmarks/mux_overhead.py --pin-client    # the client on a core of its own

Each route reaches its own echo upstream (`benchmarks/echo_upstream.py`, one process per route):

- `direct`: the upstream itself;
- `mcpmux`: `mcpmux serve` in front of it, configured with `[servers.echo.cache] allow = ["echo_cached"]`;
- stdio peers: `callmux` (`callmux -- CMD`) and `callmux-c64` (`callmux --concurrency 64 -- CMD`);
- HTTP peer: `mcp-proxy` (`mcp-proxy --port P -- CMD`: the upstream on stdio, HTTP in front).

The peers are installed on first use into the git-ignored `benchmarks/.peers/` (`peers.py`); one
that cannot be installed is left out with a message, and `--no-peers` leaves both out. They run
with their defaults: no cache.

The run has up to three sections, each with processes of its own: `stdio` and `http` under a real
`mcp.Client` per route, and `http-raw` under a raw keep-alive HTTP/1.1 driver (`drivers.py`, one
connection per caller), which costs a tenth of the client per call, so the servers' side is what
is timed: on 2 cores, 64 callers make `mcp.Client` a saturated core, and any process in the
middle takes CPU from it. `--driver client` or `--driver raw` keeps one of the two.

In each section, for each tool kind, the routes are timed interleaved:

- `plain`: the upstream's `echo` tool, no annotations;
- `readonly`: `echo_ro`, annotated `readOnlyHint: true, idempotentHint: true`;
- `cached`: `echo_cached`, which mcpmux's config allows into its result cache.

Every call's text is new (this run's id and a counter): a read-only idempotent tool may share one
flight between identical concurrent calls and a cached one may answer from the cache, and either
would fake throughput. So `cached` times a cache miss every call: what the cache's bookkeeping
costs on the way to the upstream, not a cache hit.

For N = 1 and 64 concurrent callers (`--concurrency`; 16 too if asked) each route makes a fixed
number of calls: one warm-up pass (discarded), then `--repeats` passes with the routes' order
rotating, medians reported. Then each route takes bursts of 64 concurrent calls whose tool sleeps
50 ms upstream, and the burst's wall time is reported (a middle that queues calls shows there).
The verdicts (`overhead_report.py`): mcpmux's p50 at N=1 ≤ 1.3× direct, its calls/s at N=64 ≥
0.85× direct, each ahead of every peer in the section, and the burst ≤ 1.2× direct.

- `--tree DIR`: the `mcpmux` route runs from the source tree DIR (a `git worktree` of a commit,
  say) instead of the installed package, so a run is tied to a commit while the checkout changes.
- `--sdk-path`: a second mcpmux (route `sdk`) with the raw `tools/call` fast path turned off, so
  that every call takes the SDK's server and client sessions.
- `--floor`: a relay that copies lines (stdio) or bytes (HTTP: one upstream connection per client
  connection) both ways without parsing them, i.e. what any process between client and upstream
  costs on this machine; no middle can do better than that.
- `--base DIR`: a second mcpmux (route `base`) run from the source tree DIR, say a `git worktree`
  of the commit before a change, so that a change is judged against its parent in the same minutes.
- `--pin-client`: the benchmark (the client) runs on CPU 0 alone and every server it starts
  (upstreams, middles) on the other CPUs, the way wrk or h2load are pinned apart from the server
  they load: the client's core is then the same whichever route it calls, and what the middle costs
  shows up as latency and throughput instead of as CPU taken from the client. It suits HTTP under
  `mcp.Client`, where the client is the bottleneck; on stdio the upstream is, and pinning squeezes
  upstream and middle onto the same core.

Beside latency and throughput it reads each process's CPU time from /proc: CPU ms per call of the
middle process, the upstream and the client. On a small or busy machine latency is mostly waiting
for a core, while CPU per call stays comparable between runs.

Prints a line per route and cell as it goes, then the verdicts and a Markdown table of every
route's ratios to direct, and writes JSON to `benchmarks/results/mux_overhead.json`.

Every process started here carries MUXBENCH_RUN=<id> in its environment (mcp-proxy is told to pass
its environment on); on exit (also on Ctrl-C or an error) any process still carrying it is reported
as a leak and killed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx2
import peers
from drivers import CallFailed, ClientDriver, RawHttpDriver
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from overhead_report import (
    BURST,
    CELL_HEADER,
    Cell,
    Timing,
    Verdict,
    burst_lines,
    cell_lines,
    failure_lines,
    summary_table,
    verdicts,
)

HERE = Path(__file__).resolve().parent
ECHO = str(HERE / "echo_upstream.py")
RUN_ID = uuid.uuid4().hex[:12]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
CALL_TIMEOUT = 30.0  # a hung call must fail the run, not hang it
KEEPALIVE_S = 2.0
"""Seconds `mcp.Client`'s HTTP connection pool keeps an idle connection (httpx's other limits as they are).

httpx keeps one for 5 s, as long as uvicorn's servers do: a call sent as the server closes the
connection fails with ReadError, and a pass that starts after the other routes' passes often does."""
HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)
CONCURRENCY = (1, 16, 64)
FULL_CALLS = {1: 500, 16: 1000, 64: 2000}
QUICK_CALLS = {1: 100, 16: 300, 64: 300}
BURSTS_PER_REPEAT = 5
KINDS = {"plain": "echo", "readonly": "echo_ro", "cached": "echo_cached"}
"""Tool kind -> the upstream's tool of that kind."""
MIDDLES = ("mcpmux", "base", "sdk")
"""Routes through an mcpmux, whose tools carry the upstream's prefix."""
MCPMUX_SETTINGS: dict[str, Any] = {"cache": {"allow": [KINDS["cached"]]}}
"""What every mcpmux here is told about its upstream `echo` besides how to reach it."""
CLIENT_CPUS = {0}
"""`--pin-client`: the benchmark's own core; every server it starts shares the others."""
Driver = ClientDriver | RawHttpDriver
Routes = dict[str, dict[str, Driver]]
"""Route ("direct", "mcpmux", a peer, ...) -> tool kind -> what calls that kind's tool on it."""
TEXTS = itertools.count()


def _text() -> str:
    """A call's text, never sent before in this run (see the docstring: no coalescing, no cache hits)."""
    return f"{RUN_ID}-{next(TEXTS)}"


def _percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    rank = max(1, round(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


async def _call(driver: Driver, lane: int, failures: list[str], sleep_ms: int = 0) -> bool:
    """One echo call with a new text; a failed call is added to `failures` (False), a wrong answer raises."""
    text = _text()
    try:
        with anyio.fail_after(CALL_TIMEOUT):
            answer = await driver.echo(lane, text, sleep_ms)
    except CallFailed as failure:  # reported with the figures: one failed call must not lose the run
        failures.append(str(failure))
        return False
    if answer != text:
        raise RuntimeError(f"{driver.tool}: asked to echo {text!r}, got {answer!r}")
    return True


def _failed(failures: list[str]) -> dict[str, Any]:
    return {"failed_calls": len(failures), "first_failure": failures[0] if failures else None}


async def timed_pass(driver: Driver, tag: str, concurrency: int, calls: int) -> dict[str, Any]:
    """`calls` echo calls, `concurrency` in flight at a time; each answer is checked against its request.

    `tag` names the server processes behind `driver` (see `_tag`), whose CPU time is counted too.
    Latencies are those of the calls that succeeded; the failed ones are counted.
    """
    latencies: list[float] = []
    failures: list[str] = []
    remaining = iter(range(calls))

    async def caller(lane: int) -> None:
        for _ in remaining:
            started = time.perf_counter()
            if await _call(driver, lane, failures):
                latencies.append(time.perf_counter() - started)

    cpu_before, client_before = processes_cpu(tag), time.process_time()
    started = time.perf_counter()
    async with anyio.create_task_group() as tasks:
        for lane in range(concurrency):
            tasks.start_soon(caller, lane)
    wall = time.perf_counter() - started
    if not latencies:
        raise RuntimeError(f"every call of a pass failed; the first: {failures[0]}")
    cpu = {role: seconds - cpu_before[role] for role, seconds in processes_cpu(tag).items()}
    cpu["client"] = time.process_time() - client_before
    latencies.sort()
    return {
        "p50_ms": 1000 * _percentile(latencies, 50),
        "p99_ms": 1000 * _percentile(latencies, 99),
        "calls_per_s": len(latencies) / wall,
        "cpu_ms_per_call": {role: 1000 * seconds / calls for role, seconds in sorted(cpu.items())},
        **_failed(failures),
    }


async def burst(driver: Driver) -> dict[str, Any]:
    """Wall ms of BURST[0] concurrent calls whose tool sleeps BURST[1] ms, each from a lane of its own."""
    concurrency, sleep_ms = BURST
    failures: list[str] = []
    started = time.perf_counter()
    async with anyio.create_task_group() as tasks:
        for lane in range(concurrency):
            tasks.start_soon(_call, driver, lane, failures, sleep_ms)
    return {"wall_ms": 1000 * (time.perf_counter() - started), **_failed(failures)}


# -- processes -------------------------------------------------------------------------------------


def _tag(route: str) -> dict[str, str]:
    """Environment that marks a process (and the children it passes its environment to) as this run's."""
    return {"MUXBENCH_RUN": RUN_ID, "MUXBENCH_ROUTE": route}


def _tagged_pids(route: str | None = None) -> list[int]:
    """Processes other than this one whose environment carries this run's tag (and `route`'s, if given)."""
    markers = [f"MUXBENCH_RUN={RUN_ID}".encode()]
    if route is not None:
        markers.append(f"MUXBENCH_ROUTE={route}".encode())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            environ = (entry / "environ").read_bytes().split(b"\0")
            if all(marker in environ for marker in markers):
                found.append(int(entry.name))
    return found


def processes_cpu(route: str) -> dict[str, float]:
    """CPU seconds (user + system) used so far by `route`'s echo upstream and the process in the middle."""
    totals = {"middle": 0.0, "upstream": 0.0}
    for pid in _tagged_pids(route):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
            # Fields after the command name in parentheses; utime and stime are the 14th and 15th.
            fields = stat[stat.rindex(")") + 2 :].split()
            role = "upstream" if len(argv) > 1 and argv[1].endswith(b"echo_upstream.py") else "middle"
            totals[role] += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return totals


def sweep_leaks() -> list[int]:
    """Kill and return any process of this run still alive (a process that outlived its owner)."""
    leaked = _tagged_pids() if Path("/proc").is_dir() else []
    for pid in leaked:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return leaked


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group, then SIGKILL what is left after 5 s (the process leads its group)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if process.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(5.0)


@contextlib.contextmanager
def http_server(
    command: list[str], port: int, route: str, log: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> Iterator[str]:
    """Start an HTTP MCP server (`env` added to ours), wait until its port accepts connections, and stop it on exit."""
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            command,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {}), **_tag(route)},
            start_new_session=True,  # Ctrl-C in the terminal reaches only us; we stop it ourselves
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                if process.poll() is not None:
                    raise RuntimeError(
                        f"{' '.join(command[:2])} exited with {process.returncode}:\n{log.read_text()[-2000:]}"
                    )
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{' '.join(command)} did not listen on port {port} within 60 s")
                time.sleep(0.1)
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            _stop(process)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _mcpmux_command() -> list[str]:
    script = Path(sys.executable).with_name("mcpmux")
    return [str(script)] if script.exists() else [sys.executable, "-m", "mcpmux"]


def _base_env(tree: Path) -> dict[str, str]:
    """What runs `mcpmux` from the source tree `tree` (`--base`) instead of the installed one."""
    if not (tree / "mcpmux" / "__init__.py").is_file():
        raise SystemExit(f"--base {tree}: no mcpmux/ package there (give a checkout of this repository)")
    return {"PYTHONPATH": str(tree.resolve())}


async def relay(command: list[str]) -> None:
    """Run `command` and copy lines between it and our stdin/stdout, untouched (`--floor`'s middle)."""
    loop = asyncio.get_running_loop()
    child = await asyncio.create_subprocess_exec(*command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdin is not None
    assert child.stdout is not None
    upstream_in, upstream_out = child.stdin, child.stdout
    # Pipes driven by the event loop, not by threads: this is the cheapest middle Python can be.
    client_in = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(client_in), sys.stdin.buffer)
    client_out, _ = await loop.connect_write_pipe(asyncio.Protocol, sys.stdout.buffer)

    async def upward() -> None:
        while line := await client_in.readline():
            upstream_in.write(line)
        upstream_in.close()

    async def downward() -> None:
        while line := await upstream_out.readline():
            client_out.write(line)

    await asyncio.gather(upward(), downward())
    await child.wait()


async def tcp_relay(listen_port: int, target_port: int) -> None:
    """Copy bytes between each client connection and a connection to the target, untouched.

    `--floor`'s HTTP middle: it neither parses HTTP nor reads JSON, so it is less than any HTTP
    proxy can be; what it costs is what any process between client and upstream costs. An upstream
    that closes an idle keep-alive connection does not close the client's: the next bytes the client
    sends open a new one (passing the close on would race the client's next request).
    """

    async def downward(upstream: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await upstream.read(1 << 16):
                client.write(data)
                await client.drain()

    async def serve(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        upstream: asyncio.StreamWriter | None = None
        reading: asyncio.Task[None] | None = None
        with contextlib.suppress(ConnectionError):
            while data := await client_reader.read(1 << 16):
                if upstream is None or reading is None or reading.done():
                    upstream_reader, upstream = await asyncio.open_connection("127.0.0.1", target_port)
                    reading = asyncio.create_task(downward(upstream_reader, client_writer))
                upstream.write(data)
                await upstream.drain()
        for writer in (upstream, client_writer):
            if writer is not None:
                writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", listen_port)
    async with server:
        await server.serve_forever()


# -- routes ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Mcpmux:
    """How one mcpmux is started: the installed `mcpmux` (`tree` None), or `python -m mcpmux` in a source tree.

    In the tree's own folder, `-m` imports the tree's package whatever is installed (PYTHONPATH
    says the same for the modules it imports later); the installed console script would import the
    editable install's entry point, which need not exist in an older tree.
    """

    tree: Path | None = None

    def serve(self, config: str) -> list[str]:
        start = _mcpmux_command() if self.tree is None else [sys.executable, "-m", "mcpmux"]
        return [*start, "serve", "--config", config]

    def env(self) -> dict[str, str]:
        return {} if self.tree is None else _base_env(self.tree)


@dataclass(slots=True)
class Setup:
    """What every section's routes start from: the options, and what was resolved from them once."""

    args: argparse.Namespace
    workdir: Path
    mcpmux: Mcpmux
    base: Mcpmux | None
    callmux: list[str] | None
    mcp_proxy: list[str] | None


def _tool(route: str, kind: str) -> str:
    return f"echo__{KINDS[kind]}" if route in MIDDLES else KINDS[kind]


def _client_drivers(client: Client, route: str, kinds: list[str]) -> dict[str, Driver]:
    return {kind: ClientDriver(client, _tool(route, kind)) for kind in kinds}


def _mux_config(path: Path, upstream: dict[str, Any], settings: dict[str, Any] | None = None) -> str:
    """Write an mcpmux config (`settings` beside the one upstream `echo`) to `path`; returns the path."""
    path.write_text(json.dumps({**(settings or {}), "mcpServers": {"echo": {**upstream, **MCPMUX_SETTINGS}}}))
    return str(path)


@contextlib.asynccontextmanager
async def stdio_routes(setup: Setup, section: str) -> AsyncIterator[Routes]:
    """Connected clients on stdio: the echo upstream itself, and each middle spawning an upstream of its own."""
    args, workdir = setup.args, setup.workdir
    echo = [sys.executable, ECHO, "stdio", "--tools", str(args.upstream_tools)]
    upstream = {"command": echo[0], "args": echo[1:]}
    config = _mux_config(workdir / "stdio.json", upstream)
    installed = Mcpmux()
    commands: dict[str, tuple[list[str], Mcpmux]] = {  # route -> its command, and the mcpmux that may run
        "direct": (echo, installed),
        "mcpmux": (setup.mcpmux.serve(config), setup.mcpmux),
    }
    if setup.base is not None:
        commands["base"] = (setup.base.serve(config), setup.base)
    if args.sdk_path:
        sdk_config = _mux_config(workdir / "stdio-sdk.json", upstream, {"mux": {"fast_path": False}})
        commands["sdk"] = (installed.serve(sdk_config), installed)
    if args.floor:
        commands["relay"] = ([sys.executable, __file__, "--relay", *echo], installed)
    if setup.callmux is not None:
        commands["callmux"] = ([*setup.callmux, "--", *echo], installed)
        commands["callmux-c64"] = ([*setup.callmux, "--concurrency", "64", "--", *echo], installed)
    path = {"PATH": os.environ.get("PATH", "")}
    async with contextlib.AsyncExitStack() as stack:
        routes: Routes = {}
        for name, (command, mcpmux) in commands.items():
            # A middle passes its environment, tag included, on to the upstream it spawns.
            env = {**path, **mcpmux.env(), **_tag(f"{section}-{name}")}
            server = StdioServerParameters(command=command[0], args=command[1:], env=env, cwd=mcpmux.tree)
            client = await stack.enter_async_context(Client(server, mode=args.era))
            routes[name] = _client_drivers(client, name, args.kinds)
        yield routes


@contextlib.asynccontextmanager
async def http_routes(setup: Setup, section: str, driver: str) -> AsyncIterator[Routes]:
    """Connected drivers on HTTP: an echo upstream on HTTP, and each middle on HTTP in front of one of its own."""
    args, workdir = setup.args, setup.workdir
    edge: dict[str, Any] = {}  # mcpmux's settings besides its upstream
    if args.idle_per_client is not None:
        edge["http"] = {"idle_connections_per_client": args.idle_per_client}

    def echo(port: int) -> list[str]:
        return [sys.executable, ECHO, "http", str(port), "--tools", str(args.upstream_tools)]

    async def connect(stack: contextlib.AsyncExitStack, route: str, url: str) -> dict[str, Driver]:
        """What calls each kind's tool of `route` at `url` under `driver`, closed with `stack`."""
        if driver == "client":
            limits = httpx2.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=KEEPALIVE_S)
            http = await stack.enter_async_context(httpx2.AsyncClient(timeout=HTTP_TIMEOUT, limits=limits))
            transport = streamable_http_client(url, http_client=http)
            return _client_drivers(await stack.enter_async_context(Client(transport, mode=args.era)), route, args.kinds)
        era: Literal["legacy", "2026-07-28"] = "legacy" if route == "mcp-proxy" else "2026-07-28"  # on mcp<2
        drivers: dict[str, Driver] = {}
        for kind in args.kinds:
            raw = drivers[kind] = RawHttpDriver(url, _tool(route, kind), era)
            stack.push_async_callback(raw.aclose)
        return drivers

    def server(
        stack: contextlib.AsyncExitStack, route: str, command: list[str], port: int, mcpmux: Mcpmux = Mcpmux()
    ) -> str:
        log = workdir / f"{section}-{route}.log"
        return stack.enter_context(http_server(command, port, f"{section}-{route}", log, mcpmux.env(), mcpmux.tree))

    def upstream(stack: contextlib.AsyncExitStack, route: str) -> int:
        """Start an echo upstream for `route`'s middle; returns its port."""
        port = _free_port()
        stack.enter_context(
            http_server(echo(port), port, f"{section}-{route}", workdir / f"{section}-{route}-echo.log")
        )
        return port

    def mux(stack: contextlib.AsyncExitStack, route: str, settings: dict[str, Any], mcpmux: Mcpmux) -> str:
        """`mcpmux` over HTTP (`settings`) in front of an echo upstream of its own; returns its URL."""
        target = {"url": f"http://127.0.0.1:{upstream(stack, route)}/mcp"}
        port = _free_port()
        config = _mux_config(workdir / f"{section}-{route}.json", target, settings)
        return server(stack, route, [*mcpmux.serve(config), "--transport", "http", "--port", str(port)], port, mcpmux)

    async with contextlib.AsyncExitStack() as stack:
        port = _free_port()
        routes: Routes = {"direct": await connect(stack, "direct", server(stack, "direct", echo(port), port))}
        routes["mcpmux"] = await connect(stack, "mcpmux", mux(stack, "mcpmux", edge, setup.mcpmux))
        if setup.base is not None:
            routes["base"] = await connect(stack, "base", mux(stack, "base", edge, setup.base))
        if args.sdk_path:
            routes["sdk"] = await connect(stack, "sdk", mux(stack, "sdk", {"mux": {"fast_path": False}}, Mcpmux()))
        if args.floor:
            target, port = upstream(stack, "relay"), _free_port()
            relay_url = server(stack, "relay", [sys.executable, __file__, "--tcp-relay", str(port), str(target)], port)
            routes["relay"] = await connect(stack, "relay", relay_url)
        if setup.mcp_proxy is not None:
            port = _free_port()
            proxy = [*setup.mcp_proxy, "--port", str(port), "--pass-environment", "--log-level", "WARNING"]
            echo_stdio = [sys.executable, ECHO, "stdio", "--tools", str(args.upstream_tools)]
            proxy_url = server(stack, "mcp-proxy", [*proxy, "--", *echo_stdio], port)
            routes["mcp-proxy"] = await connect(stack, "mcp-proxy", proxy_url)
        yield routes


async def measure(section: str, routes: Routes, calls: dict[int, int], repeats: int) -> list[Timing]:
    """Each tool kind on every route, interleaved: passes per concurrency, then the bursts."""
    names = list(routes)

    def rotation(repeat: int) -> list[str]:
        """The routes, starting one further each repeat, so that drift in the machine's load hits all alike."""
        start = repeat % len(names)
        return names[start:] + names[:start]

    timings = []
    for kind in next(iter(routes.values())):
        timing = Timing(section, kind)
        for concurrency, count in calls.items():
            for name in names:  # warm-up: imports, caches, connection pools
                await timed_pass(routes[name][kind], f"{section}-{name}", concurrency, max(concurrency * 2, count // 4))
            passes: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
            for repeat in range(repeats):
                for name in rotation(repeat):
                    passes[name].append(await timed_pass(routes[name][kind], f"{section}-{name}", concurrency, count))
            timing.cells[concurrency] = {name: Cell.of(passes[name]) for name in names}
            for name in names:
                timing.count_failures(name, passes[name])
            print("\n".join(cell_lines(timing, concurrency)), flush=True)
        for name in names:
            await burst(routes[name][kind])  # warm-up: the middle's pool grows to 64 upstream calls
        timing.bursts_ms = {name: [] for name in names}
        for repeat in range(repeats):
            for name in rotation(repeat):
                bursts = [await burst(routes[name][kind]) for _ in range(BURSTS_PER_REPEAT)]
                timing.bursts_ms[name].append(statistics.median(b["wall_ms"] for b in bursts))
                timing.count_failures(name, bursts)
        print("\n".join(burst_lines(timing)), flush=True)
        timings.append(timing)
    return timings


# -- run -------------------------------------------------------------------------------------------


def _sections(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(section, transport, driver) for each section the options ask for, in the order they run."""
    sections = [("stdio", "stdio", "client")] if "stdio" in args.transport and "client" in args.driver else []
    if "http" in args.transport:
        sections += [("http" if driver == "client" else "http-raw", "http", driver) for driver in args.driver]
    return sections


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def _meta(setup: Setup) -> dict[str, Any]:
    args = setup.args

    def git(tree: Path, *command: str) -> str:
        return subprocess.run(["git", "-C", str(tree), *command], capture_output=True, text=True).stdout.strip()

    tree = (args.tree or HERE.parent).resolve()
    return {
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "benchmark_commit": git(HERE, "rev-parse", "--short", "HEAD"),
        "mcpmux_tree": str(tree),
        "mcpmux_commit": git(tree, "rev-parse", "--short", "HEAD"),
        "mcpmux_uncommitted_changes": bool(git(tree, "status", "--porcelain", "--", "mcpmux")),
        "base_tree": None if args.base is None else str(args.base.resolve()),
        "base_commit": None if args.base is None else git(args.base, "rev-parse", "--short", "HEAD"),
        "python": platform.python_version(),
        "mcp": version("mcp"),
        "peers": {
            "callmux": peers.CALLMUX if setup.callmux else None,
            "mcp-proxy": peers.MCP_PROXY[0] if setup.mcp_proxy else None,
        },
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "loadavg_at_start": os.getloadavg(),
        "sections": [section for section, _, _ in _sections(args)],
        "kinds": args.kinds,
        "client_era": args.era,
        "upstream_extra_tools": args.upstream_tools,
        "repeats": args.repeats,
        "quick": args.quick,
        "client_cpus": sorted(CLIENT_CPUS) if args.pin_client else None,
        "server_cpus": sorted(_server_cpus()) if args.pin_client else None,
        "note": "client, middle process and upstream share this machine's cores, with any other work on it",
    }


def _server_cpus() -> set[int]:
    return os.sched_getaffinity(0) - CLIENT_CPUS


def _pin(cpus: set[int]) -> None:
    """Moves every thread of this process onto `cpus`; processes spawned afterwards inherit them."""
    for thread in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(thread), cpus)


async def run(setup: Setup) -> list[Timing]:
    args = setup.args
    calls = {n: c for n, c in (QUICK_CALLS if args.quick else FULL_CALLS).items() if n in args.concurrency}
    print(f"mux_overhead: {os.cpu_count()} CPU(s) shared by client, middle and upstream (and any other work);")
    print(f"load average {os.getloadavg()[0]:.2f} at start. Latency on a busy machine is mostly waiting for a core.")
    print(CELL_HEADER)
    print("-" * len(CELL_HEADER), flush=True)
    timings: list[Timing] = []
    servers = _server_cpus()
    for section, transport, driver in _sections(args):
        if args.pin_client:
            _pin(servers)  # the routes' processes start now and keep these CPUs
        opener = stdio_routes(setup, section) if transport == "stdio" else http_routes(setup, section, driver)
        async with opener as routes:
            if args.pin_client:
                _pin(CLIENT_CPUS)
            timings += await measure(section, routes, calls, args.repeats)
    return timings


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer calls per pass (100 at N=1, 300 at N=16 and 64)")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per cell; medians are reported")
    parser.add_argument("--transport", nargs="+", choices=["stdio", "http"], default=["stdio", "http"])
    parser.add_argument(
        "--driver",
        nargs="+",
        choices=["client", "raw"],
        default=["client", "raw"],
        help="what makes the calls: mcp.Client, and/or a raw HTTP/1.1 driver (HTTP only)",
    )
    parser.add_argument("--kinds", nargs="+", choices=list(KINDS), default=list(KINDS), help="tool kinds to time")
    parser.add_argument("--concurrency", nargs="+", type=int, choices=CONCURRENCY, default=[1, 64])
    parser.add_argument("--tree", type=Path, help="run the mcpmux route from this source tree, not the installed one")
    parser.add_argument("--no-peers", action="store_true", help="leave callmux and mcp-proxy out")
    parser.add_argument("--floor", action="store_true", help="also time a do-nothing relay in the middle")
    parser.add_argument("--sdk-path", action="store_true", help="also time mcpmux with its fast path turned off")
    parser.add_argument("--base", type=Path, help="also time mcpmux run from this source tree (route `base`)")
    parser.add_argument("--era", choices=["auto", "legacy"], default="auto", help="mcp.Client's handshake")
    parser.add_argument("--upstream-tools", type=int, default=0, help="inert tools each echo upstream lists too")
    parser.add_argument(
        "--idle-per-client",
        type=int,
        help="mcpmux's [http] idle_connections_per_client (default: mcpmux's own; 0: no limit)",
    )
    parser.add_argument(
        "--pin-client",
        action="store_true",
        help="run the client on CPU 0 alone and the servers on the other CPUs (Linux, 2+ CPUs)",
    )
    parser.add_argument("--out", type=Path, default=HERE / "results" / "mux_overhead.json")
    args = parser.parse_args(argv)
    if not _sections(args):
        parser.error("the raw driver drives HTTP only: give --transport http, or --driver client for stdio")
    if args.era != "auto" and "client" not in args.driver:
        parser.error("--era sets mcp.Client's handshake; the raw driver speaks 2026-07-28 only")
    for option, tree in (("--tree", args.tree), ("--base", args.base)):
        if tree is not None and not (tree / "mcpmux" / "__init__.py").is_file():
            parser.error(f"{option} {tree}: no mcpmux/ package there (give a checkout of this repository)")
    allowed = os.sched_getaffinity(0)
    if args.pin_client and not allowed > CLIENT_CPUS:  # a strict superset: CPU 0 and at least one more
        parser.error(f"--pin-client needs CPU 0 and at least one more CPU; this process may use {sorted(allowed)}")
    return args


def _setup(args: argparse.Namespace, workdir: Path) -> Setup:
    """Resolve the trees and install the peers the sections need (each left out, with a message, if it cannot be)."""
    sections = {transport for _, transport, _ in _sections(args)}
    wanted = not args.no_peers
    return Setup(
        args,
        workdir,
        mcpmux=Mcpmux(None if args.tree is None else args.tree.resolve()),
        base=None if args.base is None else Mcpmux(args.base.resolve()),
        callmux=peers.callmux() if wanted and "stdio" in sections else None,
        mcp_proxy=peers.mcp_proxy() if wanted and "http" in sections else None,
    )


def _report(timings: list[Timing], out: Path, meta: dict[str, Any]) -> None:
    found: list[Verdict] = [verdict for timing in timings for verdict in verdicts(timing)]
    print("\nverdicts (mcpmux's ratio; target; pass by pass):")
    print("\n".join(verdict.line() for verdict in found))
    met = sum(verdict.met for verdict in found)
    print(f"{met} of {len(found)} targets met\n")
    if failures := failure_lines(timings):
        print("failed calls (left out of the latencies):", *failures, "", sep="\n")
    print("\n".join(summary_table(timings)))
    report = {"meta": meta, "verdicts": [asdict(v) for v in found], "timings": [asdict(t) for t in timings]}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"\nwrote {out}")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    if argv[:1] == ["--relay"]:
        asyncio.run(relay(argv[1:]))
        return 0
    if argv[:1] == ["--tcp-relay"]:
        asyncio.run(tcp_relay(int(argv[1]), int(argv[2])))
        return 0
    args = _parse(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` gets the same clean-up as Ctrl-C
    try:
        with tempfile.TemporaryDirectory(prefix="muxbench-") as tmp:
            setup = _setup(args, Path(tmp))
            meta = _meta(setup)  # before the run: the code under test is what the processes start with
            try:
                timings = anyio.run(run, setup)
            except Exception:
                for log in sorted(Path(tmp).glob("*.log")):  # the servers' side of the story, before it goes
                    print(f"--- {log.name}:\n{log.read_text(errors='replace')[-2000:]}", file=sys.stderr)
                raise
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        leaked = sweep_leaks()
        if leaked:
            print(f"LEAK: {len(leaked)} process(es) of this run outlived their owner and were killed: {leaked}")
    meta.update(loadavg_at_end=os.getloadavg(), leaked_processes=leaked)
    _report(timings, args.out, meta)
    return 1 if leaked else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
