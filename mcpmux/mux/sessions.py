"""The sessions mcpmux holds with one upstream server: the one its clients share, and clients' own.

A 2025 stdio upstream's request to the client (sampling, elicitation, roots) carries nothing that
links it to the call that caused it, and a 2025 session declares the client's capabilities once, at
`initialize`. So where clients must not share what an upstream asks or shows, each needs a session
of its own. `[servers.X] sessions` says when:

- `"shared"`: one session for every client. A request the wire does not link to one call is asked
  only of the one client whose calls are in flight there, else refused to the upstream
  (`mcpmux.server.client_relay`).
- `"per-client"`: each client (by identity: its 2025 session, its bearer token, the one stdio
  client) gets a session of its own, declaring the extensions the client declared; all it asks is
  that client's. mcpmux's own calls (the library, `mcpmux call`) use the shared one.
- `"auto"` (the default): shared, except (a) a client that declared an extension the server
  advertises (SEP-2133: MCP Apps' `io.modelcontextprotocol/ui`, say; where the server advertises
  none, as a 2025 server cannot and many servers reading the client's do not, any extension counts)
  gets a session declaring it, one per set of such extensions (shared by the clients declaring that
  set, anonymous ones included), so the server shows it what it shows such clients; and (b) once
  the server has asked a client something over a channel that carries no link to the call (`asked`)
  and a second client has called it, or once such a request found calls of several clients in
  flight (`asked(ambiguous=True)`), each client gets a session of its own from then on.

A 2025 client that declared something an upstream may ask it (sampling, elicitation, roots) is
asked, by a server it reaches directly, in requests of the server's own during its call; a server
that speaks both eras may serve that only on its 2025 path (its 2026 one asking in input-required
rounds, or not at all). So where the shared session speaks 2026-07-28 (`protocol = "auto"`), such a
client's requests go to a session opened with the 2025 handshake (not under `"shared"`: there the
client shares the 2026 session, and `protocol = "legacy"` is the way to the 2025 path). Over HTTP,
where a request on a call's stream is linked to the call, that session is shared by the 2025
clients that can be asked (one per set of extensions, as above), until clients have their own; a
stdio pipe links nothing, so there each such client has one of its own from the start. A server
that refuses the handshake speaks 2026-07-28 only: its 2025 clients are then served on the shared
session, where mcpmux relays its rounds to them as requests (`mcpmux.mux.relayed_rounds`).

A request without a lasting identity (a 2026 HTTP request with no bearer token) cannot keep a
session: where clients have their own, its calls take turns with other clients' on the shared
session (`turn`), so that what the server asks during a call is always one client's.

A client's session starts at its first list or call that needs it and is ready before that is
answered (at most `startup_timeout`: until then the shared session serves). At most
`[mux] max_client_sessions` run per server: the least recently used idle one is stopped to make
room, and when none is idle a `"per-client"` call fails with an error naming the limit (`"auto"`
uses the shared session). One idle for `[mux] client_session_idle` seconds is stopped. Each is
supervised as the shared one is (restarted after a crash). The gate (limits) is the server's, shared;
cache entries and in-flight sharing stay inside each session.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field

import anyio
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcpmux.batching import canonical_json
from mcpmux.core.config import MuxSettings
from mcpmux.core.inbound import Caller
from mcpmux.errors import UpstreamUnavailableError
from mcpmux.mux.dispatcher import UpstreamDispatcher
from mcpmux.mux.lifetime import UpstreamLifetime
from mcpmux.upstream.supervisor import Upstream, UpstreamState

logger = logging.getLogger(__name__)

Session = tuple[Upstream, UpstreamDispatcher]
"""An upstream session and the executor of its calls."""
Start = Callable[
    [str, str | None, dict[str, dict[str, object]], bool],
    Awaitable[tuple[Upstream, UpstreamDispatcher, UpstreamLifetime]],
]
"""Starts a session of clients' own: (key, owning client or None, extensions to declare, 2025 handshake)."""


@dataclass(frozen=True, slots=True)
class _Wanted:
    key: str
    owner: str | None
    extensions: dict[str, dict[str, object]]
    legacy: bool = False


@dataclass(slots=True, eq=False)
class _Own:
    upstream: Upstream
    dispatcher: UpstreamDispatcher
    lifetime: UpstreamLifetime
    last_used: float = field(default_factory=anyio.current_time)


class ServerSessions:
    """One server's shared session and the sessions of clients' own (see the module docstring)."""

    def __init__(
        self,
        shared: Upstream,
        dispatcher: UpstreamDispatcher,
        start: Start,
        settings: Callable[[], MuxSettings],
        busy: Callable[[Upstream], bool],
        own_started: Callable[[], None],
    ) -> None:
        """`start` starts a session of clients' own; `busy` says whether calls are in flight on a session;
        `own_started` is told each time one has started (`Reaper.started`)."""
        self.shared: Session = (shared, dispatcher)
        self._start = start
        self._settings = settings
        self._busy = busy
        self._own_started = own_started
        self._own: dict[str, _Own] = {}
        self._starting: dict[str, anyio.Event] = {}
        self.isolated = False
        """`"auto"` gives each client a session of its own (the server asked something unattributable)."""
        self._asks = False
        """The server has asked a client something over a channel with no link to the call."""
        self._seen: set[str] = set()
        """Clients that called it (the first two: only whether there were two matters)."""
        self._turns = _Turns()
        self._told = False
        self._modern_only = False
        """The server refused a 2025 handshake while its shared session answered: it speaks 2026-07-28 only."""

    @property
    def name(self) -> str:
        return self.shared[0].name

    @property
    def owns(self) -> bool:
        """Whether sessions of clients' own are running (`Reaper` has something to look at)."""
        return bool(self._own)

    @property
    def own(self) -> int:
        """How many sessions of clients' own run."""
        return len(self._own)

    def _wanted(self, caller: Caller | None) -> _Wanted | None:
        """The caller's own session, if it should have one (None: the shared one)."""
        config = self.shared[0].config
        if caller is None or config.sessions == "shared":
            return None
        legacy = self._handshakes_with(caller)
        if caller.lasting:
            if len(self._seen) < 2:
                self._seen.add(caller.client or "")
            if self._separating() or (legacy and config.transport == "stdio"):
                key = f"client:{caller.client}" + (" (2025)" if legacy else "")
                return _Wanted(key, caller.client, dict(caller.extensions), legacy)
        elif self._separating():
            return None  # no session can be kept for it: it takes its turn on the shared one
        declared = caller.extensions
        if not declared and not legacy:  # the common case, on every call: nothing to look up
            return None
        # A server that advertised none (a 2025 one cannot; many read the client's without saying; or
        # it has not connected yet) may show clients anything for any of them: every one counts.
        advertised = self.shared[0].server_extensions
        relevant = {name: settings for name, settings in declared.items() if not advertised or name in advertised}
        if legacy:
            return _Wanted(f"legacy:{canonical_json(relevant)}", None, relevant, legacy)
        return _Wanted(f"extensions:{canonical_json(relevant)}", None, relevant) if relevant else None

    def _handshakes_with(self, caller: Caller) -> bool:
        """Whether the caller is served by a 2025 session of a server whose shared one speaks 2026 (above)."""
        shared = self.shared[0]
        return (
            caller.lasting
            and caller.handshakes
            and caller.can_be_asked
            and not self._modern_only
            and shared.config.protocol == "auto"
            and shared.protocol_version in MODERN_PROTOCOL_VERSIONS
        )

    def _separating(self) -> bool:
        """Whether each client has a session of its own now (`"per-client"`, or `"auto"` once isolated)."""
        mode = self.shared[0].config.sessions
        if mode == "auto" and not self.isolated and self._asks and len(self._seen) >= 2:
            self.isolated = True
        return mode == "per-client" or (mode == "auto" and self.isolated)

    def find(self, caller: Caller | None) -> Session | None:
        """The caller's session if it is ready now (None: its own session should be started first,
        with `session`, or its call must take its turn, with `turn`); never waits."""
        wanted = self._wanted(caller)
        if wanted is None:
            return None if self._separating() else self.shared
        own = self._own.get(wanted.key)
        if own is None or own.upstream.state != UpstreamState.READY:
            return None
        own.last_used = anyio.current_time()
        return own.upstream, own.dispatcher

    async def session(self, caller: Caller | None) -> Session:
        """The caller's session, started if need be and waited for (at most `startup_timeout`)."""
        wanted = self._wanted(caller)
        if wanted is None:
            return self.shared
        own = self._own.get(wanted.key)
        if own is None:
            own = await self._started(wanted)
            if own is None:
                return self.shared
        if own.upstream.state == UpstreamState.STARTING:
            with anyio.move_on_after(self._settings().startup_timeout):
                await own.upstream.settled.wait()
        upstream = own.upstream
        if wanted.legacy and upstream.state == UpstreamState.DOWN and not upstream.connected_once and self._ready():
            await self._refused_handshake(upstream.last_error)
            return self.shared
        own.last_used = anyio.current_time()
        return own.upstream, own.dispatcher

    def _ready(self) -> bool:
        return self.shared[0].state == UpstreamState.READY

    async def _refused_handshake(self, why: str | None) -> None:
        """A 2025 session failed to open while the shared one answers: the server speaks 2026-07-28 only,
        and its 2025 sessions are stopped (their clients are served on the shared one)."""
        if not self._modern_only:
            self._modern_only = True
            logger.info(
                "upstream %r speaks 2026-07-28 only (a 2025 handshake failed: %s); its 2025 clients are served on "
                "its 2026-07-28 session, their input-required rounds relayed to them as requests",
                self.name,
                why,
            )
        for key, own in list(self._own.items()):
            if own.upstream.legacy:
                await self._stop(key, "its server speaks 2026-07-28 only")

    async def _started(self, wanted: _Wanted) -> _Own | None:
        starting = self._starting.get(wanted.key)
        if starting is not None:  # another call of the same client is starting it
            await starting.wait()
            return self._own.get(wanted.key)
        if not await self._make_room(wanted):
            return None
        self._starting[wanted.key] = done = anyio.Event()
        try:
            upstream, dispatcher, lifetime = await self._start(
                wanted.key, wanted.owner, wanted.extensions, wanted.legacy
            )
            own = self._own[wanted.key] = _Own(upstream, dispatcher, lifetime)
            self._own_started()
            logger.info(
                "upstream %r: started a session for %s (%d of at most %d)",
                self.name,
                _whose(wanted),
                len(self._own),
                self._settings().max_client_sessions,
            )
            return own
        finally:
            del self._starting[wanted.key]
            done.set()

    async def _make_room(self, wanted: _Wanted) -> bool:
        """Stop the least recently used idle session if the limit is reached; False when none is idle."""
        limit = self._settings().max_client_sessions
        if len(self._own) + len(self._starting) < limit:
            return True
        idle = sorted((own.last_used, key) for key, own in self._own.items() if not self._busy(own.upstream))
        if idle:
            await self._stop(idle[0][1], "to make room for another client's")
            return True
        if self.shared[0].config.sessions == "per-client":
            raise UpstreamUnavailableError(
                f"upstream {self.name!r} already runs {limit} sessions for other clients, all busy "
                f"([mux] max_client_sessions = {limit}); retry shortly, or raise the limit"
            )
        return False

    def asked(self, ambiguous: bool) -> None:
        """The server asked a client something with no link to the call (`ambiguous`: while several
        clients' calls were in flight): under `"auto"`, clients get sessions of their own (see above)."""
        self._asks = True
        if ambiguous and self.shared[0].config.sessions == "auto" and not self.isolated:
            self.isolated = True
        if self.isolated and not self._told:
            self._told = True
            logger.warning(
                "upstream %r asks clients things with no link to the call that caused them; each client "
                'gets a session of its own from now on ([servers.%s] sessions = "auto")',
                self.name,
                self.name,
            )

    def turn(self, upstream: Upstream, caller: Caller | None) -> AbstractAsyncContextManager[None]:
        """Around a call on `upstream`: on the shared session of a server whose clients have sessions of
        their own, a call that has none waits until no other client's call is in flight there (see above)."""
        if upstream is not self.shared[0] or not self._separating():
            return contextlib.nullcontext()
        return self._turns.take(caller.client or "" if caller is not None else "")

    def sessions(self) -> list[Session]:
        """Every session: the shared one first."""
        return [self.shared, *((own.upstream, own.dispatcher) for own in self._own.values())]

    async def reap(self) -> None:
        """Stop the sessions idle for longer than `client_session_idle` seconds."""
        limit = self._settings().client_session_idle
        now = anyio.current_time()
        for key, own in list(self._own.items()):
            starting = own.upstream.state == UpstreamState.STARTING  # its first caller waits for it
            if not starting and not self._busy(own.upstream) and now - own.last_used >= limit:
                await self._stop(key, f"idle for {limit:g}s")

    async def stop(self) -> None:
        """Stop every session of clients' own (the server is stopping)."""
        for key in list(self._own):
            await self._stop(key, "its server is stopping")

    async def _stop(self, key: str, why: str) -> None:
        own = self._own.pop(key, None)
        if own is not None:
            logger.info("upstream %r: stopped a client's session (%s)", self.name, why)
            await own.lifetime.stop()


class Reaper:
    """Stops sessions of clients' own once idle: looks every tenth of `client_session_idle` (at least
    every second) while there are some, and sleeps while there are none (an idle mcpmux is not woken)."""

    def __init__(self, sessions: Callable[[], list[ServerSessions]], settings: Callable[[], MuxSettings]) -> None:
        self._sessions = sessions
        self._settings = settings
        self._started: anyio.Event | None = None  # made in `run`: an event needs the running loop

    def started(self) -> None:
        """A session of clients' own started: `run` looks again."""
        if self._started is not None:
            self._started.set()

    async def run(self) -> None:
        self._started = anyio.Event()
        while True:
            if not any(server.owns for server in self._sessions()):
                await self._started.wait()
                self._started = anyio.Event()
            await anyio.sleep(min(max(self._settings().client_session_idle / 10, 1.0), 60.0))
            for server in self._sessions():
                await server.reap()


class _Turns:
    """Calls of one client at a time (any number of that client's together); the others wait, in turn."""

    def __init__(self) -> None:
        self._holder: str | None = None
        self._count = 0
        self._waiting = 0
        self._changed = anyio.Event()

    @contextlib.asynccontextmanager
    async def take(self, client: str) -> AsyncIterator[None]:
        # The holder's calls join it only while nobody waits: a busy client cannot keep the others out.
        while self._count and (self._holder != client or self._waiting):
            self._waiting += 1
            try:
                await self._changed.wait()
            finally:
                self._waiting -= 1
            if not self._count:
                break
        self._holder = client
        self._count += 1
        try:
            yield
        finally:
            self._count -= 1
            if not self._count:
                self._holder = None
                self._changed.set()
                self._changed = anyio.Event()


def _whose(wanted: _Wanted) -> str:
    """Whom a session of clients' own serves, as its log lines say it."""
    if wanted.owner:
        return f"client {wanted.owner}" + (" (2025 handshake)" if wanted.legacy else "")
    declaring = f"clients declaring {sorted(wanted.extensions)}"
    if wanted.legacy:
        return f"2025 {declaring}" if wanted.extensions else "2025 clients that can be asked"
    return declaring
