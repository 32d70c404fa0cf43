"""An asyncio event loop on virtual time: timers fire at once, and the clock jumps to them.

`VirtualTimeLoop.time()` (which is what `anyio.current_time()`, `anyio.sleep`, deadlines and cancel
scopes read) returns a virtual `now` that starts at 0.0 and moves only while the loop is idle: when
no callback is ready and no I/O is ready, the loop would sleep until its next timer; instead `now`
advances by exactly that wait and the loop goes on at once. So `await anyio.sleep(5)` takes
microseconds and `anyio.current_time()` moves by 5, however busy the machine is.

What it guarantees:

- Time never passes while code runs: between two awaits that do not block, `now` is unchanged, so
  the times a test sees are the sums of its own sleeps, timeouts and deadlines (up to float rounding
  in the last bit: compare with `pytest.approx(..., rel=1e-9)`, or exactly where no sum is involved).
- Timers fire in order of their due time, by asyncio's own timer heap, as on a real loop.
- Ready I/O is still served: each idle step first polls the real selector without waiting, and when
  no timer is set at all it blocks on the real selector, so a wake-up from another thread
  (`call_soon_threadsafe`) still gets through.

What it does not guarantee: anything that waits outside the loop. Code that waits on a thread, a
subprocess or real I/O *with a timeout* sees virtual time jump past that timeout as soon as the loop
is otherwise idle, because the loop cannot know the wait will end. Keep such tests on the real loop.

    anyio.run(main, backend_options={"loop_factory": VirtualTimeLoop})
    # or, for anyio's pytest plugin: an `anyio_backend` fixture returning VIRTUAL_TIME_BACKEND
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

T = TypeVar("T")


class _IdleAdvancingSelector(selectors.DefaultSelector):
    """The platform's selector, except that an idle wait with a timeout advances the loop's clock."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # no timer at all: only I/O (or another thread) can wake the loop
            return super().select(None)
        self._loop.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose `time()` is virtual and jumps to the next timer whenever the loop is idle."""

    def __init__(self) -> None:
        self._now = 0.0
        super().__init__(_IdleAdvancingSelector(self))

    def time(self) -> float:
        """The virtual time, in seconds since the loop was made."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the virtual clock forward (the selector does this when the loop would sleep)."""
        if seconds < 0:
            raise ValueError(f"virtual time only moves forward, got {seconds} s")
        self._now += seconds


VIRTUAL_TIME_BACKEND: tuple[str, dict[str, Any]] = ("asyncio", {"loop_factory": VirtualTimeLoop})
"""What an `anyio_backend` fixture returns to run `@pytest.mark.anyio` tests on virtual time."""


def run_virtual(main: Callable[[], Awaitable[T]]) -> T:
    """`anyio.run(main)` on a fresh `VirtualTimeLoop`."""
    return anyio.run(main, backend="asyncio", backend_options={"loop_factory": VirtualTimeLoop})
