"""Calls to upstreams are scheduled: coalesced, cached, merged into list forms, limited and prioritized."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from mcpmux.core.config import config_from_dict
from mcpmux.core.inbound import Caller
from mcpmux.mux.multiplexer import Mux
from tests.e2e.conftest import demo, text_of

pytestmark = pytest.mark.anyio


def _mux(server: dict[str, Any]) -> Mux:
    return Mux(config_from_dict({"servers": {"alpha": {**demo("alpha"), **server}}}))


async def _count(mux: Mux, tool: str) -> int:
    return int(text_of(await mux.call_tool("alpha__count", {"tool": tool})))


async def test_identical_concurrent_read_only_calls_share_one_upstream_call() -> None:
    async with _mux({}) as mux:
        answers: list[str] = []

        async def one() -> None:
            answers.append(text_of(await mux.call_tool("alpha__lookup", {"key": "k"})))

        async with anyio.create_task_group() as tasks:
            for _ in range(100):
                tasks.start_soon(one)
        assert answers == ["value of k"] * 100
        assert await _count(mux, "lookup") == 1
        # Shared in flight only: nothing is kept, so the next call goes out again.
        assert text_of(await mux.call_tool("alpha__lookup", {"key": "k"})) == "value of k"
        assert text_of(await mux.call_tool("alpha__lookup", {"key": "other"})) == "value of other"
        assert await _count(mux, "lookup") == 3
        assert mux.cache.stats().stores == 0


async def test_cache_rules_errors_and_invalidation() -> None:
    async with _mux({"cache": {"allow": ["echo", "fail"], "deny": ["lookup"]}}) as mux:
        for _ in range(3):
            assert text_of(await mux.call_tool("alpha__echo", {"text": "same"})) == "alpha: same"
        assert await _count(mux, "echo") == 1  # allowed by glob although not annotated read-only
        for _ in range(2):
            await mux.call_tool("alpha__lookup", {"key": "k"})
        assert await _count(mux, "lookup") == 2  # denied: neither cached nor shared
        for _ in range(2):
            assert (await mux.call_tool("alpha__fail", {"reason": "r"})).is_error
        # An error result is never served from the cache: the upstream saw both calls fail.
        stats = mux.cache.stats()
        assert stats.stores == 1
        # The upstream's tools change: what was cached before is dropped.
        await mux.call_tool("alpha__add_tool", {"name": "newer"})
        with anyio.fail_after(10):
            while "alpha__newer" not in {t.name for t in mux.list_tools()}:
                await anyio.sleep(0.05)
        await mux.call_tool("alpha__echo", {"text": "same"})
        assert await _count(mux, "echo") == 2


async def test_concurrent_single_calls_merge_into_the_list_form() -> None:
    batch = [
        {"tool": "get_weather", "batch_tool": "get_weather_many", "argument": "location", "list_argument": "locations"}
    ]
    async with _mux({"batch": batch}) as mux:
        answers: dict[int, str] = {}

        async def one(index: int) -> None:
            answers[index] = text_of(await mux.call_tool("alpha__get_weather", {"location": f"city-{index}"}))

        async with anyio.create_task_group() as tasks:
            for index in range(50):
                tasks.start_soon(one, index)
        assert answers == {index: f"sunny in city-{index}" for index in range(50)}
        assert await _count(mux, "get_weather") == 0
        assert await _count(mux, "get_weather_many_items") == 50
        assert 1 <= await _count(mux, "get_weather_many") <= 10


async def test_full_queue_and_queue_timeout_are_clear_errors_and_lose_nothing_else() -> None:
    limits = {"max_concurrency": 1, "max_queue": 2, "on_full": "reject", "queue_timeout": 5}
    async with _mux({"limits": limits}) as mux:
        results: list[tuple[bool, str]] = []

        async def one() -> None:
            result = await mux.call_tool("alpha__sleep", {"seconds": 0.3})
            results.append((bool(result.is_error), text_of(result)))

        async with anyio.create_task_group() as tasks:
            for _ in range(5):
                tasks.start_soon(one)
                await anyio.sleep(0.01)
        assert sorted(ok for error, ok in results if not error) == ["slept 0.3"] * 3
        refusals = [text for error, text in results if error]
        assert len(refusals) == 2
        assert all("is full (max_queue=2)" in text for text in refusals)

    limits = {"max_concurrency": 1, "queue_timeout": 0.2}
    async with _mux({"limits": limits}) as mux:
        first_and_second: list[str] = []

        async def call(seconds: float) -> None:
            first_and_second.append(text_of(await mux.call_tool("alpha__sleep", {"seconds": seconds})))

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(call, 1.0)
            await anyio.sleep(0.05)
            tasks.start_soon(call, 0.1)
        assert first_and_second[1] == "slept 1.0"
        assert "0.2" in first_and_second[0]
        assert "waiting" in first_and_second[0] or "deadline" in first_and_second[0]


async def test_higher_priority_calls_overtake_queued_low_priority_ones() -> None:
    server = {"limits": {"max_concurrency": 1, "aging_interval": 60}, "priorities": {"echo": 10, "add": -10}}
    async with _mux(server) as mux:
        order: list[str] = []

        async def call(tool: str, arguments: dict[str, Any]) -> None:
            await mux.call_tool(f"alpha__{tool}", arguments)
            order.append(tool)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(call, "sleep", {"seconds": 0.5})
            await anyio.sleep(0.1)
            tasks.start_soon(call, "add", {"a": 1, "b": 2})
            await anyio.sleep(0.05)
            tasks.start_soon(call, "echo", {"text": "urgent"})
        assert order == ["sleep", "echo", "add"]


async def test_clients_named_in_client_priorities_go_first() -> None:
    config = config_from_dict(
        {
            "servers": {"alpha": {**demo("alpha"), "limits": {"max_concurrency": 1, "aging_interval": 60}}},
            "mux": {"client_priorities": {"vip-*": 20}},
        }
    )
    async with Mux(config) as mux:
        order: list[str] = []

        async def call(who: str, arguments: dict[str, Any], tool: str = "echo") -> None:
            await mux.call_tool(f"alpha__{tool}", arguments, caller=Caller(name=who))
            order.append(who)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(call, "first", {"seconds": 0.5}, "sleep")
            await anyio.sleep(0.1)
            tasks.start_soon(call, "cursor", {"text": "a"})
            await anyio.sleep(0.05)
            tasks.start_soon(call, "vip-agent", {"text": "b"})
        assert order == ["first", "vip-agent", "cursor"]
