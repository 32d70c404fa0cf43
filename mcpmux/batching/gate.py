"""`AdmissionGate`: a concurrency cap plus a token-bucket rate limit, with a priority queue in front.

    async with gate.slot(priority=2, deadline=deadline_in(5.0)):
        await call_upstream()

Callers that cannot enter at once wait in an `AgingQueue` (priority, aging, bound, deadline) and
are admitted in its order. The gate runs no task of its own: whoever releases a slot or arrives
admits waiters, and the waiter at the head of the line sleeps until the next token is due when
the rate limit is what holds it back.

A caller with no task to wait in can take its place in the same line with `hold(on_admit)`: when
its turn comes, whoever released the slot calls `on_admit()` then and there. Should it need a task
after all, `wait_held` waits for that same place in line.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio

from mcpmux.batching.errors import DeadlineExceededError, RejectedError
from mcpmux.batching.policy import GatePolicy
from mcpmux.batching.queue import AgingQueue, QueueEntry
from mcpmux.batching.signal import Signal, wake_time


@dataclass(slots=True, eq=False)
class _Waiter:
    wake: Signal = field(default_factory=Signal)
    granted: bool = False
    on_admit: Callable[[], None] | None = None
    """Called instead of waking a task, for a waiter put in line by `hold`."""


Held = QueueEntry[_Waiter]
"""A place in the gate's line taken by `hold`."""


@dataclass(frozen=True, slots=True)
class GateStats:
    """A snapshot of a gate's state and counters."""

    name: str
    active: int
    waiting: int
    admitted: int
    tokens: float | None
    rejections: dict[str, int]


class AdmissionGate:
    """Admits at most `max_concurrency` holders and `rate` admissions per second (burst `burst`)."""

    def __init__(self, policy: GatePolicy | None = None, *, name: str = "gate") -> None:
        self.policy = policy if policy is not None else GatePolicy()
        self.name = name
        self._queue: AgingQueue[_Waiter] = AgingQueue(self.policy.queue, name)
        self._active = 0
        self._admitted = 0
        self._tokens = float(self.policy.burst)
        self._refilled_at: float | None = None
        self._rejections: Counter[str] = Counter()

    @asynccontextmanager
    async def slot(self, *, priority: int = 0, deadline: float | None = None) -> AsyncIterator[None]:
        """Hold one admission for the body of the `async with`; see `acquire` for the errors."""
        await self.acquire(priority=priority, deadline=deadline)
        try:
            yield
        finally:
            self.release()

    async def acquire(self, *, priority: int = 0, deadline: float | None = None) -> None:
        """Wait for admission; raises `QueueFullError` or `DeadlineExceededError` (both counted)."""
        asked_at = anyio.current_time()
        deadline = self.policy.queue.resolve_deadline(deadline, asked_at)
        if self.try_acquire(asked_at):
            return
        try:
            entry = await self._queue.put(_Waiter(), priority=priority, deadline=deadline)
        except RejectedError as exc:
            self._rejections[exc.reason] += 1
            raise
        await self._wait(entry, deadline, asked_at)

    def hold(self, on_admit: Callable[[], None], *, priority: int = 0, deadline: float | None = None) -> Held | None:
        """Take a place in line without a task: once it is admitted, `on_admit()` runs, called by whoever
        released the slot, and the caller then holds one admission (to `release` as after `acquire`).

        `on_admit` must not raise. None, with nothing queued, where only a task can wait: a rate limit
        (its next token needs a timer) or a full queue (whose refusal or delay `acquire` words). The
        deadline is not watched here: a place past it is skipped, never admitted, so the caller must
        act by then (`wait_held` raises the deadline's error) or `withdraw` it.
        """
        if self.policy.rate is not None or self._queue.closed or len(self._queue) >= self.policy.queue.max_queue:
            return None
        asked_at = anyio.current_time()
        deadline = self.policy.queue.resolve_deadline(deadline, asked_at)
        return self._queue.put_nowait(_Waiter(on_admit=on_admit), priority=priority, deadline=deadline)

    async def wait_held(self, held: Held) -> None:
        """Wait in a task for the admission of a place `hold` took, where it stands in line; raises as
        `acquire` does (its deadline measured from `hold`). Returns at once if it was admitted already."""
        waiter = held.value
        waiter.on_admit = None
        if waiter.granted:
            return
        await self._wait(held, held.deadline, held.enqueued_at)

    def withdraw(self, held: Held) -> None:
        """Give up a place `hold` took, not yet admitted (a no-op once it was skipped past its deadline)."""
        self._queue.remove(held)

    def try_acquire(self, now: float | None = None) -> bool:
        """Admit one at once when nobody is queued and the limits allow it; False (and nothing counted) otherwise."""
        if len(self._queue) != 0 and self._queue.peek() is not None:  # peek drops places past their deadline
            return False
        if now is None:  # only the rate limit reads the clock
            now = anyio.current_time() if self.policy.rate is not None else 0.0
        return self._admit_one(now)

    def refund(self) -> None:
        """Give back an admission that was never used (see `try_acquire`): its slot, its rate token and its count."""
        self._admitted -= 1
        if self.policy.rate is not None:
            self._tokens = min(float(self.policy.burst), self._tokens + 1)
        self.release()

    def release(self) -> None:
        """Give back one admission (the `slot` context does this for you)."""
        if self._active <= 0:
            raise RuntimeError(f"gate {self.name!r}: release() without a matching acquire()")
        self._active -= 1
        self._admit_waiters(caller=None)

    def stats(self) -> GateStats:
        """Current holders, waiters, admissions so far, tokens left and rejections by reason."""
        self._refill(anyio.current_time())
        return GateStats(
            name=self.name,
            active=self._active,
            waiting=len(self._queue),
            admitted=self._admitted,
            tokens=self._tokens if self.policy.rate is not None else None,
            rejections=dict(self._rejections),
        )

    async def _wait(self, entry: QueueEntry[_Waiter], deadline: float | None, asked_at: float) -> None:
        waiter = entry.value
        try:
            await self._wait_admitted(entry, deadline, asked_at)
        except BaseException:
            if waiter.granted:
                self.release()
            else:
                self._queue.remove(entry)
                self._admit_waiters(caller=waiter)
            raise

    async def _wait_admitted(self, entry: QueueEntry[_Waiter], deadline: float | None, asked_at: float) -> None:
        waiter = entry.value
        while True:
            self._admit_waiters(caller=waiter)
            if waiter.granted:
                return
            now = anyio.current_time()
            if deadline is not None and now >= deadline:
                self._rejections[DeadlineExceededError.reason] += 1
                raise DeadlineExceededError(self.name, deadline - asked_at, "waiting for admission")
            # Only the head of the line keeps the token timer; the others sleep until nudged.
            wake_at = self._next_token_at(now) if self._queue.peek(now) is entry else None
            until = min(t for t in (wake_at, deadline, float("inf")) if t is not None)
            await waiter.wake.wait(until)

    def _admit_one(self, now: float) -> bool:
        self._refill(now)
        limit = self.policy.max_concurrency
        if (limit is not None and self._active >= limit) or self._tokens < 1:
            return False
        self._active += 1
        self._admitted += 1
        if self.policy.rate is not None:
            self._tokens -= 1
        return True

    def _admit_waiters(self, caller: _Waiter | None) -> None:
        if len(self._queue) == 0:
            return  # nobody to admit, nobody to nudge
        now = anyio.current_time()
        admitted: list[Callable[[], None]] = []
        # Same `now` for peek and pop, so the entry admitted is the one peeked.
        while self._queue.peek(now) is not None and self._admit_one(now):
            entry = self._queue.pop(now)
            if entry is not None:
                entry.value.granted = True
                if entry.value.on_admit is None:
                    entry.value.wake.fire()
                else:
                    admitted.append(entry.value.on_admit)
        # Nudge the new head so it re-arms the token timer (it may have slept untimed until now).
        head = self._queue.peek(now)
        if head is not None and head.value is not caller:
            head.value.wake.fire()
        for on_admit in admitted:  # once the line is in order: they may release or queue in turn
            on_admit()

    def _refill(self, now: float) -> None:
        if self.policy.rate is None:
            return
        if self._refilled_at is not None:
            gained = (now - self._refilled_at) * self.policy.rate
            self._tokens = min(float(self.policy.burst), self._tokens + gained)
        self._refilled_at = now

    def _next_token_at(self, now: float) -> float | None:
        if self.policy.rate is None or self._tokens >= 1:
            return None
        return wake_time(now, (1 - self._tokens) / self.policy.rate)
