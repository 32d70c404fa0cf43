"""`SingleFlight`: identical concurrent calls share one execution, its result and its error.

    async with SingleFlight[str, Result](name="search") as flights:
        result = await flights.call(call_key("search", args), lambda: upstream.call("search", args))

The shared call runs in the single-flight's own task group, not in the first caller's task, so a
caller that is cancelled does not cancel it while others still wait for it; when the last waiter
leaves, the call is cancelled because nobody wants its answer. Nothing is remembered once the
call ends (that is the cache's job): the next call with the same key runs again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Generic, TypeVar, cast

import anyio
from anyio.abc import TaskGroup

from mcpmux.batching.errors import ClosedError

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class SingleFlightStats:
    """Executions started, calls that joined one already running, and calls running now."""

    name: str
    executions: int
    shared: int
    in_flight: int


@dataclass(slots=True, eq=False)
class _Flight(Generic[V]):
    scope: anyio.CancelScope
    done: anyio.Event = field(default_factory=anyio.Event)
    waiters: int = 0
    result: V | None = None
    error: BaseException | None = None


class SingleFlight(Generic[K, V]):
    """Runs at most one call per key at a time; concurrent callers of that key share it."""

    def __init__(self, *, name: str = "single-flight") -> None:
        self.name = name
        self._flights: dict[K, _Flight[V]] = {}
        self._task_group: TaskGroup | None = None
        self._closed = False
        self._executions = 0
        self._shared = 0

    async def __aenter__(self) -> SingleFlight[K, V]:
        if self._task_group is not None:
            raise RuntimeError(f"SingleFlight {self.name!r} can be entered only once; make a new one")
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        assert self._task_group is not None
        self._closed = True
        # Leaving while calls run would strand their waiters; cancel them, waiters get ClosedError.
        self._task_group.cancel_scope.cancel()
        # The owner's own error propagates as itself, not wrapped in a task group's ExceptionGroup.
        await self._task_group.__aexit__(None, None, None)
        return None

    async def call(self, key: K, fn: Callable[[], Awaitable[V]]) -> V:
        """Run `fn()` unless a call with `key` is already running, then wait for that one instead."""
        if self._task_group is None:
            raise RuntimeError(f"SingleFlight {self.name!r} is not running: enter it with `async with`")
        if self._closed:
            raise ClosedError(self.name, "being submitted")
        flight = self._flights.get(key)
        if flight is None:
            flight = _Flight(scope=anyio.CancelScope())
            self._flights[key] = flight
            self._executions += 1
            self._task_group.start_soon(self._run, key, flight, fn)
        else:
            self._shared += 1
        flight.waiters += 1
        try:
            await flight.done.wait()
        finally:
            flight.waiters -= 1
            if flight.waiters == 0 and not flight.done.is_set():
                flight.scope.cancel()
        if flight.error is not None:
            raise flight.error
        return cast(V, flight.result)

    def stats(self) -> SingleFlightStats:
        """Counters since creation."""
        return SingleFlightStats(self.name, self._executions, self._shared, len(self._flights))

    async def _run(self, key: K, flight: _Flight[V], fn: Callable[[], Awaitable[V]]) -> None:
        completed = False
        try:
            with flight.scope:
                try:
                    flight.result = await fn()
                except Exception as exc:
                    flight.error = exc
                completed = True
        finally:
            if not completed:
                flight.error = ClosedError(self.name, "running a shared call that was cancelled")
            if self._flights.get(key) is flight:
                del self._flights[key]
            flight.done.set()
