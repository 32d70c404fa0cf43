"""Every client call in flight, so that shutdown can drain them and a reload can cancel some.

`CallTracker.track(upstream)` wraps one call; `drain()` lets the calls finish within the shutdown
grace and cancels the rest, each with an error that says why; `refuse(upstream, reason)` cancels the
calls of one upstream (a reload stopping it) and refuses new ones until `admit(upstream)`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import TracebackType

import anyio

from mcpmux.core.inbound import InboundCall
from mcpmux.errors import UpstreamUnavailableError

logger = logging.getLogger(__name__)

# How long cancelled calls get to unwind and send their error before shutdown goes on without them.
_UNWIND_SECONDS = 5.0


class CallCancelledError(UpstreamUnavailableError):
    """mcpmux cancelled the call (shutdown past its grace period, or its upstream stopped by a reload)."""


# -- in-flight calls -------------------------------------------------------------------------------


class TrackedCall:
    """One client call in flight: a cancel scope mcpmux can cancel with a reason (a sync context manager).

    Entering raises `CallCancelledError` when new calls are refused (shutting down, or the upstream is
    being restarted by a reload); leaving a call that mcpmux cancelled raises `CallCancelledError`
    with the reason, in place of the cancellation or of the error the cancellation caused.
    """

    __slots__ = ("_admitted", "_reason", "_scope", "_tracker", "caller", "on_cancel", "session", "upstream")

    def __init__(
        self, tracker: CallTracker, upstream: str | None, caller: InboundCall | None = None, session: object = None
    ) -> None:
        self._tracker = tracker
        self.upstream = upstream
        self.caller = caller
        """The inbound call it serves (None: the library's, or mcpmux's own)."""
        self.session = session
        """The upstream session it went to, once known (`Upstream`): where its upstream's requests are attributed."""
        self._scope: anyio.CancelScope | None = None
        """Made when the call is entered: a fast-path call, with no task, needs none."""
        self._reason: str | None = None
        self._admitted = False
        self.on_cancel: Callable[[], None] | None = None
        """Told when mcpmux cancels the call: a call admitted early may have no task in its `with` yet."""

    def admit(self) -> None:
        """Count the call in now, before the `with` (which then does not again); raises as entering does.

        Once admitted, the call must be entered and left, or shutdown waits for it in vain.
        """
        if not self._admitted:
            self._tracker._admit(self)
            self._admitted = True

    def release(self) -> None:
        """Count out a call admitted with `admit` that ended without entering its `with`."""
        self._tracker._release(self)

    def cancel(self, reason: str) -> None:
        """Cancel the call; its caller gets `CallCancelledError(reason)`."""
        self._reason = reason
        if self._scope is not None:
            self._scope.cancel()
        if self.on_cancel is not None:
            self.on_cancel()

    def __enter__(self) -> TrackedCall:
        self.admit()
        self._scope = anyio.CancelScope()
        if self._reason is not None:
            self._scope.cancel()  # cancelled before it was entered
        self._scope.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._scope is not None
        try:
            swallowed = self._scope.__exit__(exc_type, exc, tb)
        finally:
            self._tracker._release(self)
        # The scope swallows only our own cancellation, which always has a reason. An outer cancellation
        # (the client's, or the Mux closing) is not ours to turn into an error.
        if self._reason is not None and exc_type is not None and (swallowed or issubclass(exc_type, Exception)):
            raise CallCancelledError(self._reason) from None


class CallTracker:
    """The client calls in flight, so that shutdown can wait for them and a reload can cancel some."""

    def __init__(self) -> None:
        self._calls: dict[TrackedCall, None] = {}
        """In the order they were admitted."""
        self._idle: anyio.Event | None = None
        """Set when the last call in flight ends; made only while `drain` waits for that."""
        self._refusing: dict[str | None, str] = {}  # upstream (None: every call) -> why new calls are refused

    def track(
        self, upstream: str | None = None, caller: InboundCall | None = None, session: object = None
    ) -> TrackedCall:
        """A context manager around one call (to `upstream`, or to a local tool when None) serving
        `caller`, on the upstream session `session` (settable later, `TrackedCall.session`)."""
        return TrackedCall(self, upstream, caller, session)

    def callers(self, session: object) -> list[InboundCall | None]:
        """The inbound calls in flight on one upstream session, oldest first (None: a call of nobody's)."""
        return [call.caller for call in self._calls if call.session is session]

    def in_flight(self, upstream: str) -> int:
        """How many calls to `upstream` are in flight now (tool calls, resource reads, prompts, completions)."""
        return sum(1 for call in self._calls if call.upstream == upstream)

    def refuse(self, upstream: str | None, reason: str) -> None:
        """Refuse new calls to `upstream` (every call when None) and cancel those in flight, with `reason`."""
        self._refusing[upstream] = reason
        for call in list(self._calls):
            if upstream is None or call.upstream == upstream:
                call.cancel(reason)

    def admit(self, upstream: str) -> None:
        """Accept calls to `upstream` again."""
        self._refusing.pop(upstream, None)

    async def drain(self, grace: float, skip: anyio.Event | None = None) -> int:
        """Refuse new calls, wait up to `grace` seconds (or until `skip` is set) for those in flight, then
        cancel the rest with an error that says so; returns how many were cancelled."""
        self._refusing[None] = "mcpmux is shutting down and accepts no new calls"
        idle = self._idle = anyio.Event()  # no call is admitted from here on: set once the last one ends
        if self._calls:
            logger.warning("shutting down: waiting up to %g s for %d call(s) in flight", grace, len(self._calls))
            with anyio.move_on_after(grace):
                await _first_of(idle, skip or anyio.Event())
        late = list(self._calls)
        if skip is not None and skip.is_set():
            why = "mcpmux is shutting down: the call was cancelled (a second signal cut the grace period short)"
        else:
            why = f"mcpmux is shutting down: the call was cancelled after the {grace:g} s grace period"
        for call in late:
            call.cancel(why)
        if late:
            logger.warning("shutting down: cancelled %d call(s) still in flight", len(late))
            with anyio.move_on_after(_UNWIND_SECONDS):
                await idle.wait()
        return len(late)

    def refusal(self, upstream: str | None) -> str | None:
        """Why a new call to `upstream` would be refused right now; None when it would be admitted."""
        if not self._refusing:
            return None
        return self._refusing.get(None) or self._refusing.get(upstream)

    def _admit(self, call: TrackedCall) -> None:
        reason = self.refusal(call.upstream)
        if reason is not None:
            raise CallCancelledError(reason)
        self._calls[call] = None

    def _release(self, call: TrackedCall) -> None:
        self._calls.pop(call, None)
        if not self._calls and self._idle is not None:
            self._idle.set()


async def _first_of(*events: anyio.Event) -> None:
    async with anyio.create_task_group() as tasks:

        async def wait(event: anyio.Event) -> None:
            await event.wait()
            tasks.cancel_scope.cancel()

        for event in events:
            tasks.start_soon(wait, event)


# -- per-upstream lifetimes ------------------------------------------------------------------------
