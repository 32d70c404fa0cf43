"""`SharedStreams`: identical concurrent requests read one generation's deltas.

Two greedy requests with the same prompt, model and settings get the same answer, so the second
need not be computed at all: it reads the deltas of the first, from the beginning, as they come.
The generation runs in the owner's task group, not in the first reader's task, so a reader that
leaves early does not end it for the others; when the last reader leaves, it is cancelled (which
aborts it on its backend). Nothing is kept once it ends: a later identical request runs again.
"""

from __future__ import annotations

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
    grew: anyio.Event = field(default_factory=anyio.Event)
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
        try:
            seen = 0
            while True:
                while seen < len(run.deltas):
                    seen += 1
                    yield run.deltas[seen - 1]
                if run.done:
                    if run.error is not None:
                        raise run.error
                    return
                await run.grew.wait()
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
                        run.grew.set()
                        run.grew = anyio.Event()
        except Exception as err:  # every reader gets it
            run.error = err
        finally:
            if not run.deltas or run.deltas[-1].finish_reason is None:
                run.error = run.error or EngineError("the inference service is shutting down; the request was aborted")
            run.done = True
            run.grew.set()
            self._drop(key, run)

    def _drop(self, key: str, run: _Shared) -> None:
        if self._running.get(key) is run:
            del self._running[key]
