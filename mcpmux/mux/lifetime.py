"""One upstream session's lifetime: its supervisor and executor, in a cancel scope of their own."""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskGroup, TaskStatus

from mcpmux.mux.dispatcher import UpstreamDispatcher
from mcpmux.upstream.supervisor import Upstream


@dataclass(slots=True)
class UpstreamLifetime:
    """One upstream's supervisor and dispatcher, in a cancel scope of their own: it stops alone."""

    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    stopped: anyio.Event = field(default_factory=anyio.Event)

    @classmethod
    async def start(cls, tasks: TaskGroup, upstream: Upstream, dispatcher: UpstreamDispatcher) -> UpstreamLifetime:
        """Start `upstream.run()` and the dispatcher's tasks in `tasks`; returns once the dispatcher runs."""
        lifetime = cls()
        await tasks.start(lifetime._run, upstream, dispatcher, name=f"upstream {upstream.name}")
        return lifetime

    async def stop(self) -> None:
        """Stop the supervisor (its child process ends) and the dispatcher; returns when both have."""
        self.scope.cancel()
        await self.stopped.wait()

    async def _run(self, upstream: Upstream, dispatcher: UpstreamDispatcher, *, task_status: TaskStatus[None]) -> None:
        # Entered and left in this one task, as anyio requires of the dispatcher's task groups.
        try:
            with self.scope:
                async with AsyncExitStack() as stack:
                    await dispatcher.start(stack)
                    task_status.started()
                    await upstream.run()
        finally:
            self.stopped.set()
