"""The generic batching layer, side by side on an in-process synthetic upstream.

    .venv/bin/python benchmarks/batching.py            # full run (about a minute)
    .venv/bin/python benchmarks/batching.py --quick    # shorter passes, one repeat

The synthetic upstream is batch-capable: a call with a list of n items costs ``A + B*n``
(A = 20 ms, B = 1 ms) and at most 4 calls are in flight at once, like a real upstream server.

1. Throughput: 64 closed-loop clients (and 2, for light load) with no batching (one call per
   item), a fixed window (Triton rule) and adaptive batching: requests/s, p50 and p99 latency.
   Target: adaptive >= 5x the throughput of no batching at equal or better p99.
2. Priority under overload: open-loop arrivals at 1.5x the upstream's capacity through an
   `AdmissionGate` (4 at a time), 10% of them high priority: p99 of each class with and without
   priorities.
3. Coalescing + cache on a read-heavy mix: 64 clients read Zipf-distributed keys (10% writes,
   which invalidate their key): upstream calls saved and latency, direct vs single-flight vs
   single-flight + cache.

Prints tables with ratios and writes `benchmarks/results/batching.json`. Real sleeps on a shared
machine: read the ratios, not the absolute times.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import anyio

from mcpmux.batching import (
    AdmissionGate,
    BatchPolicy,
    DynamicBatcher,
    GatePolicy,
    QueuePolicy,
    ResultCache,
    SingleFlight,
)

RESULTS = Path(__file__).resolve().parent / "results" / "batching.json"
FIXED_COST = 0.020
PER_ITEM = 0.001
UPSTREAM_CONCURRENCY = 4


@dataclass(slots=True)
class Row:
    """One measured configuration."""

    section: str
    name: str
    requests: int
    seconds: float
    throughput: float
    p50_ms: float
    p99_ms: float
    upstream_calls: int
    extra: dict[str, float]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


class Upstream:
    """The synthetic batch-capable upstream: A + B*n seconds per call, 4 calls in flight."""

    def __init__(self) -> None:
        self.calls = 0
        self._limit = anyio.Semaphore(UPSTREAM_CONCURRENCY)

    async def many(self, items: list[int]) -> list[int]:
        async with self._limit:
            self.calls += 1
            await anyio.sleep(FIXED_COST + PER_ITEM * len(items))
            return items


async def closed_loop(clients: int, seconds: float, call: Callable[[int], Awaitable[object]]) -> list[float]:
    """Each client calls back to back until `seconds` pass; returns every latency."""
    latencies: list[float] = []
    stop_at = anyio.current_time() + seconds

    async def client(c: int) -> None:
        k = 0
        while anyio.current_time() < stop_at:
            start = anyio.current_time()
            await call(c * 1_000_000 + k)
            latencies.append(anyio.current_time() - start)
            k += 1

    async with anyio.create_task_group() as tg:
        for c in range(clients):
            tg.start_soon(client, c)
    return latencies


async def throughput_case(name: str, clients: int, seconds: float, policy: BatchPolicy | None) -> Row:
    upstream = Upstream()
    start = anyio.current_time()
    extra: dict[str, float] = {}
    if policy is None:
        latencies = await closed_loop(clients, seconds, lambda item: upstream.many([item]))
    else:
        async with DynamicBatcher(upstream.many, policy) as batcher:
            latencies = await closed_loop(clients, seconds, batcher.submit)
        stats = batcher.stats()
        extra = {
            "mean_batch": stats.mean_batch_size,
            "fit_a_ms": stats.cost_per_item * 1e3,
            "fit_b_ms": stats.cost_fixed * 1e3,
        }
    took = anyio.current_time() - start
    return Row(
        "throughput",
        f"{name} ({clients} clients)",
        len(latencies),
        took,
        len(latencies) / took,
        percentile(latencies, 0.5) * 1e3,
        percentile(latencies, 0.99) * 1e3,
        upstream.calls,
        extra,
    )


async def section_throughput(seconds: float) -> list[Row]:
    fixed = BatchPolicy(max_batch_size=32, max_delay=0.01, max_concurrent_batches=UPSTREAM_CONCURRENCY)
    adaptive = BatchPolicy(
        max_batch_size=32, max_delay=0.01, max_concurrent_batches=UPSTREAM_CONCURRENCY, mode="adaptive"
    )
    rows = []
    for clients in (64, 2):
        for name, policy in (("no batching", None), ("fixed window", fixed), ("adaptive", adaptive)):
            rows.append(await throughput_case(name, clients, seconds, policy))
    return rows


async def priority_run(use_priority: bool, seconds: float, seed: int) -> list[Row]:
    """Open-loop arrivals at 1.5x capacity through a 4-wide gate; p99 per class."""
    rate = 1.5 * UPSTREAM_CONCURRENCY / FIXED_COST
    rng = random.Random(seed)
    gate = AdmissionGate(GatePolicy(max_concurrency=UPSTREAM_CONCURRENCY, queue=QueuePolicy(max_queue=100_000)))
    upstream = Upstream()
    latencies: dict[bool, list[float]] = {True: [], False: []}

    async def request(high: bool) -> None:
        start = anyio.current_time()
        async with gate.slot(priority=10 if high and use_priority else 0):
            await upstream.many([0])
        latencies[high].append(anyio.current_time() - start)

    start = anyio.current_time()
    async with anyio.create_task_group() as tg:
        while anyio.current_time() < start + seconds:
            tg.start_soon(request, rng.random() < 0.1)
            await anyio.sleep(rng.expovariate(rate))
    took = anyio.current_time() - start
    label = "with priorities" if use_priority else "without priorities"
    rows = []
    for high in (True, False):
        values = latencies[high]
        rows.append(
            Row(
                "priority",
                f"{label}: {'high' if high else 'low'} class",
                len(values),
                took,
                len(values) / took,
                percentile(values, 0.5) * 1e3,
                percentile(values, 0.99) * 1e3,
                upstream.calls,
                {"offered_per_s": rate},
            )
        )
    return rows


def zipf_keys(rng: random.Random, count: int, keys: int = 1000, s: float = 1.1) -> list[int]:
    weights = [1 / (k + 1) ** s for k in range(keys)]
    return rng.choices(range(keys), weights=weights, k=count)


async def cache_run(name: str, per_client: int, seed: int) -> Row:
    """64 clients on a Zipf read mix with 10% writes; `name` picks direct, single-flight, or both + cache."""
    clients = 64
    rng = random.Random(seed)
    plans = [[(key, rng.random() < 0.1) for key in zipf_keys(rng, per_client)] for _ in range(clients)]
    upstream = Upstream()
    cache: ResultCache[list[int]] = ResultCache()
    latencies: list[float] = []
    async with SingleFlight[tuple[str, ...], list[int]]() as flights:

        async def read(key: tuple[str, ...], item: int) -> list[int]:
            if name == "direct":
                return await upstream.many([item])
            if name == "single-flight":
                return await flights.call(key, lambda: upstream.many([item]))
            return await cache.get_or_compute(key, lambda: flights.call(key, lambda: upstream.many([item])))

        async def client(plan: list[tuple[int, bool]]) -> None:
            for item, write in plan:
                key = ("store", "get", str(item))
                start = anyio.current_time()
                if write:
                    await upstream.many([item])
                    cache.invalidate(key)
                else:
                    await read(key, item)
                latencies.append(anyio.current_time() - start)

        start = anyio.current_time()
        async with anyio.create_task_group() as tg:
            for plan in plans:
                tg.start_soon(client, plan)
        took = anyio.current_time() - start
    requests = clients * per_client
    return Row(
        "cache",
        name,
        requests,
        took,
        requests / took,
        percentile(latencies, 0.5) * 1e3,
        percentile(latencies, 0.99) * 1e3,
        upstream.calls,
        {"calls_saved_pct": 100 * (1 - upstream.calls / requests), "cache_hits": cache.stats().hits},
    )


def median_rows(runs: list[list[Row]]) -> list[Row]:
    """Per configuration, the repeat with the median throughput."""
    merged = []
    for same in zip(*runs, strict=True):
        ordered = sorted(same, key=lambda row: row.throughput)
        merged.append(ordered[len(ordered) // 2])
    return merged


def print_table(title: str, rows: list[Row], baseline: Row) -> None:
    print(f"\n{title}")
    print(f"{'configuration':42} {'req/s':>8} {'x base':>7} {'p50 ms':>8} {'p99 ms':>8} {'calls':>7}  extra")
    for row in rows:
        extra = ", ".join(f"{k}={v:.1f}" for k, v in row.extra.items())
        print(
            f"{row.name:42} {row.throughput:8.0f} {row.throughput / baseline.throughput:7.2f} "
            f"{row.p50_ms:8.1f} {row.p99_ms:8.1f} {row.upstream_calls:7d}  {extra}"
        )


async def main(quick: bool, repeats: int) -> None:
    seconds = 0.8 if quick else 2.0
    runs = [await section_throughput(seconds) for _ in range(repeats)]
    throughput = median_rows(runs)
    priority = [row for use in (False, True) for row in await priority_run(use, seconds * 1.5, seed=1)]
    cache = [
        await cache_run(name, 20 if quick else 60, seed=2)
        for name in ("direct", "single-flight", "single-flight + cache")
    ]

    print_table(
        "1. throughput: 64 and 2 closed-loop clients, upstream A + B*n = 20 ms + 1 ms*n, 4 in flight",
        throughput[:3],
        throughput[0],
    )
    print_table("   light load", throughput[3:], throughput[3])
    print_table("2. priority under overload (1.5x capacity, 10% high priority)", priority, priority[0])
    print_table("3. coalescing + cache, read-heavy Zipf mix (10% writes)", cache, cache[0])
    direct, adaptive = throughput[0], throughput[2]
    verdict = {
        "adaptive_vs_none_throughput": adaptive.throughput / direct.throughput,
        "adaptive_p99_ms": adaptive.p99_ms,
        "none_p99_ms": direct.p99_ms,
        "target_met": adaptive.throughput >= 5 * direct.throughput and adaptive.p99_ms <= direct.p99_ms,
        "high_priority_p99_ratio": priority[0].p99_ms / priority[2].p99_ms,
        "calls_saved_pct": cache[2].extra["calls_saved_pct"],
    }
    print(
        f"\nadaptive / no batching: {verdict['adaptive_vs_none_throughput']:.1f}x throughput, p99 "
        f"{adaptive.p99_ms:.0f} ms vs {direct.p99_ms:.0f} ms -> target met: {verdict['target_met']}"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "machine": platform.platform(),
                "python": platform.python_version(),
                "quick": quick,
                "repeats": repeats,
                "upstream": {"fixed_cost_s": FIXED_COST, "per_item_s": PER_ITEM, "concurrency": UPSTREAM_CONCURRENCY},
                "rows": [asdict(row) for row in throughput + priority + cache],
                "verdict": verdict,
                "throughput_spread": {
                    row.name: statistics.pstdev(r.throughput for r in same)
                    for row, same in zip(throughput, zip(*runs, strict=True), strict=True)
                },
            },
            indent=2,
        )
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="shorter passes and one repeat")
    parser.add_argument("--repeats", type=int, default=None, help="throughput repeats (default 3, quick 1)")
    args = parser.parse_args()
    anyio.run(main, args.quick, args.repeats or (1 if args.quick else 3))
