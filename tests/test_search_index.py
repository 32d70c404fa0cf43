"""The tool search index: terms, BM25 ranking, filtering, and embeddings kept by content hash on disk."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mcpmux.tools.search_index import VIEWS, EmbeddingCache, ToolDoc, ToolIndex, default_cache_dir, words

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _doc(server: str, short: str, description: str, title: str = "", **arguments: str) -> ToolDoc:
    schema = {
        "type": "object",
        "properties": {name: {"type": "string", "description": text} for name, text in arguments.items()},
    }
    return ToolDoc(f"{server}__{short}", server, short, title, description, schema)


DOCS = [
    _doc("files", "read_file", "Read the complete contents of a file from disk.", path="Path of the file"),
    _doc("files", "write_file", "Create a new file or overwrite an existing one.", path="Where", content="Text"),
    _doc("github", "searchIssues", "Search issues and pull requests in GitHub repositories.", q="Search query"),
    _doc("gitlab", "search_issues", "Search issues of a GitLab project.", project="Project id"),
    _doc("time", "get_current_time", "Get the current time in a specific timezone.", timezone="IANA name"),
    _doc("maps", "geocode", "Turn an address into coordinates.", "Geocoder", address="Street address"),
]


def test_words_split_identifiers_and_fold_plurals() -> None:
    assert words("searchIssues") == ["search", "issue"]
    assert words("get_current_time in the Timezones") == ["current", "time", "timezone"]
    assert words("what's HTTPServer doing") == ["http", "server", "doing"]


def test_bm25_ranks_by_name_description_and_arguments() -> None:
    index = ToolIndex()
    index.update(DOCS)
    assert index.search("read a file", 2)[0].doc.name == "files__read_file"
    assert index.search("IANA timezone", 1)[0].doc.name == "time__get_current_time"  # an argument's description
    assert [hit.doc.name for hit in index.search("geocoder", 3)] == ["maps__geocode"]  # the title
    assert index.search("zzz", 3) == []
    both = [hit.doc.name for hit in index.search("search issues", 5)]
    assert set(both[:2]) == {"github__searchIssues", "gitlab__search_issues"}
    only = index.search("search issues", 5, allowed=lambda doc: doc.server == "gitlab")
    assert [hit.doc.name for hit in only] == ["gitlab__search_issues"]


def test_each_tool_is_embedded_whole_by_its_first_sentence_and_by_its_name() -> None:
    doc = _doc("files", "read_file", "Read a file from disk. Use absolute paths.\nWARNING: large files.", path="p")
    assert doc.dense_texts() == (
        "read file (files). Read a file from disk. Use absolute paths.\nWARNING: large files. Arguments: path.",
        "read file (files). Read a file from disk.",
        "read file (files)",
    )
    assert len(doc.dense_texts()) == VIEWS


async def test_embeddings_are_kept_by_content_and_reused_from_disk(tmp_path: Path) -> None:
    texts_embedded: list[str] = []

    async def embed(texts: list[str]) -> list[list[float]]:  # a stand-in model: one axis per word length
        texts_embedded.extend(texts)
        return [[float(len(text)), 1.0, float(text.count(" "))] for text in texts]

    index = ToolIndex(EmbeddingCache(tmp_path, "model-a"))
    index.update(DOCS[:3])
    assert not index.dense_ready
    assert await index.embed_missing(embed) == 3
    assert index.dense_ready
    changed = DOCS[2].__class__(**{**{f: getattr(DOCS[2], f) for f in DOCS[2].__slots__}, "description": "New."})
    index.update([DOCS[0], DOCS[1], changed, DOCS[3]])
    assert [doc.name for doc in index.missing] == ["github__searchIssues", "gitlab__search_issues"]
    assert await index.embed_missing(embed) == 2
    fresh = ToolIndex(EmbeddingCache(tmp_path, "model-a"))  # a restart: everything is on disk
    fresh.update([DOCS[0], DOCS[1], changed, DOCS[3]])
    assert fresh.dense_ready
    assert await fresh.embed_missing(embed) == 0
    other = ToolIndex(EmbeddingCache(tmp_path, "model-b"))  # another model's vectors are never reused
    other.update(DOCS[:1])
    assert not other.dense_ready
    vector = np.fromfile(next(tmp_path.rglob("*.f32")), dtype=np.float32)  # noqa: ASYNC240
    assert vector.shape == (3,)
    assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-5
    # Three texts a tool (VIEWS), each embedded once: the changed description re-embeds its two views
    # that hold it, not the name alone.
    assert len(texts_embedded) == 3 * VIEWS + 2 + VIEWS
    assert [text for text in texts_embedded[3 * VIEWS :] if text.startswith("searchIssues")] == [
        "searchIssues (github). New. Arguments: q.",
        "searchIssues (github). New.",
    ]


def test_the_cache_lives_under_mcpmux_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MCPMUX_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "cache" / "tool-embeddings"
    monkeypatch.delenv("MCPMUX_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "mcpmux" / "tool-embeddings"


def test_an_unwritable_cache_only_costs_a_re_embed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    cache = EmbeddingCache(blocker, "m")
    cache.put(cache.key("x"), np.ones(3, dtype=np.float32))
    cache.put(cache.key("y"), np.ones(3, dtype=np.float32))
    assert cache.get(cache.key("x")) is None
    assert sum("cannot write the embedding cache" in r.getMessage() for r in caplog.records) == 1
