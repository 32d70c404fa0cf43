"""Prometheus metrics for one `Mux` (and for a bare inference service), served at `/metrics`.

Only tool calls are counted on the hot path (`MuxMetrics.observe_call`: a dict lookup, two integer
increments and a bisect, well under a microsecond). Everything else is read at scrape time from the
stats the parts already keep: upstream state and restarts from `Upstream.status()`, in-flight and
queue depth from each dispatcher's `AdmissionGate`, batch sizes and rejections from the gate and the
`DynamicBatcher`s, coalesced calls from `SingleFlight`, hits and misses from the `ResultCache`s, and
the engine figures from `InferenceService.stats()`. The collectors look up `mux.upstreams`,
`mux.dispatchers` and `mux.inference` on every scrape, so upstreams added or removed at runtime show
up (or drop out) without re-registering anything.

Each `MuxMetrics` has its own `CollectorRegistry`: several Muxes can live in one process.
Labels are upstream and tool names (bounded by the upstreams' listings) and fixed words; never
arguments or client ids.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol, cast

import anyio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from mcpmux.batching import AdmissionGate, DynamicBatcher, RejectedError, ResultCache, SingleFlight
from mcpmux.errors import InputRequired, UpstreamTimeoutError, UpstreamUnavailableError

if TYPE_CHECKING:
    from mcpmux.inference.serving.service import InferenceService

# Seconds: a cache hit (tens of µs) up to a five-minute tool call.
CALL_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip
BATCH_SIZE_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
OUTCOMES = ("ok", "error", "rejected", "unavailable", "timeout", "cancelled", "input_required")
"""The `outcome` label of `mcpmux_tool_calls_total`; `observe_call` takes one of these."""

CallObserver = Callable[[str, str, float, str], None]


def outcome_of(err: BaseException) -> str:
    """The `outcome` label for a call that raised `err`."""
    if isinstance(err, RejectedError):
        return "rejected"
    if isinstance(err, UpstreamUnavailableError):
        return "unavailable"
    if isinstance(err, UpstreamTimeoutError):
        return "timeout"
    if isinstance(err, anyio.get_cancelled_exc_class()):
        return "cancelled"
    if isinstance(err, InputRequired):
        return "input_required"
    return "error"


class _Status(Protocol):
    """An upstream's status, as the collectors read it (`UpstreamStatus`)."""

    @property
    def name(self) -> str: ...
    @property
    def state(self) -> Enum: ...
    @property
    def restarts(self) -> int: ...
    @property
    def tools(self) -> int: ...
    @property
    def auth(self) -> str: ...
    @property
    def client_sessions(self) -> int: ...


class _Executor(Protocol):
    """An upstream's executor, as the collectors read it (`UpstreamDispatcher`)."""

    @property
    def gate(self) -> AdmissionGate: ...
    @property
    def flights(self) -> SingleFlight[Any, Any]: ...
    @property
    def batchers(self) -> Mapping[str, DynamicBatcher[Any, Any]]: ...


class Observed(Protocol):
    """What the collectors read of a `Mux` at each scrape."""

    @property
    def cache(self) -> ResultCache[Any]: ...
    @property
    def resource_cache(self) -> ResultCache[Any]: ...
    @property
    def dispatchers(self) -> Mapping[str, _Executor]: ...
    @property
    def inference(self) -> InferenceService | None: ...
    @property
    def to_sdk(self) -> Mapping[str, int]: ...
    def status(self) -> Sequence[_Status]: ...


@dataclass(slots=True)
class CallStats:
    """One tool's calls so far: how many ended each way, and their latencies in `CALL_BUCKETS`."""

    outcomes: dict[str, int] = field(default_factory=dict)
    buckets: list[int] = field(default_factory=lambda: [0] * (len(CALL_BUCKETS) + 1))  # per bucket, last = +Inf
    seconds: float = 0.0

    def quantile(self, q: float) -> float | None:
        """The q-quantile of the latencies, in seconds (as Prometheus' `histogram_quantile`); None if none."""
        cumulative, pairs = 0, []
        for bound, count in zip([*CALL_BUCKETS, float("inf")], self.buckets, strict=True):
            cumulative += count
            pairs.append((bound, float(cumulative)))
        return bucket_quantile(pairs, q)


def bucket_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Like Prometheus' histogram_quantile over (upper bound, cumulative count) pairs sorted by bound."""
    if not buckets or buckets[-1][1] == 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower  # in the overflow bucket: the highest finite bound is all that is known
            return lower + (bound - lower) * ((rank - below) / (count - below) if count > below else 1.0)
        lower, below = bound, count
    return lower


class MuxMetrics:
    """The metrics of one Mux: `observe_call` on the hot path, everything else collected at scrape time."""

    def __init__(self, mux: Observed) -> None:
        self.registry = CollectorRegistry()
        self._calls: dict[tuple[str, str], CallStats] = {}
        self.registry.register(_MuxCollector(mux, self._calls))
        self.registry.register(EngineCollector(lambda: mux.inference))

    def observe_call(self, upstream: str, tool: str, seconds: float, outcome: str) -> None:
        """Count one finished call of `tool` (its upstream name) on `upstream` and its latency.

        `outcome` is one of `OUTCOMES`: "ok", "error" (isError result or JSON-RPC error), "rejected"
        (a queue or rate limit refused it), "unavailable", "timeout", "cancelled", "input_required" (the
        upstream's round went to the client, whose retry is a call of its own).
        """
        stats = self._calls.get((upstream, tool))
        if stats is None:
            stats = self._calls[(upstream, tool)] = CallStats()
        stats.outcomes[outcome] = stats.outcomes.get(outcome, 0) + 1
        stats.buckets[bisect_left(CALL_BUCKETS, seconds)] += 1
        stats.seconds += seconds

    def calls(self) -> dict[tuple[str, str], CallStats]:
        """Every tool's `CallStats` by (upstream, tool), as counted so far (the live objects: read, don't keep)."""
        return dict(self._calls)


def _backend_metrics(stats: dict[str, Any]) -> Iterator[Metric]:
    """Each inference backend's state and counts (`InferenceService.stats()["backends"]`)."""
    backends: dict[str, dict[str, Any]] = stats.get("backends", {})
    info = GaugeMetricFamily(
        "mcpmux_inference_backend_info",
        "1 per inference backend: its kind, server, and what it was found to accept (json_schema, priority).",
        labels=["backend", "kind", "base_url", "json_schema", "priority", "fallback"],
    )
    up = GaugeMetricFamily("mcpmux_inference_backend_up", "1 while the backend is in, 0 while out.", labels=["backend"])
    in_flight = GaugeMetricFamily(
        "mcpmux_inference_backend_in_flight", "Requests on the backend now.", labels=["backend"]
    )
    requests = CounterMetricFamily(
        "mcpmux_inference_backend_requests", "Requests routed to the backend.", labels=["backend"]
    )
    failures = CounterMetricFamily(
        "mcpmux_inference_backend_failures",
        "Requests the backend failed: failed (down, timeout, 5xx), busy (429, queue full), refused (a bad request).",
        labels=["backend", "reason"],
    )
    known = {True: "yes", False: "no", None: "unknown"}
    for name, figures in backends.items():
        info.add_metric(
            [name, figures["kind"], figures.get("base_url", ""), known[figures.get("json_schema")],
             known[figures.get("priority")], known[figures["fallback"]]],
            1,
        )  # fmt: skip
        up.add_metric([name], 1.0 if figures["state"] == "up" else 0.0)
        in_flight.add_metric([name], figures["in_flight"])
        requests.add_metric([name], figures["requests"])
        for reason, key in (("failed", "failed"), ("busy", "busy"), ("refused", "errors")):
            failures.add_metric([name, reason], figures[key])
    if not backends:
        return
    yield from (info, up, in_flight, requests, failures)
    yield CounterMetricFamily(
        "mcpmux_inference_shared_requests",
        "Greedy requests that read an identical request's generation.",
        value=stats.get("shared", 0),
    )
    yield CounterMetricFamily(
        "mcpmux_inference_moved_requests",
        "Requests that went on to another backend after one failed them.",
        value=stats.get("moved", 0),
    )


def engine_registry(service: InferenceService) -> CollectorRegistry:
    """A registry with only the engine metrics, for `mcpmux serve --openai-only`."""
    registry = CollectorRegistry()
    registry.register(EngineCollector(lambda: service))
    return registry


def metrics_route(registry: CollectorRegistry) -> Route:
    """`GET /metrics` serving `registry` as Prometheus text."""

    async def metrics(request: Request) -> Response:
        # Rendered on the event loop, where the counters are written: no lock, no torn reads.
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_PLAIN_0_0_4)

    return Route("/metrics", metrics, methods=["GET"])


def _histogram(
    name: str, doc: str, labels: list[str], rows: Iterable[tuple[list[str], Iterable[float], list[int], float]]
) -> HistogramMetricFamily:
    """A histogram family from per-bucket (not cumulative) counts whose last entry is the overflow."""
    family = HistogramMetricFamily(name, doc, labels=labels)
    for values, bounds, counts, total in rows:
        cumulative, buckets = 0, []
        for bound, count in zip([*bounds, float("inf")], counts, strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))
        family.add_metric(values, buckets, total)
    return family


class _MuxCollector:
    """Upstream, dispatch, batching and cache figures, read from the Mux's parts on each scrape."""

    def __init__(self, mux: Observed, calls: dict[tuple[str, str], CallStats]) -> None:
        self._mux = mux
        self._calls = calls

    def collect(self) -> Iterator[Metric]:
        yield from self._tool_calls()
        yield self._sdk_path()
        yield from self._upstreams()
        yield from self._dispatchers()
        yield from self._caches()

    def _tool_calls(self) -> Iterator[Metric]:
        calls = CounterMetricFamily(
            "mcpmux_tool_calls",
            "Tool calls answered, by upstream, tool and outcome.",
            labels=["upstream", "tool", "outcome"],
        )
        rows = sorted(self._calls.items())
        for (upstream, tool), stats in rows:
            for outcome, count in sorted(stats.outcomes.items()):
                calls.add_metric([upstream, tool, outcome], count)
        yield calls
        yield _histogram(
            "mcpmux_tool_call_duration_seconds",
            "Time from a call reaching its upstream's dispatcher to its answer (cache hits included).",
            ["upstream", "tool"],
            (([upstream, tool], CALL_BUCKETS, stats.buckets, stats.seconds) for (upstream, tool), stats in rows),
        )

    def _sdk_path(self) -> Metric:
        family = CounterMetricFamily(
            "mcpmux_sdk_path_calls",
            "tools/call requests the fast path left to the SDK path, by reason.",
            labels=["reason"],
        )
        for reason, count in sorted(self._mux.to_sdk.items()):
            family.add_metric([reason], count)
        return family

    def _upstreams(self) -> Iterator[Metric]:
        state = GaugeMetricFamily(
            "mcpmux_upstream_state",
            "1 for the upstream's current connection state, 0 for the others.",
            labels=["upstream", "state"],
        )
        restarts = CounterMetricFamily(
            "mcpmux_upstream_restarts", "Reconnections after a lost connection.", labels=["upstream"]
        )
        tools = GaugeMetricFamily("mcpmux_upstream_tools", "Tools the upstream lists.", labels=["upstream"])
        auth = GaugeMetricFamily(
            "mcpmux_upstream_auth",
            "1 for how the upstream authenticates now: none, or OAuth and its login (e.g. 'oauth, needs login').",
            labels=["upstream", "auth"],
        )
        sessions = GaugeMetricFamily(
            "mcpmux_upstream_client_sessions",
            "Sessions of clients' own with the upstream, beside the shared one ([servers.X] sessions).",
            labels=["upstream"],
        )
        for status in self._mux.status():
            sessions.add_metric([status.name], status.client_sessions)
            for each in type(status.state):  # every state, 0 or 1, so a state left shows 0 rather than vanishing
                state.add_metric([status.name, each.value], 1 if each is status.state else 0)
            restarts.add_metric([status.name], status.restarts)
            tools.add_metric([status.name], status.tools)
            # Without its "(token expires in N min)": a label that changed every minute would be a new series.
            auth.add_metric([status.name, status.auth.split(" (", 1)[0]], 1)
        yield from (state, restarts, tools, auth, sessions)

    def _dispatchers(self) -> Iterator[Metric]:
        in_flight = GaugeMetricFamily(
            "mcpmux_upstream_in_flight", "Requests holding an upstream slot now.", labels=["upstream"]
        )
        queued = GaugeMetricFamily(
            "mcpmux_upstream_queue_depth", "Requests waiting for an upstream slot.", labels=["upstream"]
        )
        rejections = CounterMetricFamily(
            "mcpmux_rejections",
            "Calls refused by a limit, by stage and reason.",
            labels=["upstream", "stage", "reason"],
        )
        coalesced = CounterMetricFamily(
            "mcpmux_coalesced_calls", "Calls that joined an identical call already in flight.", labels=["upstream"]
        )
        coalesced_by_tool = CounterMetricFamily(
            "mcpmux_tool_coalesced_calls",
            "Calls that joined an identical call already in flight, by tool.",
            labels=["upstream", "tool"],
        )
        batches = CounterMetricFamily("mcpmux_batches", "List-form batch calls sent.", labels=["upstream", "tool"])
        items = CounterMetricFamily(
            "mcpmux_batch_items", "Calls merged into list-form batch calls.", labels=["upstream", "tool"]
        )
        batch_queue = GaugeMetricFamily(
            "mcpmux_batch_queue_depth", "Calls waiting for a list-form batch.", labels=["upstream", "tool"]
        )
        sizes: list[tuple[list[str], Iterable[float], list[int], float]] = []
        for name, dispatcher in list(self._mux.dispatchers.items()):
            gate = dispatcher.gate.stats()
            in_flight.add_metric([name], gate.active)
            queued.add_metric([name], gate.waiting)
            for reason, count in sorted(gate.rejections.items()):
                rejections.add_metric([name, "gate", reason], count)
            coalesced.add_metric([name], dispatcher.flights.stats().shared)
            for tool, count in sorted(dispatcher.flights.shared_by.items(), key=str):
                coalesced_by_tool.add_metric([name, str(tool)], count)
            for tool, batcher in dispatcher.batchers.items():
                stats = batcher.stats()
                batches.add_metric([name, tool], stats.batches)
                items.add_metric([name, tool], stats.items)
                batch_queue.add_metric([name, tool], stats.queue_depth)
                for reason, count in sorted(stats.rejections.items()):
                    rejections.add_metric([name, "batch", reason], count)
                counts = [0] * (len(BATCH_SIZE_BUCKETS) + 1)
                for size, count in stats.size_histogram.items():
                    counts[bisect_left(BATCH_SIZE_BUCKETS, size)] += count
                sizes.append(([name, tool], BATCH_SIZE_BUCKETS, counts, float(stats.items)))
        yield from (in_flight, queued, rejections, coalesced, coalesced_by_tool, batches, items, batch_queue)
        yield _histogram("mcpmux_batch_size", "Calls per list-form batch call.", ["upstream", "tool"], sizes)

    def _caches(self) -> Iterator[Metric]:
        hits = CounterMetricFamily("mcpmux_cache_hits", "Result cache hits.", labels=["cache"])
        misses = CounterMetricFamily("mcpmux_cache_misses", "Result cache misses.", labels=["cache"])
        evictions = CounterMetricFamily("mcpmux_cache_evictions", "Entries evicted to make room.", labels=["cache"])
        entries = GaugeMetricFamily("mcpmux_cache_entries", "Live entries.", labels=["cache"])
        for label, cache in (("tools", self._mux.cache), ("resources", self._mux.resource_cache)):
            stats = cache.stats()
            hits.add_metric([label], stats.hits)
            misses.add_metric([label], stats.misses)
            evictions.add_metric([label], stats.evictions)
            entries.add_metric([label], stats.entries)
        yield from (hits, misses, evictions, entries)
        by_tool = CounterMetricFamily(
            "mcpmux_tool_cache_hits", "Tool calls answered from the result cache, by tool.", labels=["upstream", "tool"]
        )
        for counted, count in sorted(self._mux.cache.hits_by.items(), key=str):
            upstream, tool = cast(tuple[str, str], counted)  # the tool cache's label (`Mux.cache`)
            by_tool.add_metric([upstream, tool], count)
        yield by_tool


class EngineCollector:
    """The inference engines' figures (`InferenceService.stats()`), per model, and each backend's state;
    nothing while inference is off."""

    def __init__(self, service: Callable[[], InferenceService | None]) -> None:
        self._service = service

    def collect(self) -> Iterator[Metric]:
        service = self._service()
        if service is None:
            return
        stats = service.stats()
        models: dict[str, dict[str, Any]] = stats.get("models", {})
        gauges = {
            "running": ("mcpmux_engine_requests_running", "Requests in the running batch."),
            "waiting": ("mcpmux_engine_requests_waiting", "Requests waiting to be scheduled."),
            "kv_usage": ("mcpmux_engine_kv_cache_usage_ratio", "Fraction of KV cache blocks in use."),
            "num_blocks": ("mcpmux_engine_kv_cache_blocks", "KV cache blocks in the pool."),
            "prefix_hit_rate": ("mcpmux_engine_prefix_cache_hit_ratio", "Cached prompt tokens over prompt tokens."),
            "generation_tokens_per_s": ("mcpmux_engine_generation_tokens_per_second", "Output tokens per busy second."),
        }
        counters = {
            "prompt_tokens": ("mcpmux_engine_prompt_tokens", "Prompt tokens of admitted requests."),
            "cached_prompt_tokens": (
                "mcpmux_engine_cached_prompt_tokens",
                "Prompt tokens served from the prefix cache.",
            ),
            "generated_tokens": ("mcpmux_engine_generation_tokens", "Output tokens generated."),
            "steps": ("mcpmux_engine_steps", "Engine steps run."),
            "num_preemptions": ("mcpmux_engine_preemptions", "Requests preempted to free KV cache."),
        }
        for key, (name, doc) in gauges.items():
            gauge = GaugeMetricFamily(name, doc, labels=["model"])
            for model, figures in models.items():
                gauge.add_metric([model], float(figures[key]))
            yield gauge
        for key, (name, doc) in counters.items():
            counter = CounterMetricFamily(name, doc, labels=["model"])
            for model, figures in models.items():
                counter.add_metric([model], float(figures[key]))
            yield counter
        requests = CounterMetricFamily(
            "mcpmux_engine_requests", "Requests ended, by outcome.", labels=["model", "outcome"]
        )
        for model, figures in models.items():
            for outcome in ("finished", "aborted", "rejected"):
                requests.add_metric([model, outcome], figures[f"requests_{outcome}"])
        yield requests
        for key, name, doc in (
            ("ttft", "mcpmux_engine_time_to_first_token_seconds", "Arrival to first output token."),
            ("tpot", "mcpmux_engine_time_per_output_token_seconds", "Mean gap between a request's later tokens."),
        ):
            rows = [([m], f[key]["bounds"], f[key]["counts"], f[key]["total"]) for m, f in models.items()]
            yield _histogram(name, doc, ["model"], rows)
        yield from _backend_metrics(stats)
