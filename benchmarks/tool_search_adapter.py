"""A learned linear query adapter for tool search, measured and not shipped (issue 38).

    python benchmarks/tool_search_adapter.py [--folds 5] [--repeats 3] [--heldout]

The "embedding adapters" technique: the query's MiniLM embedding q becomes q + W q (W 384 × 384,
starting at zero) before the ranking, the tools' vectors unchanged. W is trained with a contrastive
loss: each tuning query against every tool of the training servers, its right tool the positive,
scored as `ToolIndex.search` scores (the best view's cosine fused with BM25 and the server bonus),
with weight decay pulling W back to zero. Seeded, a few seconds on a CPU.

Chosen by cross-validation over the 28 tuning SERVERS (their queries split into `--folds` groups
of servers, `--repeats` shuffles): the adapter is trained on the other folds' servers and queries
and measured on the held-back fold's queries, searching the whole catalog as the shipped ranking
does. `--heldout` then trains on every tuning server and prints the 15 held-out servers' figures,
to be run once, after the choice. Nonsense queries are left out (the threshold answers them).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import anyio
import numpy as np
import torch
from tool_search_data import Query, load_docs, load_queries, metrics

from mcpmux.inference.serving.embeddings import Embedder
from mcpmux.inference.serving.encoder import EmbeddingModel
from mcpmux.inference.serving.settings import EmbeddingSettings
from mcpmux.tools.search_index import CC_ALPHA, CC_FLOOR, CC_MIN, SERVER_BONUS, ToolIndex

MODEL = "builtin:all-minilm-l6-v2"
KINDS = ("keyword", "paraphrase", "similar-tools")
WEIGHT_DECAY = 1e-2
EPOCHS = 100
LEARNING_RATE = 1e-2
TEMPERATURE = 0.05


class Data:
    """The catalog's views and the queries' embeddings, BM25 scores and right tools, as arrays."""

    def __init__(self, index: ToolIndex, queries: list[Query], vectors: np.ndarray) -> None:
        self.queries = queries
        self.names = [doc.name for doc in index.docs]
        self.servers = np.array([doc.server for doc in index.docs])
        unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        self.vectors = unit.astype(np.float32)
        assert index._matrix is not None
        self.matrix = index._matrix.reshape(len(index.docs), -1, unit.shape[1])
        keyword = np.stack([index.keyword_scores(q.text) for q in queries])
        top = np.maximum(keyword.max(axis=1, keepdims=True), CC_FLOOR)
        named = np.stack([index.named(q.text) for q in queries])
        self.offset = ((1 - CC_ALPHA) * keyword / top + SERVER_BONUS * named).astype(np.float32)
        """Each query's fused score without the cosine's part: BM25 and the server bonus."""
        self.right = np.array([self.names.index(min(q.right)) for q in queries])
        self.server = self.servers[self.right]

    def ranks(self, rows: Sequence[int], adapter: np.ndarray | None) -> list[int]:
        """The right tool's rank for each query of `rows` under the shipped fusion (0: not in the top 50
        or below the threshold), with the query adapted by `adapter` (None: as shipped)."""
        query = self.vectors[list(rows)]
        if adapter is not None:
            query = query + query @ adapter
            query = query / np.linalg.norm(query, axis=1, keepdims=True)
        fused = CC_ALPHA * np.einsum("tvd,qd->qtv", self.matrix, query).max(axis=2) + self.offset[list(rows)]
        out = []
        for row, scores in zip(rows, fused, strict=True):
            if scores.max() < CC_MIN:
                out.append(0)
                continue
            order = [self.names[i] for i in np.argsort(-scores, kind="stable")[:50]]
            out.append(next((at for at, name in enumerate(order, 1) if name in self.queries[row].right), 0))
        return out


def train(data: Data, rows: Sequence[int], servers: set[str], seed: int) -> np.ndarray:
    """W of q + W q, trained on `rows` against the tools of `servers`."""
    torch.manual_seed(seed)
    tools = np.flatnonzero(np.isin(data.servers, sorted(servers)))
    where = {tool: at for at, tool in enumerate(tools)}
    views = torch.from_numpy(data.matrix[tools])
    query = torch.from_numpy(data.vectors[list(rows)])
    offset = torch.from_numpy(data.offset[list(rows)][:, tools])
    target = torch.tensor([where[data.right[row]] for row in rows])
    weight = torch.nn.Parameter(torch.zeros(query.shape[1], query.shape[1]))
    optimizer = torch.optim.Adam([weight], lr=LEARNING_RATE)
    for _ in range(EPOCHS):
        optimizer.zero_grad()
        adapted = query + query @ weight
        adapted = adapted / adapted.norm(dim=1, keepdim=True)
        fused = CC_ALPHA * torch.einsum("qd,tvd->qtv", adapted, views).amax(dim=2) + offset
        loss = torch.nn.functional.cross_entropy(fused / TEMPERATURE, target) + WEIGHT_DECAY * (weight**2).sum()
        loss.backward()
        optimizer.step()
    return weight.detach().numpy()


def table(data: Data, rows: list[int], ranks: dict[str, list[list[int]]]) -> str:
    """R@1 / R@5 / MRR per kind, averaged over the repeats."""
    lines = [f"{'':24} {'all':>16} " + " ".join(f"{kind:>16}" for kind in KINDS)]
    for label, runs in ranks.items():
        cells = []
        for kind in ("all", *KINDS):
            picked = [at for at, row in enumerate(rows) if kind == "all" or data.queries[row].kind == kind]
            got = [metrics([run[at] for at in picked]) for run in runs]
            cells.append("/".join(f"{np.mean([g[m] for g in got]):.3f}" for m in ("R@1", "R@5", "MRR")))
        lines.append(f"{label:24} " + " ".join(f"{cell:>16}" for cell in cells))
    return "\n".join(lines) + "\n"


async def embed_all(index: ToolIndex, queries: list[Query]) -> np.ndarray:
    model = await anyio.to_thread.run_sync(EmbeddingModel, MODEL, "cpu")
    async with Embedder(EmbeddingSettings(model=MODEL), model=model) as embedder:
        await index.embed_missing(embedder.embed)
        return np.asarray(await embedder.embed([q.text for q in queries]), dtype=np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--heldout", action="store_true", help="after the choice: the held-out servers' figures")
    args = parser.parse_args()
    torch.set_num_threads(1)
    index = ToolIndex()
    index.update(load_docs())
    wanted = ("tune", "heldout") if args.heldout else ("tune",)  # held-out queries are not even embedded before
    queries = [q for q in load_queries() if q.kind != "nonsense" and q.split in wanted]
    data = Data(index, queries, anyio.run(embed_all, index, queries))
    tune = [row for row, q in enumerate(queries) if q.split == "tune"]
    tune_servers = sorted({str(data.server[row]) for row in tune})
    shipped: list[list[int]] = []
    adapted: list[list[int]] = []
    for repeat in range(args.repeats):
        order = np.random.default_rng(100 + repeat).permutation(tune_servers)
        ranks = {"shipped": dict.fromkeys(tune, 0), "adapted": dict.fromkeys(tune, 0)}
        for fold in range(args.folds):
            back = set(order[fold :: args.folds])
            fit = [row for row in tune if data.server[row] not in back]
            check = [row for row in tune if data.server[row] in back]
            adapter = train(data, fit, set(tune_servers) - back, seed=repeat * args.folds + fold)
            ranks["shipped"].update(zip(check, data.ranks(check, None), strict=True))
            ranks["adapted"].update(zip(check, data.ranks(check, adapter), strict=True))
        shipped.append([ranks["shipped"][row] for row in tune])
        adapted.append([ranks["adapted"][row] for row in tune])
    sys.stdout.write(f"tuning servers, {args.folds}-fold cross-validation by server, {args.repeats} repeats:\n")
    sys.stdout.write(table(data, tune, {"shipped": shipped, "+ query adapter": adapted}))
    if args.heldout:
        held = [row for row, q in enumerate(queries) if q.split == "heldout"]
        adapter = train(data, tune, set(tune_servers), seed=0)
        sys.stdout.write("held-out servers (the adapter trained on every tuning server):\n")
        sys.stdout.write(
            table(data, held, {"shipped": [data.ranks(held, None)], "+ query adapter": [data.ranks(held, adapter)]})
        )


if __name__ == "__main__":
    main()
