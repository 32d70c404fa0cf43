"""`SharedStreams`: identical concurrent requests read one generation's deltas.

Two greedy requests with the same prompt, model and settings get the same answer, so the second
need not be computed at all: it reads the deltas of the first, from the beginning, as they come.
The generation runs in the owner's task group, not in the first reader's task, so a reader that
leaves early does not end it for the others; when the last reader leaves, it is cancelled (which
aborts it on its backend). Nothing is kept once it ends: a later identical request runs again.

A reader waits on a bare asyncio future that the generation resolves with each delta: that
hand-over happens for every delta of every greedy request, and an `anyio.Event` made, set and
waited on per delta cost ~10 µs more each time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskGroup

from mcpmux.inference.errors import EngineError
from mcpmux.inference.serving.delta import Delta


@dataclass(slots=True, eq=False)
class _Shared:
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    deltas: list[Delta] = field(default_factory=list)
    waiters: list[asyncio.Future[None]] = field(default_factory=list)  # readers that have read every delta
    done: bool = False
    error: BaseException | None = None
    readers: int = 0


class SharedStreams:
    """Runs at most one generation per key at a time; `shared` counts the requests that joined one."""

    def __init__(self, task_group: TaskGroup) -> None:
        self._task_group = task_group
        self._running: dict[str, _Shared] = {}
        self.shared = 0

    async def stream(self, key: str, start: Callable[[], AsyncGenerator[Delta, None]]) -> AsyncGenerator[Delta, None]:
        """The deltas of the generation `start()` makes, shared with every concurrent reader of `key`."""
        run = self._running.get(key)
        if run is None:
            run = self._running[key] = _Shared()
            self._task_group.start_soon(self._run, key, run, start)
        else:
            self.shared += 1
        run.readers += 1
        loop = asyncio.get_running_loop()
        try:
            seen = 0
            deltas = run.deltas
            while True:
                while seen < len(deltas):
                    seen += 1
                    yield deltas[seen - 1]
                if run.done:
                    if run.error is not None:
                        raise run.error
                    return
                waiter = loop.create_future()
                run.waiters.append(waiter)
                await waiter
        finally:
            run.readers -= 1
            if run.readers == 0 and not run.done:  # nobody wants the answer any more
                run.scope.cancel()
                self._drop(key, run)

    async def _run(self, key: str, run: _Shared, start: Callable[[], AsyncGenerator[Delta, None]]) -> None:
        try:
            with run.scope:
                async with aclosing(start()) as deltas:
                    async for delta in deltas:
                        run.deltas.append(delta)
                        _wake(run)
        except Exception as err:  # every reader gets it
            run.error = err
        finally:
            if not run.deltas or run.deltas[-1].finish_reason is None:
                run.error = run.error or EngineError("the inference service is shutting down; the request was aborted")
            run.done = True
            _wake(run)
            self._drop(key, run)

    def _drop(self, key: str, run: _Shared) -> None:
        if self._running.get(key) is run:
            del self._running[key]


def _wake(run: _Shared) -> None:
    """Resume the readers waiting for the next delta (or the end); a cancelled one is already gone."""
    waiters, run.waiters = run.waiters, []
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)
