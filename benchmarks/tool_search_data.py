"""The tool search benchmark's data: the stored catalogs as `ToolDoc`s, the labeled queries, the metrics.

Imported by `tool_search.py` and by `tool_search_startup.py`, which must not import torch before
mcpmux does (a start's cost includes it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcpmux.tools.search_index import ToolDoc

ROOT = Path(__file__).resolve().parents[1]
CATALOGS = ROOT / "tests" / "data" / "tool_catalogs.json"
QUERIES = ROOT / "tests" / "data" / "tool_search_queries.json"
DEV_QUERIES = ROOT / "tests" / "data" / "tool_search_dev_queries.json"
SERVERS = ROOT / "tests" / "data" / "tool_servers.json"


def load_docs(copies: int = 1) -> list[ToolDoc]:
    catalogs: dict[str, list[dict[str, Any]]] = json.loads(CATALOGS.read_text())
    docs = []
    for copy in range(copies):
        for server, tools in catalogs.items():
            name = server if copy == 0 else f"{server}{copy}"
            for tool in tools:
                docs.append(
                    ToolDoc(
                        f"{name}__{tool['name']}",
                        name,
                        tool["name"],
                        tool.get("title") or "",
                        tool.get("description") or "",
                        tool.get("inputSchema") or {},
                    )
                )
    return docs


def grown(size: int) -> list[ToolDoc]:
    base = len(load_docs())
    return load_docs(-(-size // base))[:size]


def metrics(ranks: list[int]) -> dict[str, float]:
    """`ranks`: 1-based rank of the right tool per query (0: not found)."""
    n = len(ranks)
    return {
        "R@1": sum(1 for r in ranks if r == 1) / n,
        "R@5": sum(1 for r in ranks if 0 < r <= 5) / n,
        "MRR": sum(1 / r for r in ranks if r > 0) / n,
        "n": n,
    }


@dataclass(frozen=True)
class Query:
    text: str
    right: frozenset[str]
    """The right tool's public name (and its aliases: a server listing one tool under two names)."""
    kind: str
    split: str


def load_queries() -> list[Query]:
    """The dev set's queries (split by server: those on held-out servers are `heldout`) and the first
    set's 152 (all on tuning servers: the method was chosen with them in view)."""
    splits = {name: info["split"] for name, info in json.loads(SERVERS.read_text()).items()}
    found = [
        Query(
            item["query"],
            frozenset([item["tool"], *item.get("also", [])]) if item["tool"] else frozenset(),
            item["kind"],
            item["split"],
        )
        for item in json.loads(DEV_QUERIES.read_text())
    ]
    for item in json.loads(QUERIES.read_text()):
        assert splits[item["tool"].split("__")[0]] == "tune"
        found.append(Query(item["query"], frozenset([item["tool"]]), item["kind"], "tune"))
    return found


def rank_in(order: list[str], right: frozenset[str]) -> int:
    """1-based rank of the best right tool in `order` (0: not there)."""
    return next((position for position, name in enumerate(order, 1) if name in right), 0)


def grouped(queries: list[Query], ranks: list[int]) -> dict[str, dict[str, float]]:
    """Metrics per split and per split/kind (nonsense queries apart: there, an empty answer is right)."""
    per: dict[str, list[int]] = {}
    for query, rank in zip(queries, ranks, strict=True):
        if query.kind == "nonsense":
            continue
        for group in (query.split, f"{query.split}/{query.kind}"):
            per.setdefault(group, []).append(rank)
    return {group: metrics(values) for group, values in sorted(per.items())}
