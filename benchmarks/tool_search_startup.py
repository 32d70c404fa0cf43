"""One start of mcpmux in front of every stored server, timed: `python benchmarks/tool_search_startup.py HOME`.

Run by `benchmarks/tool_search.py --parts startup` in a new process for each start (torch's import
and the embedding model's load are part of a start), with HOME as `MCPMUX_HOME` (where the embedding
cache lives: empty for the cold start, filled for the warm ones). Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from tool_search_data import CATALOGS, ROOT, Query, grouped, load_queries, rank_in

from mcpmux.core.config import config_from_dict
from mcpmux.mux.multiplexer import Mux

CATALOG_SERVER = ROOT / "benchmarks" / "catalog_server.py"


async def startup_once(home: Path) -> dict[str, Any]:
    """One start of mcpmux in front of every stored server (each a `catalog_server.py` process), as a
    Claude-Desktop-style config leaves it: `tool_search = "auto"`, the default embeddings. A client
    searches the moment the listing is complete (what a model does), and goes on searching, one query
    after another; a second client asks every query again once the index is ready (one that waited)."""
    os.environ["MCPMUX_HOME"] = str(home)
    catalogs = json.loads(CATALOGS.read_text())
    servers = {name: {"command": sys.executable, "args": [str(CATALOG_SERVER), name]} for name in catalogs}
    queries = load_queries()
    started = time.perf_counter()
    async with Mux(config_from_dict({"mcpServers": servers})) as mux:
        listed = time.perf_counter() - started
        search = mux.tool_search
        assert search is not None

        async def ask(query: Query) -> tuple[float, dict[str, Any]]:
            result = await mux.call_tool("mux_search_tools", {"query": query.text, "limit": 50})
            return time.perf_counter() - started, result.structured_content or {}

        at_once = [await ask(query) for query in queries]
        await search.indexed.wait()
        waited = [await ask(query) for query in queries]
        embedded = search.index.embedded_texts
    first = at_once[0]
    return {
        "servers": len(servers),
        "tools": sum(len(tools) for tools in catalogs.values()),
        "listed_s": listed,
        "first_answer_s": first[0],
        "first_answer_ranking": first[1].get("ranking"),
        "first_answer_why": first[1].get("why", ""),
        "rankings_at_once": sorted({answer.get("ranking", "") for _, answer in at_once}),
        "why_at_once": sorted({answer.get("why", "") for _, answer in at_once} - {""}),
        "newly_embedded": embedded,
        "at_once": _answer_metrics(queries, [answer for _, answer in at_once]),
        "waited": _answer_metrics(queries, [answer for _, answer in waited]),
    }


def _answer_metrics(queries: list[Query], answers: list[dict[str, Any]]) -> dict[str, Any]:
    names = [[tool["name"] for tool in answer.get("tools", [])] for answer in answers]
    result: dict[str, Any] = grouped(
        queries, [rank_in(order, q.right) for q, order in zip(queries, names, strict=True)]
    )
    nonsense = [not order for q, order in zip(queries, names, strict=True) if q.kind == "nonsense"]
    result["nonsense answered empty"] = {"share": sum(nonsense) / len(nonsense), "n": len(nonsense)}
    return result


if __name__ == "__main__":
    sys.stdout.write(json.dumps(anyio.run(startup_once, Path(sys.argv[1]))) + "\n")
