"""What mcpmux costs per call: `echo` direct to an upstream vs through mcpmux, over stdio and HTTP.

    .venv/bin/python benchmarks/mux_overhead.py            # full run (about 10 minutes on 2 cores)
    .venv/bin/python benchmarks/mux_overhead.py --quick    # fewer calls, for a smoke run
    .venv/bin/python benchmarks/mux_overhead.py --floor    # also a do-nothing relay in the middle, for reference
    .venv/bin/python benchmarks/mux_overhead.py --sdk-path # also mcpmux with `[mux] fast_path = false`
    .venv/bin/python benchmarks/mux_overhead.py --idle-per-client 0  # mcpmux retiring no idle connection
    .venv/bin/python benchmarks/mux_overhead.py --base ../base  # also mcpmux from another tree (A/B in one run)
    .venv/bin/python benchmarks/mux_overhead.py --driver raw --floor  # HTTP under a raw driver, not mcp.Client

For each transport the benchmark keeps real `mcp.Client` connections open, one straight to the echo
upstream (`benchmarks/echo_upstream.py`) and one to mcpmux in front of the same kind of upstream,
and for N = 1, 16, 64 concurrent callers times a fixed number of `echo` calls: one warm-up pass
(discarded), then `--repeats` passes with the routes' order rotating, medians reported.

- stdio: the client spawns the upstream (direct) or `mcpmux serve` (which spawns the upstream).
- http: the upstream serves streamable HTTP on one loopback port, mcpmux on another.
- `--sdk-path`: a second mcpmux (route `sdk`) with the raw `tools/call` fast path turned off, so
  that every call takes the SDK's server and client sessions (docs/fastpath.md).
- `--floor`: a relay that copies lines (stdio) or bytes (HTTP: one upstream connection per client
  connection) both ways without parsing them, i.e. what any process between client and upstream
  costs on this machine; mcpmux cannot do better than that.
- `--base DIR`: a second mcpmux (route `base`) run from the source tree DIR, say a `git worktree`
  of the commit before a change, so that a change is judged against its parent in the same minutes.
- `--driver raw`: HTTP only; the calls come from a raw keep-alive HTTP/1.1 driver (`drivers.py`),
  one connection per caller, instead of `mcp.Client`. It costs a tenth of the client per call, so the
  servers' side is what is timed: on 2 cores, 64 callers make `mcp.Client` a saturated core, and any
  process in the middle takes CPU from it (the do-nothing relay kept 73-99% there in session 13).

Beside latency and throughput it reads each process's CPU time from /proc: CPU ms per call of the
middle process (mcpmux or relay), the upstream and the client. On a small or busy machine latency
is mostly waiting for a core, while CPU per call stays comparable between runs.

Prints a side-by-side table (added p50 latency in ms, throughput kept in %) and writes JSON to
`benchmarks/results/mux_overhead.json`. Target: under 1 ms added at p50 (read at N=1, where no
queueing hides it) and at least 90% of direct throughput at N=64. Each verdict also lists its
figure pass by pass (each pass through the middle against the direct pass of the same repeat):
on a 2-core host they spread by 15-25%, and that spread says how far one run's verdict goes.

Every process started here carries MUXBENCH_RUN=<id> in its environment; on exit (also on Ctrl-C or
an error) any process still carrying it is reported as a leak and killed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from typing import Any

import anyio
from drivers import ClientDriver, RawHttpDriver
from mcp import Client
from mcp.client.stdio import StdioServerParameters

HERE = Path(__file__).resolve().parent
ECHO = str(HERE / "echo_upstream.py")
RUN_ID = uuid.uuid4().hex[:12]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
CALL_TIMEOUT = 30.0  # a hung call must fail the run, not hang it
CONCURRENCY = (1, 16, 64)
FULL_CALLS = {1: 500, 16: 1000, 64: 2000}
QUICK_CALLS = {1: 100, 16: 300, 64: 300}
Driver = ClientDriver | RawHttpDriver
Routes = dict[str, Driver]  # "direct" | "mcpmux" | "base" | "relay" | "sdk" -> what calls its `echo`
MIDDLES = ("mcpmux", "base", "sdk")
"""Routes through an mcpmux, whose tools carry the upstream's prefix."""


@dataclass(slots=True)
class Cell:
    """One route at one concurrency: medians over the repeats, and each timed pass."""

    p50_ms: float
    p99_ms: float
    calls_per_s: float
    cpu_ms_per_call: dict[str, float]
    """CPU time per call by process role: `client` (this process), `middle`, `upstream`."""
    passes: list[dict[str, Any]]

    @classmethod
    def of(cls, passes: list[dict[str, Any]]) -> Cell:
        def median(key: str) -> float:
            return float(statistics.median(p[key] for p in passes))

        roles = passes[0]["cpu_ms_per_call"]
        cpu = {role: statistics.median(p["cpu_ms_per_call"][role] for p in passes) for role in roles}
        return cls(median("p50_ms"), median("p99_ms"), median("calls_per_s"), cpu, passes)


@dataclass(slots=True)
class Row:
    """Direct vs one route through a middle process (`via`), for one transport and concurrency."""

    transport: str
    via: str
    concurrency: int
    calls: int
    direct: Cell
    middle: Cell

    @property
    def added_p50_ms(self) -> float:
        return self.middle.p50_ms - self.direct.p50_ms

    @property
    def kept_pct(self) -> float:
        return 100.0 * self.middle.calls_per_s / self.direct.calls_per_s

    def by_pass(self, key: str) -> list[tuple[float, float]]:
        """`key` of the direct pass and of the middle's pass, repeat by repeat (the same rotation, minutes apart)."""
        return [(d[key], m[key]) for d, m in zip(self.direct.passes, self.middle.passes, strict=True)]


def _percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    rank = max(1, round(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


async def timed_pass(driver: Driver, tag: str, concurrency: int, calls: int) -> dict[str, Any]:
    """`calls` echo calls, `concurrency` in flight at a time; each answer is checked against its request.

    `tag` names the server processes behind `driver` (see `_tag`), whose CPU time is counted too.
    """
    latencies: list[float] = []
    remaining = iter(range(calls))

    async def caller(lane: int) -> None:
        for index in remaining:
            text = f"call {index}"
            started = time.perf_counter()
            with anyio.fail_after(CALL_TIMEOUT):
                answer = await driver.echo(lane, text)
            latencies.append(time.perf_counter() - started)
            if answer != text:
                raise RuntimeError(f"{driver.tool}: asked to echo {text!r}, got {answer!r}")

    cpu_before, client_before = processes_cpu(tag), time.process_time()
    started = time.perf_counter()
    async with anyio.create_task_group() as tasks:
        for lane in range(concurrency):
            tasks.start_soon(caller, lane)
    wall = time.perf_counter() - started
    cpu = {role: seconds - cpu_before[role] for role, seconds in processes_cpu(tag).items()}
    cpu["client"] = time.process_time() - client_before
    latencies.sort()
    return {
        "p50_ms": 1000 * _percentile(latencies, 50),
        "p99_ms": 1000 * _percentile(latencies, 99),
        "calls_per_s": calls / wall,
        "cpu_ms_per_call": {role: 1000 * seconds / calls for role, seconds in sorted(cpu.items())},
    }


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
    command: list[str], port: int, route: str, log: Path, env: dict[str, str] | None = None
) -> Iterator[str]:
    """Start an HTTP MCP server (`env` added to ours), wait until its port accepts connections, and stop it on exit."""
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            command,
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
                    raise RuntimeError(f"{command[1]} exited with {process.returncode}:\n{log.read_text()[-2000:]}")
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


@contextlib.asynccontextmanager
async def stdio_routes(args: argparse.Namespace, workdir: Path) -> AsyncIterator[Routes]:
    """Connected clients: the echo upstream on stdio, mcpmux on stdio spawning another (and the relay)."""
    echo = [ECHO, "stdio", "--tools", str(args.upstream_tools)]
    config = workdir / "stdio.json"
    config.write_text(json.dumps({"mcpServers": {"echo": {"command": sys.executable, "args": echo}}}))
    sdk_config = workdir / "stdio-sdk.json"
    sdk_config.write_text(json.dumps({**json.loads(config.read_text()), "mux": {"fast_path": False}}))
    path = {"PATH": os.environ.get("PATH", "")}
    mcpmux = _mcpmux_command()
    servers = {  # a middle process passes its environment, tag included, on to the upstream it spawns
        "direct": StdioServerParameters(command=sys.executable, args=echo, env={**path, **_tag("stdio-direct")}),
        "mcpmux": StdioServerParameters(
            command=mcpmux[0],
            args=[*mcpmux[1:], "serve", "--config", str(config)],
            env={**path, **_tag("stdio-mcpmux")},
        ),
    }
    if args.base is not None:
        servers["base"] = StdioServerParameters(
            command=mcpmux[0],
            args=[*mcpmux[1:], "serve", "--config", str(config)],
            env={**path, **_base_env(args.base), **_tag("stdio-base")},
        )
    if args.sdk_path:
        servers["sdk"] = StdioServerParameters(
            command=mcpmux[0],
            args=[*mcpmux[1:], "serve", "--config", str(sdk_config)],
            env={**path, **_tag("stdio-sdk")},
        )
    if args.floor:
        relay_args = [__file__, "--relay", sys.executable, *echo]
        servers["relay"] = StdioServerParameters(
            command=sys.executable, args=relay_args, env={**path, **_tag("stdio-relay")}
        )
    async with contextlib.AsyncExitStack() as stack:
        routes: Routes = {}
        for name, server in servers.items():
            client = await stack.enter_async_context(Client(server, mode=args.era))
            routes[name] = ClientDriver(client, "echo__echo" if name in MIDDLES else "echo")
        yield routes


@contextlib.asynccontextmanager
async def http_routes(args: argparse.Namespace, workdir: Path) -> AsyncIterator[Routes]:
    """Connected clients: the echo upstream on HTTP, and mcpmux on HTTP in front of a second one."""
    direct_port, upstream_port, mux_port = _free_port(), _free_port(), _free_port()
    config = workdir / "http.json"
    edge: dict[str, Any] = {}  # mcpmux's settings besides its upstream
    if args.idle_per_client is not None:
        edge["http"] = {"idle_connections_per_client": args.idle_per_client}
    config.write_text(json.dumps({**edge, "mcpServers": {"echo": {"url": f"http://127.0.0.1:{upstream_port}/mcp"}}}))
    mux_serve = [*_mcpmux_command(), "serve", "--config", str(config), "--transport", "http", "--port", str(mux_port)]

    def echo(port: int) -> list[str]:
        return [sys.executable, ECHO, "http", str(port), "--tools", str(args.upstream_tools)]

    async def connect(stack: contextlib.AsyncExitStack, url: str, tool: str) -> Driver:
        """What calls `tool` at `url` under `--driver`, closed with `stack`."""
        if args.driver == "raw":
            driver = RawHttpDriver(url, tool)
            stack.push_async_callback(driver.aclose)
            return driver
        return ClientDriver(await stack.enter_async_context(Client(url, mode=args.era)), tool)

    async def another_mux(
        stack: contextlib.AsyncExitStack, route: str, settings: dict[str, Any], env: dict[str, str] | None = None
    ) -> Driver:
        """One more mcpmux over HTTP (`settings`, `env`) in front of an echo upstream of its own, kept on `stack`."""
        upstream, port = _free_port(), _free_port()
        path = workdir / f"http-{route}.json"
        path.write_text(json.dumps({**settings, "mcpServers": {"echo": {"url": f"http://127.0.0.1:{upstream}/mcp"}}}))
        serve = [*_mcpmux_command(), "serve", "--config", str(path), "--transport", "http", "--port", str(port)]
        stack.enter_context(http_server(echo(upstream), upstream, f"http-{route}", workdir / f"echo-{route}.log"))
        url = stack.enter_context(http_server(serve, port, f"http-{route}", workdir / f"mcpmux-{route}.log", env))
        return await connect(stack, url, "echo__echo")

    with (
        http_server(echo(direct_port), direct_port, "http-direct", workdir / "echo-direct.log") as direct_url,
        http_server(echo(upstream_port), upstream_port, "http-mcpmux", workdir / "echo-upstream.log"),
        http_server(mux_serve, mux_port, "http-mcpmux", workdir / "mcpmux-http.log") as mux_url,
    ):
        async with contextlib.AsyncExitStack() as stack:
            routes: Routes = {
                "direct": await connect(stack, direct_url, "echo"),
                "mcpmux": await connect(stack, mux_url, "echo__echo"),
            }
            if args.floor:
                relay_upstream_port, relay_port = _free_port(), _free_port()
                relay = [sys.executable, __file__, "--tcp-relay", str(relay_port), str(relay_upstream_port)]
                relay_echo, echo_log = echo(relay_upstream_port), workdir / "relay-echo.log"
                stack.enter_context(http_server(relay_echo, relay_upstream_port, "http-relay", echo_log))
                relay_url = stack.enter_context(http_server(relay, relay_port, "http-relay", workdir / "relay.log"))
                routes["relay"] = await connect(stack, relay_url, "echo")
            if args.base is not None:
                routes["base"] = await another_mux(stack, "base", edge, _base_env(args.base))
            if args.sdk_path:
                routes["sdk"] = await another_mux(stack, "sdk", {"mux": {"fast_path": False}})
            yield routes


async def measure(transport: str, routes: Routes, calls: dict[int, int], repeats: int) -> list[Row]:
    names = list(routes)
    rows = []
    for concurrency, count in calls.items():
        for name, driver in routes.items():  # warm-up: imports, caches, connection pools
            await timed_pass(driver, f"{transport}-{name}", concurrency, max(concurrency * 2, count // 4))
        passes: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        for repeat in range(repeats):
            # Rotate which route goes first so that drift in the machine's load hits all of them alike.
            for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
                passes[name].append(await timed_pass(routes[name], f"{transport}-{name}", concurrency, count))
        for via in names[1:]:
            row = Row(transport, via, concurrency, count, Cell.of(passes["direct"]), Cell.of(passes[via]))
            print(_format_row(row), flush=True)
            rows.append(row)
    return rows


# -- report ----------------------------------------------------------------------------------------

HEADER = (
    f"{'transport':<9} {'via':<6} {'N':>3} {'calls':>5} | {'p50 direct':>10} {'via':>7} {'+ms':>7} | "
    f"{'p99 direct':>10} {'via':>7} | {'calls/s direct':>14} {'via':>5} {'kept':>5} | "
    f"{'CPU ms/call: middle':>19} {'upstream':>8} {'client':>7}"
)


def _format_row(row: Row) -> str:
    d, m = row.direct, row.middle

    def pair(role: str) -> str:  # direct/via: did the middle change the others' cost too?
        return f"{d.cpu_ms_per_call[role]:.1f}/{m.cpu_ms_per_call[role]:.1f}"

    return (
        f"{row.transport:<9} {row.via:<6} {row.concurrency:>3} {row.calls:>5} | {d.p50_ms:>10.2f} {m.p50_ms:>7.2f} "
        f"{row.added_p50_ms:>+7.2f} | {d.p99_ms:>10.2f} {m.p99_ms:>7.2f} | "
        f"{d.calls_per_s:>14.0f} {m.calls_per_s:>5.0f} {row.kept_pct:>4.0f}% | "
        f"{m.cpu_ms_per_call['middle']:>19.2f} {pair('upstream'):>8} {pair('client'):>7}"
    )


def _targets(rows: list[Row]) -> dict[str, dict[str, Any]]:
    """mcpmux's verdicts; with `--floor`, the do-nothing relay's too (`relay_...`): what no middle can beat."""
    verdicts: dict[str, dict[str, Any]] = {}
    for row in (row for row in rows if row.via in ("mcpmux", "relay")):
        prefix = row.transport if row.via == "mcpmux" else f"relay_{row.transport}"
        if row.concurrency == 1:
            added = round(row.added_p50_ms, 3)
            passes = [round(m - d, 3) for d, m in row.by_pass("p50_ms")]
            verdict = {"value": added, "target": "< 1.0", "met": added < 1.0, "passes": passes}
            verdicts[f"{prefix}_added_p50_ms_at_1"] = verdict
        if row.concurrency == 64:
            kept = round(row.kept_pct, 1)
            passes = [round(100 * m / d, 1) for d, m in row.by_pass("calls_per_s")]
            verdict = {"value": kept, "target": ">= 90", "met": kept >= 90, "passes": passes}
            verdicts[f"{prefix}_throughput_kept_pct_at_64"] = verdict
    return verdicts


def _meta(args: argparse.Namespace) -> dict[str, Any]:
    def git(*command: str) -> str:
        return subprocess.run(["git", *command], capture_output=True, text=True, cwd=HERE).stdout.strip()

    base = None if args.base is None else args.base.resolve()
    return {
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git_commit": git("rev-parse", "--short", "HEAD"),
        "mcpmux_uncommitted_changes": bool(git("status", "--porcelain", "--", str(HERE.parent / "mcpmux"))),
        "base_tree": None if base is None else str(base),
        "base_commit": None if base is None else git("-C", str(base), "rev-parse", "--short", "HEAD"),
        "python": platform.python_version(),
        "mcp": version("mcp"),
        "cpus": os.cpu_count(),
        "loadavg_at_start": os.getloadavg(),
        "client_era": args.era,
        "driver": args.driver,
        "upstream_extra_tools": args.upstream_tools,
        "repeats": args.repeats,
        "quick": args.quick,
        "note": "client, middle process and upstream share this machine's cores, with any other work on it",
    }


async def run(args: argparse.Namespace, workdir: Path) -> list[Row]:
    calls = {n: c for n, c in (QUICK_CALLS if args.quick else FULL_CALLS).items() if n in args.concurrency}
    print(f"mux_overhead: {os.cpu_count()} CPU(s) shared by client, middle and upstream (and any other work);")
    print(f"load average {os.getloadavg()[0]:.2f} at start. Latency on a busy machine is mostly waiting for a core.")
    print(HEADER)
    print("-" * len(HEADER), flush=True)
    rows: list[Row] = []
    opener = {"stdio": stdio_routes, "http": http_routes}
    for transport in args.transport:
        async with opener[transport](args, workdir) as routes:
            rows += await measure(transport, routes, calls, args.repeats)
    return rows


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer calls per pass (100/300/300)")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per cell; medians are reported")
    parser.add_argument("--transport", nargs="+", choices=["stdio", "http"], help="default: both (raw driver: http)")
    parser.add_argument("--concurrency", nargs="+", type=int, choices=CONCURRENCY, default=list(CONCURRENCY))
    parser.add_argument("--floor", action="store_true", help="also time a do-nothing relay in the middle")
    parser.add_argument("--sdk-path", action="store_true", help="also time mcpmux with its fast path turned off")
    parser.add_argument("--base", type=Path, help="also time mcpmux run from this source tree (route `base`)")
    parser.add_argument("--era", choices=["auto", "legacy"], default="auto", help="the benchmark client's handshake")
    parser.add_argument(
        "--driver",
        choices=["client", "raw"],
        default="client",
        help="what makes the calls: mcp.Client, or a raw HTTP/1.1 driver (HTTP only, 2026-07-28)",
    )
    parser.add_argument("--upstream-tools", type=int, default=0, help="inert tools each echo upstream lists too")
    parser.add_argument(
        "--idle-per-client",
        type=int,
        help="mcpmux's [http] idle_connections_per_client (default: mcpmux's own; 0: no limit)",
    )
    parser.add_argument("--out", type=Path, default=HERE / "results" / "mux_overhead.json")
    args = parser.parse_args(argv)
    if args.driver == "raw" and "stdio" in (args.transport or []):
        parser.error("--driver raw drives HTTP only: drop --transport or give --transport http")
    if args.driver == "raw" and args.era != "auto":
        parser.error("--driver raw speaks 2026-07-28 only: drop --era")
    args.transport = args.transport or (["http"] if args.driver == "raw" else ["stdio", "http"])
    return args


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
    meta = _meta(args)  # before the run: the code under test is what the processes start with
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` gets the same clean-up as Ctrl-C
    try:
        with tempfile.TemporaryDirectory(prefix="muxbench-") as tmp:
            try:
                rows = anyio.run(run, args, Path(tmp))
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
    targets = _targets(rows)
    print()
    for name, verdict in targets.items():
        outcome = "met" if verdict["met"] else "MISSED"
        spread = ", ".join(f"{value:g}" for value in verdict["passes"])  # how far one run's verdict can be trusted
        print(f"{name}: {verdict['value']} (target {verdict['target']}): {outcome}; pass by pass: {spread}")
    rows_json = [{**asdict(row), "added_p50_ms": row.added_p50_ms, "throughput_kept_pct": row.kept_pct} for row in rows]
    meta.update(loadavg_at_end=os.getloadavg(), leaked_processes=leaked)
    report = {"meta": meta, "targets": targets, "rows": rows_json}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")
    return 1 if leaked else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
