"""One relayed call between a front and the executor: the front's sink, and the call in flight.

Every front hands a `tools/call` that `FastPath.route` takes to this module, and does nothing else
for the call: it parses and writes. A front that reads requests from synchronous code (stdio lines,
raw HTTP below ASGI) calls `serve` with a `CallSink`: where the call's response and progress are
written, and how the front runs a task. `serve` launches the call where it can (`FastPath.launch`:
the answer is written from the code that reads it off the upstream's wire, with no task), and
otherwise, or once something needs one (progress, an error, a timeout, a cancellation), runs
`FastPath.answer` in a task the sink starts. The front keeps the `ServedCall` it gets back, to
cancel the call. A front whose request already runs in a task of its own (the SDK's request
handler, the ASGI middleware) awaits `answered` in that task instead: the same answer, the same
error mapping and result shaping, and cancelling that task cancels the call.

Every request is answered exactly once: with its result; as the sink's `withhold` answers it if it
was cancelled first (not at all on stdio, the SDK's -32800 on a 2025 HTTP session); or with an
internal error if serving it failed unexpectedly (logged). `ended` tells the front, once, that the
call is over for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import mcp_types as types

from mcpmux.core.inbound import InboundCall, serving
from mcpmux.mux.fast_path import FastCall, FastPath, Launched
from mcpmux.upstream.lane import ProgressFn

logger = logging.getLogger(__name__)


class CallSink(Protocol):
    """What a front gives `serve` for one call."""

    @property
    def progress(self) -> ProgressFn | None:
        """Where the call's progress goes (None: the client asked for none)."""

    def respond_now(self, response: dict[str, Any]) -> bool:
        """Write the JSON-RPC response at once, from synchronous code; False when it cannot go out now."""

    async def respond(self, response: dict[str, Any]) -> None:
        """Write the JSON-RPC response (from the call's task)."""

    def start(self, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run `work` in a task the front owns; `RuntimeError` when the front can start none (it ended)."""

    async def withhold(self, call: FastCall) -> None:
        """Answer a call cancelled before its answer, as the front's protocol says (or not at all)."""

    def ended(self) -> None:
        """The call is over for the front (answered, abandoned, or its task ended); called once."""


@dataclass(slots=True, eq=False)
class ServedCall:
    """A call `serve` took on, for its front to cancel."""

    call: FastCall
    sink: CallSink
    launched: Launched | None = None
    """The launched call, while it may still need a task (None: it was not launched)."""
    scope: anyio.CancelScope | None = None
    """Its task's scope, once it has a task."""
    cancelled: bool = False
    answered: bool = False
    """Whether its response went out."""
    over: bool = False

    def cancel(self) -> None:
        """The client cancelled the call (or went away): its answer is withheld, the upstream told."""
        self.cancelled = True
        if self.scope is not None:
            self.scope.cancel()
        if self.launched is not None:
            self.launched.wake()  # a launched call with no task yet gets one, to tell the upstream

    def detach(self) -> None:
        """The front is closing: a launched call still without a task gets one (which the front then cancels)."""
        if self.launched is not None:
            self.launched.wake()

    def end(self) -> None:
        if not self.over:
            self.over = True
            self.sink.ended()


def noted(response: dict[str, Any], inbound: InboundCall) -> dict[str, Any]:
    """`response` (a JSON-RPC response about to be written) with the notes for the model its call
    gathered (why an elicitation was declined) added to its result, as the SDK path adds them."""
    notes = inbound.take_notes() if inbound.notes else None
    result = response.get("result")
    if not notes or not isinstance(result, dict) or not isinstance(result.get("content"), list):
        return response
    blocks = [{"type": "text", "text": note} for note in notes]
    return {**response, "result": {**result, "content": [*result["content"], *blocks]}}


def serve(fast: FastPath, call: FastCall, sink: CallSink) -> ServedCall:
    """Take on `call`: launched right here when it can be, else in a task the sink starts."""
    served = ServedCall(call, sink)

    def deliver_now(response: dict[str, Any]) -> bool:
        if served.cancelled or not sink.respond_now(noted(response, call.inbound)):
            return False  # its task answers (a cancelled call, through `withhold`)
        served.answered = True
        served.end()  # answered: a cancellation for it is too late
        return True

    def escalate() -> None:
        try:
            sink.start(lambda: _answer(fast, served))
        except RuntimeError:  # the front has ended abnormally: nobody is left to answer
            assert served.launched is not None
            fast.abandon(call, served.launched)
            served.end()

    try:
        served.launched = fast.launch(call, deliver_now, escalate)
        if served.launched is None:
            sink.start(lambda: _answer(fast, served))
    except BaseException:
        served.end()
        raise
    return served


async def _answer(fast: FastPath, served: ServedCall) -> None:
    """Serve the call in its task (`FastPath.answer`), then write what a cancelled or failed call gets."""
    call, sink = served.call, served.sink

    async def deliver(response: dict[str, Any]) -> None:
        if not served.cancelled:  # a call cancelled before its answer is answered through `withhold`
            served.answered = True
            await sink.respond(noted(response, call.inbound))

    served.scope = anyio.CancelScope()
    if served.cancelled:
        served.scope.cancel()
    failed = False
    try:
        with served.scope, serving(call.inbound):
            await fast.answer(call, sink.progress, deliver=deliver, launched=served.launched)
    except Exception:  # the request still gets an answer, as an unexpected error does on the SDK path
        logger.exception("fast-path call %r failed", call.tool)
        failed = True
    finally:
        served.end()
    if served.answered:
        return
    if served.cancelled:  # even if the call ended before it could notice: the result was withheld
        await sink.withhold(call)
    elif failed:
        error = {"code": types.INTERNAL_ERROR, "message": "Internal error"}
        await sink.respond({"jsonrpc": "2.0", "id": call.request_id, "error": error})


async def answered(fast: FastPath, call: FastCall, progress: ProgressFn | None) -> dict[str, Any]:
    """`call`'s JSON-RPC response, served in the caller's own task (`serve`'s task form). Cancelling
    that task cancels the call; its front answers a cancelled request as its protocol says."""
    sink = _Kept(progress)
    await _answer(fast, ServedCall(call, sink))
    assert sink.response is not None  # `_answer` answers every call it was not told to withhold
    return sink.response


@dataclass(slots=True)
class _Kept:
    """The sink of a call served in its caller's task: the response is kept for the caller to write."""

    progress: ProgressFn | None
    response: dict[str, Any] | None = None

    def respond_now(self, response: dict[str, Any]) -> bool:
        self.response = response
        return True

    async def respond(self, response: dict[str, Any]) -> None:
        self.response = response

    def start(self, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        raise RuntimeError("a call served in its caller's task starts no other")  # never asked: nothing is launched

    async def withhold(self, call: FastCall) -> None:
        """Never asked: the caller cancels the call by cancelling its own task."""

    def ended(self) -> None:
        pass
