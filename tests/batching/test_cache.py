"""ResultCache: TTL and LRU bounds, per-entry TTL, scopes, invalidation, counters; errors never cached."""

from __future__ import annotations

import math
import time

import pytest

from mcpmux.batching import CachePolicy, ResultCache, call_key


class ManualClock:
    """A clock for `ResultCache(clock=...)` that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def just_before(t: float) -> float:
    """The last float before `t`: the latest moment an entry with expiry `t` is still served."""
    return math.nextafter(t, -math.inf)


def key(tool: str, **args: object) -> tuple[str, ...]:
    return ("weather", *call_key(tool, args))


def test_entries_expire_after_their_ttl_and_a_per_entry_ttl_wins() -> None:
    clock = ManualClock()
    cache: ResultCache[str] = ResultCache(CachePolicy(ttl=0.03), clock=clock)
    cache.put(key("now", city="Paris"), "sunny")
    cache.put(key("now", city="Oslo"), "snow", ttl=0.3)  # e.g. the server's ttlMs
    clock.now = just_before(0.03)
    assert cache.get(key("now", city="Paris")) == "sunny"  # alive for its whole TTL ...
    clock.now = 0.03
    assert cache.get(key("now", city="Paris")) is None  # ... and not an instant longer
    assert cache.get(key("now", city="Oslo")) == "snow"
    clock.now = just_before(0.3)
    assert cache.get(key("now", city="Oslo")) == "snow"
    clock.now = 0.3
    assert cache.get(key("now", city="Oslo")) is None
    assert not cache.put(key("now", city="Rome"), "rain", ttl=0)  # TTL 0: do not cache
    assert cache.get(key("now", city="Rome")) is None
    assert cache.stats().entries == 0


def test_a_ttl_runs_from_the_put_on_the_clock_it_was_given() -> None:
    clock = ManualClock()
    cache: ResultCache[str] = ResultCache(CachePolicy(ttl=10.0), clock=clock)
    clock.now = 100.0
    cache.put(("a",), "first")
    clock.now = 105.0
    cache.put(("a",), "second")  # a fresh put restarts the TTL
    clock.now = just_before(115.0)
    assert cache.get(("a",)) == "second"
    clock.now = 115.0
    assert cache.get(("a",)) is None
    assert ResultCache().clock is time.monotonic  # what mcpmux's own caches use


def test_least_recently_used_entry_is_evicted_at_max_entries() -> None:
    cache: ResultCache[int] = ResultCache(CachePolicy(max_entries=2))
    cache.put(("a",), 1)
    cache.put(("b",), 2)
    assert cache.get(("a",)) == 1  # "b" is now the least recently used
    cache.put(("c",), 3)
    assert (cache.get(("a",)), cache.get(("b",)), cache.get(("c",))) == (1, None, 3)
    assert cache.stats().evictions == 1


def test_byte_bound_evicts_and_refuses_values_larger_than_the_bound() -> None:
    cache: ResultCache[str] = ResultCache(CachePolicy(max_entries=100, max_bytes=10), sizeof=len)
    assert cache.put(("a",), "xxxx")
    assert cache.put(("b",), "yyyy")
    assert cache.put(("c",), "zzzz")  # 12 bytes > 10: "a" goes
    assert cache.get(("a",)) is None
    assert cache.stats().size == 8
    assert not cache.put(("huge",), "x" * 11)
    with pytest.raises(ValueError, match="max_bytes=10 but no sizeof"):
        ResultCache(CachePolicy(max_bytes=10))


def test_scopes_keep_private_results_apart() -> None:
    cache: ResultCache[str] = ResultCache()
    cache.put(key("inbox"), "alice's mail", scope="alice")
    assert cache.get(key("inbox"), scope="bob") is None
    assert cache.get(key("inbox")) is None  # the shared scope does not see it either
    assert cache.get(key("inbox"), scope="alice") == "alice's mail"
    assert cache.invalidate_scope("alice") == 1
    assert cache.get(key("inbox"), scope="alice") is None


def test_invalidate_by_prefix_tag_and_key() -> None:
    cache: ResultCache[str] = ResultCache()
    cache.put(("weather", "now", "{}"), "w1", tags={"geo"})
    cache.put(("weather", "week", "{}"), "w2", scope="alice")
    cache.put(("github", "issues", "{}"), "g1", tags={"geo"})
    assert cache.invalidate_prefix(("weather",)) == 2  # every scope, e.g. on list_changed or restart
    assert cache.get(("github", "issues", "{}")) == "g1"
    assert cache.invalidate_tag("geo") == 1
    assert cache.get(("github", "issues", "{}")) is None
    cache.put(("x",), "y")
    assert cache.invalidate(("x",))
    assert not cache.invalidate(("x",))
    assert cache.stats().invalidations == 4


@pytest.mark.anyio
async def test_get_or_compute_counts_hits_and_never_caches_errors() -> None:
    cache: ResultCache[dict[str, object]] = ResultCache(name="results")
    calls = 0

    async def lookup() -> dict[str, object]:
        nonlocal calls
        calls += 1
        return {"temp": 21}

    async def failing() -> dict[str, object]:
        raise ConnectionError("upstream down")

    for _ in range(3):
        assert await cache.get_or_compute(key("now", city="Paris"), lookup) == {"temp": 21}
    assert calls == 1
    for _ in range(2):
        with pytest.raises(ConnectionError):
            await cache.get_or_compute(key("now", city="Oslo"), failing)
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.stores, stats.entries) == (2, 3, 1, 1)


@pytest.mark.anyio
async def test_ttl_for_refuses_error_shaped_results_and_honours_result_ttls() -> None:
    clock = ManualClock()
    cache: ResultCache[dict[str, object]] = ResultCache(CachePolicy(ttl=60), clock=clock)

    def ttl_for(result: dict[str, object]) -> float | None:
        if result.get("isError"):
            return 0
        ttl_ms = result.get("ttlMs")
        return ttl_ms / 1000 if isinstance(ttl_ms, int) else None

    async def error_result() -> dict[str, object]:
        return {"isError": True, "content": "rate limited"}

    async def short_lived() -> dict[str, object]:
        return {"content": "fresh", "ttlMs": 20}

    await cache.get_or_compute(("e",), error_result, ttl_for=ttl_for)
    await cache.get_or_compute(("s",), short_lived, ttl_for=ttl_for)
    assert cache.get(("e",)) is None
    clock.now = just_before(0.02)
    assert cache.get(("s",)) == {"content": "fresh", "ttlMs": 20}  # the result's 20 ms, not the default 60 s
    clock.now = 0.02
    assert cache.get(("s",)) is None
    assert cache.stats().entries == 0


def test_policy_validation() -> None:
    with pytest.raises(ValueError, match="ttl must be positive"):
        CachePolicy(ttl=0)
