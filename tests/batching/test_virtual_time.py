"""The virtual-time loop the other tests run on: what it promises and the one thing it cannot do."""

from __future__ import annotations

import time

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

from tests.batching.virtual_time import VirtualTimeLoop, run_virtual


@pytest.mark.anyio
async def test_sleeps_and_deadlines_move_virtual_time_by_exactly_their_length() -> None:
    start = anyio.current_time()
    await anyio.sleep(5)
    assert anyio.current_time() == start + 5
    with anyio.move_on_after(3600) as scope:
        await anyio.sleep(86_400 * 2)  # longer than asyncio's longest single wait (one day); no real wait
    assert scope.cancelled_caught
    assert anyio.current_time() == pytest.approx(start + 5 + 3600, rel=1e-9)


def test_each_loop_starts_at_zero_and_time_stands_still_while_code_runs() -> None:
    async def main() -> tuple[float, float]:
        before = anyio.current_time()
        sum(range(200_000))  # real work takes no virtual time
        await anyio.lowlevel.checkpoint()
        return before, anyio.current_time()

    assert run_virtual(main) == (0.0, 0.0)
    loop = VirtualTimeLoop()
    try:
        with pytest.raises(ValueError, match="only moves forward"):
            loop.advance(-1.0)
    finally:
        loop.close()


@pytest.mark.anyio
async def test_a_wake_up_from_another_thread_gets_through_without_moving_time() -> None:
    """With no timer set the loop blocks on the real selector, so a worker thread's answer arrives."""

    def work() -> str:
        time.sleep(0.05)
        return "done"

    start = anyio.current_time()
    assert await anyio.to_thread.run_sync(work) == "done"
    assert anyio.current_time() == start


@pytest.mark.anyio
async def test_a_thread_waited_for_with_a_timeout_sees_time_jump_past_it() -> None:
    """The documented limit: the loop cannot know a thread will answer, so an idle timeout fires at once."""
    start = anyio.current_time()
    with anyio.move_on_after(10) as scope:
        await anyio.to_thread.run_sync(time.sleep, 0.05, abandon_on_cancel=True)  # 50 ms of real work ...
    assert scope.cancelled_caught  # ... "timed out" after 10 s of virtual time
    assert anyio.current_time() == start + 10
