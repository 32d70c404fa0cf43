"""Tool search: `mux_search_tools` and `mux_call_tool`, and what `tools/list` shows in search mode.

With many servers behind mcpmux, listing every tool costs a model tens of thousands of tokens a turn.
In search mode (`[mux] tool_search = "on"`, or `"auto"` once the catalog has more than
`tool_search_threshold` tools) `tools/list` shows only mcpmux's own `mux_*` tools, the tools
matching `[mux] pinned_tools`, and the MCP Apps tools a host must list to render and serve views
(those with a view, and those only views call); the model finds the rest with `mux_search_tools`
and calls them with `mux_call_tool` (or directly: every catalog tool stays callable by name). A tool
only views may call is never found nor called that way.

The index (`search_index.ToolIndex`) follows the catalog: it is built when the `Mux` starts and
brought up to date, in the Mux's task group, after every catalog change (list_changed, reconnect,
reload); only tools whose text changed are embedded again, and embeddings are kept on disk.

A search never ranks worse than configured because the index is still warming: while the catalog's
embeddings are being computed (the model loading, a new server's tools), it waits for them, at most
`READY_WAIT` seconds. Every answer says which ranking produced it ("BM25 + embeddings" or "BM25",
with the reason). BM25 answers alone only where embeddings are off (`[inference] backend = "off"`,
`[inference.embeddings] model = ""`), failing (logged once), or not ready within the wait. Outside
search mode the catalog is embedded only once a search asks for it (the model would otherwise load
at every start for a listing that shows every tool anyway).
"""

from __future__ import annotations

import fnmatch
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from anyio.abc import TaskGroup
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mcpmux.core import apps
from mcpmux.core.inbound import Caller
from mcpmux.errors import UnknownToolError, UnlistedToolError, error_result
from mcpmux.tools.base import LocalTool, SearchHost
from mcpmux.tools.meta import META_TOOL_NAMES
from mcpmux.tools.search_description import describe_catalog
from mcpmux.tools.search_index import EmbeddingCache, EmbedFn, Hit, ToolDoc, ToolIndex, default_cache_dir
from mcpmux.upstream.lane import ProgressFn

logger = logging.getLogger(__name__)

MAX_RESULTS = 50
QUERY_EMBED_TIMEOUT = 10.0
"""Seconds a search waits for its query's embedding (a hung remote server, a host too busy to run the
model) before it ranks by BM25 alone and says so. A query takes milliseconds on an idle core; many
clients at once on a busy 2-core host took several seconds."""
READY_WAIT = 30.0
"""Seconds a search waits for the catalog's embeddings (the model loading, new tools embedded) before
it ranks by BM25 alone and says so. A warm start is ready in a few seconds; a cold one embeds every
tool first (about 10 ms a tool on two cores)."""
HYBRID = "BM25 + embeddings"
KEYWORDS = "BM25"

_TOOL_ITEM = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "description": {"type": "string"},
        "inputSchema": {"type": "object"},
        "score": {"type": "number"},
        "_meta": {"type": "object", "description": "The tool's own `_meta`, where it has one."},
    },
    "required": ["name", "description", "inputSchema", "score"],
}

SEARCH_TOOL_INTRO = (
    "Find tools of the connected servers; most are not listed. Describe one task in plain words, the "
    "action and what it acts on ('create an issue in a GitHub repository', 'current time in a "
    "timezone'), not a guessed tool name. Returns the best matches with their input schemas; call one "
    "with mux_call_tool. If none fits, search again with other words or the service's name."
)
"""The search tool's description; in search mode the listing adds the servers behind it."""

SEARCH_TOOL = types.Tool(
    name="mux_search_tools",
    title="Find tools",
    description=SEARCH_TOOL_INTRO,
    input_schema={
        "type": "object",
        "properties": {
            "query": {"type": "string", "minLength": 1, "description": "The task, in plain words."},
            "limit": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_RESULTS,
                "default": 5,
            },
            "servers": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Only servers matching these globs, e.g. ['git*'].",
            },
        },
        "required": ["query"],
        "additionalProperties": False,
    },
    output_schema={
        "type": "object",
        "properties": {
            "tools": {"type": "array", "items": _TOOL_ITEM},
            "ranking": {
                "type": "string",
                "description": f"Which ranking answered: {HYBRID!r}, or {KEYWORDS!r} (then `why` says why).",
            },
            "why": {"type": "string"},
        },
        "required": ["tools", "ranking"],
    },
    annotations=types.ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False),
)

CALL_TOOL = types.Tool(
    name="mux_call_tool",
    title="Call a tool by name",
    description=(
        "Call any tool of the connected servers by its exact name, listed or not (find it with "
        "mux_search_tools). The answer is the tool's own result, as from a direct call."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "tool": {
                "type": "string",
                "minLength": 1,
                "description": "The name mux_search_tools gave, e.g. 'github__create_issue'.",
            },
            "arguments": {"type": "object", "default": {}, "description": "Matching that tool's input schema."},
        },
        "required": ["tool"],
        "additionalProperties": False,
    },
    annotations=types.ToolAnnotations(read_only_hint=False, open_world_hint=True),
)

SEARCH_TOOL_NAMES = frozenset({SEARCH_TOOL.name, CALL_TOOL.name})
OWN_TOOL_NAMES = SEARCH_TOOL_NAMES | META_TOOL_NAMES
"""mcpmux's own tools: always listed in search mode, never in the index."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _SearchArgs(_Strict):
    query: str = Field(min_length=1)
    limit: int = Field(default=5, ge=1, le=MAX_RESULTS)
    servers: list[str] | None = None


class _CallArgs(_Strict):
    tool: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


def embedding_identity(mux: SearchHost, precision: str) -> str:
    """What names the vectors in the disk cache: the backend, the model, a remote server's URL, and the
    precision a local model computes them in (`InferenceService.embedding_precision`)."""
    inference = mux.config.inference
    where = inference.remote.base_url if inference.backend == "openai" and inference.remote is not None else ""
    return f"{inference.backend}|{inference.embeddings.model}|{where}|{precision}"


@dataclass(frozen=True, slots=True)
class Found:
    """One search's answer: the hits, best first, and which ranking produced them."""

    hits: list[Hit]
    ranking: str
    """`HYBRID` or `KEYWORDS`."""
    why: str = ""
    """Why BM25 answered alone ("" when the embeddings took part)."""

    @property
    def method(self) -> str:
        """The ranking with its reason, as the answer's text and `mcpmux search` print it."""
        return f"{self.ranking}: {self.why}" if self.why else self.ranking


class ToolSearch:
    """The search index over one `Mux`'s catalog, its two tools, and the listing of search mode."""

    def __init__(self, mux: SearchHost) -> None:
        self.mux = mux
        self.index = ToolIndex()  # its disk cache is opened once the embedding precision is known
        # The catalog's tool list as last indexed (held, so its identity cannot be reused) and the local tools' count.
        self._seen: tuple[list[types.Tool], int] | None = None
        self._wanted = anyio.Event()
        self._started = False
        self._asked = False  # a search asked for the embeddings outside search mode
        self._unavailable = ""  # why embeddings cannot take part now ("": they can, or are on their way)
        self._said_bm25_only = False
        self.query_timeout = QUERY_EMBED_TIMEOUT
        self.on_found: Callable[[Caller, list[str]], Awaitable[None]] | None = None
        """Told the tools each search returned, in search mode with `[mux] tool_search_expose = "listing"`."""
        self.indexed = anyio.Event()
        """Set while the index is up to date with the catalog (embedded, or BM25 alone); a catalog change
        replaces it with a new, unset event."""
        self._described: tuple[tuple[str, ...], types.Tool] | None = None
        mux.on_catalog_changed(self._catalog_changed)

    def local_tools(self) -> list[LocalTool]:
        return [LocalTool(SEARCH_TOOL, self._search_tool), LocalTool(CALL_TOOL, self._call_tool, fitted=False)]

    # -- what tools/list shows -----------------------------------------------------------------------

    def searchable(self, tools: list[types.Tool]) -> int:
        return sum(1 for tool in tools if tool.name not in OWN_TOOL_NAMES)

    def search_mode(self, tools: list[types.Tool] | None = None) -> bool:
        """Whether tools/list shows only mcpmux's own tools and the pinned ones."""
        settings = self.mux.config.mux
        if settings.tool_search == "on":
            return True
        if settings.tool_search == "off":
            return False
        return self.searchable(tools if tools is not None else self.mux.list_tools()) > settings.tool_search_threshold

    def listing(self, tools: list[types.Tool]) -> list[types.Tool]:
        """`tools` (the whole catalog, or a profile's part of it) as tools/list shows it; in search mode
        the search tool's description names the servers and what their tools act on."""
        if not self.search_mode(tools):
            return [tool for tool in tools if tool.name not in SEARCH_TOOL_NAMES]
        pinned = self.mux.config.mux.pinned_tools
        listed = [
            tool
            for tool in tools
            if tool.name in OWN_TOOL_NAMES
            or apps.for_views(tool.meta)  # a host renders a view only for a tool it listed with one
            or any(fnmatch.fnmatchcase(tool.name, glob) for glob in pinned)
        ]
        return [self._described_search_tool(tools) if tool.name == SEARCH_TOOL.name else tool for tool in listed]

    def _described_search_tool(self, tools: list[types.Tool]) -> types.Tool:
        names = tuple(tool.name for tool in tools if tool.name not in OWN_TOOL_NAMES)
        if self._described is None or self._described[0] != names:  # tools/list is frequent; catalogs change seldom
            docs = [self._doc(tool) for tool in tools if tool.name not in OWN_TOOL_NAMES]
            described = SEARCH_TOOL.model_copy(update={"description": describe_catalog(SEARCH_TOOL_INTRO, docs)})
            self._described = (names, described)
        return self._described[1]

    # -- keeping the index current -------------------------------------------------------------------

    def start(self, tasks: TaskGroup) -> None:
        """Build the index now and keep it current, in `tasks` (the Mux's task group)."""
        if not self._started:
            self._started = True
            tasks.start_soon(self._keep_current, name="tool search index")

    async def _catalog_changed(self) -> None:
        self._want()

    def _want(self) -> None:
        if self.indexed.is_set():
            self.indexed = anyio.Event()
        self._wanted.set()

    def sync(self) -> None:
        """Bring BM25 up to date with the catalog if it changed (cheap: a rebuild of the word index)."""
        seen = (self.mux.catalog.tools, len(self.mux.local_tools))
        if self._seen is not None and seen[0] is self._seen[0] and seen[1] == self._seen[1]:
            return
        self._seen = seen
        tools = [tool for tool in self.mux.list_tools() if tool.name not in OWN_TOOL_NAMES]
        self.index.update([self._doc(tool) for tool in tools if not apps.app_only(tool.meta)])
        if self.index.missing:
            self._want()

    def _doc(self, tool: types.Tool) -> ToolDoc:
        name = tool.name
        if name in self.mux.local_tools:
            server, _, short = name.rpartition(self.mux.config.mux.separator)
            server = server or "mcpmux"
        else:
            route = self.mux.catalog.resolve_tool(name)
            server, short = route.upstream, route.name
        title = tool.title or (tool.annotations.title if tool.annotations is not None else None) or ""
        return ToolDoc(name, server, short, title, tool.description or "", tool.input_schema, tool.meta)

    def _embedder(self) -> EmbedFn | None:
        service = self.mux.inference
        if service is None or not service.embedding_model:
            return None
        return service.embed

    def _bm25_only(self, why: str) -> None:
        self._unavailable = why
        if not self._said_bm25_only:
            self._said_bm25_only = True
            logger.warning("tool search ranks by BM25 alone: %s", why)

    def _embedding_failed(self, err: Exception) -> None:
        failure = f"{type(err).__name__}: {err}"
        if self.mux.sampling.service is not None:  # not merely shutting down
            self._bm25_only(f"the embedding model failed ({failure}); retried on the next catalog change")

    async def _keep_current(self) -> None:
        if self.mux.config.inference.backend == "off":
            self._bm25_only('[inference] backend is "off" (set it to "local" or "openai" to add embeddings)')
        elif not self.mux.config.inference.embeddings.model:
            self._bm25_only('[inference.embeddings] model is "" (set it, e.g. "builtin:all-minilm-l6-v2")')
        while True:
            self._wanted = anyio.Event()
            # Outside search mode tools/list shows the whole catalog: the model loads only once a search asks.
            embed = self._embedder() if self._asked or self.search_mode() else None
            if embed is not None and self.index.cache is None and not await self._open_cache():
                embed = None
            self.sync()
            if embed is not None and self.index.missing:
                try:
                    count = await self.index.embed_missing(embed)
                except Exception as err:  # search keeps working on BM25; retried after the next change
                    self._embedding_failed(err)
                else:
                    self._unavailable = ""
                    logger.info("tool search: %d tools indexed, %d newly embedded", len(self.index.docs), count)
            if not self._wanted.is_set():
                self.indexed.set()
            await self._wanted.wait()

    async def _open_cache(self) -> bool:
        """Give the index its disk cache, named by what computes the vectors. A local model is loaded for
        its precision (the first query needs it anyway); False, logged, where it fails to load."""
        assert self.mux.inference is not None
        try:
            precision = await self.mux.inference.embedding_precision()
        except Exception as err:  # search keeps working on BM25; retried after the next change
            self._embedding_failed(err)
            return False
        self.index.cache = EmbeddingCache(default_cache_dir(), embedding_identity(self.mux, precision))
        self._seen = None  # the index's keys name the cache: `sync` computes them again
        return True

    # -- searching -----------------------------------------------------------------------------------

    async def search(
        self,
        query: str,
        limit: int = 5,
        servers: list[str] | None = None,
        profile: str | None = None,
        wait: float = READY_WAIT,
    ) -> Found:
        """The best `limit` catalog tools for `query` in `profile`'s view, best first; `servers`: only
        those servers' tools (globs). Waits up to `wait` seconds for the catalog's embeddings."""
        self.sync()
        embed = self._embedder()
        why = await self._wait_for_embeddings(wait) if embed is not None else self._unavailable or "embeddings are off"
        vector = None
        if embed is not None and not why:
            try:
                with anyio.fail_after(self.query_timeout):
                    vector = (await embed([query]))[0]
            except Exception as err:
                why = f"the query's embedding failed ({type(err).__name__}: {err})"
                logger.warning("tool search ranked one query by BM25 alone: %s", why)

        view = self.mux.view(profile)

        def allowed(doc: ToolDoc) -> bool:
            in_view = view.profile is None or view.allows(doc.name)
            return in_view and (servers is None or any(fnmatch.fnmatchcase(doc.server, glob) for glob in servers))

        narrowed = allowed if servers is not None or profile is not None else None
        hits = self.index.search(query, limit, vector, narrowed)
        return Found(hits, HYBRID, "") if vector is not None else Found(hits, KEYWORDS, why)

    def ranking(self) -> str:
        """The ranking a search would get now: `HYBRID`, or `KEYWORDS` with why (the dashboard shows it)."""
        if self.index.dense_ready and self._embedder() is not None:
            return HYBRID
        return f"{KEYWORDS}: {self._unavailable or 'embeddings not ready yet'}"

    async def _wait_for_embeddings(self, wait: float) -> str:
        """ "" once every tool of the catalog has its vector; else why not (after at most `wait` seconds)."""
        if not self.index.dense_ready and not self._asked and not self.search_mode():
            self._asked = True
            self._want()
        with anyio.move_on_after(wait):
            while not self.index.dense_ready and not self._unavailable:
                if self.indexed.is_set() and not self._wanted.is_set():
                    break  # the index is idle without vectors: nothing more is coming
                await self.indexed.wait()
                self.sync()
        if self.index.dense_ready:
            return ""
        if self._unavailable:
            return self._unavailable
        embedded = len(self.index.docs) - len(self.index.missing)
        return f"embeddings not ready after {wait:g} s ({embedded} of {len(self.index.docs)} tools embedded)"

    async def _search_tool(
        self, arguments: dict[str, Any], progress: ProgressFn | None, caller: Caller
    ) -> types.CallToolResult:
        try:
            args = _SearchArgs.model_validate(arguments)
        except ValidationError as err:
            return _malformed(SEARCH_TOOL.name, err)
        await self.mux.wait_for_starting()  # a search, like a list, sees the upstreams coming up
        found = await self.search(args.query, args.limit, args.servers, caller.profile)
        expose = self.mux.config.mux.tool_search_expose == "listing" and self.search_mode()
        if expose and found.hits and self.on_found is not None:
            await self.on_found(caller, [hit.doc.name for hit in found.hits])
        items = [_item(hit) for hit in found.hits]
        structured: dict[str, Any] = {"tools": items, "ranking": found.ranking}
        if found.why:
            structured["why"] = found.why
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=self._text(args, items, found, caller.profile))],
            structured_content=structured,
        )

    def _text(self, args: _SearchArgs, items: list[dict[str, Any]], found: Found, profile: str | None) -> str:
        scope = f" on servers {', '.join(args.servers)}" if args.servers is not None else ""
        if not items:
            view = self.mux.view(profile)
            searched = sum(1 for doc in self.index.docs if view.allows(doc.name))
            return (
                f"{SEARCH_TOOL.name}: no tool matches {args.query!r}{scope} ({searched} tools searched), ranked by "
                f"{found.method}; search again with other words"
                + (", or fewer `servers` globs" if args.servers is not None else "")
            )
        lines = [
            f"{SEARCH_TOOL.name}: {len(items)} tools for {args.query!r}{scope}, best first ({found.method}). "
            f'Call one with {CALL_TOOL.name} {{"tool": "<name>", "arguments": {{...}}}}.'
        ]
        for rank, item in enumerate(items, 1):
            summary = " ".join(item["description"].split())
            lines.append(f"{rank}. {item['name']} (score {item['score']:.4f}): {summary}")
            lines.append(f"   input: {json.dumps(item['inputSchema'], separators=(',', ':'))}")
        return "\n".join(lines)

    async def _call_tool(
        self, arguments: dict[str, Any], progress: ProgressFn | None, caller: Caller
    ) -> types.CallToolResult:
        try:
            args = _CallArgs.model_validate(arguments)
        except ValidationError as err:
            return _malformed(CALL_TOOL.name, err)
        if args.tool in OWN_TOOL_NAMES:
            return error_result(f"{CALL_TOOL.name}: {args.tool} is one of mcpmux's own tools; call it directly")
        refusal = self.mux.model_refusal(args.tool, caller.profile)
        if refusal is not None:
            return error_result(f"{CALL_TOOL.name}: {refusal}")
        try:
            return await self.mux.call_tool(args.tool, args.arguments, progress=progress, caller=caller)
        except UnlistedToolError as err:
            return error_result(f"{CALL_TOOL.name}: {err}")
        except UnknownToolError as err:
            return error_result(f"{CALL_TOOL.name}: {err}. Find the exact name with {SEARCH_TOOL.name}.")


def _item(hit: Hit) -> dict[str, Any]:
    item = {
        "name": hit.doc.name,
        "description": hit.doc.description,
        "inputSchema": hit.doc.input_schema,
        "score": round(hit.score, 6),
    }
    if hit.doc.meta is not None:
        item["_meta"] = hit.doc.meta
    return item


def _malformed(tool: str, err: ValidationError) -> types.CallToolResult:
    problems = "; ".join(
        f"{'.'.join(str(part) for part in problem['loc']) or '(arguments)'}: {problem['msg']}"
        for problem in err.errors()
    )
    return error_result(f"{tool}: the request is malformed: {problems}. See the tool's input schema.")
