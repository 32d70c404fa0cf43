"""`Signal`: a reusable wake-up for anyio tasks that may be built outside an event loop; `wake_time`: when to wake."""

from __future__ import annotations

import math

import anyio


def wake_time(now: float, delay: float) -> float:
    """The absolute time `delay` seconds after `now`, strictly after `now` whenever `delay > 0`.

    A positive delay that is only a float rounding residue (say 5e-18 s left of a 5 ms window
    measured at t = 0.08) adds nothing to `now`: waking "then" would find the same state and wait
    again at once, a spin that only a moving clock ends (and a virtual-time loop's clock moves only
    when the loop is idle). The next float after `now` is the shortest wait that lets time move.
    """
    at = now + delay
    return math.nextafter(now, math.inf) if delay > 0 and at <= now else at


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
