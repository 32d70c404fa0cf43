"""`DynamicBatcher`: callers submit single items, a batch function sees lists.

    async def embed_many(texts: list[str]) -> list[Vector | BaseException]: ...

    async with DynamicBatcher(embed_many, BatchPolicy(max_batch_size=64, mode="adaptive")) as b:
        vector = await b.submit("hello", priority=1, deadline=deadline_in(2.0))

Contract of the batch function: it returns one result per item, in order. A result that is an
exception fails that item alone; the function raising fails every item of the batch with that
error; a result list of the wrong length fails the batch with `BatchResultError`.

The batcher owns its flush loop and its running batches in an anyio task group, so it must be
entered with `async with`. When a batch slot is free (`max_concurrent_batches`), the flush loop
applies the fixed or adaptive rule of `flush.py` to decide when to send and how many. A caller
that gives up (cancelled, or its deadline passed) leaves cleanly: its item is not sent if still
queued, and its result is dropped if its batch already runs. Leaving the `async with` answers
every queued item with `ClosedError` and lets running batches finish (or cancels them, answering
their items with `ClosedError`, when the block exits with an error).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Generic, TypeVar, cast

import anyio
from anyio.abc import TaskGroup

from mcpmux.batching.errors import BatchResultError, ClosedError, DeadlineExceededError, RejectedError
from mcpmux.batching.flush import CostModel, FlushDecision, RecentArrivals, decide_adaptive, decide_fixed
from mcpmux.batching.policy import BatchPolicy
from mcpmux.batching.queue import AgingQueue, QueueEntry
from mcpmux.batching.signal import Signal, wake_time

T = TypeVar("T")
R = TypeVar("R")

BatchFn = Callable[[list[T]], Awaitable[Sequence[R | BaseException]]]


@dataclass(frozen=True, slots=True)
class BatcherStats:
    """A snapshot of a batcher's counters; costs are the fitted ``a*n + b`` in seconds."""

    name: str
    batches: int
    items: int
    failed_batches: int
    size_histogram: dict[int, int]
    queue_depth: int
    in_flight_batches: int
    rejections: dict[str, int]
    cost_per_item: float
    cost_fixed: float

    @property
    def mean_batch_size(self) -> float:
        """Items per batch sent so far (0.0 before the first batch)."""
        return self.items / self.batches if self.batches else 0.0


@dataclass(slots=True, eq=False)
class _Job(Generic[T, R]):
    item: T
    done: anyio.Event = field(default_factory=anyio.Event)
    result: R | None = None
    error: BaseException | None = None

    def settle(self, outcome: R | BaseException) -> None:
        if self.done.is_set():
            return
        if isinstance(outcome, BaseException):
            self.error = outcome
        else:
            self.result = outcome
        self.done.set()

    def outcome(self) -> R:
        if self.error is not None:
            raise self.error
        return cast(R, self.result)


class DynamicBatcher(Generic[T, R]):
    """Groups concurrently submitted items into batches for `fn` under a `BatchPolicy`."""

    def __init__(self, fn: BatchFn[T, R], policy: BatchPolicy | None = None, *, name: str = "batcher") -> None:
        self.policy = policy if policy is not None else BatchPolicy()
        self.name = name
        self._fn = fn
        self._queue: AgingQueue[_Job[T, R]] = AgingQueue(self.policy.queue, name)
        self._cost = CostModel(window=self.policy.cost_window)
        self._recent = RecentArrivals()
        self._task_group: TaskGroup | None = None
        self._loop_scope: anyio.CancelScope | None = None
        self._free_slots = self.policy.max_concurrent_batches
        self._slot_freed = Signal()
        self._closed = False
        self._batches = 0
        self._items = 0
        self._failed = 0
        self._sizes: Counter[int] = Counter()
        self._rejections: Counter[str] = Counter()

    async def __aenter__(self) -> DynamicBatcher[T, R]:
        if self._task_group is not None or self._closed:
            raise RuntimeError(f"DynamicBatcher {self.name!r} can be entered only once; make a new one")
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        self._loop_scope = anyio.CancelScope()
        task_group.start_soon(self._flush_loop, task_group, self._loop_scope)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        self._close()
        assert self._task_group is not None
        if exc_type is not None:
            self._task_group.cancel_scope.cancel()
        # The owner's own error propagates as itself, not wrapped in a task group's ExceptionGroup.
        await self._task_group.__aexit__(None, None, None)
        return None

    async def submit(self, item: T, *, priority: int = 0, deadline: float | None = None) -> R:
        """Queue `item` and wait for its own result (or its own error).

        `priority`: higher is served first (with aging, see `policy.py`). `deadline`: absolute
        anyio time (`deadline_in(seconds)`); default from `policy.queue.default_timeout`. Raises
        `QueueFullError`, `DeadlineExceededError`, `ClosedError`, or the item's error from `fn`.
        """
        if self._task_group is None:
            raise RuntimeError(f"DynamicBatcher {self.name!r} is not running: enter it with `async with`")
        now = anyio.current_time()
        deadline = self.policy.queue.resolve_deadline(deadline, now)
        job: _Job[T, R] = _Job(item)
        try:
            entry = await self._queue.put(job, priority=priority, deadline=deadline)
        except RejectedError as exc:
            self._rejections[exc.reason] += 1
            raise
        if self.policy.mode == "adaptive":
            self._recent.record(anyio.current_time())
        try:
            with anyio.CancelScope(deadline=deadline if deadline is not None else float("inf")):
                await job.done.wait()
        finally:
            # Leaving early (deadline or cancellation): a queued item is withdrawn and never sent;
            # for an item already sent this is a no-op and its result is dropped.
            was_queued = self._queue.remove(entry)
        if job.done.is_set():
            return job.outcome()
        stage = "waiting in the queue" if was_queued else "in a batch still running"
        self._rejections[DeadlineExceededError.reason] += 1
        assert deadline is not None
        raise DeadlineExceededError(self.name, deadline - now, stage)

    def stats(self) -> BatcherStats:
        """Batches and items sent, batch sizes, queue depth, rejections by reason and fitted costs."""
        return BatcherStats(
            name=self.name,
            batches=self._batches,
            items=self._items,
            failed_batches=self._failed,
            size_histogram=dict(sorted(self._sizes.items())),
            queue_depth=len(self._queue),
            in_flight_batches=self.policy.max_concurrent_batches - self._free_slots,
            rejections=dict(self._rejections),
            cost_per_item=self._cost.a,
            cost_fixed=self._cost.b,
        )

    def _close(self) -> None:
        self._closed = True
        if self._loop_scope is not None:
            self._loop_scope.cancel()
        drained = self._queue.close()
        for entry in drained:
            entry.value.settle(ClosedError(self.name, "waiting in the queue"))
        if drained:
            self._rejections[ClosedError.reason] += len(drained)

    async def _flush_loop(self, task_group: TaskGroup, scope: anyio.CancelScope) -> None:
        with scope:
            while True:
                while self._free_slots == 0:
                    await self._slot_freed.wait()
                entries = await self._next_batch()
                self._free_slots -= 1
                task_group.start_soon(self._run_batch, [entry.value for entry in entries])

    async def _next_batch(self) -> list[QueueEntry[_Job[T, R]]]:
        while True:
            now = anyio.current_time()
            oldest = self._queue.oldest_enqueued_at()
            if oldest is None:
                await self._queue.wait_changed()
                continue
            decision = self._decide(len(self._queue), now - oldest, now)
            if decision.take:
                entries = self._queue.take(decision.take, now)
                if entries:
                    return entries
                continue
            recheck_at = wake_time(now, decision.recheck_in) if decision.recheck_in is not None else None
            await self._queue.wait_changed(recheck_at)

    def _decide(self, n: int, oldest_wait: float, now: float) -> FlushDecision:
        if self.policy.mode == "adaptive":
            return decide_adaptive(n, oldest_wait, self.policy, self._cost, self._recent, now, self._free_slots)
        return decide_fixed(n, oldest_wait, self.policy)

    async def _run_batch(self, jobs: list[_Job[T, R]]) -> None:
        self._batches += 1
        self._items += len(jobs)
        self._sizes[len(jobs)] += 1
        try:
            started = anyio.current_time()
            try:
                results = await self._fn([job.item for job in jobs])
            except Exception as exc:
                self._failed += 1
                for job in jobs:
                    job.settle(exc)
                return
            if len(results) != len(jobs):
                self._failed += 1
                error = BatchResultError(self.name, len(jobs), len(results))
                for job in jobs:
                    job.settle(error)
                return
            self._cost.observe(len(jobs), anyio.current_time() - started)
            self._recent.horizon = self._cost.b
            for job, outcome in zip(jobs, results, strict=True):
                job.settle(outcome)
        finally:
            for job in jobs:
                job.settle(ClosedError(self.name, "in a batch that was cancelled"))
            self._free_slots += 1
            self._slot_freed.fire()
