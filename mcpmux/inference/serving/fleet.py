"""`Fleet`: routes each generation to one of the configured backends, and to another when that one fails.

    request ─▶ shared? ─▶ candidates ─▶ admit ─▶ backend.stream ─▶ deltas
               (same      (serve the    (least     │ failed before the answer, or the server is
               greedy     model; up,    in flight  │ down/busy: the next backend (each once);
               request:   else fallback, / weight; │ a greedy stream already begun resumes there,
               read its   else the down concurrency│ its new text checked against what was sent
               deltas)    ones)          and rate) ▼
                                                  health: `down_after` failures in a row take a backend
                                                  out; a probe every `probe_interval` s brings it back

Candidates are the backends that serve the model (a regex or Lark grammar needs the local engine).
Backends that are up come first; `fallback` backends only while every other one is down; and when
all are down the request still goes to one of them, so its error says exactly what is wrong (and a
server that came back answers at once). A backend at its `max_concurrency` or out of its
`requests_per_second` is passed over; when every candidate is, the request waits for the first
that admits it.

A failure is the backend's (`RemoteError.backend_failed`: no answer, a timeout, HTTP 5xx, 429), or
the request's (a bad request is bad everywhere: passed on at once). A backend that is merely busy
(HTTP 429, a full local queue) is passed over without counting against its health.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

import anyio
from anyio.abc import TaskGroup

from mcpmux.inference.errors import EngineError, QueueFullError
from mcpmux.inference.serving.delta import Delta
from mcpmux.inference.serving.generation import Generation
from mcpmux.inference.serving.remote import RemoteError
from mcpmux.inference.serving.remote_form import served_remotely
from mcpmux.inference.serving.settings import BackendSettings
from mcpmux.inference.serving.shared import SharedStreams

log = logging.getLogger(__name__)

T = TypeVar("T")


class Backend(Protocol):
    """What the fleet needs of a backend (`LocalBackend`, `RemoteBackend`)."""

    name: str
    models: dict[str, str]  # mcpmux's model name -> the backend's own

    def stream(self, generation: Generation) -> AsyncGenerator[Delta, None]: ...

    async def probe(self) -> None: ...


class DivergedError(RemoteError):
    """A greedy stream resumed on another backend, which answered differently from what was already sent."""


@dataclass(slots=True, eq=False)
class Member:
    """One backend in the fleet and what the router knows of it."""

    backend: Backend
    settings: BackendSettings
    up: bool = True
    failures_in_a_row: int = 0
    in_flight: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    last_error: str = ""
    _tokens: float = math.inf
    _refilled: float = 0.0

    def __post_init__(self) -> None:
        if self.settings.requests_per_second is not None:
            self._tokens = float(self._burst)

    @property
    def local(self) -> bool:
        return self.settings.kind == "local"

    @property
    def _burst(self) -> int:
        rate = self.settings.requests_per_second or 1.0
        return self.settings.burst or max(1, math.ceil(rate))

    def serves(self, generation: Generation) -> bool:
        return generation.model in self.backend.models and (self.local or served_remotely(generation))

    def admits(self, now: float) -> bool:
        """Whether a request may start now (under `max_concurrency` and `requests_per_second`)."""
        limit = self.settings.max_concurrency
        if limit is not None and self.in_flight >= limit:
            return False
        return self._refill(now) >= 1

    def seconds_to_admit(self, now: float) -> float:
        """How long until the rate limit admits one (inf while at `max_concurrency`: a release says when)."""
        limit = self.settings.max_concurrency
        if limit is not None and self.in_flight >= limit:
            return math.inf
        rate = self.settings.requests_per_second
        return 0.0 if rate is None else max(0.0, (1 - self._refill(now)) / rate)

    def take(self, now: float) -> None:
        self._refill(now)
        self._tokens -= 1
        self.in_flight += 1
        self.counts["requests"] += 1

    def _refill(self, now: float) -> float:
        rate = self.settings.requests_per_second
        if rate is not None:
            self._tokens = min(float(self._burst), self._tokens + (now - self._refilled) * rate)
            self._refilled = now
        return self._tokens

    def stats(self) -> dict[str, Any]:
        stats = getattr(self.backend, "stats", None)
        return {
            "kind": self.settings.kind,
            "state": "up" if self.up else "down",
            "models": list(self.backend.models),
            "fallback": self.settings.fallback,
            "weight": self.settings.weight,
            "in_flight": self.in_flight,
            "requests": self.counts["requests"],
            "failed": self.counts["failed"],
            "busy": self.counts["busy"],
            "errors": self.counts["errors"],
            "last_error": self.last_error,
            **(stats() if stats is not None and not self.local else {}),
        }


class Fleet:
    """The backends, their health and limits; `stream` serves one generation."""

    def __init__(self, members: list[Member], task_group: TaskGroup, *, share_identical: bool) -> None:
        self.members = members
        self._task_group = task_group
        self._shared = SharedStreams(task_group) if share_identical else None
        self._changed = anyio.Event()  # set when a slot frees or a backend comes back
        self.moved = 0  # requests that went on to another backend after one failed them
        self.resumed = 0  # of those, streams that had begun: the new backend's text continues them

    @property
    def shared(self) -> int:
        """Requests that read another identical request's generation."""
        return self._shared.shared if self._shared is not None else 0

    def stream(self, generation: Generation) -> AsyncGenerator[Delta, None]:
        """The deltas of `generation` from the backend that serves it (see the module's drawing)."""
        key = generation.share_key() if self._shared is not None else None
        if self._shared is None or key is None:
            return self._serve(generation)
        return self._shared.stream(key, lambda: self._serve(generation))

    async def call(self, select: Callable[[Member], bool], what: str, run: Callable[[Member], Awaitable[T]]) -> T:
        """`run` on an admitted backend among those `select` picks, moving on as `stream` does."""
        tried: list[Member] = []
        last: EngineError | None = None
        while True:
            member = await self._admit(select, what, tried, last)
            try:
                result = await run(member)
            except EngineError as err:
                self._failed(member, err, tried)
                last = err
                continue
            finally:
                self._release(member)
            self._succeeded(member)
            return result

    async def _serve(self, generation: Generation) -> AsyncGenerator[Delta, None]:
        tried: list[Member] = []
        last: EngineError | None = None
        sent = ""  # the text the reader already has (incremental requests)
        resumable = generation.params.greedy or generation.params.seed is not None
        while True:
            member = await self._admit(lambda m: m.serves(generation), f"model {generation.model!r}", tried, last)
            held: list[Delta] = []  # a whole request's deltas, handed out once the backend finished
            skip = sent  # what earlier attempts sent: this one's text must repeat it first
            repeated: list[Delta] = []
            self.resumed += bool(skip)
            try:
                async for delta in member.backend.stream(generation):
                    if not generation.incremental:
                        held.append(delta)
                        continue
                    fresh = _past(skip, delta, repeated, member) if skip else delta
                    if fresh is not None:
                        sent += fresh.text
                        yield fresh
            except EngineError as err:
                # Begun and not reproducible: another backend's text would not continue this one.
                self._failed(member, err, tried, may_move=not sent or resumable)
                last = err
                continue
            finally:
                self._release(member)
            self._succeeded(member)
            for delta in held:
                yield delta
            return

    async def _admit(
        self, select: Callable[[Member], bool], what: str, tried: list[Member], last: EngineError | None
    ) -> Member:
        while True:
            members = self._candidates(select, what, tried, last)
            now = time.monotonic()
            ready = [m for m in members if m.admits(now)]
            if ready:
                best = min(ready, key=lambda m: ((m.in_flight + 1) / m.settings.weight, m.counts["requests"]))
                best.take(now)
                if tried:
                    self.moved += 1
                return best
            wait = min(m.seconds_to_admit(now) for m in members)
            changed = self._changed
            with anyio.move_on_after(wait):
                await changed.wait()

    def _candidates(
        self, select: Callable[[Member], bool], what: str, tried: list[Member], last: EngineError | None
    ) -> list[Member]:
        able = [m for m in self.members if select(m)]
        if not able:
            raise EngineError(
                f"no inference backend can serve {what} (a regex or Lark grammar needs a local backend that serves it)"
            )
        left = [m for m in able if m not in tried]
        if not left:
            assert last is not None, "a backend is tried only after it failed"
            raise last  # every backend that could serve it failed: the last one's words
        primary = [m for m in left if not m.settings.fallback]
        return [m for m in primary if m.up] or [m for m in left if m.settings.fallback and m.up] or primary or left

    def _release(self, member: Member) -> None:
        member.in_flight -= 1
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def _succeeded(self, member: Member) -> None:
        member.failures_in_a_row = 0
        if not member.up:
            self._back(member, "it answered")

    def _failed(self, member: Member, err: EngineError, tried: list[Member], *, may_move: bool = True) -> None:
        """Count the failure against the backend; re-raise it unless another backend may take the request."""
        busy = isinstance(err, QueueFullError) or (isinstance(err, RemoteError) and err.status in (408, 429))
        if not (busy or (isinstance(err, RemoteError) and err.backend_failed)):
            member.counts["errors"] += 1
            raise err  # the request's own fault: the same everywhere
        tried.append(member)
        member.counts["busy" if busy else "failed"] += 1
        member.last_error = str(err)
        if not busy:
            member.failures_in_a_row += 1
            if member.up and member.failures_in_a_row >= member.settings.down_after:
                self._take_out(member)
        if not may_move:
            raise err
        log.info("inference backend %s failed a request (%s); trying another", member.backend.name, err)

    def _take_out(self, member: Member) -> None:
        member.up = False
        log.warning(
            "inference backend %s is out after %d failures in a row (%s); probing it every %g s",
            member.backend.name, member.failures_in_a_row, member.last_error, member.settings.probe_interval,
        )  # fmt: skip
        self._task_group.start_soon(self._probe, member)

    async def _probe(self, member: Member) -> None:
        while not member.up:
            await anyio.sleep(member.settings.probe_interval)
            try:
                await member.backend.probe()
            except EngineError as err:
                member.last_error = str(err)
                continue
            if not member.up:
                self._back(member, "its probe answered")

    def _back(self, member: Member, why: str) -> None:
        member.up = True
        member.failures_in_a_row = 0
        log.warning("inference backend %s is back in (%s)", member.backend.name, why)
        self._notify()

    def stats(self) -> dict[str, dict[str, Any]]:
        """Each backend's state, by name."""
        return {m.backend.name: m.stats() for m in self.members}


def _past(sent: str, delta: Delta, repeated: list[Delta], member: Member) -> Delta | None:
    """The part of a resumed stream's `delta` past `sent`, what the reader already has (None: nothing new);
    `repeated` holds this stream's earlier deltas."""
    before = "".join(d.text for d in repeated)
    repeated.append(delta)
    if len(before) >= len(sent):
        return delta
    now = before + delta.text
    if not (now.startswith(sent) if len(now) >= len(sent) else sent.startswith(now)):
        raise DivergedError(
            f"the request was resumed on inference backend {member.backend.name} after another failed it "
            "mid-answer, but the new answer differs from the text already sent; retry the request"
        )
    if len(now) <= len(sent):
        return None if delta.finish_reason is None else replace(delta, text="", token_ids=[], logprobs=[])
    return replace(delta, text=now[len(sent) :], token_ids=[], logprobs=[])
