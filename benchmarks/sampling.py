"""Upstream sampling through mcpmux: N upstream servers x M concurrent calls vs the same calls one at a time.

    .venv/bin/python benchmarks/sampling.py                                  # tiny random model
    .venv/bin/python benchmarks/sampling.py --model builtin:smollm2-135m     # the real SmolLM2
    .venv/bin/python benchmarks/sampling.py --servers 4 --concurrency 8 --max-tokens 32 --repeats 3

Each upstream is `examples/sampling_server.py` (half on 2026-07-28 input-required rounds, half on
2025 pushed requests); every call of its `sample` tool asks mcpmux for a completion, which the
in-process engine answers (`policy = "local"`). The same N x M requests (distinct prompts,
temperature 0, `--max-tokens` each) run twice per repeat: one at a time, then all at once. The first
pass is a warm-up and is discarded.

Reported per mode (medians over repeats): TTFT (request reaching the bridge to its first text) and
end-to-end call latency (tool call to result, through the upstream) at p50/p99, output tokens/s over
the wall time, and the engine's mean sequences per step. Prints a table and writes
`benchmarks/results/sampling.json`.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository's packages come first

from mcpmux import Mux  # noqa: E402
from mcpmux.inference.serving.sampling_bridge import SamplingTiming  # noqa: E402

SERVER = ROOT / "examples" / "sampling_server.py"
RESULTS = ROOT / "benchmarks" / "results" / "sampling.json"


@dataclass(slots=True)
class Row:
    mode: str
    requests: int
    wall_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    e2e_p50_ms: float
    e2e_p99_ms: float
    tokens_per_s: float
    seqs_per_step: float


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def write_config(folder: Path, model: str, servers: int) -> Path:
    tables = [
        '[inference]\nbackend = "local"\n',
        f'[inference.models.bench]\nmodel = "{model}"\nkv_cache_memory_mb = 256\n',
        '[inference.embeddings]\nmodel = ""\n',
        "[mux]\ncall_timeout = 600\n",
    ]
    for i in range(servers):
        protocol = "auto" if i % 2 == 0 else "legacy"
        tables.append(
            f'[servers.s{i}]\ncommand = "{sys.executable}"\nargs = ["{SERVER}"]\nprotocol = "{protocol}"\n'
            f'[servers.s{i}.sampling]\npolicy = "local"\nmax_tokens = 4096\n'
        )
    path = folder / "mcpmux.toml"
    path.write_text("\n".join(tables))
    return path


def tiny_model(folder: Path) -> str:
    from tests.inference.tiny_models import build_tiny_model

    return str(build_tiny_model("llama", folder / "tiny-llama"))


async def run_mode(mux: Mux, mode: str, calls: list[tuple[str, str]], max_tokens: int) -> Row:
    assert mux.inference is not None
    before = mux.inference.stats()["models"]["bench"]
    first = len(mux.sampling.recent)
    latencies: list[float] = []

    async def one(upstream: str, prompt: str) -> None:
        started = time.perf_counter()
        arguments = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        result = await mux.call_tool(f"{upstream}__sample", arguments)
        if result.is_error:
            raise RuntimeError(f"sampling call failed: {result.content}")
        latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    if mode == "one at a time":
        for upstream, prompt in calls:
            await one(upstream, prompt)
    else:
        async with anyio.create_task_group() as tasks:
            for upstream, prompt in calls:
                tasks.start_soon(one, upstream, prompt)
    wall = time.perf_counter() - started
    timings: list[SamplingTiming] = list(mux.sampling.recent)[first:]
    after = mux.inference.stats()["models"]["bench"]
    steps = after["steps"] - before["steps"]
    scheduled = after["mean_seqs_per_step"] * after["steps"] - before["mean_seqs_per_step"] * before["steps"]
    ttfts = [t.ttft for t in timings]
    return Row(
        mode=mode,
        requests=len(calls),
        wall_s=wall,
        ttft_p50_ms=percentile(ttfts, 0.5) * 1000,
        ttft_p99_ms=percentile(ttfts, 0.99) * 1000,
        e2e_p50_ms=percentile(latencies, 0.5) * 1000,
        e2e_p99_ms=percentile(latencies, 0.99) * 1000,
        tokens_per_s=sum(t.completion_tokens for t in timings) / wall,
        seqs_per_step=scheduled / steps if steps else 0.0,
    )


def median_row(rows: list[Row]) -> Row:
    fields: dict[str, Any] = {"mode": rows[0].mode, "requests": rows[0].requests}
    for name in ("wall_s", "ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p99_ms", "tokens_per_s", "seqs_per_step"):
        fields[name] = statistics.median(getattr(row, name) for row in rows)
    return Row(**fields)


async def run(args: argparse.Namespace) -> list[Row]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = args.model or tiny_model(folder)
        config = write_config(folder, model, args.servers)
        async with Mux.from_config(config) as mux:
            calls = [
                (f"s{i % args.servers}", f"Request {i}: say something about the number {i}.")
                for i in range(args.servers * args.concurrency)
            ]
            results: dict[str, list[Row]] = {"one at a time": [], "concurrent": []}
            for repeat in range(args.repeats + 1):
                for mode in results:
                    row = await run_mode(mux, mode, calls, args.max_tokens)
                    if repeat:  # the first pass warms up the engine and the upstreams
                        results[mode].append(row)
    return [median_row(rows) for rows in results.values()]


def print_table(rows: list[Row], args: argparse.Namespace) -> None:
    print(
        f"\nsampling through mcpmux: {args.servers} upstreams x {args.concurrency} calls, {args.max_tokens} tokens each"
    )
    print(f"model: {args.model or 'tiny random llama'}; medians of {args.repeats} repeats\n")
    columns = ("reqs", "wall s", "TTFT p50", "TTFT p99", "e2e p50", "e2e p99", "tok/s", "seqs/step")
    header = f"{'mode':<14}" + "".join(f"{c:>10}" for c in columns)
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r.mode:<14}{r.requests:>10}{r.wall_s:>10.2f}{r.ttft_p50_ms:>8.0f}ms{r.ttft_p99_ms:>8.0f}ms"
            f"{r.e2e_p50_ms:>8.0f}ms{r.e2e_p99_ms:>8.0f}ms{r.tokens_per_s:>10.1f}{r.seqs_per_step:>10.1f}"
        )
    alone, together = rows
    print(f"\nconcurrent vs one at a time: {together.tokens_per_s / alone.tokens_per_s:.1f}x tokens/s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", type=int, default=4, help="upstream servers (N)")
    parser.add_argument("--concurrency", type=int, default=8, help="concurrent calls per server (M)")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per request")
    parser.add_argument("--repeats", type=int, default=3, help="measured passes after one warm-up")
    parser.add_argument("--model", default=None, help="model spec (default: a tiny random Llama built here)")
    args = parser.parse_args(argv)
    rows = anyio.run(run, args)
    print_table(rows, args)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    meta = {"args": vars(args), "python": platform.python_version(), "machine": platform.machine()}
    RESULTS.write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=2))
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
