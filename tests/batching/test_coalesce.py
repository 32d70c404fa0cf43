"""SingleFlight: identical concurrent calls share one execution, its result and its error."""

from __future__ import annotations

from collections.abc import Awaitable

import anyio
import pytest

from mcpmux.batching import ClosedError, SingleFlight, call_key


@pytest.mark.anyio
async def test_one_hundred_identical_calls_run_once() -> None:
    executions = 0

    async def read_file() -> str:
        nonlocal executions
        executions += 1
        await anyio.sleep(0.02)
        return "contents"

    results: list[str] = []
    async with SingleFlight[tuple[str, str], str]() as flights:

        async def caller(args: dict[str, object]) -> None:
            results.append(await flights.call(call_key("read", args), read_file))

        start = anyio.current_time()
        async with anyio.create_task_group() as tg:
            for k in range(100):
                # Same arguments written in different key orders: still one key.
                tg.start_soon(caller, {"path": "/a", "lines": 3} if k % 2 else {"lines": 3.0, "path": "/a"})
        took = anyio.current_time() - start
    assert executions == 1
    assert took == pytest.approx(0.02, rel=1e-9)  # everyone answered when the one call ended (virtual time)
    assert results == ["contents"] * 100
    stats = flights.stats()
    assert (stats.executions, stats.shared, stats.in_flight) == (1, 99, 0)


@pytest.mark.anyio
async def test_different_keys_and_later_calls_run_separately() -> None:
    seen: list[str] = []

    async def fetch(name: str) -> str:
        seen.append(name)
        await anyio.sleep(0.005)
        return name.upper()

    async with SingleFlight[str, str]() as flights:
        async with anyio.create_task_group() as tg:
            for name in ["a", "b", "a"]:
                tg.start_soon(flights.call, name, lambda n=name: fetch(n))
        assert await flights.call("a", lambda: fetch("a")) == "A"  # nothing is remembered afterwards
    assert sorted(seen) == ["a", "a", "b"]


@pytest.mark.anyio
async def test_the_error_is_shared_by_every_waiter() -> None:
    async def broken() -> str:
        await anyio.sleep(0.01)
        raise PermissionError("upstream said no")

    errors: list[BaseException] = []
    async with SingleFlight[str, str]() as flights:

        async def caller() -> None:
            try:
                await flights.call("k", broken)
            except PermissionError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(caller)
    assert len(errors) == 5
    assert all(str(e) == "upstream said no" for e in errors)


@pytest.mark.anyio
async def test_a_cancelled_waiter_does_not_cancel_the_call_for_the_others() -> None:
    finished = anyio.Event()

    async def slow() -> int:
        await anyio.sleep(0.03)
        finished.set()
        return 42

    async with SingleFlight[str, int]() as flights:
        results: list[int] = []
        async with anyio.create_task_group() as tg:
            with anyio.move_on_after(0.01):
                tg.start_soon(_collect, flights, results)
                await flights.call("k", slow)  # the first caller, who started the call, gives up
        assert results == [42]
        assert finished.is_set()


async def _collect(flights: SingleFlight[str, int], results: list[int]) -> None:
    results.append(await flights.call("k", _never_called))


async def _never_called() -> int:
    raise AssertionError("a second execution started although one was running")


@pytest.mark.anyio
async def test_the_call_is_cancelled_when_its_last_waiter_leaves() -> None:
    cancelled = anyio.Event()
    cancelled_at: list[float] = []

    async def hangs() -> int:
        try:
            await anyio.sleep(10)
        finally:
            cancelled_at.append(anyio.current_time())
            cancelled.set()
        return 0

    async with SingleFlight[str, int]() as flights:
        start = anyio.current_time()
        with anyio.move_on_after(0.01):
            await flights.call("k", hangs)
        with anyio.fail_after(1):
            await cancelled.wait()
        assert flights.stats().in_flight == 0
    assert cancelled_at == [pytest.approx(start + 0.01, rel=1e-9)]  # as the waiter left (virtual time)


@pytest.mark.anyio
async def test_closing_answers_waiters_with_closed_error() -> None:
    async def hangs() -> int:
        await anyio.sleep(10)
        return 0

    outcome: list[BaseException] = []

    async def caller(flights: SingleFlight[str, int]) -> None:
        try:
            await flights.call("k", hangs)
        except ClosedError as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as tg, SingleFlight[str, int](name="reads") as flights:
        tg.start_soon(caller, flights)
        await anyio.sleep(0.01)
    assert len(outcome) == 1
    assert "'reads' was closed" in str(outcome[0])
    with pytest.raises(ClosedError, match="'reads' was closed while the item was being submitted"):
        await flights.call("k", hangs)


@pytest.mark.anyio
async def test_a_lead_run_by_its_caller_answers_the_identical_calls_that_wait_for_it() -> None:
    ran: list[str] = []

    async def fetch() -> str:
        ran.append("fetch")
        return "own"

    async with SingleFlight[str, str]() as flights:
        lead = flights.lead("k")
        assert lead is not None
        assert flights.lead("k") is None  # one lead per key at a time
        results: list[str] = []
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(lambda: _append(results, flights.call("k", fetch)))
            await anyio.wait_all_tasks_blocked()
            assert lead.waiting == 3
            lead.finish("led")
            lead.fail(RuntimeError("ignored: it ended already"))
        assert results == ["led"] * 3
        assert ran == []
        assert flights.lead("k") is not None  # ended: the key is free again (nothing is remembered)


@pytest.mark.anyio
async def test_a_failed_lead_fails_its_waiters_and_an_abandoned_one_lets_them_run_the_call() -> None:
    async def fetch() -> str:
        return "their own"

    async with SingleFlight[str, str]() as flights:
        failing = flights.lead("a")
        assert failing is not None
        errors: list[BaseException] = []

        async def wait_for_error() -> None:
            try:
                await flights.call("a", fetch)
            except RuntimeError as err:
                errors.append(err)

        results: list[str] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_for_error)
            abandoned = flights.lead("b")
            assert abandoned is not None
            tg.start_soon(lambda: _append(results, flights.call("b", fetch)))
            await anyio.wait_all_tasks_blocked()
            failing.fail(RuntimeError("upstream down"))
            abandoned.abandon()
        assert [str(err) for err in errors] == ["upstream down"]
        assert results == ["their own"]


async def _append(results: list[str], pending: Awaitable[str]) -> None:
    results.append(await pending)
