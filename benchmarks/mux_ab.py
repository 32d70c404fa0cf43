"""A/B of mcpmux's own CPU per HTTP call: this source tree against another (a worktree of the parent commit, say).

    git worktree add ../base HEAD~1
    .venv/bin/python benchmarks/mux_ab.py ../base                     # N = 1, 8 rounds of 1,500 calls each
    .venv/bin/python benchmarks/mux_ab.py ../base --concurrency 64 --calls 3000

Each tree's mcpmux serves HTTP in front of an echo upstream of its own (`benchmarks/echo_upstream.py`).
The rounds alternate between the two, and each round's figure is mcpmux's CPU time over its upstream's
in that same round. The host's speed drifts by tens of percent within minutes, and dividing by the
upstream's CPU cancels most of that drift; what is left is about 2% between medians of 8 rounds.

The load comes from the raw keep-alive HTTP/1.1 driver of `drivers.py`, not from `mcp.Client`: it
sends session-less 2026-07-28 `tools/call` POSTs with the headers the SDK's client sends, and checks
every answer. `mcp.Client` costs several times what mcpmux does per call, so it would swamp the difference.

Before any timing, each side is checked to import `mcpmux` from its own tree. An earlier A/B ran
`python -m mcpmux` from this checkout for both sides, so both imported this checkout whatever
PYTHONPATH said, and changes read as "within noise".

Prints one line per round and the medians. Exits 1 if a process outlived the run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from drivers import RawHttpDriver
from mux_overhead import ECHO, HERE, Mcpmux, _base_env, _free_port, http_server, processes_cpu, sweep_leaks

TREE = HERE.parent


async def drive(port: int, concurrency: int, calls: int) -> None:
    """`calls` calls from `concurrency` keep-alive connections, each answer checked against its request."""
    driver = RawHttpDriver(f"http://127.0.0.1:{port}/mcp", "echo__echo")
    numbers = iter(range(calls))

    async def lane(index: int) -> None:
        for number in numbers:
            text = f"ab-{number}"
            if (answer := await driver.echo(index, text)) != text:
                raise RuntimeError(f"call {number}: asked to echo {text!r}, got {answer!r}")

    try:
        await asyncio.gather(*(lane(index) for index in range(concurrency)))
    finally:
        await driver.aclose()


def check_imports(tree: Path, workdir: Path) -> None:
    """Fail unless a process started with `tree`'s environment imports the `mcpmux` package from `tree`."""
    probe = [sys.executable, "-c", "import mcpmux; print(mcpmux.__file__)"]
    found = subprocess.run(
        probe, cwd=workdir, env={**os.environ, **_base_env(tree)}, capture_output=True, text=True, check=True
    ).stdout.strip()
    if not Path(found).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"the mcpmux meant to run from {tree} imports {found}: the A/B would time one tree twice")


def round_ratio(route: str, port: int, concurrency: int, calls: int) -> tuple[float, float]:
    """One round on `route`: mcpmux's CPU ms per call, and its CPU over its upstream's."""
    before = processes_cpu(route)
    asyncio.run(drive(port, concurrency, calls))
    after = processes_cpu(route)
    middle, upstream = (after[role] - before[role] for role in ("middle", "upstream"))
    return middle / calls * 1e3, middle / upstream


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base", type=Path, help="the other source tree (route `base`); this one is `new`")
    parser.add_argument("--rounds", type=int, default=8, help="rounds per tree, alternating")
    parser.add_argument("--calls", type=int, default=1500, help="calls per round")
    parser.add_argument("--concurrency", type=int, default=1, help="connections the driver keeps busy")
    args = parser.parse_args(argv)
    trees = {"base": args.base, "new": TREE}
    ratios: dict[str, list[float]] = {route: [] for route in trees}
    costs: dict[str, list[float]] = {route: [] for route in trees}
    try:
        with tempfile.TemporaryDirectory(prefix="muxab-") as tmp, contextlib.ExitStack() as stack:
            workdir = Path(tmp)
            ports = {}
            for route, tree in trees.items():
                check_imports(tree, workdir)
                upstream, ports[route] = _free_port(), _free_port()
                config = workdir / f"{route}.json"
                config.write_text(json.dumps({"mcpServers": {"echo": {"url": f"http://127.0.0.1:{upstream}/mcp"}}}))
                echo = [sys.executable, ECHO, "http", str(upstream)]
                stack.enter_context(http_server(echo, upstream, route, workdir / f"echo-{route}.log"))
                mcpmux = Mcpmux(tree)  # `python -m mcpmux` in the tree: an older tree has its own entry point
                serve = [*mcpmux.serve(str(config)), "--transport", "http", "--port", str(ports[route])]
                log = workdir / f"{route}.log"
                stack.enter_context(http_server(serve, ports[route], route, log, mcpmux.env(), cwd=tree))
                asyncio.run(drive(ports[route], args.concurrency, 200))  # warm-up
            print(f"mux_ab: N = {args.concurrency}, {args.calls} calls per round; base = {args.base}, new = {TREE}")
            for number in range(args.rounds):
                for route in trees:
                    started = time.perf_counter()
                    cost, ratio = round_ratio(route, ports[route], args.concurrency, args.calls)
                    rate = args.calls / (time.perf_counter() - started)
                    costs[route].append(cost)
                    ratios[route].append(ratio)
                    figures = f"{rate:5.0f} calls/s  mcpmux {cost:.3f} ms/call  / upstream {ratio:.3f}"
                    print(f"round {number + 1} {route:4}  {figures}", flush=True)
    finally:
        leaked = sweep_leaks()
    medians = {route: statistics.median(ratios[route]) for route in trees}
    for route in trees:
        cost = statistics.median(costs[route])
        print(f"{route:4}: median mcpmux/upstream CPU {medians[route]:.3f}, mcpmux {cost:.3f} ms/call")
    change = (medians["new"] / medians["base"] - 1) * 100
    print(f"new against base: {change:+.1f}% mcpmux CPU per call (upstream's CPU as the yardstick)")
    if leaked:
        print(f"LEAK: {len(leaked)} process(es) outlived the run and were killed: {leaked}")
    return 1 if leaked else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
