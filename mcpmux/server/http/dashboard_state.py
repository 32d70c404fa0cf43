"""What the dashboard shows, read from a running `Mux` as one JSON-ready dict (`snapshot`).

Everything is read when asked, from the figures the parts keep anyway (as `/metrics` reads them):
the upstreams' status and stderr tails, the per-tool call counters and latency buckets of
`MuxMetrics`, the cache's and the single-flights' per-tool counts, the front's connections, the
profiles, the engine's stats and the search index. Nothing here runs per call. Rates are the
page's to compute, from two snapshots.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from mcp.server.connection import Connection
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcpmux import __version__
from mcpmux.core.metrics import bucket_quantile
from mcpmux.mux.multiplexer import Mux

TOOLS_SHOWN = 200
"""Tools listed, busiest first (a catalog of thousands stays one screen)."""
STDERR_SHOWN = 8
"""Lines of an upstream's stderr tail shown."""


def snapshot(mux: Mux, connections: Callable[[], Iterable[Connection]]) -> dict[str, Any]:
    """The dashboard's state now: server, upstreams, tools, sessions, profiles, engine, search."""
    return {
        "server": {"version": __version__, "source": mux.config.source, "uptime_s": mux.uptime()},
        "upstreams": _upstreams(mux),
        "tools": _tools(mux),
        "sessions": _sessions(connections()),
        "profiles": _profiles(mux),
        "engine": _engine(mux),
        "backends": _backends(mux),
        "search": _search(mux),
    }


def _upstreams(mux: Mux) -> list[dict[str, Any]]:
    rows = []
    for name, upstream in list(mux.upstreams.items()):
        status = upstream.status()
        dispatcher = mux.dispatchers.get(name)
        gate = dispatcher.gate.stats() if dispatcher is not None else None
        rows.append(
            {
                "name": name,
                "transport": status.transport,
                "state": status.state.value,
                "era": status.protocol_version,
                "tools": status.tools,
                "restarts": status.restarts,
                "last_error": status.last_error,
                "auth": status.auth,
                "in_flight": gate.active if gate is not None else 0,
                "queued": gate.waiting if gate is not None else 0,
                "stderr": list(upstream.stderr.lines)[-STDERR_SHOWN:],
            }
        )
    return rows


def _tools(mux: Mux) -> list[dict[str, Any]]:
    counted = [(sum(stats.outcomes.values()), key, stats) for key, stats in mux.metrics.calls().items()]
    counted.sort(key=lambda item: (-item[0], item[1]))
    rows = []
    for calls, (upstream, tool), stats in counted[:TOOLS_SHOWN]:
        dispatcher = mux.dispatchers.get(upstream)
        p50, p99 = stats.quantile(0.5), stats.quantile(0.99)
        rows.append(
            {
                "upstream": upstream,
                "tool": tool,
                "calls": calls,
                "errors": calls - stats.outcomes.get("ok", 0),
                "p50_ms": None if p50 is None else p50 * 1e3,
                "p99_ms": None if p99 is None else p99 * 1e3,
                "cache_hits": mux.cache.hits_by.get((upstream, tool), 0),
                "coalesced": dispatcher.flights.shared_by.get(tool, 0) if dispatcher is not None else 0,
            }
        )
    return rows


def _sessions(connections: Iterable[Connection]) -> dict[str, Any]:
    connected = []
    for connection in connections:
        params = connection.client_params
        if connection.protocol_version in MODERN_PROTOCOL_VERSIONS or params is None:
            continue
        info = params.client_info
        connected.append(
            {
                "client": f"{info.name} {info.version}",
                "protocol": connection.protocol_version,
                "transport": "http" if connection.session_id else "stdio",
            }
        )
    connected.sort(key=lambda row: (row["client"], row["protocol"]))
    return {"connected": connected, "note": "(2025 sessions; a 2026-07-28 client keeps no session)"}


def _profiles(mux: Mux) -> list[dict[str, Any]]:
    rows = []
    for name, profile in mux.config.profiles.items():
        servers = ", ".join(profile.servers) + "".join(f", not {glob}" for glob in profile.deny_servers)
        rows.append(
            {
                "name": name,
                "tools": len(mux.list_tools(name)),
                "servers": servers,
                "tokens": bool(profile.auth_token_env or profile.auth_token_file),
            }
        )
    return rows


def _engine(mux: Mux) -> list[dict[str, Any]] | None:
    service = mux.inference
    if service is None:
        return None
    models: dict[str, dict[str, Any]] = service.stats().get("models", {})
    return [
        {
            "model": model,
            "running": figures["running"],
            "waiting": figures["waiting"],
            "kv_usage": figures["kv_usage"],
            "tokens_per_s": figures["generation_tokens_per_s"],
            "ttft_p50_ms": _histogram_ms(figures["ttft"], 0.5),
            "ttft_p99_ms": _histogram_ms(figures["ttft"], 0.99),
        }
        for model, figures in models.items()
    ]


def _backends(mux: Mux) -> list[dict[str, Any]] | None:
    """The inference backends (the fleet), each with its state, load and failures; None while inference is off."""
    service = mux.inference
    if service is None:
        return None
    backends: dict[str, dict[str, Any]] = service.stats().get("backends", {})
    return [
        {
            "name": name,
            "kind": figures["kind"] + (", fallback" if figures["fallback"] else ""),
            "state": figures["state"],
            "in_flight": figures["in_flight"],
            "requests": figures["requests"],
            "failed": figures["failed"],
            "busy": figures["busy"],
            "refused": figures["errors"],
            "last_error": figures["last_error"],
        }
        for name, figures in backends.items()
    ]


def _histogram_ms(histogram: dict[str, Any], q: float) -> float | None:
    """A quantile, in ms, of the engine's histogram (per-bucket counts, the last one the overflow)."""
    cumulative, pairs = 0.0, []
    for bound, count in zip([*histogram["bounds"], float("inf")], histogram["counts"], strict=True):
        cumulative += count
        pairs.append((float(bound), cumulative))
    seconds = bucket_quantile(pairs, q)
    return None if seconds is None else seconds * 1e3


def _search(mux: Mux) -> dict[str, Any] | None:
    search = mux.tool_search
    if search is None:
        return None
    return {
        "mode": mux.config.mux.tool_search,
        "active": search.search_mode(),
        "indexed": search.indexed.is_set(),
        "tools": len(search.index.docs),
        "ranking": search.ranking(),
    }
