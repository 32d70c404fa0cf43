"""Policies: frozen, validated dataclasses with documented defaults.

Priority convention: an ``int``, **higher is more urgent**, default 0. Negative values are fine.

Aging (`QueuePolicy.aging_interval = I` seconds): an item's effective priority is
``priority + waited / I``, uncapped. Items are served in order of effective priority, ties by
arrival. Because every waiting item gains priority at the same rate, that order never changes
while items wait: it equals ordering by the *virtual arrival time* ``enqueued_at - priority * I``.
The bound it gives: an item of priority ``p`` is overtaken only by items of priority ``P > p``
that arrived less than ``(P - p) * I`` seconds after it. So however steady a stream of
higher-priority items is, an item waits at most ``(P - p) * I`` plus the time to serve what was
already queued before that point. ``aging_interval=None`` gives strict priority (which can starve).

All times are seconds; deadlines are absolute times on anyio's clock (`anyio.current_time()`),
which is the running event loop's clock; `deadline_in` makes one from a relative timeout. It is
the only clock the queue, gate and batcher read (and they wait only through anyio), so running
them on a virtual-time event loop puts every deadline, delay and rate on virtual time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import anyio


def deadline_in(seconds: float) -> float:
    """The absolute deadline (anyio clock) that lies `seconds` from now."""
    return anyio.current_time() + seconds


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """How a waiting line behaves: bound, action when full, default deadline and aging."""

    max_queue: int = 1024
    """Most items waiting at once (not counting those already dispatched)."""
    on_full: Literal["reject", "delay"] = "reject"
    """`reject`: raise `QueueFullError` at once; `delay`: the submitter waits for room until its deadline."""
    default_timeout: float | None = None
    """Deadline, in seconds after submission, for items submitted without one; None = no deadline."""
    aging_interval: float | None = 1.0
    """Seconds of waiting worth one priority level (see module docstring); None = strict priority."""

    def __post_init__(self) -> None:
        _require(self.max_queue >= 1, f"max_queue must be at least 1, got {self.max_queue}")
        _require(self.on_full in ("reject", "delay"), f"on_full must be 'reject' or 'delay', got {self.on_full!r}")
        _require(
            self.default_timeout is None or self.default_timeout > 0,
            f"default_timeout must be positive seconds or None, got {self.default_timeout}",
        )
        _require(
            self.aging_interval is None or (self.aging_interval > 0 and math.isfinite(self.aging_interval)),
            f"aging_interval must be positive finite seconds or None, got {self.aging_interval}",
        )

    def resolve_deadline(self, deadline: float | None, now: float) -> float | None:
        """The item's own deadline if given, else `now + default_timeout`, else None."""
        if deadline is not None or self.default_timeout is None:
            return deadline
        return now + self.default_timeout


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """When a `DynamicBatcher` sends a batch, how big, and how many run at once.

    `fixed` mode (NVIDIA Triton's rule): when a batch slot is free, send `max_batch_size` items if
    that many wait; else the largest of `preferred_sizes` that the waiting items reach; else wait
    until the oldest item has waited `max_delay`, then send all (up to `max_batch_size`).

    `adaptive` mode: batch cost is learnt online as ``a*n + b`` (see `CostModel`); while a slot is
    free it keeps waiting only while waiting pays: ``n < rate * b`` (the items expected to arrive
    during one fixed cost `b` outnumber the `n` items a short wait delays), and never past
    `max_delay` for the oldest item, nor past the point where its wait plus the predicted batch cost
    would exceed `max_latency`.
    """

    max_batch_size: int = 32
    max_delay: float = 0.005
    """Longest the oldest waiting item is held back to let a batch grow (seconds)."""
    preferred_sizes: tuple[int, ...] = ()
    mode: Literal["fixed", "adaptive"] = "fixed"
    max_latency: float = 1.0
    """Adaptive only: never wait so long that wait + predicted batch cost exceeds this (seconds)."""
    max_concurrent_batches: int = 1
    cost_window: int = 50
    """Adaptive only: the cost model is refit over this many most recent batches."""
    queue: QueuePolicy = field(default_factory=QueuePolicy)

    def __post_init__(self) -> None:
        _require(self.max_batch_size >= 1, f"max_batch_size must be at least 1, got {self.max_batch_size}")
        _require(self.max_delay >= 0, f"max_delay must be >= 0 seconds, got {self.max_delay}")
        _require(self.mode in ("fixed", "adaptive"), f"mode must be 'fixed' or 'adaptive', got {self.mode!r}")
        _require(self.max_latency > 0, f"max_latency must be positive seconds, got {self.max_latency}")
        _require(
            self.max_concurrent_batches >= 1,
            f"max_concurrent_batches must be at least 1, got {self.max_concurrent_batches}",
        )
        _require(self.cost_window >= 2, f"cost_window must be at least 2 batches, got {self.cost_window}")
        bad = [s for s in self.preferred_sizes if not 1 <= s <= self.max_batch_size]
        _require(
            not bad,
            f"preferred_sizes {bad} fall outside 1..max_batch_size ({self.max_batch_size}); "
            "drop them or raise max_batch_size",
        )


@dataclass(frozen=True, slots=True)
class GatePolicy:
    """Admission to a shared resource: concurrency cap plus token-bucket rate limit."""

    max_concurrency: int | None = 8
    """Most holders of a slot at once; None = unlimited."""
    rate: float | None = None
    """Admissions per second, refilled continuously; None = no rate limit."""
    burst: int = 1
    """Token bucket capacity: admissions allowed back to back after an idle period."""
    queue: QueuePolicy = field(default_factory=QueuePolicy)

    def __post_init__(self) -> None:
        _require(
            self.max_concurrency is None or self.max_concurrency >= 1,
            f"max_concurrency must be at least 1 or None, got {self.max_concurrency}",
        )
        _require(
            self.rate is None or (self.rate > 0 and math.isfinite(self.rate)),
            f"rate must be positive finite calls/second or None, got {self.rate}",
        )
        _require(self.burst >= 1, f"burst must be at least 1, got {self.burst}")
