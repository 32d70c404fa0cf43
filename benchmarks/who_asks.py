"""Two clients whose calls ask them things, through mcpmux against direct: latency, and who got what.

    .venv/bin/python benchmarks/who_asks.py                 # 2 clients x 4 callers x 100 calls per route
    .venv/bin/python benchmarks/who_asks.py --calls 30      # a smoke run

Two real `mcp.Client`s (alice and bob, 2025-11-25) each answer elicitation with their own name and list
their own root; each runs `--callers` concurrent callers that call `whoami` (elicits the name) and
`myroots` (lists the roots) of `tests/servers/asking_server.py`, with no delay before asking.
Routes, timed interleaved, `--repeats` passes each:

- `direct-http`: both clients on the upstream's streamable HTTP endpoint (a session each);
- `mcpmux-http`: both on one mcpmux HTTP front, the upstream behind it over HTTP (one shared session:
  each request rides the stream of the call that caused it);
- `direct-stdio`: each client starts the upstream itself, over stdio;
- `mcpmux-stdio`: both on one mcpmux HTTP front, the upstream behind it over stdio with
  `sessions = "per-client"` (a process per client, as direct).

Every answer is checked: a name or root of the other client is counted as wrong (it must be 0).
Prints p50/p99 latency and calls/s per route with their ratios to the direct route of the same
upstream transport, and writes JSON to `benchmarks/results/who_asks.json`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mux_overhead import _free_port, http_server

HERE = Path(__file__).resolve().parent
ASKING = HERE.parent / "tests" / "servers" / "asking_server.py"
PEOPLE = ("alice", "bob")


def _callbacks(name: str) -> dict[str, Any]:
    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"name": name})

    async def roots(context: Any) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri=f"file:///home/{name}")])

    return {"elicitation_callback": elicit, "list_roots_callback": roots}


@asynccontextmanager
async def _client(target: str | StdioServerParameters, name: str, token: str | None) -> Any:
    async with AsyncExitStack() as stack:
        transport: Any = target
        if isinstance(target, str):
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            http = await stack.enter_async_context(httpx2.AsyncClient(headers=headers, timeout=None))
            transport = streamable_http_client(target, http_client=http)
        yield await stack.enter_async_context(Client(transport, mode="legacy", **_callbacks(name)))


async def _pass(clients: dict[str, Client], prefix: str, callers: int, calls: int) -> tuple[list[float], int, float]:
    latencies: list[float] = []
    wrong = 0

    async def caller(name: str, client: Client, lane: int) -> None:
        nonlocal wrong
        for index in range(calls // callers):
            tool = "whoami" if (index + lane) % 2 == 0 else "myroots"
            started = time.perf_counter()
            result = await client.call_tool(f"{prefix}{tool}", {"delay_ms": 0})
            latencies.append(time.perf_counter() - started)
            text = "".join(getattr(block, "text", "") for block in result.content)
            if result.is_error or name not in text:
                wrong += 1

    started = time.perf_counter()
    async with anyio.create_task_group() as tasks:
        for name, client in clients.items():
            for lane in range(callers):
                tasks.start_soon(caller, name, client, lane)
    return latencies, wrong, time.perf_counter() - started


async def _route(route: str, stack: AsyncExitStack, folder: Path) -> tuple[dict[str, Client], str]:
    """Connect both clients for `route`; returns them and the tools' prefix."""
    python = sys.executable
    if route.startswith("direct"):
        if route == "direct-http":
            port = _free_port()
            stack.enter_context(
                http_server([python, str(ASKING), "http", str(port)], port, route, folder / f"{route}.log")
            )
            target: Any = f"http://127.0.0.1:{port}/mcp"
        else:
            target = StdioServerParameters(command=python, args=[str(ASKING)])
        clients = {name: await stack.enter_async_context(_client(target, name, None)) for name in PEOPLE}
        return clients, ""
    if route == "mcpmux-http":
        port = _free_port()
        log = folder / f"{route}-up.log"
        stack.enter_context(http_server([python, str(ASKING), "http", str(port)], port, f"{route}-up", log))
        upstream: dict[str, Any] = {"url": f"http://127.0.0.1:{port}/mcp", "protocol": "legacy"}
    else:
        upstream = {"command": python, "args": [str(ASKING)], "protocol": "legacy", "sessions": "per-client"}
    tokens = folder / f"{route}.tokens"
    tokens.write_text("".join(f"{name}-token\n" for name in PEOPLE))
    config = folder / f"{route}.json"
    settings = {"tool_search": "off", "meta_tools": False}
    body = {"mcpServers": {"who": upstream}, "mux": settings, "http": {"auth_token_file": str(tokens)}}
    config.write_text(json.dumps({**body, "inference": {"backend": "off"}}))
    port = _free_port()
    command = [python, "-m", "mcpmux", "serve", "--config", str(config), "--transport", "http", "--port", str(port)]
    stack.enter_context(http_server(command, port, route, folder / f"{route}.log"))
    url = f"http://127.0.0.1:{port}/mcp"
    clients = {name: await stack.enter_async_context(_client(url, name, f"{name}-token")) for name in PEOPLE}
    return clients, "who__"


async def run(args: argparse.Namespace) -> dict[str, Any]:
    routes = ["direct-http", "mcpmux-http", "direct-stdio", "mcpmux-stdio"]
    samples: dict[str, list[tuple[list[float], int, float]]] = {route: [] for route in routes}
    with tempfile.TemporaryDirectory() as workdir:
        async with AsyncExitStack() as stack:
            connected = {route: await _route(route, stack, Path(workdir)) for route in routes}
            for repeat in range(args.repeats + 1):  # the first pass warms up (new sessions start) and is dropped
                order = routes[repeat % len(routes) :] + routes[: repeat % len(routes)]
                for route in order:
                    clients, prefix = connected[route]
                    outcome = await _pass(clients, prefix, args.callers, args.calls)
                    if repeat:
                        samples[route].append(outcome)
    report: dict[str, Any] = {}
    for route, passes in samples.items():
        latencies = sorted(latency for lats, _, _ in passes for latency in lats)
        rate = statistics.median(len(lats) / seconds for lats, _, seconds in passes)
        report[route] = {
            "p50_ms": latencies[len(latencies) // 2] * 1e3,
            "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3,
            "calls_per_s": rate,
            "wrong": sum(wrong for _, wrong, _ in passes),
        }
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100, help="calls per client per pass")
    parser.add_argument("--callers", type=int, default=4, help="concurrent callers per client")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    report = anyio.run(run, args)
    print(f"{'route':14} {'p50 ms':>8} {'p99 ms':>8} {'calls/s':>8} {'wrong':>6}  against direct (p50, calls/s)")
    for route, row in report.items():
        direct = report["direct-" + route.split("-", 1)[1]]
        ratios = f"x{row['p50_ms'] / direct['p50_ms']:.2f}, x{row['calls_per_s'] / direct['calls_per_s']:.2f}"
        line = f"{route:14} {row['p50_ms']:8.1f} {row['p99_ms']:8.1f} {row['calls_per_s']:8.1f} {row['wrong']:6d}"
        print(f"{line}  {ratios}")
    out = HERE / "results" / "who_asks.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    return 1 if any(row["wrong"] for row in report.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
