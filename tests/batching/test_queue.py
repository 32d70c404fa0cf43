"""AgingQueue: priority order, FIFO within a level, aging, bounds, deadlines and close."""

from __future__ import annotations

import gc
import weakref
from typing import TypeVar

import anyio
import pytest

from mcpmux.batching import AgingQueue, ClosedError, DeadlineExceededError, QueueFullError, QueuePolicy

T = TypeVar("T")


def drain(queue: AgingQueue[T]) -> list[T]:
    """Everything queued, in the order the queue hands it out."""
    return [entry.value for entry in queue.take(len(queue))]


@pytest.mark.anyio
async def test_higher_priority_first_and_fifo_within_a_level() -> None:
    queue: AgingQueue[str] = AgingQueue(QueuePolicy(aging_interval=10.0))
    for value, priority in [("a0", 0), ("b2", 2), ("c0", 0), ("d2", 2), ("e1", 1)]:
        queue.put_nowait(value, priority=priority)
    assert drain(queue) == ["b2", "d2", "e1", "a0", "c0"]


@pytest.mark.anyio
async def test_aging_lets_an_old_low_item_pass_a_new_high_one() -> None:
    aged: AgingQueue[str] = AgingQueue(QueuePolicy(aging_interval=0.01))
    strict: AgingQueue[str] = AgingQueue(QueuePolicy(aging_interval=None))
    for queue in (aged, strict):
        queue.put_nowait("old-low", priority=0)
    await anyio.sleep(0.05)  # five aging intervals: worth five priority levels
    for queue in (aged, strict):
        queue.put_nowait("new-high", priority=2)
    assert drain(aged) == ["old-low", "new-high"]
    assert drain(strict) == ["new-high", "old-low"]


@pytest.mark.anyio
async def test_full_queue_rejects_with_the_limit_in_the_message() -> None:
    queue: AgingQueue[int] = AgingQueue(QueuePolicy(max_queue=2), name="search")
    queue.put_nowait(1)
    queue.put_nowait(2)
    with pytest.raises(QueueFullError, match=r"queue 'search' is full \(max_queue=2\)") as info:
        await queue.put(3)
    assert info.value.reason == "queue_full"
    assert len(queue) == 2


@pytest.mark.anyio
async def test_full_queue_delays_until_room_then_admits() -> None:
    queue: AgingQueue[int] = AgingQueue(QueuePolicy(max_queue=1, on_full="delay"))
    queue.put_nowait(1)
    admitted: list[int] = []

    async def put_late() -> None:
        await queue.put(2)
        admitted.append(2)

    async with anyio.create_task_group() as tg:
        tg.start_soon(put_late)
        await anyio.sleep(0.02)
        assert admitted == []  # still waiting for room
        assert queue.pop() is not None
    assert admitted == [2]
    assert drain(queue) == [2]


@pytest.mark.anyio
async def test_delayed_put_gives_up_at_its_deadline() -> None:
    queue: AgingQueue[int] = AgingQueue(QueuePolicy(max_queue=1, on_full="delay"), name="slow")
    queue.put_nowait(1)
    started = anyio.current_time()
    with pytest.raises(DeadlineExceededError, match="waiting for room"):
        await queue.put(2, deadline=started + 0.03)
    assert anyio.current_time() - started == pytest.approx(0.03, rel=1e-9)  # on virtual time (conftest.py)
    assert len(queue) == 1


@pytest.mark.anyio
async def test_removed_and_expired_entries_are_never_handed_out() -> None:
    queue: AgingQueue[str] = AgingQueue()
    gone = queue.put_nowait("cancelled")
    queue.put_nowait("expired", deadline=anyio.current_time() + 0.01)
    queue.put_nowait("live")
    assert queue.remove(gone)
    assert not queue.remove(gone)
    await anyio.sleep(0.02)
    assert drain(queue) == ["live"]
    assert len(queue) == 0
    assert queue.oldest_enqueued_at() is None


@pytest.mark.anyio
async def test_many_cancellations_do_not_grow_memory() -> None:
    queue: AgingQueue[int] = AgingQueue(QueuePolicy(max_queue=10_000))
    keeper = queue.put_nowait(-1)
    for i in range(5_000):
        queue.remove(queue.put_nowait(i))
    assert len(queue) == 1
    assert len(queue._heap) < 200
    assert queue.pop() is keeper


class _Item:
    pass


@pytest.mark.anyio
@pytest.mark.parametrize("priorities", [False, True])
async def test_items_handed_out_are_not_kept(priorities: bool) -> None:
    """A queue that only ever has a few waiting (a gate's line) holds on to nothing it handed out.

    Found in session 10: every entry a gate had queued stayed alive in its list of arrivals,
    and the collector's full passes over them came to most of mcpmux's CPU under load.
    """
    queue: AgingQueue[_Item] = AgingQueue(QueuePolicy(max_queue=10_000))
    handed_out: list[weakref.ref[_Item]] = []
    for i in range(3_000):
        item = _Item()
        handed_out.append(weakref.ref(item))
        queue.put_nowait(item, priority=i % 3 if priorities else 0)
        if i % 4 == 3:  # a few wait at a time, and are handed out in the queue's order
            for entry in queue.take(4):
                assert entry.value is not None
    del item, entry
    assert len(queue) == 0
    gc.collect()
    assert sum(ref() is not None for ref in handed_out) == 0


@pytest.mark.anyio
async def test_close_returns_queued_entries_and_refuses_more() -> None:
    queue: AgingQueue[str] = AgingQueue(QueuePolicy(max_queue=1, on_full="delay"), name="q")
    queue.put_nowait("queued")
    outcome: list[BaseException] = []

    async def delayed() -> None:
        try:
            await queue.put("late")
        except ClosedError as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(delayed)
        await anyio.sleep(0.01)
        assert [entry.value for entry in queue.close()] == ["queued"]
    assert len(outcome) == 1
    assert "'q' was closed" in str(outcome[0])
    with pytest.raises(ClosedError):
        queue.put_nowait("after")


def test_policy_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="max_queue must be at least 1, got 0"):
        QueuePolicy(max_queue=0)
    with pytest.raises(ValueError, match="on_full must be 'reject' or 'delay'"):
        QueuePolicy(on_full="drop")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="aging_interval"):
        QueuePolicy(aging_interval=0)
