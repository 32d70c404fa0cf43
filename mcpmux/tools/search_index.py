"""The ranking behind `mux_search_tools`: BM25 over the words of each tool, dense embeddings, fused.

- **BM25** (`bm25s`) over a tool's name (split at `__`, `_`, `-`, `.` and camelCase), title,
  description, and its arguments' names and descriptions; lowercased, English stop words dropped,
  plurals and `-ing`/`-ed` folded.
- **Dense**: three embeddings per tool (the embedded MiniLM or the remote backend's model): the whole
  definition ("name (server): title. description. Arguments: ..."), the name with the description's
  first sentence, and the name alone; a tool's cosine with the query is the best of its three.
- **Fusion**: a convex combination, `score = CC_ALPHA * cosine + (1 - CC_ALPHA) * bm25 / max(top
  bm25, CC_FLOOR)`: the query's best keyword match counts fully only when it is a strong one, so one
  shared weak word does not outrank a close meaning; tools of a server the query names get
  `SERVER_BONUS`. A query whose best score is below `CC_MIN` matches nothing.

Chosen with `benchmarks/tool_search.py` on the queries of 28 tuning servers (of 43 real ones; the
other 15 are held out and were never looked at while choosing): against reciprocal rank fusion,
which ranks by position alone and let lone weak keyword hits win, against one embedding per tool
(R@1 0.67 / MRR 0.77 there; the three views 0.72 / 0.81), and against all-mpnet-base-v2 (5 times
MiniLM's size, +0.02). Without embeddings, BM25 ranks alone.

Embeddings are cached on disk by content hash (the model and the text embedded), one small file
each, so a restart or a catalog change embeds only what is new. `ToolIndex.update` is cheap (BM25
is rebuilt, embeddings kept by hash); `embed_missing` embeds what changed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bm25s
import numpy as np

logger = logging.getLogger(__name__)
logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets DEBUG on import: one line per index build

EmbedFn = Callable[[list[str]], Awaitable[list[list[float]]]]
CC_ALPHA = 0.7
"""Weight of the embedding's cosine in the fused score (the rest is BM25's)."""
CC_FLOOR = 10.0
"""A BM25 score this high counts as a full keyword match; the query's top score normalizes only above it."""
SERVER_BONUS = 0.07
"""Added to the fused score of the tools of a server the query names ("... on gitlab", "with playwright"):
where two servers offer the same tool, the one asked for comes first."""
CC_MIN = 0.25
"""A query whose best fused score is below this matches nothing. Chosen on the tuning servers, where
every nonsense query scores below it (made-up words 0.14-0.18, English words that mean nothing to
any tool up to 0.247) and 2 of 228 real queries lose their top-5 hit to it. The cost: a terse task
far from a terse description can fall below it too ("will it rain in Berlin tomorrow" against a
weather tool: 0.22), and is answered with nothing and the advice to search again in other words."""
VIEWS = 3
"""Texts embedded per tool (`ToolDoc.dense_texts`)."""
RRF_K = 60
"""Reciprocal rank fusion's usual constant (Cormack et al. 2009), for `fusion="rrf"`."""
DENSE_DEPTH = 50
"""How many of the nearest tools by embedding take part in reciprocal rank fusion."""

_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
_STOP_WORDS = (
    "a an and are as at be by can do does for from get gets has have how i in into is it its me my of on "
    "or our please so some that the their them then there these this to us using use was we what when "
    "which with you your"
)
_STOP = frozenset(_STOP_WORDS.split())


def words(text: str) -> list[str]:
    """`text` as BM25 terms: identifiers split, lowercased, stop words and single letters out, plurals and
    -ing/-ed folded."""
    out = []
    for raw in _WORD.findall(text):
        word = raw.lower()
        if len(word) < 2 or word in _STOP:
            continue
        out.append(_fold(word))
    return out


def _fold(word: str) -> str:
    if len(word) <= 3:
        return word
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith(("sses", "shes", "ches", "xes", "zes")):
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    if word.endswith("ing") and len(word) > 5:
        return word[:-3]
    if word.endswith("ed") and len(word) > 4:
        return word[:-2]
    return word


@dataclass(frozen=True, slots=True)
class ToolDoc:
    """One searchable tool: its public name, the server it comes from, and the definition shown."""

    name: str
    server: str
    short: str
    """The tool's own name on its server (the public name without the server prefix)."""
    title: str
    description: str
    input_schema: dict[str, Any]
    meta: dict[str, Any] | None = None
    """The tool's `_meta`, handed back with each result (MCP Apps read `_meta.ui` from it)."""

    @property
    def arguments(self) -> list[tuple[str, str]]:
        """(name, description) of each top-level argument."""
        properties = self.input_schema.get("properties")
        if not isinstance(properties, dict):
            return []
        return [
            (str(name), str(spec.get("description", "")) if isinstance(spec, dict) else "")
            for name, spec in properties.items()
        ]

    def keyword_text(self) -> str:
        args = " ".join(f"{name} {text}" for name, text in self.arguments)
        return f"{self.name} {self.title} {self.description} {args}"

    def dense_texts(self) -> tuple[str, ...]:
        """What is embedded, `VIEWS` texts: the whole definition (the readable name, what it does, what it
        takes), the name with the description's first sentence, and the name alone. A long description
        (usage notes, warnings, examples) pulls its one vector away from the task it serves; the short
        views keep the task findable."""
        readable = " ".join(part for part in re.split(r"[_\-.]+", self.short) if part)
        head = f"{readable} ({self.server})" + (f": {self.title}" if self.title else "")
        args = ", ".join(name for name, _ in self.arguments)
        description = self.description.strip()
        whole = f"{head}. {description}" + (f" Arguments: {args}." if args else "")
        return whole, f"{head}. {_first_sentence(description)}", head


def _first_sentence(text: str) -> str:
    return _SENTENCE_END.split(text, maxsplit=1)[0] if text else ""


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


@dataclass(frozen=True, slots=True)
class Hit:
    doc: ToolDoc
    score: float


def default_cache_dir() -> Path:
    """`$MCPMUX_HOME/cache/tool-embeddings`, else `$XDG_CACHE_HOME/mcpmux/tool-embeddings`
    (`~/.cache/mcpmux/tool-embeddings`)."""
    home = os.environ.get("MCPMUX_HOME")
    if home:
        return Path(home).expanduser() / "cache" / "tool-embeddings"
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "mcpmux" / "tool-embeddings"


class EmbeddingCache:
    """Vectors on disk, one file per (model, text) hash; writes are atomic, so processes may share it."""

    def __init__(self, folder: Path | None, model: str) -> None:
        self.model = model
        self.folder = folder / hashlib.sha256(model.encode()).hexdigest()[:16] if folder is not None else None
        self._broken = False

    def key(self, text: str) -> str:
        return hashlib.sha256(f"{self.model}\0{text}".encode()).hexdigest()[:32]

    def get(self, key: str) -> np.ndarray | None:
        if self.folder is None:
            return None
        try:
            vector = np.fromfile(self.folder / f"{key}.f32", dtype=np.float32)
        except OSError:
            return None
        return vector if vector.size else None

    def put(self, key: str, vector: np.ndarray) -> None:
        if self.folder is None or self._broken:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            meta = self.folder / "model.json"
            if not meta.exists():
                meta.write_text(json.dumps({"model": self.model}))
            fd, tmp = tempfile.mkstemp(dir=self.folder, suffix=".tmp")
            with os.fdopen(fd, "wb") as out:
                out.write(vector.astype(np.float32).tobytes())
            os.replace(tmp, self.folder / f"{key}.f32")
        except OSError as err:  # a read-only home must not break search: it only costs a re-embed next start
            self._broken = True
            logger.warning(
                "tool search: cannot write the embedding cache in %s (%s); embeddings are recomputed at each "
                "start. Set MCPMUX_HOME to a writable folder to keep them.",
                self.folder,
                err.strerror or err,
            )


class ToolIndex:
    """BM25 and dense rankings over a set of tools, fused."""

    def __init__(self, cache: EmbeddingCache | None = None) -> None:
        self.cache = cache
        self.docs: list[ToolDoc] = []
        self._keys: list[tuple[str, ...]] = []  # per tool, one per text of `ToolDoc.dense_texts`
        self._server_words: dict[str, frozenset[str]] = {}
        self._bm25: bm25s.BM25 | None = None
        self._vectors: dict[str, np.ndarray] = {}  # content key -> unit vector
        self._matrix: np.ndarray | None = None  # VIEWS rows per doc, in self.docs' order, once all are there
        self.embedded_texts = 0
        """Texts sent to the embedding model so far (not found in memory or on disk)."""

    # -- building ----------------------------------------------------------------------------------

    def update(self, docs: Sequence[ToolDoc]) -> None:
        """Index exactly `docs`: BM25 is rebuilt (milliseconds); known embeddings are kept by content."""
        self.docs = list(docs)
        self._keys = [self._key(doc) for doc in self.docs]
        self._server_words = {doc.server: frozenset(words(doc.server)) for doc in self.docs}
        corpus = [words(doc.keyword_text()) or ["_"] for doc in self.docs]
        if corpus:
            bm25 = bm25s.BM25()
            bm25.index(corpus, show_progress=False)
            self._bm25 = bm25
        else:
            self._bm25 = None
        keep = {key for keys in self._keys for key in keys}
        self._vectors = {key: vector for key, vector in self._vectors.items() if key in keep}
        if self.cache is not None:
            for key in keep - self._vectors.keys():
                cached = self.cache.get(key)
                if cached is not None:
                    self._vectors[key] = cached
        self._assemble()

    def _key(self, doc: ToolDoc) -> tuple[str, ...]:
        if self.cache is not None:
            return tuple(self.cache.key(text) for text in doc.dense_texts())
        return tuple(hashlib.sha256(text.encode()).hexdigest()[:32] for text in doc.dense_texts())

    @property
    def missing(self) -> list[ToolDoc]:
        """Tools without all their embeddings yet."""
        return [doc for doc, keys in zip(self.docs, self._keys, strict=True) if not self._vectors.keys() >= set(keys)]

    @property
    def dense_ready(self) -> bool:
        return self._matrix is not None

    async def embed_missing(self, embed: EmbedFn) -> int:
        """Embed the texts that have no vector (neither in memory nor on disk), each text once; returns
        how many tools had one missing."""
        todo: dict[str, str] = {}
        tools = 0
        for doc, keys in zip(self.docs, self._keys, strict=True):
            texts = {key: text for key, text in zip(keys, doc.dense_texts(), strict=True) if key not in self._vectors}
            tools += bool(texts)
            todo |= texts
        if not todo:
            return 0
        vectors = await embed(list(todo.values()))
        for key, vector in zip(todo, vectors, strict=True):
            unit = _unit(np.asarray(vector, dtype=np.float32))
            self._vectors[key] = unit
            if self.cache is not None:
                self.cache.put(key, unit)
        self.embedded_texts += len(todo)
        self._assemble()
        return tools

    def _assemble(self) -> None:
        keys = [key for keys in self._keys for key in keys]
        if self.docs and all(key in self._vectors for key in keys):
            self._matrix = np.stack([self._vectors[key] for key in keys])
        else:
            self._matrix = None

    # -- searching ---------------------------------------------------------------------------------

    def named(self, query: str) -> np.ndarray:
        """1.0 for the tools of each server the query names (a word of the server's name), else 0.0."""
        said = set(words(query))
        return np.array([bool(said & self._server_words[doc.server]) for doc in self.docs], dtype=np.float32)

    def keyword_scores(self, query: str) -> np.ndarray:
        terms = words(query)
        if self._bm25 is None or not terms:
            return np.zeros(len(self.docs), dtype=np.float32)
        return np.asarray(self._bm25.get_scores(terms), dtype=np.float32)

    def dense_scores(self, query_vector: Sequence[float]) -> np.ndarray | None:
        """Each tool's cosine with the query: that of its closest view."""
        views = self.view_scores(query_vector)
        return None if views is None else views.max(axis=1)

    def view_scores(self, query_vector: Sequence[float]) -> np.ndarray | None:
        """The cosine of each view of each tool with the query, shape (tools, VIEWS); None until all are embedded."""
        if self._matrix is None:
            return None
        # einsum, not `@`: a matrix-vector product through OpenBLAS wakes its thread pool, which in a
        # process running torch fights torch's spinning threads (2,000 tools: 23 ms p50, einsum 0.4 ms).
        cosines = np.einsum("ij,j->i", self._matrix, _unit(np.asarray(query_vector, dtype=np.float32)))
        return cosines.reshape(len(self.docs), VIEWS)

    def search(
        self,
        query: str,
        limit: int,
        query_vector: Sequence[float] | None = None,
        allowed: Callable[[ToolDoc], bool] | None = None,
        method: str = "hybrid",
        fusion: str = "cc",
    ) -> list[Hit]:
        """The best `limit` tools for `query`, best first. `method`: "hybrid", "bm25" or "dense"
        (dense and hybrid need `query_vector` and every tool embedded; else BM25 alone). `fusion`:
        "cc" (the convex combination) or "rrf" (reciprocal rank fusion)."""
        if not self.docs:
            return []
        mask = np.array([allowed(doc) for doc in self.docs]) if allowed is not None else np.ones(len(self.docs), bool)
        keyword = self.keyword_scores(query) if method != "dense" else None
        dense = self.dense_scores(query_vector) if query_vector is not None and method != "bm25" else None
        if dense is None:
            if keyword is None:
                keyword = self.keyword_scores(query)
            return self._top(np.where(mask & (keyword > 0), keyword, -np.inf), limit)
        if keyword is None:
            return self._top(np.where(mask, dense, -np.inf), limit)
        if fusion == "cc":
            allowed_keyword = np.where(mask, keyword, 0.0)
            top = max(float(allowed_keyword.max()), CC_FLOOR)
            fused = CC_ALPHA * dense + (1 - CC_ALPHA) * allowed_keyword / top + SERVER_BONUS * self.named(query)
            fused_cc = np.where(mask, fused, -np.inf)
            if float(fused_cc.max()) < CC_MIN:  # nothing is close: an empty answer says "search again"
                return []
            return self._top(fused_cc, limit)
        fused = np.zeros(len(self.docs), dtype=np.float64)
        for ranking in (
            _ranking(np.where(mask & (keyword > 0), keyword, -np.inf)),
            _ranking(np.where(mask, dense, -np.inf), DENSE_DEPTH),
        ):
            for rank, index in enumerate(ranking):
                fused[index] += 1.0 / (RRF_K + rank + 1)
        return self._top(np.where(mask & (fused > 0), fused, -np.inf), limit)

    def _top(self, scores: np.ndarray, limit: int) -> list[Hit]:
        return [Hit(self.docs[index], float(scores[index])) for index in _ranking(scores, limit)]


def _ranking(scores: np.ndarray, depth: int | None = None) -> list[int]:
    """Indices of the finite scores, best first (ties: catalog order), at most `depth`."""
    order = np.argsort(-scores, kind="stable")
    order = order[np.isfinite(scores[order])]
    return [int(index) for index in (order if depth is None else order[:depth])]


def _unit(vector: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector
