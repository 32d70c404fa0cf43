"""Engine counters and latency histograms, and the snapshot `Engine.stats()` returns."""

from __future__ import annotations

from dataclasses import dataclass, field

# Seconds; covers sub-millisecond decode steps up to minutes-long queues.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)  # fmt: skip


@dataclass(slots=True)
class Histogram:
    """Counts per bucket (`counts[i]`: values <= `bounds[i]`; the last count is the overflow)."""

    bounds: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    count: int = 0
    total: float = 0.0

    def observe(self, value: float) -> None:
        i = next((i for i, b in enumerate(self.bounds) if value <= b), len(self.bounds))
        self.counts[i] += 1
        self.count += 1
        self.total += value

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def quantile(self, q: float) -> float:
        """Upper bound of the bucket holding the q-quantile (inf when it is the overflow)."""
        if not self.count:
            return 0.0
        rank, seen = q * self.count, 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= rank and c:
                return self.bounds[i] if i < len(self.bounds) else float("inf")
        return float("inf")

    def copy(self) -> Histogram:
        return Histogram(self.bounds, list(self.counts), self.count, self.total)


@dataclass(slots=True)
class EngineStats:
    """A point-in-time view of the engine.

    `generation_tokens_per_s` is output tokens over the time spent in steps (busy throughput).
    `prefix_hit_rate` is cached prompt tokens over prompt tokens, for admitted requests.
    `ttft` is arrival to first output token; `tpot` is the mean gap between a request's later tokens.
    """

    running: int = 0
    waiting: int = 0
    num_blocks: int = 0
    kv_usage: float = 0.0
    prefix_hit_rate: float = 0.0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    generated_tokens: int = 0
    steps: int = 0
    mean_seqs_per_step: float = 0.0
    mean_tokens_per_step: float = 0.0
    generation_tokens_per_s: float = 0.0
    num_preemptions: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0
    requests_rejected: int = 0
    ttft: Histogram = field(default_factory=Histogram)
    tpot: Histogram = field(default_factory=Histogram)


@dataclass(slots=True)
class StatsCollector:
    """Accumulates what the engine core observes; `snapshot` fills in the live queue figures."""

    steps: int = 0
    busy_seconds: float = 0.0
    scheduled_seqs: int = 0
    batched_tokens: int = 0
    generated_tokens: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0
    requests_rejected: int = 0
    ttft: Histogram = field(default_factory=Histogram)
    tpot: Histogram = field(default_factory=Histogram)

    def on_step(self, num_seqs: int, num_tokens: int, num_generated: int, seconds: float) -> None:
        self.steps += 1
        self.scheduled_seqs += num_seqs
        self.batched_tokens += num_tokens
        self.generated_tokens += num_generated
        self.busy_seconds += seconds

    def on_first_token(self, delay: float) -> None:
        self.ttft.observe(delay)

    def on_finish(self, reason: str, decode_seconds: float, num_output_tokens: int) -> None:
        """A request ended: count it and record its time per output token after the first."""
        if reason == "abort":
            self.requests_aborted += 1
        else:
            self.requests_finished += 1
        if num_output_tokens > 1:
            self.tpot.observe(decode_seconds / (num_output_tokens - 1))

    def snapshot(self, into: EngineStats) -> EngineStats:
        into.steps = self.steps
        into.generated_tokens = self.generated_tokens
        into.mean_seqs_per_step = self.scheduled_seqs / self.steps if self.steps else 0.0
        into.mean_tokens_per_step = self.batched_tokens / self.steps if self.steps else 0.0
        into.generation_tokens_per_s = self.generated_tokens / self.busy_seconds if self.busy_seconds else 0.0
        into.requests_finished = self.requests_finished
        into.requests_aborted = self.requests_aborted
        into.requests_rejected = self.requests_rejected
        into.ttft = self.ttft.copy()
        into.tpot = self.tpot.copy()
        return into
