"""`Signal`: a reusable wake-up for anyio tasks that may be built outside an event loop."""

from __future__ import annotations

import anyio


class Signal:
    """Broadcast wake-up: `wait` sleeps until the next `fire` (or an absolute anyio time).

    An `anyio.Event` cannot be created outside a running loop and fires only once; this makes a
    fresh one on demand, so long-lived objects (queues, batchers) can be built in plain sync code.
    """

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event: anyio.Event | None = None

    def fire(self) -> None:
        """Wake every task now waiting; later waits wait for the next fire."""
        if self._event is not None:
            self._event.set()
            self._event = None

    async def wait(self, until: float | None = None) -> None:
        """Sleep until the next `fire`, or until `until` (absolute `anyio.current_time()`) passes."""
        if self._event is None:
            self._event = anyio.Event()
        event = self._event
        with anyio.CancelScope(deadline=until if until is not None else float("inf")):
            await event.wait()
