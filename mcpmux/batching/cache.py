"""`ResultCache`: a TTL + LRU result cache, bounded by entries (and by bytes when asked).

Keys are tuples of strings, e.g. ``(upstream, tool, canonical_json(args))``, so that all entries
of one upstream can be dropped with `invalidate_prefix((upstream,))`. A `scope` (e.g. a client id)
separates entries whose data may be private to one caller; `None` is the shared scope. Tags mark
entries for `invalidate_tag`. Each entry may carry its own TTL (e.g. a server's `ttlMs`).

Errors are never cached: `get_or_compute` stores only what `compute` returns, never what it
raises, and `ttl_for` can refuse a returned value (e.g. an error-shaped result) with TTL 0.
`None` is never stored, because `get` uses it to mean a miss.

Clock: the cache is synchronous and may be used outside an event loop, so it does not read
anyio's clock; it reads `clock` (default `time.monotonic`, which is also what asyncio's loop
reads, so on the real loop the cache and the rest of this package see the same time). A test
passes a clock it advances by hand (or `anyio.current_time` to follow a virtual-time loop)
instead of sleeping through a TTL.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from cachetools import TLRUCache

V = TypeVar("V")
CacheKey = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CachePolicy:
    """Default TTL and size bounds of a `ResultCache`."""

    ttl: float = 60.0
    """Seconds an entry lives unless `put` gives its own TTL."""
    max_entries: int = 1024
    max_bytes: int | None = None
    """Bound on the summed `sizeof` of entries; None = bound by entries only."""

    def __post_init__(self) -> None:
        if self.ttl <= 0:
            raise ValueError(f"cache ttl must be positive seconds, got {self.ttl}")
        if self.max_entries < 1:
            raise ValueError(f"cache max_entries must be at least 1, got {self.max_entries}")
        if self.max_bytes is not None and self.max_bytes < 1:
            raise ValueError(f"cache max_bytes must be at least 1 or None, got {self.max_bytes}")


@dataclass(frozen=True, slots=True)
class CacheStats:
    """Counters since creation and the current fill."""

    name: str
    hits: int
    misses: int
    stores: int
    evictions: int
    invalidations: int
    entries: int
    size: int


@dataclass(slots=True)
class _Stored(Generic[V]):
    value: V
    ttl: float
    tags: frozenset[str]
    size: int


class _CountingCache(TLRUCache):
    """TLRUCache that counts LRU evictions (expiry is not an eviction)."""

    def __init__(self, maxsize: int, getsizeof: Callable[[Any], int] | None, clock: Callable[[], float]) -> None:
        super().__init__(maxsize, ttu=lambda _key, stored, now: now + stored.ttl, timer=clock, getsizeof=getsizeof)
        self.evictions = 0

    def popitem(self) -> Any:
        self.evictions += 1
        return super().popitem()


class ResultCache(Generic[V]):
    """TTL + LRU cache of call results with scopes, tags, prefix invalidation and hit/miss counters.

    `clock` is what TTLs are measured on: a function returning seconds that never go backwards,
    default `time.monotonic` (see the module docstring). An entry put at time ``t`` with TTL ``ttl``
    is served while ``clock() < t + ttl`` and gone from ``clock() >= t + ttl`` on.
    """

    def __init__(
        self,
        policy: CachePolicy | None = None,
        *,
        sizeof: Callable[[V], int] | None = None,
        name: str = "cache",
        clock: Callable[[], float] = time.monotonic,
        label: Callable[[CacheKey], Hashable] | None = None,
    ) -> None:
        """`label`: what hits are counted by besides the total (`hits_by`), e.g. a key's tool; keep it few-valued."""
        self.policy = policy if policy is not None else CachePolicy()
        self.name = name
        self.clock = clock
        if self.policy.max_bytes is not None and sizeof is None:
            raise ValueError(f"cache {name!r} has max_bytes={self.policy.max_bytes} but no sizeof to measure entries")
        self._sizeof = sizeof
        if self.policy.max_bytes is not None:
            self._data = _CountingCache(self.policy.max_bytes, lambda stored: stored.size, clock)
        else:
            self._data = _CountingCache(self.policy.max_entries, None, clock)
        self._hits = 0
        self._label = label
        self.hits_by: dict[Hashable, int] = {}
        """Hits by `label(key)` (empty without a `label`)."""
        self._misses = 0
        self._stores = 0
        self._invalidations = 0

    def get(self, key: CacheKey, *, scope: str | None = None) -> V | None:
        """The live cached value for `key` in `scope`, or None (a miss); counts the hit or miss."""
        stored: _Stored[V] | None = self._data.get((scope, key))
        if stored is None:
            self._misses += 1
            return None
        self._hits += 1
        if self._label is not None:
            label = self._label(key)
            self.hits_by[label] = self.hits_by.get(label, 0) + 1
        return stored.value

    def put(
        self,
        key: CacheKey,
        value: V,
        *,
        scope: str | None = None,
        ttl: float | None = None,
        tags: Iterable[str] = (),
    ) -> bool:
        """Store `value`; `ttl` overrides the default (0 = do not store). False if not stored (too big too)."""
        ttl = self.policy.ttl if ttl is None else ttl
        if value is None or ttl <= 0:
            return False
        size = self._sizeof(value) if self._sizeof is not None else 1
        if self.policy.max_bytes is not None and size > self.policy.max_bytes:
            return False
        self._data[(scope, key)] = _Stored(value, ttl, frozenset(tags), size)
        while len(self._data) > self.policy.max_entries:
            self._data.popitem()
        self._stores += 1
        return True

    async def get_or_compute(
        self,
        key: CacheKey,
        compute: Callable[[], Awaitable[V]],
        *,
        scope: str | None = None,
        ttl: float | None = None,
        ttl_for: Callable[[V], float | None] | None = None,
        tags: Iterable[str] = (),
    ) -> V:
        """Cached value, or `await compute()` stored under `ttl_for(value)` (None = `ttl`, 0 = don't store).

        An exception from `compute` propagates and nothing is stored.
        """
        cached = self.get(key, scope=scope)
        if cached is not None:
            return cached
        value = await compute()
        chosen = ttl_for(value) if ttl_for is not None else None
        self.put(key, value, scope=scope, ttl=ttl if chosen is None else chosen, tags=tags)
        return value

    def invalidate(self, key: CacheKey, *, scope: str | None = None) -> bool:
        """Drop one entry; True if it was there."""
        return self._drop([(scope, key)]) == 1

    def invalidate_prefix(self, prefix: CacheKey) -> int:
        """Drop every entry whose key starts with `prefix`, in every scope; returns how many."""
        return self._drop([k for k in list(self._data.keys()) if k[1][: len(prefix)] == prefix])

    def invalidate_tag(self, tag: str) -> int:
        """Drop every entry carrying `tag`; returns how many."""
        return self._drop([k for k, stored in list(self._data.items()) if tag in stored.tags])

    def invalidate_scope(self, scope: str | None) -> int:
        """Drop every entry of one scope (e.g. a client that disconnected); returns how many."""
        return self._drop([k for k in list(self._data.keys()) if k[0] == scope])

    def clear(self) -> int:
        """Drop everything; returns how many entries there were."""
        return self._drop(list(self._data.keys()))

    def stats(self) -> CacheStats:
        """Hits, misses, stores, evictions, invalidations, live entries and their summed size."""
        self._data.expire()
        return CacheStats(
            name=self.name,
            hits=self._hits,
            misses=self._misses,
            stores=self._stores,
            evictions=self._data.evictions,
            invalidations=self._invalidations,
            entries=len(self._data),
            size=int(self._data.currsize),
        )

    def _drop(self, keys: list[tuple[str | None, CacheKey]]) -> int:
        dropped = sum(1 for k in keys if self._data.pop(k, None) is not None)
        self._invalidations += dropped
        return dropped
