"""When to send a batch: the fixed (Triton) and adaptive (learnt cost) rules, as pure functions.

`decide_fixed` and `decide_adaptive` look at the queue (`n` items, the oldest has waited
`oldest_wait` seconds) at a moment when a batch slot is free, and return how many items to send
now (0 = keep waiting) and when to look again if nothing arrives.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from mcpmux.batching.policy import BatchPolicy


class FlushDecision(NamedTuple):
    """`take` items now (0 = wait); if waiting, look again after `recheck_in` seconds at the latest."""

    take: int
    recheck_in: float | None = None


@dataclass(slots=True)
class CostModel:
    """Batch cost ``a*n + b`` seconds, refit by least squares over the last `window` batches.

    Until two different batch sizes have been seen the slope cannot be told apart from the fixed
    part, so the whole mean cost counts as fixed (`a = 0`): that errs towards batching, which in
    turn produces the differing sizes the fit needs. Both coefficients are kept non-negative.
    """

    window: int = 50
    a: float = 0.0
    b: float = 0.0
    samples: deque[tuple[int, float]] = field(default_factory=deque)

    @property
    def fitted(self) -> bool:
        """True once at least one batch has been observed."""
        return bool(self.samples)

    def observe(self, size: int, seconds: float) -> None:
        """Record one batch of `size` items that took `seconds`, and refit."""
        self.samples.append((size, seconds))
        while len(self.samples) > self.window:
            self.samples.popleft()
        self._fit()

    def predict(self, size: int) -> float:
        """Predicted seconds for a batch of `size` items."""
        return self.a * size + self.b

    def _fit(self) -> None:
        count = len(self.samples)
        mean_n = sum(n for n, _ in self.samples) / count
        mean_t = sum(t for _, t in self.samples) / count
        var_n = sum((n - mean_n) ** 2 for n, _ in self.samples)
        if var_n == 0:
            self.a, self.b = 0.0, mean_t
            return
        cov = sum((n - mean_n) * (t - mean_t) for n, t in self.samples)
        a = cov / var_n
        b = mean_t - a * mean_n
        if a < 0:
            a, b = 0.0, mean_t
        elif b < 0:
            # Refit through the origin: all of the cost is per item.
            a, b = sum(n * t for n, t in self.samples) / sum(n * n for n, _ in self.samples), 0.0
        self.a, self.b = a, b


@dataclass(slots=True)
class RecentArrivals:
    """Arrival times within the last `horizon` seconds (the adaptive rule sets it to the fixed cost `b`)."""

    horizon: float = 0.0
    times: deque[float] = field(default_factory=deque)

    def record(self, now: float) -> None:
        """Count one arrival at `now`."""
        self.times.append(now)
        self._expire(now)

    def count(self, now: float) -> int:
        """Arrivals during the last `horizon` seconds."""
        self._expire(now)
        return len(self.times)

    def changes_in(self, now: float) -> float | None:
        """Seconds until the oldest counted arrival leaves the window (the count drops then)."""
        self._expire(now)
        return self.times[0] + self.horizon - now if self.times else None

    def _expire(self, now: float) -> None:
        # The same sum as `changes_in`, so an arrival still counted always leaves the window strictly
        # later than `now` (``t <= now - horizon`` can disagree with it in the last bit, and a wait of
        # 0 s until the count drops would then spin).
        while self.times and self.times[0] + self.horizon <= now:
            self.times.popleft()


def decide_fixed(n: int, oldest_wait: float, policy: BatchPolicy) -> FlushDecision:
    """Triton's rule: a full batch, else the largest reachable preferred size, else wait out max_delay."""
    if n >= policy.max_batch_size:
        return FlushDecision(policy.max_batch_size)
    reachable = [size for size in policy.preferred_sizes if size <= n]
    if reachable:
        return FlushDecision(max(reachable))
    if oldest_wait >= policy.max_delay:
        return FlushDecision(n)
    return FlushDecision(0, policy.max_delay - oldest_wait)


def decide_adaptive(
    n: int,
    oldest_wait: float,
    policy: BatchPolicy,
    cost: CostModel,
    recent: RecentArrivals,
    now: float,
    free_slots: int = 1,
) -> FlushDecision:
    """Spread work over free batch slots; on the last free slot, wait only while waiting pays.

    Waiting saves upstream time (arrivals share one fixed cost `b`), which is worth something
    only when upstream time is scarce: while more than one batch slot is free, the waiting items
    go at once, split evenly over the free slots (with ``a > 0`` smaller batches finish sooner,
    and an idle slot adds nothing). On the last free slot: over a short wait `dt` at arrival rate
    `r`, the `n` queued items each lose `dt` (cost ``n*dt``), while the ``r*dt`` items expected
    to arrive join this batch instead of paying a fixed cost `b` of their own (gain ``r*dt*b``).
    So waiting pays while ``n < r*b``; ``r*b`` is measured as the number of arrivals during the
    last `b` seconds (`recent`, whose horizon the batcher keeps equal to `b`). Waiting never goes
    past `max_delay` for the oldest item, nor past the point where its wait plus the predicted
    batch cost would exceed `max_latency`. Before any batch is observed there is no `b` to save,
    so the first batch goes at once.
    """
    share = min(policy.max_batch_size, -(-n // max(1, free_slots)))
    if share < n and free_slots > 1:
        return FlushDecision(share)
    if n >= policy.max_batch_size:
        return FlushDecision(policy.max_batch_size)
    if not cost.fitted or free_slots > 1 or oldest_wait >= policy.max_delay:
        return FlushDecision(n)
    latency_left = policy.max_latency - oldest_wait - cost.predict(n + 1)
    if latency_left <= 0 or n >= recent.count(now):
        return FlushDecision(n)
    recheck = min(policy.max_delay - oldest_wait, latency_left)
    drops_in = recent.changes_in(now)
    if drops_in is not None:
        recheck = min(recheck, drops_in)
    return FlushDecision(0, recheck)
