"""The async engine: an `LLMEngine` stepping in its own thread, talked to from the event loop.

The event loop never runs a step. Requests and aborts go to the step thread through a thread-safe
queue; each step's outputs are appended to per-request buffers and the waiting consumers are woken
through the loop's token (one hop per step). Breaking out of `generate` (or cancelling it) aborts
the request. Use as `engine = await Engine.start(cfg)` ... `await engine.shutdown()`, or as
`async with await Engine.start(cfg) as engine:`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from contextlib import suppress
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from mcpmux.inference.engine.config import EngineConfig, SamplingParams
from mcpmux.inference.engine.llm_engine import LLMEngine, Prompt, RequestOutput
from mcpmux.inference.engine.outputs import Completion, TokenLogprob
from mcpmux.inference.engine.stats import EngineStats
from mcpmux.inference.errors import EngineError
from mcpmux.inference.models.loader import LoadedModel

if TYPE_CHECKING:
    from mcpmux.inference.engine.grammar import GrammarMatcher

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Stream:
    """One request's outputs, filled by the step thread and drained on the event loop."""

    items: deque[RequestOutput | BaseException] = field(default_factory=deque)
    waiter: anyio.Event | None = None


@dataclass(slots=True)
class _Add:
    request_id: str
    prompt: Prompt
    params: SamplingParams
    priority: int
    arrival_time: float
    stream: _Stream
    matcher: GrammarMatcher | None


@dataclass(slots=True)
class _Abort:
    request_id: str


_STOP = object()


class Engine:
    """Continuous-batching inference, served to async callers."""

    def __init__(self, config: EngineConfig, loaded: LoadedModel | None, token: anyio.lowlevel.EventLoopToken) -> None:
        self._token = token
        self._inbox: queue.SimpleQueue[_Add | _Abort | object] = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}  # owned by the step thread
        self._closed = False
        self._ready = anyio.Event()
        self._failure: BaseException | None = None
        self._core: LLMEngine  # built by the step thread, before `_ready` is set
        self._stats: EngineStats
        self._thread = threading.Thread(target=self._run, args=(config, loaded), name="mcpmux-engine", daemon=True)

    @classmethod
    async def start(cls, config: EngineConfig, loaded: LoadedModel | None = None) -> Engine:
        """Start the step thread; it loads the model (unless given) and builds the engine, then steps.

        The step thread does all of the engine's torch work, building included: on CPU each thread
        that runs a parallel torch op keeps its own OpenMP team, and once the process has more team
        threads than cores libgomp stops spinning between parallel regions and puts its threads to
        sleep instead, which slowed every step by about a third (docs/engineperf.md, round 3).
        """
        engine = cls(config, loaded, anyio.lowlevel.current_token())
        engine._thread.start()
        with anyio.CancelScope(shield=True):  # building cannot be interrupted: wait for its outcome
            await engine._ready.wait()
            if engine._failure is not None:
                await anyio.to_thread.run_sync(engine._thread.join)
                raise engine._failure
        try:
            await anyio.lowlevel.checkpoint()  # a cancellation that came while building lands here
        except BaseException:
            with anyio.CancelScope(shield=True):
                await engine.shutdown()
            raise
        return engine

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.shutdown()

    @property
    def core(self) -> LLMEngine:
        """The synchronous core (its tokenizer and model); do not step it while the engine runs."""
        return self._core

    async def generate(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        priority: int = 0,
        request_id: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Stream a request's deltas: a prompt string, chat messages or token ids. Larger `priority`
        runs first. Errors (queue full, too large, a grammar that cannot be used) are raised on the
        first iteration. A grammar is compiled in a worker thread, never on the step loop."""
        if self._closed:
            raise EngineError("the engine is shut down; start a new one with Engine.start()")
        rid = request_id or uuid.uuid4().hex
        params = params or SamplingParams()
        arrival = time.perf_counter()
        matcher = None
        if params.grammar is not None:
            matcher = await anyio.to_thread.run_sync(self._core.compile_grammar, params.grammar)
        stream = _Stream()
        self._inbox.put(_Add(rid, prompt, params, priority, arrival, stream, matcher))
        finished = False
        try:
            while True:
                while not stream.items:
                    stream.waiter = anyio.Event()
                    if not stream.items:
                        await stream.waiter.wait()
                item = stream.items.popleft()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self.abort(rid)

    async def complete(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        priority: int = 0,
        request_id: str | None = None,
    ) -> Completion:
        """Run a request to the end and return the whole result."""
        text: list[str] = []
        tokens: list[int] = []
        logprobs: list[TokenLogprob] = []
        last: RequestOutput | None = None
        async for delta in self.generate(prompt, params, priority, request_id):
            text.append(delta.text)
            tokens += delta.token_ids
            logprobs += delta.logprobs
            last = delta
        # generate always ends on a finished delta (or raises), so `last` carries the totals.
        assert last is not None
        assert last.finish_reason is not None
        wants_logprobs = params is not None and params.logprobs is not None
        return Completion(
            last.request_id,
            "".join(text),
            tokens,
            last.finish_reason,
            last.prompt_tokens,
            last.cached_prompt_tokens,
            last.completion_tokens,
            logprobs if wants_logprobs else None,
        )

    def abort(self, request_id: str) -> None:
        """Stop a request; its stream ends with finish_reason "abort". Unknown ids are ignored."""
        if not self._closed:
            self._inbox.put(_Abort(request_id))

    def stats(self) -> EngineStats:
        """The latest snapshot, refreshed after every step."""
        return self._stats

    async def shutdown(self) -> None:
        """Abort what is in flight, stop the step thread and wait for it, even when cancelled: a step
        thread still running as the interpreter exits aborts the process as its tensors are freed."""
        if not self._closed:
            self._closed = True
            self._inbox.put(_STOP)
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._thread.join)

    # --- the step thread -------------------------------------------------------------------------

    def _run(self, config: EngineConfig, loaded: LoadedModel | None) -> None:
        try:
            self._core = LLMEngine(config, loaded)
            self._stats = self._core.stats()
        except BaseException as exc:  # reported by start(), which then joins this thread
            self._failure = exc
        with suppress(RuntimeError):  # the event loop is gone: nobody is waiting
            anyio.from_thread.run_sync(self._ready.set, token=self._token)
        if self._failure is None:
            self._serve()

    def _serve(self) -> None:
        while True:
            # Block only when idle; while requests run, take what has arrived and keep stepping.
            cmds = [self._inbox.get()] if not self._core.has_unfinished() else []
            while True:
                try:
                    cmds.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
            outputs: list[RequestOutput] = []
            touched: list[_Stream] = []
            stop = False
            for cmd in cmds:
                if cmd is _STOP:
                    stop = True
                elif isinstance(cmd, _Add):
                    self._add(cmd, touched)
                elif isinstance(cmd, _Abort):
                    out = self._core.abort(cmd.request_id)
                    outputs += [out] if out else []
            if stop:
                outputs += self._core.abort_all()
            elif self._core.has_unfinished():
                outputs += self._step(touched)
            # Publish stats first: a caller that sees its request end then sees it counted.
            self._stats = self._core.stats()
            self._deliver(outputs, touched)
            if stop:
                return

    def _add(self, cmd: _Add, touched: list[_Stream]) -> None:
        try:
            if cmd.request_id in self._streams:
                raise ValueError(f"request id {cmd.request_id!r} is already in use; pick a unique id")
            self._core.add_request(
                cmd.request_id, cmd.prompt, cmd.params, cmd.priority, cmd.arrival_time, matcher=cmd.matcher
            )
        except Exception as exc:  # a bad request fails its own stream, never the engine
            cmd.stream.items.append(exc)
            touched.append(cmd.stream)
            return
        self._streams[cmd.request_id] = cmd.stream

    def _step(self, touched: list[_Stream]) -> list[RequestOutput]:
        try:
            return self._core.step()
        except Exception as exc:
            # A failing step (a model or kernel error) fails every request in flight, not the thread.
            log.exception("engine step failed; failing %d requests", len(self._streams))
            self._core.abort_all()
            for stream in self._streams.values():
                stream.items.append(EngineError(f"the engine step failed: {exc!r}"))
                touched.append(stream)
            self._streams.clear()
            return []

    def _deliver(self, outputs: list[RequestOutput], touched: list[_Stream]) -> None:
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            stream.items.append(out)
            touched.append(stream)
            if out.finished:
                del self._streams[out.request_id]
        if touched:
            try:
                anyio.from_thread.run_sync(_wake, touched, token=self._token)
            except RuntimeError:
                log.debug("event loop gone; %d streams not woken", len(touched))


def _wake(streams: list[_Stream]) -> None:
    for stream in streams:
        if stream.waiter is not None:
            stream.waiter.set()
            stream.waiter = None
