"""Embedding service side by side: no batching vs a fixed window vs adaptive batching, and padding
waste with and without length bucketing, on the real all-MiniLM-L6-v2 (CPU).

    .venv/bin/python benchmarks/embeddings.py            # 64 clients x 8 texts each, 3 repeats
    .venv/bin/python benchmarks/embeddings.py --quick    # 64 clients x 3 texts, 1 repeat
    .venv/bin/python benchmarks/embeddings.py --float32  # float32 weights where bfloat16 would run

64 closed-loop clients each embed texts one at a time (a mix of short queries and long passages,
as a retrieval workload sends). Every configuration serves the same texts through an `Embedder`
(the `DynamicBatcher` in front of one loaded model); "no batching" is max_batch_size=1. Reported:
texts/s, p50 and p99 latency, mean batch size, forward passes and padding waste (pad tokens / all
tokens fed to the model). Medians over repeats; one warm-up pass excluded. Writes
`benchmarks/results/embeddings.json`. Shared machine: read the ratios, not the absolute times.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import anyio
import torch

from mcpmux.inference.serving.embeddings import Embedder
from mcpmux.inference.serving.encoder import EmbeddingModel
from mcpmux.inference.serving.settings import EmbeddingSettings

RESULTS = Path(__file__).resolve().parent / "results" / "embeddings.json"
MODEL = "builtin:all-minilm-l6-v2"
SENTENCE = (
    "paged attention stores keys and values in fixed size blocks continuous batching lets requests join "
    "and leave the running batch at every step the scheduler admits waiting requests under a token budget"
)
WORDS = SENTENCE.split(" ")


def workload(n: int, seed: int = 0) -> list[str]:
    """70% short queries (2-8 words), 30% passages (40-120 words)."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        size = rng.randint(2, 8) if rng.random() < 0.7 else rng.randint(40, 120)
        texts.append(" ".join(rng.choice(WORDS) for _ in range(size)))
    return texts


@dataclass(slots=True)
class Result:
    config: str
    texts_per_s: float
    p50_ms: float
    p99_ms: float
    mean_batch: float
    forward_passes: int
    padding_waste: float


CONFIGS = {
    "no batching": EmbeddingSettings(model=MODEL, max_batch_size=1, max_delay=0.0, mode="fixed", bucketing=False),
    "fixed window, no bucketing": EmbeddingSettings(model=MODEL, max_batch_size=32, max_delay=0.005, mode="fixed",
                                                    bucketing=False),
    "fixed window": EmbeddingSettings(model=MODEL, max_batch_size=32, max_delay=0.005, mode="fixed"),
    "adaptive, no bucketing": EmbeddingSettings(model=MODEL, max_batch_size=32, mode="adaptive", bucketing=False),
    "adaptive": EmbeddingSettings(model=MODEL, max_batch_size=32, mode="adaptive"),
}  # fmt: skip


async def run(name: str, settings: EmbeddingSettings, model: EmbeddingModel, clients: int, per_client: int) -> Result:
    texts = workload(clients * per_client)
    latencies: list[float] = []
    model.padding.real_tokens = model.padding.pad_tokens = model.forward_passes = 0
    async with Embedder(settings, model=model) as embedder:

        async def client(c: int) -> None:
            for k in range(per_client):
                started = time.perf_counter()
                await embedder.embed([texts[c * per_client + k]])
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for c in range(clients):
                tg.start_soon(client, c)
        elapsed = time.perf_counter() - started
        stats = embedder.stats()
    latencies.sort()
    return Result(
        name,
        len(texts) / elapsed,
        1000 * latencies[len(latencies) // 2],
        1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        stats["mean_batch_size"],
        stats["forward_passes"],
        stats["padding_waste"],
    )


def median_result(runs: list[Result]) -> Result:
    def med(field: str) -> float:
        return statistics.median(getattr(r, field) for r in runs)

    return Result(
        runs[0].config,
        med("texts_per_s"),
        med("p50_ms"),
        med("p99_ms"),
        med("mean_batch"),
        int(med("forward_passes")),
        med("padding_waste"),
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--float32", action="store_true", help="float32 linear layers (the default: matmul_dtype())")
    args = parser.parse_args()
    per_client, repeats = (3, 1) if args.quick else (8, 3)
    model = EmbeddingModel(MODEL, device="cpu", weights=torch.float32 if args.float32 else None)
    weights = model.packed.dtype if model.packed is not None else torch.float32
    model.embed(workload(16, seed=1))  # warm-up, excluded
    results = []
    for name, settings in CONFIGS.items():
        runs = [await run(name, settings, model, args.clients, per_client) for _ in range(repeats)]
        results.append(median_result(runs))
    base = results[0].texts_per_s
    print(
        f"\n{args.clients} clients x {per_client} texts, {repeats} repeat(s), torch threads {torch.get_num_threads()}, "
        f"linear layers in {weights}"
    )
    header = f"{'config':<28}{'texts/s':>9}{'x':>7}{'p50 ms':>9}{'p99 ms':>9}{'batch':>7}{'passes':>8}{'pad waste':>11}"
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r.config:<28}{r.texts_per_s:>9.1f}{r.texts_per_s / base:>7.2f}{r.p50_ms:>9.1f}{r.p99_ms:>9.1f}"
            f"{r.mean_batch:>7.1f}{r.forward_passes:>8}{r.padding_waste:>10.1%}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "machine": platform.platform(),
                "torch_threads": torch.get_num_threads(),
                "weights": str(weights),
                "clients": args.clients,
                "texts_per_client": per_client,
                "repeats": repeats,
                "results": [asdict(r) for r in results],
            },
            indent=2,
        )
    )
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    anyio.run(main)
