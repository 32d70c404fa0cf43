"""DynamicBatcher: flush rules, partial and whole failures, deadlines, cancellation, close, backpressure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import anyio
import pytest
from anyio.abc import TaskGroup

from mcpmux.batching import (
    BatchPolicy,
    BatchResultError,
    ClosedError,
    DeadlineExceededError,
    DynamicBatcher,
    QueueFullError,
    QueuePolicy,
)
from mcpmux.batching.signal import Signal, wake_time
from tests.batching.virtual_time import run_virtual

# These tests run on virtual time (conftest.py): the times they assert are exact, up to float rounding.


@dataclass
class Upstream:
    """A batch-capable function: doubles each number, fails items < 0, takes `latency` per batch."""

    latency: float = 0.0
    batches: list[list[int]] = field(default_factory=list)
    started_at: list[float] = field(default_factory=list)
    running: int = 0
    peak_running: int = 0
    batch_started: Signal = field(default_factory=Signal)

    async def __call__(self, items: list[int]) -> Sequence[int | BaseException]:
        self.batches.append(list(items))
        self.started_at.append(anyio.current_time())
        self.batch_started.fire()
        self.running += 1
        self.peak_running = max(self.peak_running, self.running)
        try:
            await anyio.sleep(self.latency)
        finally:
            self.running -= 1
        return [ValueError(f"item {i} is negative") if i < 0 else 2 * i for i in items]

    async def wait_for_batches(self, count: int) -> None:
        """Return once `count` batches have started (fail after a second)."""
        with anyio.fail_after(1):
            while len(self.batches) < count:
                await self.batch_started.wait()


async def submit_all(batcher: DynamicBatcher[int, int], items: list[int]) -> dict[int, int | str]:
    """Submit every item concurrently; map each item to its result or its error message."""
    results: dict[int, int | str] = {}

    async def one(item: int) -> None:
        try:
            results[item] = await batcher.submit(item)
        except Exception as exc:
            results[item] = f"{type(exc).__name__}: {exc}"

    async with anyio.create_task_group() as tg:
        for item in items:
            tg.start_soon(one, item)
    return results


@pytest.mark.anyio
async def test_flushes_at_max_batch_size_and_each_caller_gets_its_own_result() -> None:
    upstream = Upstream(latency=0.01)
    async with DynamicBatcher(upstream, BatchPolicy(max_batch_size=4, max_delay=1.0)) as batcher:
        start = anyio.current_time()
        results = await submit_all(batcher, list(range(8)))
    assert results == {i: 2 * i for i in range(8)}
    assert [len(b) for b in upstream.batches] == [4, 4]
    # No 1 s delay: full batches go at once, the second as soon as the first frees the only slot.
    assert [t - start for t in upstream.started_at] == pytest.approx([0.0, 0.01], rel=1e-9)
    assert batcher.stats().size_histogram == {4: 2}


@pytest.mark.anyio
async def test_flushes_a_partial_batch_after_max_delay() -> None:
    upstream = Upstream()
    async with DynamicBatcher(upstream, BatchPolicy(max_batch_size=100, max_delay=0.03)) as batcher:
        started = anyio.current_time()
        results = await submit_all(batcher, [1, 2, 3])
        waited = anyio.current_time() - started
    assert results == {1: 2, 2: 4, 3: 6}
    assert upstream.batches == [[1, 2, 3]]
    assert waited == pytest.approx(0.03, rel=1e-9)  # sent when the oldest had waited max_delay, not before


@pytest.mark.timeout(60)  # the bug this guards against spins without end on virtual time: fail, not hang
def test_a_wait_whose_last_bit_is_a_rounding_residue_still_ends() -> None:
    """Submitted at t = 0.006 with a 5 ms window: woken at 0.011, the oldest has waited 5 ms less about
    1e-18 s, a rest too small to add to the clock. The batcher must let time move, not look again at once."""
    upstream = Upstream()

    async def main() -> None:
        async with DynamicBatcher(upstream, BatchPolicy(max_batch_size=100, max_delay=0.005)) as batcher:
            await anyio.sleep(0.006)
            assert await batcher.submit(1) == 2

    run_virtual(main)  # a fresh loop: its clock starts at 0, so the figures above are the ones met
    assert upstream.started_at == [pytest.approx(0.011, rel=1e-9)]


def test_wake_time_is_strictly_later_for_any_positive_delay() -> None:
    assert wake_time(0.08, 5e-18) > 0.08  # 0.08 + 5e-18 == 0.08 in floats
    assert wake_time(0.08, 0.01) == 0.08 + 0.01
    assert wake_time(0.08, 0.0) == 0.08


@pytest.mark.anyio
async def test_sends_the_largest_reachable_preferred_size_at_once() -> None:
    upstream = Upstream()
    policy = BatchPolicy(max_batch_size=16, max_delay=0.05, preferred_sizes=(2, 4))
    async with DynamicBatcher(upstream, policy) as batcher:
        start = anyio.current_time()
        results = await submit_all(batcher, list(range(7)))
    assert len(results) == 7
    # 7 waiting: 4 (largest preferred reachable) now, then 2 now, then the last 1 after max_delay.
    assert [len(b) for b in upstream.batches] == [4, 2, 1]
    assert [t - start for t in upstream.started_at] == pytest.approx([0.0, 0.0, 0.05], rel=1e-9)


@pytest.mark.anyio
async def test_a_failing_item_fails_alone() -> None:
    upstream = Upstream()
    async with DynamicBatcher(upstream, BatchPolicy(max_batch_size=8, max_delay=0.01)) as batcher:
        results = await submit_all(batcher, [1, -2, 3, -4])
    assert results == {1: 2, 3: 6, -2: "ValueError: item -2 is negative", -4: "ValueError: item -4 is negative"}
    assert batcher.stats().failed_batches == 0


@pytest.mark.anyio
async def test_a_raising_batch_function_fails_every_item_of_that_batch_only() -> None:
    async def fragile(items: list[int]) -> list[int]:
        if 13 in items:
            raise RuntimeError("upstream crashed on 13")
        return [2 * i for i in items]

    async with DynamicBatcher(fragile, BatchPolicy(max_batch_size=3, max_delay=0.01)) as batcher:
        results = await submit_all(batcher, [1, 2, 13, 4, 5, 6])
    crashed = {k for k, v in results.items() if v == "RuntimeError: upstream crashed on 13"}
    assert 13 in crashed
    assert len(crashed) == 3  # the batch holding 13, and nothing else
    assert all(results[k] == 2 * k for k in results if k not in crashed)
    assert batcher.stats().failed_batches == 1


@pytest.mark.anyio
async def test_wrong_number_of_results_is_a_contract_error() -> None:
    async def short(items: list[int]) -> list[int]:
        return items[:-1]

    async with DynamicBatcher(short, BatchPolicy(max_batch_size=3, max_delay=0.01), name="embed") as batcher:
        results = await submit_all(batcher, [1, 2, 3])
    assert set(results.values()) == {
        f"{BatchResultError.__name__}: batch function of 'embed' returned 2 results for 3 items; "
        "it must return a sequence of the same length, one result (or exception) per item, in order"
    }


@pytest.mark.anyio
async def test_full_queue_rejects_and_nothing_else_is_lost() -> None:
    upstream = Upstream(latency=0.03)
    policy = BatchPolicy(max_batch_size=2, max_delay=0.0, queue=QueuePolicy(max_queue=4))
    async with DynamicBatcher(upstream, policy, name="search") as batcher:
        results = await submit_all(batcher, list(range(10)))
    rejected = [k for k, v in results.items() if isinstance(v, str)]
    served = [k for k, v in results.items() if v == 2 * k]
    assert len(rejected) + len(served) == 10
    assert rejected
    expected = f"{QueueFullError.__name__}: queue 'search' is full (max_queue=4)"
    assert all(str(results[k]).startswith(expected) for k in rejected)
    assert sorted(i for b in upstream.batches for i in b) == sorted(served)
    assert batcher.stats().rejections == {"queue_full": len(rejected)}


@pytest.mark.anyio
async def test_full_queue_with_delay_applies_backpressure_and_serves_everyone() -> None:
    upstream = Upstream(latency=0.005)
    policy = BatchPolicy(max_batch_size=2, max_delay=0.0, queue=QueuePolicy(max_queue=2, on_full="delay"))
    async with DynamicBatcher(upstream, policy) as batcher:
        results = await submit_all(batcher, list(range(12)))
    assert results == {i: 2 * i for i in range(12)}
    assert batcher.stats().rejections == {}


@pytest.mark.anyio
async def test_deadline_answers_promptly_while_queued_and_while_running() -> None:
    upstream = Upstream(latency=0.2)
    async with DynamicBatcher(upstream, BatchPolicy(max_batch_size=1, max_delay=0.0), name="slow") as batcher:
        outcome: dict[int, BaseException] = {}
        answered_at: dict[int, float] = {}

        async def one(item: int) -> None:
            try:
                await batcher.submit(item, deadline=anyio.current_time() + 0.05)
            except DeadlineExceededError as exc:
                outcome[item] = exc
                answered_at[item] = anyio.current_time() - started

        started = anyio.current_time()
        async with anyio.create_task_group() as tg:
            tg.start_soon(one, 1)  # sent at once, its batch outlives the deadline
            await anyio.sleep(0.001)
            tg.start_soon(one, 2)  # waits behind it in the queue
    # Each answered at its own deadline, not when the 0.2 s batch ended.
    assert answered_at == {1: pytest.approx(0.05, rel=1e-9), 2: pytest.approx(0.051, rel=1e-9)}
    assert "in a batch still running" in str(outcome[1])
    assert "waiting in the queue" in str(outcome[2])
    assert upstream.batches == [[1]]  # the queued item was never sent
    assert batcher.stats().rejections == {"deadline": 2}


@pytest.mark.anyio
async def test_default_timeout_applies_to_items_without_a_deadline() -> None:
    upstream = Upstream(latency=0.2)
    policy = BatchPolicy(max_batch_size=1, queue=QueuePolicy(default_timeout=0.03))
    async with DynamicBatcher(upstream, policy) as batcher:
        start = anyio.current_time()
        with pytest.raises(DeadlineExceededError, match=r"timeout=0\.030s"):
            await batcher.submit(1)
        assert anyio.current_time() - start == pytest.approx(0.03, rel=1e-9)


@pytest.mark.anyio
async def test_cancelled_items_leave_their_batch_cleanly() -> None:
    upstream = Upstream(latency=0.05)
    async with DynamicBatcher(upstream, BatchPolicy(max_batch_size=2, max_delay=0.0)) as batcher:
        results: dict[int, int] = {}

        async def one(item: int) -> None:
            results[item] = await batcher.submit(item)

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, 1)
            tg.start_soon(one, 2)
            await upstream.wait_for_batches(1)  # [1, 2] runs; 3 and 4 queue behind it
            async with anyio.create_task_group() as doomed:
                doomed.start_soon(one, 3)
                doomed.start_soon(one, 4)
                await anyio.sleep(0.005)
                assert batcher.stats().queue_depth == 2
                doomed.cancel_scope.cancel()  # 3 and 4 leave before they are sent
            assert batcher.stats().queue_depth == 0
            tg.start_soon(one, 5)
            async with anyio.create_task_group() as late:
                late.start_soon(one, 6)
                await upstream.wait_for_batches(2)  # [5, 6] is now running
                late.cancel_scope.cancel()  # 6's result is dropped, 5 still gets its own
    assert results == {1: 2, 2: 4, 5: 10}
    assert upstream.batches == [[1, 2], [5, 6]]


@pytest.mark.anyio
async def test_close_answers_every_queued_item_and_finishes_running_batches() -> None:
    upstream = Upstream(latency=0.05)
    results: dict[int, int | str] = {}

    async def one(batcher: DynamicBatcher[int, int], item: int) -> None:
        try:
            results[item] = await batcher.submit(item)
        except ClosedError as exc:
            results[item] = str(exc)

    async with anyio.create_task_group() as tg:
        async with DynamicBatcher(upstream, BatchPolicy(max_batch_size=2, max_delay=0.0), name="b") as batcher:
            for item in range(5):
                tg.start_soon(one, batcher, item)
            await anyio.sleep(0.01)
        with pytest.raises(ClosedError, match="'b' was closed while the item was being submitted"):
            await batcher.submit(9)
    assert [results[i] for i in (0, 1)] == [0, 2]  # the running batch finished
    assert {results[i] for i in (2, 3, 4)} == {
        "'b' was closed while the item was waiting in the queue; it was not answered, submit it again to a running one"
    }
    assert batcher.stats().rejections == {"closed": 4}


@pytest.mark.anyio
async def test_concurrent_batches_are_capped() -> None:
    upstream = Upstream(latency=0.02)
    policy = BatchPolicy(max_batch_size=2, max_delay=0.0, max_concurrent_batches=3)
    async with DynamicBatcher(upstream, policy) as batcher:
        start = anyio.current_time()
        results = await submit_all(batcher, list(range(20)))
        took = anyio.current_time() - start
    assert results == {i: 2 * i for i in range(20)}
    assert upstream.peak_running == 3
    assert took == pytest.approx(4 * 0.02, rel=1e-9)  # 10 batches, 3 at a time: 4 rounds, no slot left idle
    stats = batcher.stats()
    assert (stats.items, stats.queue_depth, stats.in_flight_batches) == (20, 0, 0)
    assert stats.mean_batch_size == 2.0


@pytest.mark.anyio
async def test_submit_outside_async_with_is_a_clear_error() -> None:
    batcher = DynamicBatcher(Upstream(), name="idle")
    with pytest.raises(RuntimeError, match="'idle' is not running: enter it with `async with`"):
        await batcher.submit(1)


def test_policy_validation_names_the_limit() -> None:
    with pytest.raises(ValueError, match=r"preferred_sizes \[64\] fall outside 1\.\.max_batch_size \(32\)"):
        BatchPolicy(max_batch_size=32, preferred_sizes=(8, 64))
    with pytest.raises(ValueError, match="mode must be 'fixed' or 'adaptive'"):
        BatchPolicy(mode="greedy")  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_leaving_with_an_error_cancels_running_batches_and_answers_their_items() -> None:
    upstream = Upstream(latency=10.0)
    outcome: list[BaseException] = []

    async def one(batcher: DynamicBatcher[int, int], item: int) -> None:
        try:
            await batcher.submit(item)
        except ClosedError as exc:
            outcome.append(exc)

    async def owner(tg: TaskGroup) -> None:
        async with DynamicBatcher(upstream, BatchPolicy(max_batch_size=2, max_delay=0.0), name="b") as batcher:
            tg.start_soon(one, batcher, 1)
            await upstream.wait_for_batches(1)
            raise KeyError("the owner failed")

    async with anyio.create_task_group() as tg:
        with pytest.raises(KeyError, match="the owner failed"):  # as itself, not in an ExceptionGroup
            await owner(tg)
    assert [str(e) for e in outcome] == [
        "'b' was closed while the item was in a batch that was cancelled; it was not answered, "
        "submit it again to a running one"
    ]
    assert upstream.running == 0
