"""`SingleFlight`: identical concurrent calls share one execution, its result and its error.

    async with SingleFlight[str, Result](name="search") as flights:
        result = await flights.call(call_key("search", args), lambda: upstream.call("search", args))

The shared call runs in the single-flight's own task group, not in the first caller's task, so a
caller that is cancelled does not cancel it while others still wait for it; when the last waiter
leaves, the call is cancelled because nobody wants its answer. Nothing is remembered once the
call ends (that is the cache's job): the next call with the same key runs again.

A caller that runs the call itself, with no task (mcpmux's fast path writes the request from the
code that read it), claims the key with `lead` instead; identical calls wait for its `Lead` as for
any shared call, and get its value, its error, or (when it is abandoned) run the call again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeVar, cast

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
    scope: anyio.CancelScope | None
    """The task that runs the call; None for a `Lead` (its caller runs it)."""
    done: anyio.Event | None = None
    """Made by the first waiter: a `Lead` may be claimed where there is no event loop to ask for one."""
    finished: bool = False
    waiters: int = 0
    result: V | None = None
    error: BaseException | None = None
    abandoned: bool = False
    """Its lead gave up without an answer: whoever waits runs the call anew."""


class SingleFlight(Generic[K, V]):
    """Runs at most one call per key at a time; concurrent callers of that key share it."""

    def __init__(self, *, name: str = "single-flight", label: Callable[[K], Hashable] | None = None) -> None:
        """`label`: what shared calls are counted by besides the total (`shared_by`); keep it few-valued."""
        self.name = name
        self._label = label
        self.shared_by: dict[Hashable, int] = {}
        """Calls that joined another's flight, by `label(key)` (empty without a `label`)."""
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
        while True:
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
                if self._label is not None:
                    label = self._label(key)
                    self.shared_by[label] = self.shared_by.get(label, 0) + 1
            flight.waiters += 1
            try:
                if flight.done is None:
                    flight.done = anyio.Event()
                await flight.done.wait()
            finally:
                flight.waiters -= 1
                if flight.waiters == 0 and not flight.finished and flight.scope is not None:
                    flight.scope.cancel()
            if not flight.abandoned:
                break
        if flight.error is not None:
            raise flight.error
        return cast(V, flight.result)

    def lead(self, key: K) -> Lead[V] | None:
        """Claim `key` for a call its caller runs itself; None (nothing claimed) when a call with
        `key` is under way already, or the single-flight is not running. The lead must be ended once."""
        if self._task_group is None or self._closed or key in self._flights:
            return None
        flight: _Flight[V] = _Flight(scope=None)
        self._flights[key] = flight
        self._executions += 1
        return Lead(self, key, flight)

    def _end(self, key: K, flight: _Flight[V]) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]
        flight.finished = True
        if flight.done is not None:
            flight.done.set()

    def stats(self) -> SingleFlightStats:
        """Counters since creation."""
        return SingleFlightStats(self.name, self._executions, self._shared, len(self._flights))

    async def _run(self, key: K, flight: _Flight[V], fn: Callable[[], Awaitable[V]]) -> None:
        completed = False
        assert flight.scope is not None
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
            self._end(key, flight)


class Lead(Generic[V]):
    """A shared call its first caller runs itself (`SingleFlight.lead`). End it once: `finish` with
    the value, `fail` with the error, or `abandon` (its caller gave up: the waiters run the call
    themselves). Whatever comes after the first end is ignored."""

    __slots__ = ("_flight", "_key", "_owner")

    def __init__(self, owner: SingleFlight[Any, V], key: Hashable, flight: _Flight[V]) -> None:
        self._owner, self._key, self._flight = owner, key, flight

    @property
    def waiting(self) -> int:
        """How many identical calls wait for its value now."""
        return self._flight.waiters

    @property
    def ended(self) -> bool:
        return self._flight.finished

    def finish(self, value: V) -> None:
        if not self.ended:
            self._flight.result = value
            self._owner._end(self._key, self._flight)

    def fail(self, error: Exception) -> None:
        if not self.ended:
            self._flight.error = error
            self._owner._end(self._key, self._flight)

    def abandon(self) -> None:
        if not self.ended:
            self._flight.abandoned = True
            self._owner._end(self._key, self._flight)
