"""List-form batching end to end: 64 clients call `get_weather` through a real Mux and a real upstream.

    .venv/bin/python benchmarks/batching_e2e.py [--clients 64] [--seconds 8]

The upstream (`benchmarks/weather_upstream.py`, a subprocess over stdio) answers `get_weather` in
A = 20 ms and `get_weather_many` in A + B·n (B = 1 ms per item); mcpmux lets 4 calls be in flight on
it (`limits.max_concurrency = 4`), like a rate-limited API. Three configs, side by side in one run:
no batching, a fixed window and adaptive batching (`[[servers.weather.batch]]`). Each closed-loop
client calls again as soon as it has its answer; every answer is checked. Prints a table with
ratios and writes `benchmarks/results/batching_e2e.json`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from mcpmux.core.config import config_from_dict
from mcpmux.mux.multiplexer import Mux

HERE = Path(__file__).resolve().parent
UPSTREAM = {"command": sys.executable, "args": [str(HERE / "weather_upstream.py"), "20", "1"]}
FORM = {"tool": "get_weather", "batch_tool": "get_weather_many", "argument": "location", "list_argument": "locations"}
MODES: dict[str, list[dict[str, Any]]] = {
    "no batching": [],
    "fixed window": [{**FORM, "mode": "fixed", "max_delay": 0.01, "max_batch_size": 64}],
    "adaptive": [{**FORM, "mode": "adaptive", "max_delay": 0.05, "max_batch_size": 64}],
}


async def run_mode(batch: list[dict[str, Any]], clients: int, seconds: float) -> dict[str, float]:
    server = {**UPSTREAM, "limits": {"max_concurrency": 4}, "batch": batch, "cache": {"enabled": False}}
    config = config_from_dict({"servers": {"weather": server}, "mux": {"meta_tools": False}})
    latencies: list[float] = []
    async with Mux(config) as mux:
        deadline = time.perf_counter() + seconds

        async def client(index: int) -> None:
            call = 0
            while time.perf_counter() < deadline:
                location = f"city-{index}-{call}"
                started = time.perf_counter()
                result = await mux.call_tool("weather__get_weather", {"location": location})
                latencies.append(time.perf_counter() - started)
                text = "".join(getattr(block, "text", "") for block in result.content)
                if result.is_error or text != f"sunny in {location}":
                    raise RuntimeError(f"wrong answer for {location}: {text}")
                call += 1

        begun = time.perf_counter()
        async with anyio.create_task_group() as tasks:
            for index in range(clients):
                tasks.start_soon(client, index)
        elapsed = time.perf_counter() - begun
    latencies.sort()
    return {
        "calls": len(latencies),
        "calls_per_s": len(latencies) / elapsed,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[int(0.99 * (len(latencies) - 1))] * 1000,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    results = {name: await run_mode(batch, args.clients, args.seconds) for name, batch in MODES.items()}
    base = results["no batching"]["calls_per_s"]
    print(f"{args.clients} clients, upstream A=20 ms, B=1 ms/item, 4 in flight, {args.seconds:g} s per mode")
    print(f"{'mode':<14} {'calls/s':>9} {'x none':>7} {'p50 ms':>8} {'p99 ms':>8}")
    for name, row in results.items():
        ratio = row["calls_per_s"] / base
        print(f"{name:<14} {row['calls_per_s']:9.1f} {ratio:7.2f} {row['p50_ms']:8.1f} {row['p99_ms']:8.1f}")
    out = HERE / "results" / "batching_e2e.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"clients": args.clients, "seconds": args.seconds, "results": results}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    anyio.run(main)
