"""`mcpmux status --url http://127.0.0.1:8765`: a readable summary of a running server's `/metrics`.

It scrapes the server's Prometheus endpoint, parses it with `prometheus_client.parser` and prints
rich tables: upstreams (state, auth, calls, errors, p50/p99, restarts), the busiest tools,
scheduling (in flight, queues, coalescing, batches, rejections), caches, the inference backends
(state, load, failures, what each remote accepts) and the inference engine. Quantiles
are estimated from the histogram buckets the way Prometheus' `histogram_quantile` does.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import httpx2
from prometheus_client.parser import text_string_to_metric_families
from rich import box
from rich.console import Console
from rich.table import Table

from mcpmux.core.metrics import bucket_quantile

Labels = dict[str, str]


def add_status_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `status` subcommand to the CLI's subparsers."""
    status = commands.add_parser("status", help="print a summary of a running mcpmux server (its /metrics)")
    status.add_argument("--url", default="http://127.0.0.1:8765", help="the server (any path; /metrics is used)")
    status.add_argument("--token-env", default=None, metavar="NAME", help="send the bearer token in env var NAME")
    status.add_argument("--top", type=int, default=10, help="how many tools to list (default 10)")


def status_main(args: argparse.Namespace) -> int:
    """Run `mcpmux status`: 0 after printing the tables, 1 with one line on stderr when it can't."""
    try:
        scrape = Scrape.parse(fetch_metrics(args.url, args.token_env))
    except StatusError as err:
        sys.stderr.write(f"mcpmux status: {err}\n")
        return 1
    render(scrape, Console(), top=args.top)
    return 0


class StatusError(Exception):
    """The metrics could not be fetched; the message says where and what to do."""


def metrics_url(url: str) -> str:
    """`/metrics` on the server `url` names, whatever path it carries (e.g. the `/mcp` endpoint)."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    return urlunsplit((parts.scheme, parts.netloc, "/metrics", "", ""))


def fetch_metrics(url: str, token_env: str | None = None, timeout: float = 10.0) -> str:
    """The Prometheus text of the server at `url`; raises `StatusError` with one readable line."""
    target = metrics_url(url)
    headers = {}
    if token_env:
        token = os.environ.get(token_env)
        if not token:
            raise StatusError(f"--token-env {token_env}: that environment variable is not set or empty")
        headers["Authorization"] = f"Bearer {token}"
    try:
        response = httpx2.get(target, headers=headers, timeout=timeout)
    except httpx2.HTTPError as err:
        raise StatusError(
            f"no mcpmux server answered at {target} ({type(err).__name__}); "
            "is `mcpmux serve --transport http` running there? pass its address with --url"
        ) from None
    if response.status_code in (401, 403):
        raise StatusError(
            f"{target} refused the request ({response.status_code}); pass the server's token with --token-env NAME"
        )
    if response.status_code != 200:
        raise StatusError(f"{target} answered HTTP {response.status_code}; is that an mcpmux server?")
    return response.text


@dataclass(slots=True)
class Scrape:
    """Samples by sample name (`mcpmux_tool_calls_total`, `..._bucket`), each with its labels."""

    samples: dict[str, list[tuple[Labels, float]]] = field(default_factory=lambda: defaultdict(list))

    @classmethod
    def parse(cls, text: str) -> Scrape:
        """Parse Prometheus text; raises `StatusError` when it is not."""
        scrape = cls()
        try:
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    scrape.samples[sample.name].append((dict(sample.labels), float(sample.value)))
        except ValueError as err:
            raise StatusError(f"the server's /metrics is not Prometheus text ({err})") from None
        return scrape

    def total(self, name: str, **match: str) -> float:
        """The sum of `name`'s samples whose labels include `match`."""
        return sum(value for labels, value in self.samples.get(name, []) if _matches(labels, match))

    def values(self, name: str, key: str, **match: str) -> dict[str, float]:
        """`name`'s samples summed by the value of label `key`."""
        result: dict[str, float] = defaultdict(float)
        for labels, value in self.samples.get(name, []):
            if key in labels and _matches(labels, match):
                result[labels[key]] += value
        return result

    def quantile(self, histogram: str, q: float, **match: str) -> float | None:
        """The q-quantile of `histogram` over its matching series, interpolated in its bucket; None if empty."""
        cumulative: dict[float, float] = defaultdict(float)
        for labels, value in self.samples.get(f"{histogram}_bucket", []):
            if _matches(labels, match):
                cumulative[float(labels["le"])] += value
        return bucket_quantile(sorted(cumulative.items()), q)


def _matches(labels: Labels, match: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in match.items())


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return (
        f"{seconds * 1e3:.2f} ms"
        if seconds < 0.01
        else f"{seconds * 1e3:.0f} ms"
        if seconds < 1
        else f"{seconds:.2f} s"
    )


def _count(value: float) -> str:
    return f"{int(value)}" if value == int(value) else f"{value:.2f}"


def _table(title: str, columns: Iterable[str], names: int = 1) -> Table:
    """A table whose first `names` columns are left-aligned names and the rest right-aligned figures.

    Light borders, and names never wrapped or cut: at 80 columns the figures' headers wrap instead
    (a box-drawn table there cut "everything" to "ever…")."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for index, column in enumerate(columns):
        is_name = index < names
        table.add_column(column, justify="left" if is_name else "right", no_wrap=is_name)
    return table


CALLS = "mcpmux_tool_calls_total"
LATENCY = "mcpmux_tool_call_duration_seconds"
AUTH = "mcpmux_upstream_auth"


def render(scrape: Scrape, console: Console, top: int = 10) -> None:
    """Print the tables; sections with nothing to show are left out."""
    states = {
        labels["upstream"]: labels["state"]
        for labels, value in scrape.samples.get("mcpmux_upstream_state", [])
        if value
    }
    auths = {labels["upstream"]: labels["auth"] for labels, value in scrape.samples.get(AUTH, []) if value}
    tables = [
        _upstreams(scrape, states, auths),
        _tools(scrape, top),
        _scheduling(scrape, sorted(states)),
        _caches(scrape),
        _backends(scrape),
        _engine(scrape),
    ]
    shown = [table for table in tables if table.row_count]
    for table in shown:
        console.print(table)
    if not shown:
        console.print("The server reports no upstreams, caches or inference engines.")


def _upstreams(scrape: Scrape, states: dict[str, str], auths: dict[str, str]) -> Table:
    columns = ["upstream", "state", "auth", "tools", "calls", "errors", "p50", "p99", "restarts"]
    table = _table("Upstreams", columns, names=2)
    for name in sorted(states):
        total = scrape.total(CALLS, upstream=name)
        table.add_row(
            name,
            states[name],
            auths.get(name, "-"),  # a server older than the metric
            _count(scrape.total("mcpmux_upstream_tools", upstream=name)),
            _count(total),
            _count(total - scrape.total(CALLS, upstream=name, outcome="ok")),
            _duration(scrape.quantile(LATENCY, 0.5, upstream=name)),
            _duration(scrape.quantile(LATENCY, 0.99, upstream=name)),
            _count(scrape.total("mcpmux_upstream_restarts_total", upstream=name)),
        )
    return table


def _tools(scrape: Scrape, top: int) -> Table:
    table = _table(f"Top tools (by calls, {top} at most)", ["upstream", "tool", "calls", "errors", "p50", "p99"], 2)
    per_tool: dict[tuple[str, str], float] = defaultdict(float)
    for labels, value in scrape.samples.get(CALLS, []):
        per_tool[(labels["upstream"], labels["tool"])] += value
    for (upstream, tool), total in sorted(per_tool.items(), key=lambda item: -item[1])[:top]:
        errors = total - scrape.total(CALLS, upstream=upstream, tool=tool, outcome="ok")
        p50 = scrape.quantile(LATENCY, 0.5, upstream=upstream, tool=tool)
        p99 = scrape.quantile(LATENCY, 0.99, upstream=upstream, tool=tool)
        table.add_row(upstream, tool, _count(total), _count(errors), _duration(p50), _duration(p99))
    return table


def _scheduling(scrape: Scrape, upstreams: list[str]) -> Table:
    columns = ["upstream", "in flight", "queued", "coalesced", "batches", "items/batch", "rejected"]
    table = _table("Scheduling", columns)
    for name in upstreams:
        batches = scrape.total("mcpmux_batches_total", upstream=name)
        items = scrape.total("mcpmux_batch_items_total", upstream=name)
        queued = scrape.total("mcpmux_upstream_queue_depth", upstream=name)
        queued += scrape.total("mcpmux_batch_queue_depth", upstream=name)
        reasons = scrape.values("mcpmux_rejections_total", "reason", upstream=name)
        table.add_row(
            name,
            _count(scrape.total("mcpmux_upstream_in_flight", upstream=name)),
            _count(queued),
            _count(scrape.total("mcpmux_coalesced_calls_total", upstream=name)),
            _count(batches),
            f"{items / batches:.1f}" if batches else "-",
            ", ".join(f"{reason} {_count(n)}" for reason, n in sorted(reasons.items()) if n) or "0",
        )
    return table


def _caches(scrape: Scrape) -> Table:
    table = _table("Caches", ["cache", "hits", "misses", "hit rate", "entries"])
    for cache in sorted(scrape.values("mcpmux_cache_entries", "cache")):
        hits = scrape.total("mcpmux_cache_hits_total", cache=cache)
        misses = scrape.total("mcpmux_cache_misses_total", cache=cache)
        rate = f"{hits / (hits + misses):.0%}" if hits + misses else "-"
        entries = scrape.total("mcpmux_cache_entries", cache=cache)
        table.add_row(cache, _count(hits), _count(misses), rate, _count(entries))
    return table


def _backends(scrape: Scrape) -> Table:
    columns = [
        "backend",
        "kind",
        "state",
        "in flight",
        "requests",
        "failed",
        "busy",
        "refused",
        "json_schema",
        "priority",
    ]
    table = _table("Inference backends", columns, names=3)
    backends = [labels for labels, _ in scrape.samples.get("mcpmux_inference_backend_info", [])]
    if [labels["kind"] for labels in backends] == ["local"]:
        return table  # the embedded engine alone: its own table says it all
    for labels in backends:
        name = labels["backend"]
        up = scrape.total("mcpmux_inference_backend_up", backend=name)
        failures = "mcpmux_inference_backend_failures_total"
        table.add_row(
            name,
            labels["kind"] + (", fallback" if labels["fallback"] == "yes" else ""),
            "up" if up else "down",
            _count(scrape.total("mcpmux_inference_backend_in_flight", backend=name)),
            _count(scrape.total("mcpmux_inference_backend_requests_total", backend=name)),
            _count(scrape.total(failures, backend=name, reason="failed")),
            _count(scrape.total(failures, backend=name, reason="busy")),
            _count(scrape.total(failures, backend=name, reason="refused")),
            "-" if labels["kind"] == "local" else labels["json_schema"],
            "-" if labels["kind"] == "local" else labels["priority"],
        )
    return table


def _engine(scrape: Scrape) -> Table:
    engine = _table(
        "Inference engine",
        ["model", "running", "waiting", "KV used", "prefix hits", "tok/s", "tokens", "TTFT p50", "TPOT p50"],
    )
    for model in sorted(scrape.values("mcpmux_engine_requests_running", "model")):
        engine.add_row(
            model,
            _count(scrape.total("mcpmux_engine_requests_running", model=model)),
            _count(scrape.total("mcpmux_engine_requests_waiting", model=model)),
            f"{scrape.total('mcpmux_engine_kv_cache_usage_ratio', model=model):.0%}",
            f"{scrape.total('mcpmux_engine_prefix_cache_hit_ratio', model=model):.0%}",
            f"{scrape.total('mcpmux_engine_generation_tokens_per_second', model=model):.1f}",
            _count(scrape.total("mcpmux_engine_generation_tokens_total", model=model)),
            _duration(scrape.quantile("mcpmux_engine_time_to_first_token_seconds", 0.5, model=model)),
            _duration(scrape.quantile("mcpmux_engine_time_per_output_token_seconds", 0.5, model=model)),
        )
    return engine
