"""Requests written by the local model for each tool at index time (doc2query), measured against the
shipped tool search and not kept (issue 38).

    python benchmarks/tool_search_doc2query.py [--requests 5] [--folds 5] [--repeats 3] [--fresh]
        [--show 25] [--heldout] [--time-at 2000]

Query rewriting with the local model costs a generation per search, past the 20 ms budget; the same
model can instead write, once per tool when the tool is indexed, a few short requests a user would
type for it ("open a bug report about the login crash" for github's `create_issue`), each embedded
as one more view of the tool, so a search costs what it costs now. The model is mcpmux's own
embedded `builtin:smollm2-135m`, driven in-process by the engine: a few-shot chat (six tools of the
TUNING servers, one request each written by hand), then the tool's server and its description's
first sentence (its name where it has none); one request a generation, ending at the line's end.
The first request is greedy, the others sampled (temperature 0.8, top-p 0.95, seeded by their
number), all of a catalog's generations in one continuous batch. A request that is empty or copies
an example of the prompt is dropped.

Measured with the shipped fusion (`ToolIndex.search`: the convex combination with BM25, the server
bonus; no threshold, whose range extra views would move), each ranking's cosine being:

- **requests alone**: the best of the tool's first n requests' cosines, instead of its three views;
- **max over views**: the best over the three views and the n requests (as the three are fused now);
- **weighted**: the three views' best plus w × the requests' best, over 1 + w;
- **a fourth view**: the cosine with the mean of the first n requests' vectors (every tool one more
  view, so tools with more requests kept are not favoured), the best over it and the three views;
- **in BM25**: the requests appended to the tool's BM25 text as well (classic doc2query), three views.

In the first three a request counts only if it passes a filter (doc2query--'s): its cosine with its
own tool's best view at least t, and its own tool within the first r when the request is searched
for by the views' cosine (in BM25, r alone). n, w, t and r are chosen by cross-validation over the
28 tuning SERVERS (their queries in `--folds` groups of servers, `--repeats` shuffles;
`tool_search_rerank.py`'s procedure). `--heldout`, once the choice is made: each candidate with the
setting the whole tuning part chooses, on the 15 held-out servers' queries. The generations are kept
in benchmarks/.peers/ (keyed by the prompt's version) so a rerun scores without generating again;
`--fresh` generates again and times it; `--time-at N` only times the generation for N tools (the
real servers copied under new names). Figures: docs/perf.md.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import sys
import time
from collections.abc import Sequence

import anyio
import numpy as np
import torch
from tool_search_data import ROOT, Query, grown, load_docs
from tool_search_rerank import DEPTH, Candidates, Ranks, grid, report
from tool_search_tried import indexed

from mcpmux.inference.engine.async_engine import Engine
from mcpmux.inference.engine.config import EngineConfig, SamplingParams
from mcpmux.inference.serving.embeddings import Embedder
from mcpmux.inference.serving.encoder import EmbeddingModel
from mcpmux.inference.serving.settings import EmbeddingSettings
from mcpmux.tools.search_index import CC_ALPHA, CC_FLOOR, SERVER_BONUS, VIEWS, ToolDoc, ToolIndex, _first_sentence

EMBEDDER = "builtin:all-minilm-l6-v2"
WRITER = "builtin:smollm2-135m"
SYSTEM = (
    "You write the request a user would type to an assistant when they need what a tool does: "
    "one short line, everyday words, no tool or function names."
)
SHOTS = (
    ("github", "Create a new issue in a GitHub repository", "open a bug report about the login crash"),
    ("slack", "Post a new message to a Slack channel", "tell the team channel the deploy is done"),
    ("filesystem", "Read the complete contents of a file from the file system", "show me what config.yaml says"),
    ("maps", "Get directions between two points", "how do I drive from the airport to my hotel"),
    ("time", "Convert time between timezones", "what time is 3pm Tokyo in London"),
    ("github", "Merge a pull request", "land my PR into main"),
)
"""The few-shot tools, all of tuning servers (github `create_issue` and `merge_pull_request`, slack
`slack_post_message`, filesystem `read_file`, maps `maps_directions`, time `convert_time`); their
requests were written by hand, not taken from the query sets."""
MAX_TOKENS = 24
WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0)
OWN = (-1.0, 0.5, 0.6, 0.7)
"""The filter on a request's cosine with its own tool's best view (doc2query--'s relevance filter)."""
PLACE = (1, 3, DEPTH)
"""The filter on its own tool's place when the request is searched for (by the views' cosine)."""
BM25_REQUESTS = (1, 2, 3, 5)
PROMPT_VERSION = hashlib.sha256(json.dumps([SYSTEM, SHOTS, MAX_TOKENS]).encode()).hexdigest()[:12]
CACHE = ROOT / "benchmarks" / ".peers" / f"doc2query-{PROMPT_VERSION}.json"


def asked(doc: ToolDoc) -> str:
    what = _first_sentence(doc.description.strip())[:300] or doc.short.replace("_", " ")
    return f"A tool on {doc.server} that does this: {what}"


def messages(doc: ToolDoc) -> list[dict[str, str]]:
    chat = [{"role": "system", "content": SYSTEM}]
    for server, does, request in SHOTS:
        chat.append({"role": "user", "content": f"A tool on {server} that does this: {does}"})
        chat.append({"role": "assistant", "content": request})
    chat.append({"role": "user", "content": asked(doc)})
    return chat


def params(number: int) -> SamplingParams:
    if number == 0:
        return SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, stop=("\n",))
    return SamplingParams(max_tokens=MAX_TOKENS, temperature=0.8, top_p=0.95, seed=number, stop=("\n",))


async def generate(docs: Sequence[ToolDoc], requests: int) -> tuple[dict[str, list[str]], float, int]:
    """Each tool's `requests` generations (by public name), the wall time of the batch and its output
    tokens; every generation of the catalog is submitted at once."""
    out: dict[str, list[str]] = {doc.name: [""] * requests for doc in docs}
    tokens = 0
    engine = await Engine.start(EngineConfig(model=WRITER, max_waiting=len(docs) * requests + 1))
    async with engine:
        await engine.complete(messages(docs[0]), params(0))  # warm-up: the first step's allocations

        async def one(doc: ToolDoc, number: int) -> None:
            nonlocal tokens
            done = await engine.complete(messages(doc), params(number))
            out[doc.name][number] = done.text.strip().lstrip("-*0123456789. ").strip()
            tokens += done.completion_tokens

        started = time.perf_counter()
        async with anyio.create_task_group() as tasks:
            for doc in docs:
                for number in range(requests):
                    tasks.start_soon(one, doc, number)
        wall = time.perf_counter() - started
    return out, wall, tokens


def generations(docs: Sequence[ToolDoc], requests: int, fresh: bool) -> dict[str, list[str]]:
    if not fresh and CACHE.is_file():
        stored: dict[str, list[str]] = json.loads(CACHE.read_text())
        if all(len(stored.get(doc.name, [])) >= requests for doc in docs):
            return stored
    written, wall, tokens = anyio.run(generate, docs, requests)
    sys.stdout.write(
        f"generation: {len(docs)} tools x {requests} requests in {wall:.1f} s, {tokens} tokens, "
        f"{tokens / wall:.0f} tok/s; at that rate 2,000 tools take {wall * 2000 / len(docs):.0f} s\n"
    )
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    CACHE.write_text(json.dumps(written, indent=0))
    return written


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.maximum(np.linalg.norm(rows, axis=-1, keepdims=True), 1e-9)).astype(np.float32)


class Data(Ranks):
    """BM25 (plain and with the requests), server bonus, the views' and the requests' cosines."""

    def __init__(
        self,
        index: ToolIndex,
        expanded: dict[tuple[int, int], np.ndarray],
        queries: list[Query],
        views: np.ndarray,
        asks: np.ndarray,
        own: np.ndarray,
        place: np.ndarray,
        centred: dict[int, np.ndarray],
    ) -> None:
        self.queries = queries
        self.names = [doc.name for doc in index.docs]
        self.keyword = np.stack([index.keyword_scores(q.text) for q in queries])
        self.expanded = expanded  # (n, r) -> (queries, tools): BM25 with the first n requests that pass r
        self.named = np.stack([index.named(q.text) for q in queries])
        self.views = views  # (queries, tools): the best of the three views
        self.asks = asks  # (queries, tools, requests)
        self.own = own  # (tools, requests): each request's cosine with its own tool's best view
        self.place = place  # (tools, requests): its own tool's place when the request is searched for
        self.centred = centred  # n -> (queries, tools): the cosine with the mean of the first n requests
        self.right = [q.right for q in queries]
        servers = np.array([doc.server for doc in index.docs])
        self.server = np.array([servers[self.names.index(min(q.right))] for q in queries])

    def fused(self, rows: Sequence[int], cosine: np.ndarray, keyword: np.ndarray | None = None) -> np.ndarray:
        keyword = (self.keyword if keyword is None else keyword)[list(rows)]
        top = np.maximum(keyword.max(axis=1, keepdims=True), CC_FLOOR)
        return CC_ALPHA * cosine + (1 - CC_ALPHA) * keyword / top + SERVER_BONUS * self.named[list(rows)]

    def requests(self, rows: Sequence[int], setting: dict[str, float]) -> np.ndarray:
        """The best cosine over each tool's first n requests that pass the filter (a tool with none: its
        views' cosine, so it neither gains nor loses)."""
        n = int(setting["n"])
        kept = np.logical_and(
            np.greater_equal(self.own[:, :n], setting.get("t", -1.0)),
            np.less_equal(self.place[:, :n], setting.get("r", DEPTH)),
        )
        any_kept = kept.any(axis=1)
        asks = np.where(kept[None], self.asks[list(rows), :, :n], -1.0).max(axis=2)
        return np.where(any_kept[None], asks, self.views[list(rows)])

    def shipped(self, _: dict[str, float], rows: Sequence[int]) -> list[int]:
        return self.ranked(rows, self.fused(rows, self.views[list(rows)]))

    def alone(self, setting: dict[str, float], rows: Sequence[int]) -> list[int]:
        return self.ranked(rows, self.fused(rows, self.requests(rows, setting)))

    def max_over(self, setting: dict[str, float], rows: Sequence[int]) -> list[int]:
        cosine = np.maximum(self.views[list(rows)], self.requests(rows, setting))
        return self.ranked(rows, self.fused(rows, cosine))

    def weighted(self, setting: dict[str, float], rows: Sequence[int]) -> list[int]:
        w = setting["w"]
        cosine = (self.views[list(rows)] + w * self.requests(rows, setting)) / (1 + w)
        return self.ranked(rows, self.fused(rows, cosine))

    def centroid(self, setting: dict[str, float], rows: Sequence[int]) -> list[int]:
        """The mean of the first n requests' vectors as one more view, every tool having one."""
        cosine = np.maximum(self.views[list(rows)], self.centred[int(setting["n"])][list(rows)])
        return self.ranked(rows, self.fused(rows, cosine))

    def in_bm25(self, setting: dict[str, float], rows: Sequence[int]) -> list[int]:
        keyword = self.expanded[int(setting["n"]), int(setting["r"])]
        return self.ranked(rows, self.fused(rows, self.views[list(rows)], keyword))


async def embed_all(docs: list[ToolDoc], asks: list[str], queries: list[Query]) -> tuple[np.ndarray, ...]:
    model = await anyio.to_thread.run_sync(EmbeddingModel, EMBEDDER, "cpu")
    async with Embedder(EmbeddingSettings(model=EMBEDDER), model=model) as embedder:
        views = await embedder.embed([text for doc in docs for text in doc.dense_texts()])
        written = await embedder.embed(asks)
        vectors = await embedder.embed([q.text for q in queries])
    return (
        unit(np.asarray(views, dtype=np.float32).reshape(len(docs), VIEWS, -1)),
        unit(np.asarray(written, dtype=np.float32)),
        unit(np.asarray(vectors, dtype=np.float32)),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=5, help="requests written per tool")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--fresh", action="store_true", help="generate again (and time it)")
    parser.add_argument("--show", type=int, default=0, help="print this many tools' requests first")
    parser.add_argument("--heldout", action="store_true", help="after the choice: the held-out servers' figures")
    parser.add_argument("--time-at", type=int, default=0, help="only time the generation for this many tools")
    args = parser.parse_args()
    if args.time_at:
        _, wall, tokens = anyio.run(generate, grown(args.time_at), args.requests)
        sys.stdout.write(
            f"generation: {args.time_at} tools x {args.requests} requests in {wall:.1f} s, {tokens} tokens, "
            f"{tokens / wall:.0f} tok/s\n"
        )
        return
    index, queries = indexed(args.heldout)
    written = generations(load_docs(), args.requests, args.fresh)
    torch.set_num_threads(1)
    if args.show:
        for doc in np.random.default_rng(0).permutation(np.array(index.docs, dtype=object))[: args.show]:
            sys.stdout.write(f"{doc.name}: {asked(doc)}\n    " + " | ".join(written[doc.name]) + "\n")
    # An empty generation, or one that copies a line of the prompt's examples, is dropped (its text is
    # embedded all the same, to keep the arrays square).
    copied = {request for _, _, request in SHOTS}
    asks = [[text or doc.dense_texts()[2] for text in written[doc.name][: args.requests]] for doc in index.docs]
    dropped = np.array([[not t or t in copied for t in written[doc.name][: args.requests]] for doc in index.docs])
    views, vectors, query = anyio.run(embed_all, index.docs, [a for per in asks for a in per], queries)
    per_request = vectors.reshape(len(index.docs), args.requests, -1)
    searched = np.einsum("tvd,snd->sntv", views, per_request).max(axis=3)  # (tools, requests, tools)
    own_tool = np.arange(len(index.docs))[:, None]
    own = np.take_along_axis(searched, own_tool[:, :, None], axis=2)[:, :, 0]
    place = 1 + (searched > own[:, :, None]).sum(axis=2)
    own = np.where(dropped, -2.0, own)
    place = np.where(dropped, DEPTH + 1, place)
    expanded = {}
    for n, r in itertools.product(BM25_REQUESTS, PLACE):
        index_n_r = ToolIndex()
        index_n_r.update(
            [
                ToolDoc(d.name, d.server, d.short, d.title, " ".join([d.description, *chosen]), d.input_schema)
                for d, a, p in zip(index.docs, asks, place, strict=True)
                for chosen in [[text for text, at in zip(a[:n], p[:n], strict=True) if at <= r]]
            ]
        )
        expanded[n, r] = np.stack([index_n_r.keyword_scores(q.text) for q in queries])
    data = Data(
        index,
        expanded,
        queries,
        np.einsum("tvd,qd->qtv", views, query).max(axis=2),
        np.einsum("tnd,qd->qtn", per_request, query),
        own,
        place,
        {n: np.einsum("td,qd->qt", unit(per_request[:, :n].mean(axis=1)), query) for n in range(1, args.requests + 1)},
    )
    sys.stdout.write(
        f"requests kept: {int((~dropped).sum())} of {dropped.size}; own tool first when searched: "
        f"{int((place == 1).sum())}; median cosine with its own tool {np.median(own[~dropped]):.2f}\n"
    )
    counts = tuple(range(1, args.requests + 1))
    candidates: Candidates = {
        "requests alone": (data.alone, grid(n=counts, t=OWN, r=PLACE)),
        "max over views + requests": (data.max_over, grid(n=counts, t=OWN, r=PLACE)),
        "views + w x requests": (data.weighted, grid(w=WEIGHTS, n=counts, t=OWN, r=PLACE)),
        "requests' mean, a fourth view": (data.centroid, grid(n=counts)),
        "requests in BM25 too": (data.in_bm25, grid(n=BM25_REQUESTS, r=PLACE)),
    }
    report(data, queries, candidates, args.folds, args.repeats, args.heldout, fits=5)


if __name__ == "__main__":
    main()
