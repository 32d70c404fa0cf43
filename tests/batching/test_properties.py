"""Property tests: under random sizes, delays, failures, deadlines and cancellations, every caller
gets exactly one answer, its own, in time; and aging bounds how long a low-priority item waits.

All of them run on virtual time (`virtual_time.py`), so "in time" means at the deadline itself: no
allowance for a busy machine, whose pauses do not move a virtual clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcpmux.batching import BatchPolicy, DeadlineExceededError, DynamicBatcher, QueuePolicy
from tests.batching.virtual_time import run_virtual


def at_most(took: float, bound: float) -> bool:
    """`took <= bound`, but for the last bit of float rounding in the sums that made them."""
    return took <= bound or took == pytest.approx(bound, rel=1e-9)


@dataclass(frozen=True)
class Call:
    priority: int
    start_delay: float
    fails: bool
    deadline: float | None
    cancel_after: float | None


calls = st.builds(
    Call,
    priority=st.integers(0, 3),
    start_delay=st.floats(0, 0.005),
    fails=st.booleans(),
    deadline=st.one_of(st.none(), st.floats(0.002, 0.04)),
    cancel_after=st.one_of(st.none(), st.floats(0, 0.02)),
)


@st.composite
def policies(draw: st.DrawFn) -> BatchPolicy:
    max_batch_size = draw(st.integers(1, 8))
    preferred = draw(st.sampled_from([(), (2,), (1, 4)]))
    return BatchPolicy(
        max_batch_size=max_batch_size,
        max_delay=draw(st.floats(0, 0.005)),
        preferred_sizes=tuple(size for size in preferred if size <= max_batch_size),
        mode=draw(st.sampled_from(["fixed", "adaptive"])),
        max_concurrent_batches=draw(st.integers(1, 3)),
        queue=QueuePolicy(max_queue=1000, aging_interval=5.0),
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=st.lists(calls, min_size=1, max_size=30), policy=policies(), latency=st.floats(0, 0.004))
def test_every_caller_gets_exactly_its_own_answer_in_time(
    scenario: list[Call], policy: BatchPolicy, latency: float
) -> None:
    sent: list[int] = []
    enqueued: list[int] = []
    outcomes: dict[int, tuple[str, object, float]] = {}

    async def fn(items: list[int]) -> Sequence[int | BaseException]:
        sent.extend(items)
        await anyio.sleep(latency)
        return [ValueError(f"item {i} failed") if scenario[i].fails else i * 10 for i in items]

    async def caller(batcher: DynamicBatcher[int, int], i: int) -> None:
        call = scenario[i]
        await anyio.sleep(call.start_delay)
        start = anyio.current_time()
        deadline = None if call.deadline is None else start + call.deadline
        with anyio.move_on_after(call.cancel_after if call.cancel_after is not None else float("inf")):
            enqueued.append(i)
            try:
                result = await batcher.submit(i, priority=call.priority, deadline=deadline)
                outcomes[i] = ("ok", result, anyio.current_time() - start)
            except Exception as exc:
                outcomes[i] = ("error", exc, anyio.current_time() - start)
            return
        outcomes[i] = ("cancelled", None, anyio.current_time() - start)

    async def main() -> None:
        async with DynamicBatcher(fn, policy) as batcher, anyio.create_task_group() as tg:
            for i in range(len(scenario)):
                tg.start_soon(caller, batcher, i)

    run_virtual(main)

    assert sorted(outcomes) == list(range(len(scenario)))  # everyone answered (or left)
    assert len(sent) == len(set(sent))  # nothing sent twice
    for i, (kind, value, took) in outcomes.items():
        call = scenario[i]
        if call.deadline is not None:
            assert at_most(took, call.deadline)
        if call.cancel_after is not None:
            assert at_most(took, call.cancel_after)
        if kind == "ok":
            assert not call.fails
            assert value == i * 10  # its own result, nobody else's
            assert i in sent
        elif kind == "error" and isinstance(value, DeadlineExceededError):
            assert call.deadline is not None
            assert took == pytest.approx(call.deadline, rel=1e-9)  # answered at its deadline, not later
        elif kind == "error":
            assert call.fails
            assert str(value) == f"item {i} failed"
        else:
            assert call.cancel_after is not None
            assert took == pytest.approx(call.cancel_after, rel=1e-9)  # left the moment it gave up
    # Within a priority level, items go out in the order they were queued.
    position = {item: k for k, item in enumerate(sent)}
    for level in range(4):
        order = [i for i in enqueued if i in position and scenario[i].priority == level]
        assert [position[i] for i in order] == sorted(position[i] for i in order)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(deadlines=st.lists(st.floats(0.005, 0.03), min_size=1, max_size=20), stall=st.floats(0.6, 1.0))
def test_no_item_waits_past_its_deadline_even_when_nothing_else_happens(deadlines: list[float], stall: float) -> None:
    answered: dict[int, tuple[float, float]] = {}  # item: (deadline, when its DeadlineExceededError came)

    async def stuck(items: list[int]) -> list[int]:
        await anyio.sleep(stall)  # the upstream hangs longer than any deadline
        return items

    async def caller(batcher: DynamicBatcher[int, int], i: int) -> None:
        deadline = anyio.current_time() + deadlines[i]
        with pytest.raises(DeadlineExceededError):
            await batcher.submit(i, deadline=deadline)
        answered[i] = (deadline, anyio.current_time())

    async def main() -> None:
        policy = BatchPolicy(max_batch_size=2, max_delay=0.002)
        async with DynamicBatcher(stuck, policy) as batcher, anyio.create_task_group() as tg:
            for i in range(len(deadlines)):
                tg.start_soon(caller, batcher, i)

    run_virtual(main)
    assert sorted(answered) == list(range(len(deadlines)))
    for deadline, at in answered.values():
        assert at == pytest.approx(deadline, rel=1e-9)  # whether queued or in the stuck batch


@pytest.mark.anyio
@pytest.mark.parametrize("aging_interval", [0.01, None])
async def test_a_stream_of_high_priority_items_cannot_starve_a_low_one(aging_interval: float | None) -> None:
    """Aging bound (policy.py): overtaken only by items arriving < (P - p) * I after it.

    With P - p = 5 and I = 10 ms the low item may be overtaken for 50 ms, plus the service of the
    items already queued then (at most 8 here, 2 ms each). Strict priority starves it instead.
    """
    service = 0.002

    async def fn(items: list[str]) -> list[str]:
        await anyio.sleep(service)
        return items

    policy = BatchPolicy(max_batch_size=1, max_delay=0.0, queue=QueuePolicy(aging_interval=aging_interval))
    low_waited: list[float] = []
    stream_ended = anyio.Event()

    async with DynamicBatcher(fn, policy) as batcher:

        async def high_client() -> None:
            while not stream_ended.is_set():
                await batcher.submit("high", priority=5)

        async def low_client() -> None:
            await anyio.sleep(0.01)  # join once the stream has filled the queue
            start = anyio.current_time()
            await batcher.submit("low", priority=0)
            low_waited.append(anyio.current_time() - start)

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(high_client)
            tg.start_soon(low_client)
            await anyio.sleep(0.4)
            stream_ended.set()

    bound = 5 * 0.01 + 9 * service
    if aging_interval is None:
        assert low_waited[0] >= 0.4 - 0.01  # joined at 10 ms, served only once the stream stopped at 400 ms
    else:
        assert at_most(low_waited[0], bound)
