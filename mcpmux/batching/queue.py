"""A bounded priority queue with aging and deadlines (the waiting line of the gate and the batcher).

Ordering follows `QueuePolicy` (see `policy.py`): effective priority ``priority + waited / I``,
which is the same as ordering by the fixed key ``enqueued_at - priority * I``, so a plain heap
serves it; FIFO within a level falls out of the arrival time and a sequence number.

The queue itself never answers anyone: whoever put an item waits for it under the item's
deadline and calls `remove` when it gives up. `pop` skips items already past their deadline, so
expired work is never handed out.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, TypeVar

import anyio

from mcpmux.batching.errors import ClosedError, DeadlineExceededError, QueueFullError
from mcpmux.batching.policy import QueuePolicy
from mcpmux.batching.signal import Signal

T = TypeVar("T")


class EntryState(Enum):
    """Where an entry is: waiting in the queue, handed out by `pop`, or dropped."""

    QUEUED = "queued"
    TAKEN = "taken"
    DROPPED = "dropped"


@dataclass(slots=True, eq=False)
class QueueEntry(Generic[T]):
    """One queued item with its scheduling facts."""

    value: T
    priority: int
    enqueued_at: float
    deadline: float | None
    sort_key: tuple[float, float, int]
    state: EntryState = EntryState.QUEUED

    def expired(self, now: float) -> bool:
        """True once the entry's deadline has passed."""
        return self.deadline is not None and now >= self.deadline


@dataclass(slots=True)
class AgingQueue(Generic[T]):
    """Bounded priority queue with aging; `put` rejects or delays when full (per policy)."""

    policy: QueuePolicy = field(default_factory=QueuePolicy)
    name: str = "queue"
    _heap: list[tuple[tuple[float, float, int], QueueEntry[T]]] = field(default_factory=list)
    _arrivals: deque[QueueEntry[T]] = field(default_factory=deque)
    _live: int = 0
    _seq: itertools.count[int] = field(default_factory=itertools.count)
    _changed: Signal = field(default_factory=Signal)
    _room: Signal = field(default_factory=Signal)
    _closed: bool = False

    def __len__(self) -> int:
        """Items waiting (excluding those handed out or dropped)."""
        return self._live

    @property
    def closed(self) -> bool:
        """True after `close`: `put` raises `ClosedError`."""
        return self._closed

    def put_nowait(self, value: T, *, priority: int = 0, deadline: float | None = None) -> QueueEntry[T]:
        """Enqueue now or raise `QueueFullError` (whatever `on_full` says) or `ClosedError`."""
        if self._closed:
            raise ClosedError(self.name, "being submitted")
        if self._live >= self.policy.max_queue:
            raise QueueFullError(self.name, self.policy.max_queue)
        now = anyio.current_time()
        seq = next(self._seq)
        if self.policy.aging_interval is None:
            key = (float(-priority), now, seq)
        else:
            key = (now - priority * self.policy.aging_interval, 0.0, seq)
        entry = QueueEntry(value, priority, now, deadline, key)
        heapq.heappush(self._heap, (key, entry))
        self._arrivals.append(entry)
        self._live += 1
        self._changed.fire()
        return entry

    async def put(self, value: T, *, priority: int = 0, deadline: float | None = None) -> QueueEntry[T]:
        """Enqueue; when full, raise `QueueFullError` (`reject`) or wait for room until `deadline`."""
        while self._live >= self.policy.max_queue and self.policy.on_full == "delay" and not self._closed:
            await self._room.wait(until=deadline)
            if deadline is not None and anyio.current_time() >= deadline:
                raise DeadlineExceededError(self.name, None, "waiting for room in a full queue")
        return self.put_nowait(value, priority=priority, deadline=deadline)

    def remove(self, entry: QueueEntry[T]) -> bool:
        """Drop a still-queued entry (its owner gave up); False if it was already handed out or dropped."""
        if entry.state is not EntryState.QUEUED:
            return False
        self._drop(entry)
        self._compact()
        return True

    def peek(self, now: float | None = None) -> QueueEntry[T] | None:
        """The entry `pop` would return next, without taking it."""
        now = anyio.current_time() if now is None else now
        while self._heap:
            entry = self._heap[0][1]
            if entry.state is EntryState.QUEUED and not entry.expired(now):
                return entry
            heapq.heappop(self._heap)
            if entry.state is EntryState.QUEUED:
                self._drop(entry)
        return None

    def pop(self, now: float | None = None) -> QueueEntry[T] | None:
        """Take the most urgent live entry (skipping expired ones), or None if none waits."""
        entry = self.peek(now)
        if entry is None:
            return None
        heapq.heappop(self._heap)
        entry.state = EntryState.TAKEN
        self._live -= 1
        self._room.fire()
        self._forget_arrivals()
        return entry

    def take(self, n: int, now: float | None = None) -> list[QueueEntry[T]]:
        """Pop up to `n` entries, most urgent first."""
        now = anyio.current_time() if now is None else now
        taken: list[QueueEntry[T]] = []
        while len(taken) < n and (entry := self.pop(now)) is not None:
            taken.append(entry)
        return taken

    def oldest_enqueued_at(self) -> float | None:
        """Arrival time of the longest-waiting queued entry (what a batching delay is measured from)."""
        self._forget_arrivals()
        return self._arrivals[0].enqueued_at if self._arrivals else None

    async def wait_changed(self, until: float | None = None) -> None:
        """Sleep until the next `put` (or until `until`, an absolute anyio time)."""
        await self._changed.wait(until)

    def close(self) -> list[QueueEntry[T]]:
        """Refuse further puts, wake delayed putters, and hand back every queued entry (now dropped)."""
        self._closed = True
        drained = [entry for _, entry in sorted(self._heap) if entry.state is EntryState.QUEUED]
        for entry in drained:
            entry.state = EntryState.DROPPED
        self._heap.clear()
        self._arrivals.clear()
        self._live = 0
        self._room.fire()
        self._changed.fire()
        return drained

    def _drop(self, entry: QueueEntry[T]) -> None:
        entry.state = EntryState.DROPPED
        self._live -= 1
        self._room.fire()

    def _forget_arrivals(self) -> None:
        """Let go of the entries handed out or dropped at the front of the arrivals, and of the rest
        of them once they outnumber the live ones (handed out of arrival order, by priority)."""
        arrivals = self._arrivals
        while arrivals and arrivals[0].state is not EntryState.QUEUED:
            arrivals.popleft()
        if len(arrivals) > 2 * self._live + 64:
            self._arrivals = deque(e for e in arrivals if e.state is EntryState.QUEUED)

    def _compact(self) -> None:
        # Removed entries stay in the heap and arrival deque until they surface; rebuild when they
        # outnumber live ones so cancelled items cannot grow memory without bound.
        if len(self._heap) > 2 * self._live + 64:
            self._heap = [pair for pair in self._heap if pair[1].state is EntryState.QUEUED]
            heapq.heapify(self._heap)
        self._forget_arrivals()
