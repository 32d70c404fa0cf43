"""Tool search quality, latency, start-up, index build time and listing size (issues 26 and 38).

    python benchmarks/tool_search.py [--parts quality latency startup] [--sizes 200 2000] [--rounds N]
                                     [--cold-max N] [--pause S] [--warm-starts N] [--json OUT]

Data: `tests/data/tool_catalogs.json` (the tool lists of 43 real servers from npm and PyPI, stored
by `benchmarks/tool_catalogs.py`; 489 tools), `tests/data/tool_servers.json` (each server's package,
instructions and split) and two query sets, each query naming its right tool (and its aliases):
`tool_search_dev_queries.json`, 265 queries over the 32 servers added for issue 38, written from the
tool lists before any ranking was run, plus 18 nonsense queries; and `tool_search_queries.json`, the
first set's 152 over the first 11 servers. The split is by server: queries whose right tool is on
one of the 15 held-out servers are `heldout`; those servers were never looked at while choosing a
method or a parameter. Every query searches the whole catalog. Kinds: keyword, paraphrase (worded
away from the description), similar-tools (two servers offer the same tool; the query names which),
nonsense (right when nothing comes back).

`quality`: R@1, R@5 and MRR for BM25 alone, embeddings alone (one view of each tool or three) and
the fusions, per split and kind; the shipped ranking (`ToolIndex.search`, threshold included) with
its share of nonsense queries answered with nothing. `latency`: search latency p50/p99 (ranking
alone and with the query's embedding) at each catalog size, grown by copying the real servers under
new names, and the index build cold (empty embedding cache) and warm (every vector on disk).
`startup`: mcpmux in front of every stored server (`catalog_server.py` replays each), started in a
new process cold, then warm: when the listing is complete, when a search sent at that moment is
answered and by which ranking, and R@1/R@5/MRR of a client that searches from the listing on and of
one that waits for the index (`tool_search_startup.py`). Also the listing's size in search mode
against the full catalog (tokens estimated as JSON characters / 4).

Every embedding goes through the serving `Embedder` with default settings, as `mux_search_tools`
does: its linear layers run in bfloat16 where the CPU has the instructions (`matmul_dtype`). A
second `Embedder` holds the same model with float32 weights, and the quality table's embedding rows
are repeated with its vectors. Latency rounds alternate between the two in blocks, so both see the
same load; the host's load average is printed with each row. Searches run back to back unless
`--pause S` waits S seconds before each one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import numpy as np
import torch
from tool_search_data import QUERIES, grouped, grown, load_docs, load_queries, rank_in

from mcpmux.inference.serving.bert_encoder import matmul_dtype
from mcpmux.inference.serving.embeddings import Embedder
from mcpmux.inference.serving.encoder import EmbeddingModel
from mcpmux.inference.serving.settings import EmbeddingSettings
from mcpmux.tools.meta_schemas import BATCH_TOOL, PARALLEL_TOOL, PIPELINE_TOOL
from mcpmux.tools.search import CALL_TOOL, SEARCH_TOOL, SEARCH_TOOL_INTRO
from mcpmux.tools.search_description import describe_catalog
from mcpmux.tools.search_index import RRF_K, EmbeddingCache, ToolIndex

ROOT = Path(__file__).resolve().parents[1]
MODEL = "builtin:all-minilm-l6-v2"
STARTUP = ROOT / "benchmarks" / "tool_search_startup.py"


class Model:
    """The embedded MiniLM behind the serving `Embedder` (default settings), and the same model with
    float32 weights behind a second `Embedder`."""

    def __init__(self, embedder: Embedder, float32: Embedder) -> None:
        self.embed = embedder.embed
        self.embed_float32 = float32.embed


# -- fusion functions compared (the index ships the one that wins on the tuning part) ------------------


def rrf(keyword: np.ndarray, dense: np.ndarray, k: int = RRF_K, dense_weight: float = 1.0) -> np.ndarray:
    fused = np.zeros(len(keyword))
    for weight, scores, depth in ((1.0, keyword, None), (dense_weight, dense, 50)):
        order = np.argsort(-scores, kind="stable")
        if scores is keyword:
            order = order[keyword[order] > 0]
        for rank, index in enumerate(order[:depth]):
            fused[index] += weight / (k + rank + 1)
    return fused


def convex(keyword: np.ndarray, dense: np.ndarray, alpha: float = 0.6, floor: float = 0.0) -> np.ndarray:
    """alpha * cosine + (1 - alpha) * BM25 / max(BM25 max, floor) (Bruch et al. 2023, convex combination)."""
    top = max(float(keyword.max()), floor)
    normed = keyword / top if top > 0 else keyword
    return alpha * dense + (1 - alpha) * normed


def rank_of(scores: np.ndarray, names: list[str], right: frozenset[str], valid: np.ndarray | None = None) -> int:
    if valid is not None:
        scores = np.where(valid, scores, -np.inf)
    order = np.argsort(-scores, kind="stable")
    for position, index in enumerate(order[:50], 1):
        if not np.isfinite(scores[index]):
            return 0
        if names[index] in right:
            return position
    return 0


async def quality(embed: Callable[[list[str]], Any], only: tuple[str, ...] = ()) -> dict[str, Any]:
    """R@1, R@5, MRR per method, split and query kind over the whole catalog; `only`: these methods alone."""
    docs = load_docs()
    index = ToolIndex()
    index.update(docs)
    await index.embed_missing(embed)
    names = [doc.name for doc in docs]
    queries = load_queries()
    vectors = await embed([query.text for query in queries])
    Score = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray | None]]
    methods: dict[str, Score] = {
        "bm25": lambda kw, views: (kw, kw > 0),
        "dense, one view (whole tool)": lambda kw, views: (views[:, 0], None),
        "dense, three views": lambda kw, views: (views.max(axis=1), None),
        "rrf k=60": lambda kw, views: (rrf(kw, views.max(axis=1)), None),
        "cc a=0.7 floor=10, one view": lambda kw, views: (convex(kw, views[:, 0], 0.7, 10.0), None),
    }
    for alpha in (0.5, 0.6, 0.7, 0.8):
        for floor in (0.0, 5.0, 10.0, 15.0):
            methods[f"cc a={alpha} floor={floor:g}"] = lambda kw, views, a=alpha, f=floor: (
                convex(kw, views.max(axis=1), a, f),
                None,
            )
    results: dict[str, Any] = {}
    for method, score in methods.items():
        if only and method not in only:
            continue
        ranks = []
        for query, vector in zip(queries, vectors, strict=True):
            scores, valid = score(index.keyword_scores(query.text), np.asarray(index.view_scores(vector)))
            ranks.append(rank_of(scores, names, query.right, valid))
        results[method] = grouped(queries, ranks)
    # What mux_search_tools answers (the threshold included): a nonsense query is right when nothing comes back.
    answers = [[hit.doc.name for hit in index.search(q.text, 50, v)] for q, v in zip(queries, vectors, strict=True)]
    shipped = grouped(queries, [rank_in(answer, q.right) for q, answer in zip(queries, answers, strict=True)])
    for split in ("tune", "heldout"):
        nonsense = [
            not answer for q, answer in zip(queries, answers, strict=True) if q.kind == "nonsense" and q.split == split
        ]
        shipped[f"{split}/nonsense answered empty"] = {"share": sum(nonsense) / len(nonsense), "n": len(nonsense)}
    results["shipped (ToolIndex.search)"] = shipped
    return results


async def latency(
    model: Model, size: int, rounds: int = 200, cold_max: int = 10_000, pause: float = 0.0
) -> dict[str, Any]:
    """Past `cold_max` tools the cold build is not timed: each copy of a real tool gets the real tool's
    vector on disk (ranking costs the same whatever the vectors hold), and only the warm build is.
    The cold build covers at least the real catalog once, so that every copy has a real tool's vectors."""
    docs = grown(size)
    cold_max = max(cold_max, len(load_docs()))
    with tempfile.TemporaryDirectory() as folder:
        cache = EmbeddingCache(Path(folder), "bench")
        cold_index = ToolIndex(cache)
        started = time.perf_counter()
        cold_index.update(docs[: min(size, cold_max)])
        await cold_index.embed_missing(model.embed)
        cold = time.perf_counter() - started if size <= cold_max else float("nan")
        if size > cold_max:
            copied = {
                (doc.short, doc.server.rstrip("0123456789"), view): cache.get(cache.key(text))
                for doc in cold_index.docs
                for view, text in enumerate(doc.dense_texts())
            }
            for doc in docs[cold_max:]:
                for view, text in enumerate(doc.dense_texts()):
                    vector = copied.get((doc.short, doc.server.rstrip("0123456789"), view))
                    if vector is not None:
                        cache.put(cache.key(text), vector)
        warm_index = ToolIndex(EmbeddingCache(Path(folder), "bench"))
        started = time.perf_counter()
        warm_index.update(docs)
        await warm_index.embed_missing(model.embed)
        warm = time.perf_counter() - started
        assert warm_index.dense_ready
    queries = [item["query"] for item in json.loads(QUERIES.read_text())]
    vectors = await model.embed(queries)
    rank_ms: list[float] = []
    timed: dict[str, list[float]] = {"now": [], "float32": []}
    load_before = os.getloadavg()[0]
    for round_ in range(rounds):
        query, embedded = queries[round_ % len(queries)], vectors[round_ % len(queries)]
        started = time.perf_counter()
        warm_index.search(query, 5, embedded)
        rank_ms.append((time.perf_counter() - started) * 1e3)
    # The two ways alternate in blocks of rounds, each block a new run of queries, so that both see the
    # same load and neither warms the caches for the other's next query.
    block = 25
    for round_ in range(2 * rounds):
        label, embed = ("now", model.embed) if (round_ // block) % 2 == 0 else ("float32", model.embed_float32)
        query = queries[round_ % len(queries)]
        if pause:
            await anyio.sleep(pause)
        started = time.perf_counter()
        fresh = (await embed([query]))[0]
        warm_index.search(query, 5, fresh)
        timed[label].append((time.perf_counter() - started) * 1e3)
    return {
        "tools": len(docs),
        "build_cold_s": cold,
        "build_warm_s": warm,
        "rank_p50_ms": _pct(rank_ms, 50),
        "rank_p99_ms": _pct(rank_ms, 99),
        "search_p50_ms": _pct(timed["now"], 50),
        "search_p99_ms": _pct(timed["now"], 99),
        "float32_p50_ms": _pct(timed["float32"], 50),
        "float32_p99_ms": _pct(timed["float32"], 99),
        "pause_s": pause,
        "load_average": [load_before, os.getloadavg()[0]],
    }


def startup(runs: int = 1) -> list[dict[str, Any]]:
    """A cold start (empty embedding cache), then `runs` warm ones (every vector on disk), each in a new
    process: torch's import and the model's load are part of what a start costs."""
    rows = []
    with tempfile.TemporaryDirectory() as home:
        for run in range(1 + runs):
            done = subprocess.run(
                [sys.executable, str(STARTUP), home], capture_output=True, text=True, check=True, cwd=ROOT
            )
            row = json.loads(done.stdout.strip().splitlines()[-1])
            row["cache"] = "cold" if run == 0 else "warm"
            rows.append(row)
            sys.stdout.write(_startup_line(row) + "\n")
            sys.stdout.flush()
    return rows


def _startup_line(row: dict[str, Any]) -> str:
    early = row["first_answer_s"] - row["listed_s"]
    why = f" ({row['first_answer_why']})" if row["first_answer_why"] else ""
    lines = [
        f"start ({row['cache']} vector cache, {row['servers']} servers, {row['tools']} tools): listed at "
        f"{row['listed_s']:.1f} s; a search sent then answered at {row['first_answer_s']:.1f} s ({early:.1f} s "
        f"after the listing) by {row['first_answer_ranking']}{why}; rankings of the searches that followed: "
        f"{', '.join(row['rankings_at_once'])} {row['why_at_once'] or ''}"
    ]
    for client in ("at_once", "waited"):
        for split in ("tune", "heldout"):
            cell = row[client].get(split, {})
            lines.append(
                f"  {client:8} {split:8} R@1 {cell.get('R@1', 0):.3f} R@5 {cell.get('R@5', 0):.3f} "
                f"MRR {cell.get('MRR', 0):.3f}"
            )
    return "\n".join(lines)


def _pct(values: list[float], pct: int) -> float:
    return float(np.percentile(values, pct)) if len(values) > 1 else statistics.fmean(values)


def listing_size() -> dict[str, float]:
    def tokens(tools: list[dict[str, Any]]) -> float:
        return len(json.dumps({"tools": tools}, separators=(",", ":"))) / 4

    docs = load_docs()
    described = SEARCH_TOOL.model_copy(update={"description": describe_catalog(SEARCH_TOOL_INTRO, docs)})
    own = [
        t.model_dump(mode="json", by_alias=True, exclude_none=True)
        for t in (PARALLEL_TOOL, BATCH_TOOL, PIPELINE_TOOL, described, CALL_TOOL)
    ]
    catalog = [{"name": d.name, "description": d.description, "inputSchema": d.input_schema} for d in docs]
    full = tokens(own[:3] + catalog)
    search = tokens(own)
    return {"catalog_tools": len(catalog), "full_tokens": full, "search_mode_tokens": search, "ratio": search / full}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="*", default=[200, 2000])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--pause", type=float, default=0.0, help="seconds of idle before each timed search")
    parser.add_argument("--cold-max", type=int, default=10_000, help="time the cold build only up to this many tools")
    parser.add_argument("--parts", nargs="*", choices=PARTS, default=list(PARTS), help="what to measure")
    parser.add_argument("--warm-starts", type=int, default=1, help="warm starts after the cold one (--parts startup)")
    args = parser.parse_args()
    report: dict[str, Any] = {"matmul_dtype": str(matmul_dtype()), "cpu": _cpu()}
    sys.stdout.write(f"CPU: {report['cpu']}; the query forward's linear layers: {report['matmul_dtype']}\n")
    if "startup" in args.parts:  # first: its processes must not share the host with this one's model
        report["startup"] = await anyio.to_thread.run_sync(startup, args.warm_starts)
    loaded = await anyio.to_thread.run_sync(EmbeddingModel, MODEL, "cpu")
    float32 = await anyio.to_thread.run_sync(lambda: EmbeddingModel(MODEL, "cpu", weights=torch.float32))
    settings = EmbeddingSettings(model=MODEL)
    async with Embedder(settings, model=loaded) as embedder, Embedder(settings, model=float32) as embedder32:
        model = Model(embedder, embedder32)
        if "quality" in args.parts:
            report["quality"] = await quality(model.embed)
            if loaded.packed is not None and loaded.packed.dtype != torch.float32:
                same = await quality(model.embed_float32, ("dense, three views", "shipped (ToolIndex.search)"))
                report["quality"] |= {f"{method}, float32": groups for method, groups in same.items()}
            report["listing"] = listing_size()
            sys.stdout.write(_table(report))
            sys.stdout.flush()
        report["latency"] = []
        for size in args.sizes if "latency" in args.parts else []:
            report["latency"].append(await latency(model, size, args.rounds, args.cold_max, args.pause))
            sys.stdout.write(_latency_line(report["latency"][-1]) + "\n")
            sys.stdout.flush()
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1))


PARTS = ("quality", "latency", "startup")


def _table(report: dict[str, Any]) -> str:
    kinds = ("keyword", "paraphrase", "similar-tools")
    lines = [
        "method                        split    | all R@1 R@5  MRR  | "
        + " | ".join(f"{kind[:10]:10} R@1 R@5  MRR" for kind in kinds)
    ]
    for method, groups in report["quality"].items():
        for split in ("tune", "heldout"):
            cells = [groups[split], *(groups.get(f"{split}/{kind}") for kind in kinds)]
            row = " | ".join(
                f"{'':10} {cell['R@1']:.2f} {cell['R@5']:.2f} {cell['MRR']:.2f}" if cell else " " * 25 for cell in cells
            )
            lines.append(f"{method[:29]:29} {split:8} | {row.strip()}")
        for split in ("tune", "heldout"):
            empty = groups.get(f"{split}/nonsense answered empty")
            if empty:
                lines.append(f"{'':29} {split:8} | nonsense queries answered with nothing: {empty['share']:.2f}")
    listing = report["listing"]
    lines.append(
        f"listing: {listing['search_mode_tokens']:.0f} tokens in search mode vs {listing['full_tokens']:.0f} for "
        f"{listing['catalog_tools']} tools ({listing['ratio']:.1%})"
    )
    return "\n".join(lines) + "\n"


def _latency_line(row: dict[str, Any]) -> str:
    pause = f", {row['pause_s']:g} s idle before each search" if row["pause_s"] else ""
    return (
        f"{row['tools']} tools{pause}: build cold {row['build_cold_s']:.2f} s, "
        f"warm {row['build_warm_s'] * 1e3:.0f} ms; "
        f"rank p50 {row['rank_p50_ms']:.2f} ms p99 {row['rank_p99_ms']:.2f} ms; with query embedding "
        f"p50 {row['search_p50_ms']:.1f} ms p99 {row['search_p99_ms']:.1f} ms (float32 weights: p50 "
        f"{row['float32_p50_ms']:.1f} ms p99 {row['float32_p99_ms']:.1f} ms); "
        f"load average {row['load_average'][0]:.1f} -> {row['load_average'][1]:.1f}"
    )


def _cpu() -> str:
    """The CPU's model name and its bfloat16 instructions, from /proc/cpuinfo (Linux)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    name = fields.get("model name\t", "").strip()
    flags = fields.get("flags\t\t", "").split()
    wanted = [flag for flag in ("avx512_bf16", "amx_bf16", "amx_int8", "avx_vnni") if flag in flags]
    return f"{name}, {os.cpu_count()} cores, {' '.join(wanted) or 'no bfloat16 instructions'}"


if __name__ == "__main__":
    anyio.run(main)
