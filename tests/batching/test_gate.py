"""AdmissionGate: concurrency cap, token-bucket rate, priority order, deadlines and cancellation."""

from __future__ import annotations

import anyio
import pytest

from mcpmux.batching import AdmissionGate, DeadlineExceededError, GatePolicy, QueueFullError, QueuePolicy
from tests.batching.virtual_time import run_virtual

# These tests run on virtual time (conftest.py): the times they assert are exact, up to float rounding.


async def _in_turn(gate: AdmissionGate, admitted: list[str], name: str, priority: int = 0) -> None:
    """A task that waits for its turn at `gate` and notes `name` once admitted."""
    async with gate.slot(priority=priority):
        admitted.append(name)


@pytest.mark.anyio
async def test_never_more_holders_than_max_concurrency() -> None:
    gate = AdmissionGate(GatePolicy(max_concurrency=3))
    holding = 0
    peak = 0
    done = 0

    async def call() -> None:
        nonlocal holding, peak, done
        async with gate.slot():
            holding += 1
            peak = max(peak, holding)
            await anyio.sleep(0.005)
            holding -= 1
        done += 1

    start = anyio.current_time()
    async with anyio.create_task_group() as tg:
        for _ in range(20):
            tg.start_soon(call)
    assert (peak, done) == (3, 20)
    assert anyio.current_time() - start == pytest.approx(7 * 0.005, rel=1e-9)  # ceil(20 / 3) waves, no idle slot
    stats = gate.stats()
    assert (stats.active, stats.waiting, stats.admitted) == (0, 0, 20)


@pytest.mark.anyio
async def test_rate_limit_spaces_admissions_after_the_burst() -> None:
    gate = AdmissionGate(GatePolicy(max_concurrency=None, rate=100.0, burst=2))
    admitted_at: list[float] = []
    start = anyio.current_time()

    async def call() -> None:
        async with gate.slot():
            admitted_at.append(anyio.current_time() - start)

    async with anyio.create_task_group() as tg:
        for _ in range(7):
            tg.start_soon(call)
    # The burst of 2 goes at once, then one every 10 ms, each as soon as its token is due.
    assert admitted_at == pytest.approx([0.0, 0.0, 0.01, 0.02, 0.03, 0.04, 0.05], rel=1e-9)


@pytest.mark.timeout(60)  # the bug this guards against spins without end on virtual time: fail, not hang
def test_a_token_due_a_rounding_residue_from_now_still_comes() -> None:
    """At 7/s, refills computed in floats leave a token short of 1 by a residue too small to add to
    the clock; the head of the line must let time move to get it, not look again at once."""
    admitted_at: list[float] = []

    async def main() -> None:
        gate = AdmissionGate(GatePolicy(max_concurrency=None, rate=7.0, burst=2))

        async def call() -> None:
            async with gate.slot():
                admitted_at.append(anyio.current_time())

        async with anyio.create_task_group() as tg:
            for _ in range(12):
                tg.start_soon(call)

    run_virtual(main)  # a fresh loop: its clock starts at 0, so these are the float sums met
    assert admitted_at == pytest.approx([0.0, 0.0] + [k / 7 for k in range(1, 11)], rel=1e-9)


@pytest.mark.anyio
async def test_waiters_are_admitted_by_priority() -> None:
    gate = AdmissionGate(GatePolicy(max_concurrency=1, queue=QueuePolicy(aging_interval=60.0)))
    order: list[str] = []

    async def call(name: str, priority: int) -> None:
        async with gate.slot(priority=priority):
            order.append(name)

    async with anyio.create_task_group() as tg:
        await gate.acquire()  # hold the only slot while the others line up
        for name, priority in [("low", 0), ("high", 5), ("mid", 2), ("high2", 5)]:
            tg.start_soon(call, name, priority)
            await anyio.sleep(0.002)
        gate.release()
    assert order == ["high", "high2", "mid", "low"]


@pytest.mark.anyio
async def test_cancelled_waiter_leaves_and_the_next_one_gets_the_slot() -> None:
    gate = AdmissionGate(GatePolicy(max_concurrency=1))
    served: list[str] = []

    async def call(name: str) -> None:
        async with gate.slot():
            served.append(name)

    async with anyio.create_task_group() as tg:
        await gate.acquire()
        with anyio.CancelScope() as scope:
            tg.start_soon(call, "stays")
            async with anyio.create_task_group() as inner:
                inner.start_soon(call, "cancelled")
                await anyio.sleep(0.01)
                inner.cancel_scope.cancel()
        assert not scope.cancelled_caught
        assert gate.stats().waiting == 1
        gate.release()
    assert served == ["stays"]
    assert gate.stats().active == 0


@pytest.mark.anyio
async def test_deadline_while_waiting_is_a_clear_counted_error() -> None:
    gate = AdmissionGate(GatePolicy(max_concurrency=1), name="github")
    await gate.acquire()
    started = anyio.current_time()
    with pytest.raises(DeadlineExceededError, match=r"'github' was not answered within timeout=0\.030s") as info:
        await gate.acquire(deadline=started + 0.03)
    assert anyio.current_time() == pytest.approx(started + 0.03, rel=1e-9)  # refused at its deadline, not later
    assert "waiting for admission" in str(info.value)
    gate.release()
    stats = gate.stats()
    assert (stats.active, stats.waiting, stats.rejections) == (0, 0, {"deadline": 1})
    async with gate.slot():  # the gate still works
        assert gate.stats().active == 1


@pytest.mark.anyio
async def test_full_waiting_line_rejects() -> None:
    gate = AdmissionGate(GatePolicy(max_concurrency=1, queue=QueuePolicy(max_queue=1)), name="slack")

    async def wait_in_line() -> None:
        async with gate.slot():
            pass

    async with anyio.create_task_group() as tg:
        await gate.acquire()
        tg.start_soon(wait_in_line)
        await anyio.sleep(0.005)
        with pytest.raises(QueueFullError, match=r"max_queue=1"):
            await gate.acquire()
        gate.release()
    assert gate.stats().rejections == {"queue_full": 1}


@pytest.mark.anyio
async def test_release_without_acquire_is_refused() -> None:
    gate = AdmissionGate(name="db")
    with pytest.raises(RuntimeError, match="'db': release\\(\\) without a matching acquire\\(\\)"):
        gate.release()


@pytest.mark.anyio
async def test_try_acquire_admits_at_once_or_not_at_all_and_never_jumps_the_line() -> None:
    gate = AdmissionGate(GatePolicy(max_concurrency=1))
    assert gate.try_acquire()
    assert not gate.try_acquire()  # at the limit: refused, and nothing counted against anyone
    admitted: list[str] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(_in_turn, gate, admitted, "waiter")
        await anyio.sleep(0.05)
        gate.release()  # the slot goes to the waiter in line ...
        assert not gate.try_acquire()  # ... not to a newcomer that asks at once
    assert admitted == ["waiter"]
    assert gate.try_acquire()
    gate.release()
    stats = gate.stats()
    assert (stats.active, stats.waiting, stats.admitted, stats.rejections) == (0, 0, 3, {})


@pytest.mark.anyio
async def test_a_refunded_admission_costs_no_token_and_counts_for_nothing() -> None:
    gate = AdmissionGate(GatePolicy(max_concurrency=None, rate=0.001, burst=1))  # one token, none for ages
    assert gate.try_acquire()
    gate.refund()  # admitted, then not used after all (the wire could not take the request at once)
    stats = gate.stats()
    assert (stats.active, stats.admitted) == (0, 0)
    assert stats.tokens is not None
    assert stats.tokens >= 1
    async with gate.slot():  # the token is still there for the call that goes on to wait its turn
        pass
    assert not gate.try_acquire()


@pytest.mark.anyio
async def test_held_places_are_admitted_in_line_order_by_whoever_releases() -> None:
    """`hold` takes a place beside the tasks' places; its turn is a call back from `release`, no task."""
    gate = AdmissionGate(GatePolicy(max_concurrency=1, queue=QueuePolicy(aging_interval=60.0)))
    order: list[str] = []
    assert gate.try_acquire()

    def held(name: str) -> None:
        order.append(name)
        gate.release()  # done at once: the next in line goes on

    async with anyio.create_task_group() as tg:
        assert gate.hold(lambda: held("held low"), priority=0) is not None
        tg.start_soon(_in_turn, gate, order, "task high", 5)
        await anyio.sleep(0.01)
        assert gate.hold(lambda: held("held high"), priority=5) is not None
        tg.start_soon(_in_turn, gate, order, "task low")
        await anyio.sleep(0.01)
        assert gate.stats().waiting == 4
        gate.release()
    assert order == ["task high", "held high", "held low", "task low"]
    stats = gate.stats()
    assert (stats.active, stats.waiting, stats.admitted) == (0, 0, 5)


@pytest.mark.anyio
async def test_a_held_place_moves_to_a_task_keeping_its_turn_and_its_deadline() -> None:
    gate = AdmissionGate(GatePolicy(max_concurrency=1))
    assert gate.try_acquire()
    admitted: list[str] = []
    first = gate.hold(lambda: admitted.append("callback"))
    assert first is not None
    async with anyio.create_task_group() as tg:
        tg.start_soon(_in_turn, gate, admitted, "later task")
        await anyio.sleep(0.01)

        async def held_task() -> None:
            await gate.wait_held(first)  # now a task waits for that same place
            admitted.append("held, now a task")
            gate.release()

        tg.start_soon(held_task)
        await anyio.sleep(0.01)
        gate.release()
    assert admitted == ["held, now a task", "later task"]

    # Past its deadline, a held place is never admitted; `wait_held` raises the deadline's error, counted,
    # measured from when the place was taken.
    assert gate.try_acquire()
    late = gate.hold(lambda: admitted.append("too late"), deadline=anyio.current_time() + 0.05)
    assert late is not None
    await anyio.sleep(0.1)
    gate.release()
    with pytest.raises(DeadlineExceededError, match=r"timeout=0\.050s"):
        await gate.wait_held(late)
    assert "too late" not in admitted
    assert gate.stats().rejections == {"deadline": 1}
    assert gate.try_acquire()  # the expired place holds up nobody
    gate.release()


@pytest.mark.anyio
async def test_a_withdrawn_held_place_is_never_admitted_and_admitted_ones_are_not_waited_for() -> None:
    gate = AdmissionGate(GatePolicy(max_concurrency=1))
    assert gate.try_acquire()
    admitted: list[str] = []
    gone = gate.hold(lambda: admitted.append("withdrawn"))
    kept = gate.hold(lambda: admitted.append("kept"))
    assert gone is not None
    assert kept is not None
    gate.withdraw(gone)
    gate.release()
    assert admitted == ["kept"]
    await gate.wait_held(kept)  # admitted already: returns at once, the admission still held
    assert gate.stats().active == 1
    gate.release()


@pytest.mark.anyio
async def test_hold_declines_where_only_a_task_can_wait() -> None:
    """A rate limit needs a timer for its next token, a full line needs `acquire`'s refusal or delay."""
    limited = AdmissionGate(GatePolicy(max_concurrency=1, rate=10.0, burst=1))
    assert limited.try_acquire()
    assert limited.hold(lambda: None) is None
    full = AdmissionGate(GatePolicy(max_concurrency=1, queue=QueuePolicy(max_queue=1)))
    assert full.try_acquire()
    assert full.hold(lambda: None) is not None
    assert full.hold(lambda: None) is None
    assert full.stats().waiting == 1
