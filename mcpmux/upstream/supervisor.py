"""One upstream MCP server: connect over stdio or streamable HTTP, supervise, restart, and call it.

`Upstream.run()` is the supervisor, owned by the Mux's task group. It connects, fetches the
listing, watches the connection and the server's list_changed signals, and when the connection is
lost (a crashed child, an HTTP server gone, an expired session; not one HTTP call's connection
dropped under a session that still answers) reconnects with exponential backoff:
`restart_initial_backoff` doubling up to `restart_max_backoff` seconds, reset after each successful
connection, retried for as long as mcpmux runs. While it is down, calls fail at once with
`UpstreamUnavailableError`; the last known listing stays in the catalog.
"""

from __future__ import annotations

import contextvars
import fnmatch
import logging
import math
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import anyio
import httpx2
import mcp_types as types
from anyio.abc import TaskGroup
from mcp import Client
from mcp.client.extension import ClientExtension, advertise
from mcp.client.session import ClientRequestContext, ElicitationFnT, ListRootsFnT, SamplingFnT
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import CONNECTION_CLOSED
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcpmux.core.config import MuxSettings, ServerConfig
from mcpmux.core.output_schema import result_error, sdk_problem
from mcpmux.errors import UpstreamError, UpstreamTimeoutError, UpstreamUnavailableError
from mcpmux.upstream.child_stderr import ChildStderr
from mcpmux.upstream.http_transport import http_transport
from mcpmux.upstream.json_bodies import JoinedBodies
from mcpmux.upstream.lane import UpstreamLane
from mcpmux.upstream.oauth.upstream_auth import NeedsLoginError, needs_login, upstream_oauth
from mcpmux.upstream.session_io import Listing, WatchedTransport, fetch_listing, listen_for_changes
from mcpmux.upstream.stdio_transport import stdio_transport
from mcpmux.upstream.task_receiver import TaskFailed

logger = logging.getLogger(__name__)

LIVENESS_TIMEOUT = 5.0
"""Seconds a session is given to answer a ping after one call's connection ended under it."""
# What the SDK's stdio_client passes to a child when told nothing (mirrored for `env_passthrough = "minimal"`).
_MINIMAL_ENV = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER")


class UpstreamState(StrEnum):
    STARTING = "starting"
    READY = "ready"
    DOWN = "down"
    NEEDS_LOGIN = "needs login"
    STOPPED = "stopped"


@dataclass(slots=True)
class UpstreamEvents:
    """What an upstream tells its owner."""

    listing_changed: Callable[[str], Awaitable[None]]
    log: Callable[[str, types.LoggingMessageNotificationParams], Awaitable[None]]
    # Answers this upstream's sampling/createMessage (both eras); None declares no sampling capability.
    sampling: SamplingFnT | None = None
    # Declares `sampling.tools` too: the calling client may answer a request that carries tools.
    sampling_tools: bool = False
    # Whether sampling can be answered for a call's client (by it or by mcpmux): `UpstreamLane.samples_for`.
    samples_for: Callable[[types.ClientCapabilities | None], bool] | None = None
    # Answer elicitation/create (form and url) and roots/list; None declares no such capability.
    elicitation: ElicitationFnT | None = None
    list_roots: ListRootsFnT | None = None
    # `notifications/elicitation/complete` from this upstream (a url-mode elicitation finished).
    elicitation_complete: Callable[[str, types.ElicitCompleteNotificationParams], Awaitable[None]] | None = None
    # `notifications/resources/updated` from this upstream: (upstream, uri).
    resource_updated: Callable[[str, str], Awaitable[None]] | None = None
    # `notifications/tasks/status` from this upstream: (upstream, the notification's params).
    task_status: Callable[[str, dict[str, Any]], Awaitable[None]] | None = None


ASKED_ON: contextvars.ContextVar[Upstream | None] = contextvars.ContextVar("mcpmux_asked_on", default=None)
"""The upstream session whose request or log message is being handled (set around mcpmux's callbacks)."""


def asked_on() -> Upstream | None:
    """The upstream session the request or log message being handled came on (None: not from an upstream)."""
    return ASKED_ON.get()


@dataclass(slots=True)
class UpstreamStatus:
    name: str
    transport: str
    state: UpstreamState
    protocol_version: str | None
    restarts: int
    last_error: str | None
    tools: int
    resources: int
    prompts: int
    auth: str = "none"
    client_sessions: int = 0
    """Sessions of its own that clients hold with it (`[servers.X] sessions`), beside the shared one."""


@dataclass(slots=True)
class _Health:
    lost: anyio.Event = field(default_factory=anyio.Event)


class Upstream:
    """A supervised connection to one upstream server: the one its clients share, or one of a client's own.

    `key` names a session of its own (None: the shared one); `owner` is the client it belongs to (a
    per-client session: every request on it is that client's); `extensions` are declared upstream
    as a client declared them (SEP-2133), so a server that shows some tools only to clients with an
    extension shows them on this session; `legacy` opens it with the 2025 handshake whatever the
    server's `protocol` says (a session for 2025 clients, `mcpmux.mux.sessions`).
    """

    def __init__(
        self,
        name: str,
        config: ServerConfig,
        settings: MuxSettings,
        events: UpstreamEvents,
        *,
        key: str | None = None,
        owner: str | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
        legacy: bool = False,
    ) -> None:
        self.name = name
        self.config = config
        self.settings = settings
        self.events = events
        self.key = key
        self.owner = owner
        self.extensions = dict(extensions or {})
        self.legacy = legacy
        self.connected_once = False
        """Whether it was ever ready (a session that never was may speak nothing its server accepts)."""
        self.listing = Listing()
        self.state = UpstreamState.STARTING
        self.restarts = 0
        self.last_error: str | None = None
        self.settled = anyio.Event()  # set after the first connection attempt succeeds or fails
        self._client: Client | None = None
        self.lane: UpstreamLane | None = None
        """Raw `tools/call` requests on the current connection (`mcpmux.mux.fast_path`); None while down."""
        self._health = _Health()
        self._client_changed = anyio.Event()
        self._refreshing: anyio.Event | None = None
        self.oauth = upstream_oauth(name, config)
        self._joined = JoinedBodies(name)  # kept across reconnections: its deviation is logged once
        self.stderr = ChildStderr(name)
        """A stdio upstream's stderr: passed on labelled with its name; the last lines kept (`down` reasons)."""
        self.subscriptions: set[str] = set()
        self.log_level: types.LoggingLevel | None = None
        """The level clients asked upstream logs at (`logging/setLevel`), sent again on every new connection."""
        """Resource URIs mcpmux's clients subscribed to (2025 `resources/subscribe`): renewed on every connection."""

    @property
    def timeout(self) -> float:
        return self.config.timeout or self.settings.call_timeout

    def allows_tool(self, tool: str) -> bool:
        allowed = any(fnmatch.fnmatchcase(tool, glob) for glob in self.config.allow_tools)
        return allowed and not any(fnmatch.fnmatchcase(tool, glob) for glob in self.config.deny_tools)

    def status(self) -> UpstreamStatus:
        return UpstreamStatus(
            name=self.name,
            transport=self.config.transport,
            state=self.state,
            protocol_version=self.protocol_version,
            restarts=self.restarts,
            last_error=self.last_error,
            tools=len(self.listing.tools),
            resources=len(self.listing.resources) + len(self.listing.resource_templates),
            prompts=len(self.listing.prompts),
            auth=self.oauth.describe() if self.oauth is not None else "none",
        )

    @property
    def protocol_version(self) -> str | None:
        """The revision the session speaks now (None while it is not connected)."""
        client = self._client
        return client.protocol_version if client is not None else None

    @property
    def server_extensions(self) -> set[str] | None:
        """The extensions the connected server advertised (SEP-2133, 2026-07-28); None where it could not
        say (a 2025 handshake has no place for them), empty while it is not connected."""
        client = self._client
        if client is None:
            return set()
        if client.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return None
        return set(client.server_capabilities.extensions or {})

    async def run(self) -> None:
        """Connect and keep connected until cancelled."""
        failures = 0
        try:
            while True:
                login: NeedsLoginError | None = None
                try:
                    async with self._connect() as client:
                        failures = 0
                        await self._serve(client)
                    self.last_error = _describe_loss(self.config, self.stderr)
                except Exception as err:  # any failure of one upstream must stay with that upstream
                    failures += 1
                    login = needs_login(err)
                    self.last_error = str(login) if login else _describe_failure(err, self.config, self.stderr)
                finally:
                    self._set_client(None)
                self.state = UpstreamState.NEEDS_LOGIN if login else UpstreamState.DOWN
                self.settled.set()
                if login is not None and self.oauth is not None:
                    logger.warning("%s (%s)", login, login.why)
                    await self.oauth.changed()  # no retry can succeed before a login (or logout) is stored
                    self.state, failures = UpstreamState.DOWN, 0
                elif failures:
                    # A lost connection that had worked is re-established at once; repeated failures back off.
                    backoff = min(
                        self.settings.restart_initial_backoff * 2 ** (failures - 1), self.settings.restart_max_backoff
                    )
                    logger.warning("upstream %r: %s; retrying in %.1fs", self.name, self.last_error, backoff)
                    await anyio.sleep(backoff)
                self.restarts += 1
        finally:
            self.state = UpstreamState.STOPPED

    async def _serve(self, client: Client) -> None:
        async with anyio.create_task_group() as tasks:
            if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
                # Subscribe before listing, so that no change can fall between the two.
                await tasks.start(listen_for_changes, client, self._refresh)
            self.listing = await fetch_listing(client)
            await self._resubscribe(client)
            if self.log_level is not None:
                await _send_log_level(self.name, client, self.log_level)
            self.state = UpstreamState.READY
            self.connected_once = True
            self.last_error = None
            self._set_client(client)
            logger.info("upstream %r ready (%s, %d tools)", self.name, client.protocol_version, len(self.listing.tools))
            await self.events.listing_changed(self.name)
            # Settled once its tools are in the catalog and clients were told: a list that waited for
            # it is answered after that list_changed, never before.
            self.settled.set()
            await self._health.lost.wait()
            tasks.cancel_scope.cancel()

    def _mark_lost(self) -> None:
        """The session is gone: no new request may use it, and the supervisor reconnects."""
        self._health.lost.set()
        self.state = UpstreamState.DOWN
        self._set_client(None)

    def _set_client(self, client: Client | None) -> None:
        self._client = client
        self._client_changed.set()
        self._client_changed = anyio.Event()

    def refresh_if_stale(self, tasks: TaskGroup) -> anyio.Event | None:
        """Start refetching the listing, in `tasks`, if the server's `ttlMs` says it is stale.

        Returns an event set when the refetch ends (None when the listing is fresh). A refetch already
        running is shared, not repeated: a stuck upstream gets one listing request at a time.
        """
        if self._client is None or anyio.current_time() < self.listing.expires_at:
            return None
        if self._refreshing is None:
            self._refreshing = anyio.Event()
            tasks.start_soon(self._refresh_stale, name=f"refresh {self.name}")
        return self._refreshing

    async def _refresh_stale(self) -> None:
        try:
            with anyio.fail_after(self.timeout):
                await self._refresh()
        except (MCPError, TimeoutError) as err:  # failures keep the last known listing
            logger.warning("upstream %r: could not refresh its stale listing: %s", self.name, err)
        finally:
            done, self._refreshing = self._refreshing, None
            if done is not None:
                done.set()

    async def _refresh(self) -> None:
        client = self._client
        if client is None:
            return
        old, self.listing = self.listing, await fetch_listing(client)
        if _offer(self.listing) != _offer(old):  # a re-fetch that changed nothing must not echo to clients
            await self.events.listing_changed(self.name)

    @asynccontextmanager
    async def _connect(self) -> AsyncIterator[Client]:
        self._health = _Health()
        health = self._health
        lane = UpstreamLane(self.events.samples_for)
        config = self.config
        spoke = anyio.Event()  # the handshake ended: a stdio child then gets its grace to exit
        if config.transport == "stdio":
            command, args, env = config.command or "", list(config.args), self._child_env()
            child = stdio_transport(command, args, env, config.cwd, lane, self.stderr, spoke)
            transport = WatchedTransport(child, health.lost, lane, self._on_task_status, self._answer_task)
        else:
            endpoint = http_transport(config.url or "", dict(config.headers), lane, self._joined, self.oauth)
            transport = WatchedTransport(endpoint, health.lost, lane, self._on_task_status, self._answer_task)
        events = self.events
        client = Client(
            transport,
            mode="legacy" if self.legacy else self.config.protocol,
            logging_callback=self._on_log,
            sampling_callback=self._asked(events.sampling) if events.sampling is not None else None,
            sampling_capabilities=types.SamplingCapability(tools=types.SamplingToolsCapability())
            if events.sampling_tools
            else None,
            # declares elicitation, form and url modes
            elicitation_callback=self._asked(events.elicitation) if events.elicitation is not None else None,
            # declares roots, with listChanged
            list_roots_callback=self._asked_roots(events.list_roots) if events.list_roots is not None else None,
            log_level="debug",  # 2026 servers log only to requests that opt in; mcpmux relays what clients want
            message_handler=self._on_message,
            cache=None,
            extensions=self._declared_extensions(),
        )
        # The deadline covers the process start and handshake only; it is lifted once connected.
        with anyio.CancelScope(deadline=anyio.current_time() + self.settings.startup_timeout) as scope:
            async with client:
                scope.deadline = math.inf
                spoke.set()
                self.lane = lane
                try:
                    yield client
                finally:
                    self.lane = None
        if scope.cancelled_caught:
            raise TimeoutError

    def _declared_extensions(self) -> list[ClientExtension]:
        declared = []
        for identifier, settings in sorted(self.extensions.items()):
            try:
                declared.append(advertise(identifier, settings))
            except ValueError as err:  # a client's malformed identifier must not cost the connection
                logger.warning("upstream %r: not declaring extension %r: %s", self.name, identifier, err)
        return declared

    def _asked(self, callback: Any) -> Any:
        """`callback` (sampling, elicitation) run knowing which upstream session asked (`asked_on`)."""

        async def asked(context: ClientRequestContext, params: Any) -> Any:
            token = ASKED_ON.set(self)
            try:
                return await callback(context, params)
            finally:
                ASKED_ON.reset(token)

        return asked

    def _asked_roots(self, callback: ListRootsFnT) -> ListRootsFnT:
        async def asked(context: ClientRequestContext) -> types.ListRootsResult | types.ErrorData:
            token = ASKED_ON.set(self)
            try:
                return await callback(context)
            finally:
                ASKED_ON.reset(token)

        return asked

    def _child_env(self) -> dict[str, str]:
        mode = self.settings.env_passthrough
        if mode == "all":
            env = dict(os.environ)
        else:
            globs = _MINIMAL_ENV if mode == "minimal" else mode
            env = {key: value for key, value in os.environ.items() if any(fnmatch.fnmatchcase(key, g) for g in globs)}
        env.update(self.config.env)
        return env

    async def _on_log(self, params: types.LoggingMessageNotificationParams) -> None:
        token = ASKED_ON.set(self)
        try:
            await self.events.log(self.name, params)
        finally:
            ASKED_ON.reset(token)

    async def _answer_task(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """What a sampling or elicitation request the upstream asked as a task is answered with."""
        answer: Any
        if method == "sampling/createMessage" and self.events.sampling is not None:
            sampling = types.CreateMessageRequestParams.model_validate(params)
            answer = await self._asked(self.events.sampling)(None, sampling)  # the callbacks take no context
        elif method == "elicitation/create" and self.events.elicitation is not None:
            elicitation = types.ElicitRequest.model_validate({"method": method, "params": params}).params
            answer = await self._asked(self.events.elicitation)(None, elicitation)
        else:
            raise TaskFailed({"code": types.METHOD_NOT_FOUND, "message": f"mcpmux does not answer {method}"})
        if isinstance(answer, types.ErrorData):
            raise TaskFailed(answer.model_dump(mode="json", exclude_none=True))
        result: dict[str, Any] = answer.model_dump(by_alias=True, mode="json", exclude_none=True)
        return result

    async def _on_task_status(self, params: dict[str, Any]) -> None:
        if self.events.task_status is not None:
            await self.events.task_status(self.name, params)

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            logger.warning("upstream %r sent something that is not MCP: %s", self.name, message)
        elif isinstance(
            message,
            types.ToolListChangedNotification
            | types.PromptListChangedNotification
            | types.ResourceListChangedNotification,
        ):
            await self._refresh()
        elif isinstance(message, types.ElicitCompleteNotification) and self.events.elicitation_complete is not None:
            await self.events.elicitation_complete(self.name, message.params)
        elif isinstance(message, types.ResourceUpdatedNotification) and self.events.resource_updated is not None:
            await self.events.resource_updated(self.name, str(message.params.uri))

    async def subscribe(self, uri: str) -> None:
        """Subscribe to `uri` (2025 `resources/subscribe`), now and on every later connection."""
        self.subscriptions.add(uri)
        if self._subscribes_per_uri():
            try:
                await self.request(f"subscribe to {uri!r}", lambda client: _subscription(client, uri, subscribe=True))
            except UpstreamError:  # the server refused it: nothing to renew
                self.subscriptions.discard(uri)
                raise

    async def unsubscribe(self, uri: str) -> None:
        self.subscriptions.discard(uri)
        if self._subscribes_per_uri():
            await self.request(f"unsubscribe from {uri!r}", lambda client: _subscription(client, uri, subscribe=False))

    def _subscribes_per_uri(self) -> bool:
        """Whether the live session takes `resources/subscribe`: a 2025 one whose server declared it."""
        client = self._client
        if client is None or client.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return False
        resources = client.server_capabilities.resources
        return resources is not None and bool(resources.subscribe)

    async def _resubscribe(self, client: Client) -> None:
        """A new connection: the URIs clients subscribed to are subscribed again (a restart lost them)."""
        resources = client.server_capabilities.resources
        if client.protocol_version in MODERN_PROTOCOL_VERSIONS or resources is None or not resources.subscribe:
            return
        for uri in sorted(self.subscriptions):
            try:
                await _subscription(client, uri, subscribe=True)
            except MCPError as err:  # a URI the restarted server no longer has: its clients hear nothing
                logger.warning("upstream %r: could not subscribe to %s again: %s", self.name, uri, err.error.message)

    async def set_log_level(self, level: types.LoggingLevel) -> None:
        """Ask the server for its logs at `level` and above, now and on every later connection."""
        self.log_level = level
        client = self._client
        if client is not None:
            await _send_log_level(self.name, client, level)

    async def roots_changed(self) -> None:
        """Tell the server the roots mcpmux answers `roots/list` with may have changed (best effort)."""
        client = self._client
        if client is None or client.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return  # 2026-07-28 has no client notifications: roots travel with each request there
        try:
            await client.session.send_notification(types.RootsListChangedNotification())
        except Exception as err:  # a connection going away must not stop the others hearing of it
            logger.debug("upstream %r: could not send roots/list_changed: %s", self.name, err)

    @property
    def client(self) -> Client | None:
        """The live session's client; None while the upstream is not connected."""
        return self._client

    async def request(
        self,
        what: str,
        send: Callable[[Client], Awaitable[Any]],
        sent_on: Client | None = None,
        deadline: float | None = None,
    ) -> Any:
        """Run one request against the live session, with this upstream's timeout and error wording.

        A session the server no longer knows (HTTP 404) is re-initialized and the request sent once more:
        the server never saw it, so that is safe. A connection lost mid-request is not retried, since
        the server may have acted on it. `sent_on`: the session a request already went out on (a
        launched fast-path call); `send` then only waits for it there, until `deadline` (on
        `anyio.current_time()`'s clock: its timeout ran from the sending), and sends it anew only
        on the new session after an expired one.
        """
        stale: Client | None = None
        for attempt in (1, 2):
            client = sent_on if sent_on is not None else await self._live_client(what, stale)
            try:
                limit = self.timeout if deadline is None else max(deadline - anyio.current_time(), 0.0)
                with anyio.fail_after(limit):
                    return await send(client)
            except TimeoutError:
                raise UpstreamTimeoutError(
                    f"upstream {self.name!r} did not answer {what} within {self.timeout:g}s "
                    f"(raise `timeout` for this server in the config if it is just slow)"
                ) from None
            except MCPError as err:
                if _session_expired(err) and attempt == 1:
                    logger.info("upstream %r: session expired; re-initializing", self.name)
                    if client is self._client:  # not a later connection: that one is fine
                        self._mark_lost()
                    stale, sent_on = client, None  # a launched request is sent anew, by `send`
                    continue
                if err.code == CONNECTION_CLOSED:
                    if self.oauth is not None and self.oauth.needs_login is not None:
                        raise self.oauth.needs_login from None  # the token was refused; `run` marks it needs login
                    if await self._answers(client):
                        raise UpstreamUnavailableError(
                            f"upstream {self.name!r} lost its connection during {what}, before answering; it "
                            "may have run it, so mcpmux did not send it again (retry if that is safe)"
                        ) from None
                    if sent_on is None or sent_on is self._client:  # not a later connection: that one is fine
                        self._mark_lost()
                    raise UpstreamUnavailableError(
                        f"upstream {self.name!r} lost its connection during {what} (the server exited or "
                        "dropped it); mcpmux is reconnecting, retry shortly"
                    ) from None
                raise UpstreamError(err.error.message, err.error.code, err.error.data) from None
            except RuntimeError as err:
                problem = sdk_problem(err)
                if problem is None:
                    raise
                raise result_error(self.name, what, problem) from None
        raise AssertionError("unreachable")

    async def _answers(self, client: Client) -> bool:
        """Whether `client`'s session still answers, after one call's connection ended under it.

        Over HTTP each call has a connection of its own, and a server may drop one (a worker that
        crashed on it, a proxy's idle timeout) while the session and every other call live on: only
        a session that no longer answers is reconnected. A stdio pipe that closed fails this at once.
        """
        if client is not self._client or self._health.lost.is_set():
            return False
        with anyio.move_on_after(min(self.timeout, LIVENESS_TIMEOUT)):
            try:
                if client.protocol_version in MODERN_PROTOCOL_VERSIONS:  # 2026 has no ping; discover is as cheap
                    await client.session.send_discover(client.protocol_version)
                else:
                    await client.session.send_ping()
            except Exception:  # however it fails, it did not answer
                return False
            return True
        return False

    async def _live_client(self, what: str, stale: Client | None = None) -> Client:
        """The connected client; waits only while the first connection, or a reconnection, is under way."""
        if self.state == UpstreamState.STARTING or stale is not None:
            with anyio.move_on_after(self.timeout):
                while (self._client is None or self._client is stale) and self.state != UpstreamState.NEEDS_LOGIN:
                    await self._client_changed.wait()
        client = self._client
        if self.state == UpstreamState.NEEDS_LOGIN and self.oauth is not None and self.oauth.needs_login is not None:
            raise self.oauth.needs_login
        if client is None or client is stale:
            reason = f": {self.last_error}" if self.last_error else ""
            raise UpstreamUnavailableError(
                f"upstream {self.name!r} is {self.state.value}{reason}; cannot run {what} "
                "(mcpmux retries the connection with backoff; see `mcpmux tools` for its status)"
            )
        return client


# How servers word "I no longer know your session" (HTTP 404): the SDK server, its client's stand-in, others.
_EXPIRED = re.compile(r"session (not found|terminated|has been terminated|expired|is no longer valid)", re.IGNORECASE)


async def _subscription(client: Client, uri: str, *, subscribe: bool) -> types.EmptyResult:
    """`resources/subscribe` or `unsubscribe` on a 2025 session (the `Client` helpers warn: 2026 removed them)."""
    request: types.SubscribeRequest | types.UnsubscribeRequest
    if subscribe:
        request = types.SubscribeRequest(params=types.SubscribeRequestParams(uri=uri))
    else:
        request = types.UnsubscribeRequest(params=types.UnsubscribeRequestParams(uri=uri))
    result: types.EmptyResult = await client.session.send_request(request, types.EmptyResult)
    return result


async def _send_log_level(name: str, client: Client, level: types.LoggingLevel) -> None:
    """`logging/setLevel` on a 2025 session whose server declared logging (2026-07-28 asks per request).
    Best effort: a server that refuses or is slow keeps its own level, and its clients still hear only
    their own levels and above."""
    if client.protocol_version in MODERN_PROTOCOL_VERSIONS or client.server_capabilities.logging is None:
        return
    request = types.SetLevelRequest(params=types.SetLevelRequestParams(level=level))
    try:
        with anyio.fail_after(SET_LEVEL_TIMEOUT):
            await client.session.send_request(request, types.EmptyResult)
    except (MCPError, TimeoutError) as err:
        logger.debug("upstream %r: logging/setLevel %s not taken: %s", name, level, err)


SET_LEVEL_TIMEOUT = 5.0


def _offer(listing: Listing) -> tuple[object, ...]:
    return (listing.tools, listing.resources, listing.resource_templates, listing.prompts)


def _session_expired(err: MCPError) -> bool:
    return err.error.code == types.INVALID_REQUEST and _EXPIRED.search(err.error.message) is not None


def _describe_failure(err: BaseException, config: ServerConfig, stderr: ChildStderr) -> str:
    """Why a connection attempt failed, in words that say what to check; a stdio child's last words quoted."""
    if isinstance(err, TimeoutError):
        said = stderr.tail() if config.transport == "stdio" else []
        quoted = f"; its stderr ended with: {' | '.join(said)}" if said else ""
        return f"did not complete the MCP handshake within [mux] startup_timeout{quoted}"
    if isinstance(err, FileNotFoundError | PermissionError) and config.transport == "stdio":
        where = f" (run in {config.cwd})" if config.cwd and "/" in (config.command or "") else ""
        return f"cannot run command {config.command!r}{where}: {err.strerror} (check the path or PATH)"
    if isinstance(err, BaseExceptionGroup) and len(err.exceptions) == 1:
        return _describe_failure(err.exceptions[0], config, stderr)
    if isinstance(err, httpx2.ConnectError):
        return f"cannot connect to {config.url}: {err}"
    if isinstance(err, MCPError) and err.error.code == CONNECTION_CLOSED and config.transport == "stdio":
        ended = stderr.describe_exit()
        how = f"; it {ended}" if ended else ""
        return (
            f"command {config.command!r} closed its stdio before the MCP handshake ended{how} "
            "(try running the command by hand)"
        )
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


def _describe_loss(config: ServerConfig, stderr: ChildStderr) -> str:
    """Why a connection that had worked ended: for a stdio child, how it exited and what it said last."""
    ended = stderr.describe_exit() if config.transport == "stdio" else ""
    return f"connection lost: the process {ended}" if ended else "connection lost"
