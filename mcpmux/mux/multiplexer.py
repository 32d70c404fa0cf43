"""`Mux`: owns the upstreams and the catalog, routes every request. The library entry point.

    async with Mux.from_config("mcpmux.toml") as mux:
        result = await mux.call_tool("time__get_current_time", {"timezone": "UTC"})

Entering starts every upstream concurrently and waits until each has connected or failed (at most
`[mux] startup_timeout`); one that is slow or broken never breaks the others, it is simply absent
from the catalog (see `status()`) until its supervisor connects it. A server does not wait
(`wait_for_upstreams=False`): it serves at once with what is ready, each late upstream's tools
join the catalog when it connects (clients hear list_changed), and a call to a tool of an upstream
still starting waits for that upstream alone.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import mcp_types as types
from anyio.abc import TaskGroup

from mcpmux.batching import CachePolicy, ResultCache
from mcpmux.core.call_tracker import CallCancelledError, CallTracker, TrackedCall
from mcpmux.core.config import Config, ProfileSettings, ServerConfig, load_config
from mcpmux.core.inbound import Caller, current_call
from mcpmux.core.logs import RequestContext, set_upstream
from mcpmux.core.metrics import MuxMetrics, outcome_of
from mcpmux.core.server_policy import priority_for
from mcpmux.errors import (
    CallFailedError,
    ConfigError,
    MuxError,
    UnknownToolError,
    UnlistedToolError,
    UpstreamUnavailableError,
    error_result,
)
from mcpmux.inference.serving.sampling_bridge import SamplingBridge
from mcpmux.mux.ask_policies import ClientRequests
from mcpmux.mux.catalog import Catalog, CatalogView, Route
from mcpmux.mux.dispatcher import CachedResult, UpstreamDispatcher
from mcpmux.mux.lifetime import UpstreamLifetime
from mcpmux.mux.relayed_rounds import get_prompt
from mcpmux.mux.reload import ReloadReport, ServerDiff, log_reload, plan_reload
from mcpmux.mux.result_store import ResultStore
from mcpmux.mux.sessions import Reaper, ServerSessions, Session
from mcpmux.mux.task_relay import TaskRelay
from mcpmux.tools.base import LocalTool
from mcpmux.upstream.lane import ProgressFn
from mcpmux.upstream.supervisor import Upstream, UpstreamEvents, UpstreamState, UpstreamStatus

if TYPE_CHECKING:
    from mcpmux.inference.serving.service import InferenceService
    from mcpmux.tools.search import ToolSearch

logger = logging.getLogger(__name__)
T = TypeVar("T")

ChangeListener = Callable[[], Awaitable[None]]
LISTING_REFRESH_WAIT = 2.0
"""Seconds a list request waits for stale upstream listings before serving the last known ones."""


LogListener = Callable[[str, types.LoggingMessageNotificationParams], Awaitable[None]]


class Mux:
    """One catalog over many MCP servers, with every call routed to its upstream."""

    def __init__(self, config: Config, *, profile: str | None = None, wait_for_upstreams: bool = True) -> None:
        """`profile`: serve only what `[profiles.NAME]` allows (the catalog, search and calls).
        `wait_for_upstreams`: entering waits for every upstream's first connection (at most `[mux]
        startup_timeout`); False returns at once (see the module docstring)."""
        self.config = config
        self.profile = profile
        self._waits_for_upstreams = wait_for_upstreams
        chosen = _profile(config, profile)
        self.catalog = Catalog(separator=config.mux.separator, prefix_single=config.mux.prefix_single, profile=chosen)
        self._events = UpstreamEvents(listing_changed=self._on_listing_changed, log=self._on_log)
        # Upstream sampling requests go to the bridge, which answers under each server's policy.
        self.sampling = SamplingBridge()
        # Upstream elicitation and roots requests, answered under each server's settings.
        self.client_requests = ClientRequests()
        self.inference: InferenceService | None = None  # started on entry when [inference] backend != "off"
        self.upstreams: dict[str, Upstream] = {}
        self.log_level: types.LoggingLevel | None = None
        """The most verbose level any client asked upstream logs at (`set_log_level`)."""
        self.cache: ResultCache[CachedResult] = ResultCache(
            CachePolicy(max_entries=config.mux.cache_max_entries),
            name="tool results",
            label=lambda key: key[:2],  # hits counted per (upstream, tool): the dashboard's and /metrics'
        )
        self.resource_cache: ResultCache[types.ReadResourceResult] = ResultCache(
            CachePolicy(max_entries=config.mux.cache_max_entries), name="resource reads"
        )
        self.results = ResultStore()
        """Whole results of the calls cut to their plan's `result_limit`, read back as `mcpmux://results/...`."""
        self.metrics = MuxMetrics(self)  # Prometheus /metrics; its collectors read the parts at scrape time
        self.dispatchers: dict[str, UpstreamDispatcher] = {}
        self.to_sdk: dict[str, int] = {}
        """`tools/call` requests the fast path left to the SDK path, by reason (`mcpmux.mux.fast_path.ToSdk`'s
        names, lower-case)."""
        self.sessions: dict[str, ServerSessions] = {}
        """Per server, its shared session and clients' own (`[servers.X] sessions`)."""
        self._reaper = Reaper(lambda: list(self.sessions.values()), lambda: self.config.mux)
        self._caller_views: dict[tuple[str | None, tuple[int, ...]], tuple[tuple[object, ...], CatalogView]] = {}
        """Catalogs of clients' own sessions, by profile and the sessions they list (each kept alive by its view)."""
        self.tasks = TaskRelay(self.upstreams, self.catalog)
        """The tasks clients created through mcpmux (2025-11-25), by mcpmux's ids."""
        self.calls = CallTracker()  # client calls in flight: shutdown drains them, a reload cancels some
        for name, server in config.enabled_servers.items():
            self._add_upstream(name, server)
        self._lifetimes: dict[str, UpstreamLifetime] = {}  # each upstream stops alone (reload)
        self._reload_lock = anyio.Lock()
        self._reloading = False  # while set, listing changes wait for the reload's one announcement
        self.local_tools: dict[str, LocalTool] = {}
        self._own_tools: set[str] = set()  # mcpmux's mux_* tools: in every profile's view
        self._views: dict[str | None, CatalogView] = {}
        self._change_listeners: list[ChangeListener] = []
        self._log_listeners: list[LogListener] = []
        self._resource_listeners: list[Callable[[str, str], Awaitable[None]]] = []
        self._stack = AsyncExitStack()
        self._tasks: TaskGroup | None = None
        self._started_at = 0.0  # `anyio.current_time()` on entry
        if config.mux.meta_tools:
            from mcpmux.tools.meta import meta_tools  # imported here: meta_tools imports this module

            for local in meta_tools(self):
                self._own_tools.add(local.tool.name)
                self.add_local_tool(local)
        self.tool_search: ToolSearch | None = None
        if config.mux.tool_search != "off":
            from mcpmux.tools.search import ToolSearch  # imported here: search imports this module

            self.tool_search = ToolSearch(self)
            for local in self.tool_search.local_tools():
                self._own_tools.add(local.tool.name)
                self.add_local_tool(local)
        if config.inference.backend != "off":
            from mcpmux.tools.local import inference_tools  # imported here: local_tools imports this module

            for local in inference_tools(lambda: self.inference, config.inference.namespace, config.mux.separator):
                if chosen is None or chosen.allows_tool(local.tool.name):
                    self.add_local_tool(local)

    @classmethod
    def from_config(cls, config: str | Path | Config, *, wait_for_upstreams: bool = True) -> Mux:
        """A Mux for a config file path (TOML or client JSON) or an already-loaded `Config`."""
        return cls(config if isinstance(config, Config) else load_config(config), wait_for_upstreams=wait_for_upstreams)

    async def __aenter__(self) -> Mux:
        await self._stack.__aenter__()
        self._started_at = anyio.current_time()
        self._tasks = anyio.create_task_group()
        await self._tasks.__aenter__()
        self.tasks.start(self._tasks)
        try:
            for name, upstream in self.upstreams.items():
                self._lifetimes[name] = await UpstreamLifetime.start(self._tasks, upstream, self.dispatchers[name])
            # The model loads while the upstreams connect.
            await self._start_inference()
            if self.tool_search is not None:
                self.tool_search.start(self._tasks)  # indexes while the upstreams connect
            self._tasks.start_soon(self._reaper.run)
            if self._waits_for_upstreams:
                await self.wait_for_upstreams()
        except BaseException:
            await self.__aexit__(None, None, None)  # what started stops; the error is the caller's
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        assert self._tasks is not None, "Mux was not entered"
        try:
            await self._stop_inference()
        finally:
            self._tasks.cancel_scope.cancel()
            try:
                # Not told of the body's exception: a task group would hand it back wrapped in an
                # ExceptionGroup, and the caller's `except KeyError` would miss it. It goes on unchanged.
                await self._tasks.__aexit__(None, None, None)
            finally:
                await self._stack.__aexit__(None, None, None)
        return None

    async def wait_for_upstreams(self, names: list[str] | None = None) -> None:
        """Wait until the upstreams `names` (default: all) have each connected or failed once; at most
        `[mux] startup_timeout` seconds, past which the late ones go on connecting in the background."""
        upstreams = [self.upstreams[name] for name in names] if names is not None else list(self.upstreams.values())
        with anyio.move_on_after(self.config.mux.startup_timeout):
            for upstream in upstreams:
                await upstream.settled.wait()

    async def wait_for_starting(self) -> None:
        """In the first `[mux] startup_list_wait` seconds, wait for the upstreams still starting (each
        until it has connected or failed): what lists, searches and names of prompts and resources
        ask before they answer, so that what comes up in time is in them. Later: no wait at all."""
        starting = [
            upstream.settled for upstream in self.upstreams.values() if upstream.state == UpstreamState.STARTING
        ]
        if starting:
            with anyio.move_on_after(self._started_at + self.config.mux.startup_list_wait - anyio.current_time()):
                for settled in starting:
                    await settled.wait()

    async def _start_inference(self) -> None:
        if self.config.inference.backend == "off":
            return
        from mcpmux.inference.serving.service import InferenceService  # torch comes with the first model loaded

        self.inference = await InferenceService.start(self.config.inference)
        self.sampling.service = self.inference

    async def _stop_inference(self) -> None:
        # Called by the task that started it, before the task group closes: the service's own task
        # groups were entered after the Mux's and must be left before it.
        self.sampling.service = None
        if self.inference is not None:
            await self.inference.shutdown()
            self.inference = None

    # -- lifecycle (mcpmux.mux.reload) ---------------------------------------------------------------

    async def reload(self, config: Config) -> ReloadReport:
        """Apply a new config while serving: added upstreams start, removed ones stop, changed ones
        restart, unchanged ones are left alone with their calls in flight; list_changed is announced once."""
        async with self._reload_lock:  # concurrent reloads run one after another
            diff, report, self.config = plan_reload(self.config, config)
            for upstream in self.upstreams.values():
                upstream.settings = self.config.mux
            if diff.added or diff.removed or diff.changed:
                await self._replace_servers(config, diff)
            log_reload(config.source, report)
            return report

    async def _replace_servers(self, new: Config, diff: ServerDiff) -> None:
        """Stop the removed and changed servers (and their clients' own sessions), start the changed and
        added ones, wait for them (at most `startup_timeout`), then announce the catalog once."""
        # Nothing awaits between taking a removed upstream out of the dicts and its routes out of the
        # catalog, so no call routes to a missing upstream; a changed one stays in the dicts (its calls
        # refused) until its successor replaces it there.
        self._reloading = True
        try:
            stopping: list[UpstreamLifetime] = []
            # Clients' own sessions stop with their server; a changed server's are replaced with it.
            own = [self.sessions.pop(name) for name in diff.removed] + [self.sessions[name] for name in diff.changed]
            for name in diff.removed:
                self.calls.refuse(name, f"upstream {name!r} was removed by a config reload; the call was cancelled")
                del self.upstreams[name], self.dispatchers[name]
                stopping.append(self._lifetimes.pop(name))
            self.catalog.rebuild(self.upstreams.values(), self.local_tools)
            for name in diff.changed:
                self.calls.refuse(
                    name,
                    f"upstream {name!r} is restarting because a config reload changed it; the call was cancelled, "
                    "retry it shortly",
                )
                stopping.append(self._lifetimes.pop(name))
            async with anyio.create_task_group() as tasks:
                for lifetime in stopping:
                    tasks.start_soon(lifetime.stop)
                for sessions in own:
                    tasks.start_soon(sessions.stop)
            for name in (*diff.changed, *diff.added):
                await self._start_upstream(name, new.servers[name])
                self.calls.admit(name)  # calls wait for the new connection, up to the upstream's timeout
            with anyio.move_on_after(self.config.mux.startup_timeout):
                for name in (*diff.changed, *diff.added):
                    await self.upstreams[name].settled.wait()
        finally:
            self._reloading = False
            for name in (*diff.removed, *diff.changed):
                self.calls.admit(name)
        for name in (*diff.removed, *diff.changed, *diff.added):
            self.cache.invalidate_tag(name)
            self.resource_cache.invalidate_tag(name)
        await self._catalog_changed()

    def track_call(self, upstream: str | None = None, session: Upstream | None = None) -> TrackedCall:
        """`with mux.track_call(upstream) as tracked:` around one client call (`upstream` None: a local tool),
        serving the inbound call being served (`current_call`), on `session` (or `tracked.session`, once known).

        Shutdown waits for tracked calls and cancels those past its grace; a reload cancels those on the
        upstreams it stops. Enter it before looking the upstream up: it raises `CallCancelledError` (an
        `UpstreamUnavailableError`) when the call is refused or cancelled, with the reason."""
        return self.calls.track(upstream, current_call(), session)

    async def drain(self, grace: float, skip: anyio.Event | None = None) -> int:
        """Refuse new calls, let those in flight finish within `grace` seconds (or until `skip` is set),
        then cancel the rest, each with an error saying so; returns how many were cancelled."""
        return await self.calls.drain(grace, skip)

    def _add_upstream(self, name: str, server: ServerConfig) -> None:
        events = self._events_for(name, server)
        upstream = Upstream(name, server, self.config.mux, events)
        upstream.log_level = self.log_level
        self.upstreams[name] = upstream
        dispatcher = UpstreamDispatcher(upstream, self.cache, lambda: self.config.mux, self.metrics.observe_call)
        self.dispatchers[name] = dispatcher
        self.sessions[name] = ServerSessions(
            upstream,
            dispatcher,
            functools.partial(self._start_own_session, name),
            lambda: self.config.mux,
            self._busy,
            self._reaper.started,
        )

    def _busy(self, upstream: Upstream) -> bool:
        return bool(self.calls.callers(upstream))

    async def _start_own_session(
        self, name: str, key: str, owner: str | None, extensions: dict[str, dict[str, Any]], legacy: bool
    ) -> tuple[Upstream, UpstreamDispatcher, UpstreamLifetime]:
        """Start a session of clients' own with server `name` (`mcpmux.mux.sessions`), in the
        Mux's task group; its first listing is no news to other clients, a later change is."""
        assert self._tasks is not None, "Mux was not entered"
        shared = self.dispatchers[name]
        first = True

        async def listing_changed(server: str) -> None:
            nonlocal first
            self._caller_views.clear()
            self.cache.invalidate_tag(server)
            if first:  # its clients wait for it before they list: no news to anyone
                first = False
                return
            for listener in list(self._change_listeners):
                await listener()

        events = replace(self._events_for(name, shared.upstream.config), listing_changed=listing_changed)
        upstream = Upstream(
            name,
            shared.upstream.config,
            self.config.mux,
            events,
            key=key,
            owner=owner,
            extensions=extensions,
            legacy=legacy,
        )
        upstream.log_level = self.log_level
        dispatcher = UpstreamDispatcher(
            upstream, self.cache, lambda: self.config.mux, self.metrics.observe_call, gate=shared.gate
        )
        lifetime = await UpstreamLifetime.start(self._tasks, upstream, dispatcher)
        return upstream, dispatcher, lifetime

    def _events_for(self, name: str, server: ServerConfig) -> UpstreamEvents:
        requests = self.client_requests
        return replace(
            self._events,
            sampling=self.sampling.callback(name, server.sampling),
            sampling_tools=server.sampling.asks_client,
            samples_for=self.sampling.samples_for(server.sampling),
            elicitation=requests.elicitation_callback(name, server.elicitation),
            list_roots=requests.roots_callback(
                name,
                server.roots if server.roots is not None else self.config.mux.roots,
                server.timeout or self.config.mux.call_timeout,
            ),
            elicitation_complete=requests.elicitation_complete,
            resource_updated=self._on_resource_updated,
            task_status=self.tasks.status,
        )

    async def _start_upstream(self, name: str, server: ServerConfig) -> None:
        assert self._tasks is not None, "Mux was not entered"
        self._add_upstream(name, server)
        self._lifetimes[name] = await UpstreamLifetime.start(self._tasks, self.upstreams[name], self.dispatchers[name])

    # -- listeners -------------------------------------------------------------------------------

    def on_catalog_changed(self, listener: ChangeListener) -> None:
        """Call `listener` whenever an upstream's tools, resources or prompts change."""
        self._change_listeners.append(listener)

    def on_log(self, listener: LogListener) -> None:
        """Call `listener(upstream, params)` for every log message an upstream sends."""
        self._log_listeners.append(listener)

    def add_local_tool(self, local: LocalTool) -> None:
        """Serve a tool implemented in this process (meta-tools, local inference) under its own name."""
        self.local_tools[local.tool.name] = local
        self.catalog.rebuild(self.upstreams.values(), self.local_tools)

    async def _on_listing_changed(self, upstream: str) -> None:
        # A new listing means new tools or a restarted server: results cached before may be stale.
        self.cache.invalidate_tag(upstream)
        self.resource_cache.invalidate_tag(upstream)
        if not self._reloading:
            await self._catalog_changed()

    async def _catalog_changed(self) -> None:
        self.catalog.rebuild(self.upstreams.values(), self.local_tools)
        for listener in list(self._change_listeners):
            await listener()

    def on_resource_updated(self, listener: Callable[[str, str], Awaitable[None]]) -> None:
        """Call `listener(upstream, uri)` for every `notifications/resources/updated` an upstream sends."""
        self._resource_listeners.append(listener)

    async def _on_resource_updated(self, upstream: str, uri: str) -> None:
        uri = self.catalog.public_uri(upstream, uri)
        for listener in list(self._resource_listeners):
            await listener(upstream, uri)

    async def subscribe_resource(self, uri: str) -> None:
        """Subscribe the upstream that lists `uri` to it (kept across its restarts); `UnknownToolError` if none does."""
        owner, own = self.catalog.locate_resource(uri)
        await self.upstreams[owner].subscribe(own)

    async def unsubscribe_resource(self, uri: str) -> None:
        try:
            owner, own = self.catalog.locate_resource(uri)
        except UnknownToolError:  # no longer listed: nothing to unsubscribe from
            return
        upstream = self.upstreams.get(owner)
        if upstream is not None:
            await upstream.unsubscribe(own)

    async def set_log_level(self, level: types.LoggingLevel) -> None:
        """Every upstream logs at `level` and above (the most verbose level any client asked for), also
        those started later; each client still hears only its own level and above."""
        self.log_level = level
        for sessions in list(self.sessions.values()):
            for upstream, _ in sessions.sessions():
                await upstream.set_log_level(level)

    async def roots_changed(self) -> None:
        """A client's roots changed (or a client with roots connected): every upstream session is told
        (one of another client's own asks its own client again: nothing of this client's reaches it)."""
        for sessions in list(self.sessions.values()):
            for upstream, _ in sessions.sessions():
                await upstream.roots_changed()

    async def _on_log(self, upstream: str, params: types.LoggingMessageNotificationParams) -> None:
        logger.info("[%s] %s: %s", upstream, params.level, params.data)
        for listener in list(self._log_listeners):
            await listener(upstream, params)

    # -- catalog ---------------------------------------------------------------------------------

    async def refresh_stale_listings(self) -> None:
        """Refetch, concurrently, every listing whose 2026 `ttlMs` has run out; call before serving a list.

        Waits at most `LISTING_REFRESH_WAIT` seconds: an upstream that is slow or stuck keeps refreshing
        in the background while the list is served from its last known listing. In the first `[mux]
        startup_list_wait` seconds it also waits for the upstreams still starting, so that a client
        that never acts on list_changed still sees every tool that comes up in time.
        """
        assert self._tasks is not None, "Mux was not entered"
        await self.wait_for_starting()
        refreshes = [upstream.refresh_if_stale(self._tasks) for upstream in list(self.upstreams.values())]
        with anyio.move_on_after(LISTING_REFRESH_WAIT):
            for done in refreshes:
                if done is not None:
                    await done.wait()

    def view(self, profile: str | None = None, caller: Caller | None = None) -> CatalogView:
        """The part of the catalog `[profiles.NAME]` allows (None: all the Mux serves); `ConfigError` if
        there is no such profile. Over HTTP a client's profile comes from its path or its bearer token.
        A `caller` with sessions of its own sees what those sessions list (`[servers.X] sessions`)."""
        settings = _profile(self.config, profile)
        own = self._own_sources(caller)
        if own is not None:
            return self._caller_view(profile, settings, own)
        found = self._views.get(profile)
        if found is None or found.profile is not settings:  # a reload may have changed the profile
            found = CatalogView(self.catalog, self.local_tools, self._own_tools, profile, settings)
            self._views[profile] = found
        return found

    def _own_sources(self, caller: Caller | None) -> list[Upstream] | None:
        """Each server's session the caller's listing comes from, where any is one of its own (else None)."""
        if caller is None or not (caller.lasting or caller.extensions):
            return None
        sources: list[Upstream] = []
        own = False
        for sessions in self.sessions.values():
            found = sessions.find(caller)
            upstream = found[0] if found is not None and found[0].listing.tools else sessions.shared[0]
            own = own or upstream is not sessions.shared[0]
            sources.append(upstream)
        return sources if own else None

    def _caller_view(
        self, profile: str | None, settings: ProfileSettings | None, sources: list[Upstream]
    ) -> CatalogView:
        """A catalog of the caller's own sessions' listings (shared by the clients of the same sessions),
        kept while those listings are."""
        listings = tuple(source.listing for source in sources)
        key = (profile, tuple(map(id, sources)))
        kept = self._caller_views.get(key)
        if kept is not None and kept[0] == listings and kept[1].profile is settings:
            return kept[1]
        if len(self._caller_views) >= 4 * max(self.config.mux.max_client_sessions, 1):
            self._caller_views.clear()  # sessions stopped since: their views go (the live ones are rebuilt)
        catalog = Catalog(separator=self.config.mux.separator, prefix_single=self.config.mux.prefix_single)
        catalog.profile = self.catalog.profile
        catalog.rebuild(sources, self.local_tools)
        view = CatalogView(catalog, self.local_tools, self._own_tools, profile, settings)
        self._caller_views[key] = (listings, view)
        return view

    def list_tools(self, profile: str | None = None, caller: Caller | None = None) -> list[types.Tool]:
        """Every tool in `profile`'s view (as `caller` sees it): mcpmux's own first, then the upstreams'."""
        view = self.view(profile, caller)
        local = [local.tool for name, local in self.local_tools.items() if view.allows_local(name)]
        return local + view.tools()

    def listed_tools(self, profile: str | None = None, caller: Caller | None = None) -> list[types.Tool]:
        """What tools/list shows clients: every tool, or in search mode mcpmux's own and the pinned ones."""
        tools = self.list_tools(profile, caller)
        return self.tool_search.listing(tools) if self.tool_search is not None else tools

    def input_schema(self, name: str) -> dict[str, Any] | None:
        """The input schema of a listed tool, found without building the whole list."""
        local = self.local_tools.get(name)
        return local.tool.input_schema if local is not None else self.catalog.input_schemas.get(name)

    def list_prompts(self, profile: str | None = None) -> list[types.Prompt]:
        return self.view(profile).prompts()

    def list_resources(self, profile: str | None = None) -> list[types.Resource]:
        return self.view(profile).resources()

    def list_resource_templates(self, profile: str | None = None) -> list[types.ResourceTemplate]:
        return self.view(profile).resource_templates()

    def uptime(self) -> float:
        """Seconds since the Mux was entered."""
        return anyio.current_time() - self._started_at

    def status(self) -> list[UpstreamStatus]:
        """Each upstream's connection state, protocol version, restarts, last error and clients' own sessions."""
        statuses = []
        for name, upstream in self.upstreams.items():
            status = upstream.status()
            sessions = self.sessions.get(name)
            status.client_sessions = sessions.own if sessions is not None else 0
            statuses.append(status)
        return statuses

    # -- routing ---------------------------------------------------------------------------------

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        progress: ProgressFn | None = None,
        caller: Caller | None = None,
        hears_logs: bool = False,
    ) -> types.CallToolResult:
        """Call a tool by its public name, through the upstream's queue, cache, coalescing and batching.

        Upstream `isError` results and JSON-RPC errors (`UpstreamError`) come back unchanged. An
        unavailable or timed-out upstream, or a call refused by a limit, gives an `isError` result whose
        text says what happened, so a model sees it and can carry on; an unknown name raises
        `UnknownToolError`. `caller`: who calls (None: the library); its identity scopes per-client
        cache entries and picks its upstream session (`[servers.X] sessions`), its clientInfo name adds
        its `[mux] client_priorities` entry to the call's priority, and its profile is the view the
        name is looked up in. `hears_logs`: the caller relays the upstream's log messages of this call
        to its client (`on_log`), which must have them before the result.

        Every log line written while the call runs carries its request id (`mcpmux.core.logs`).
        """
        with RequestContext(tool=name):
            started = time.perf_counter()
            outcome = "error"
            logger.debug("client call started: %s", name)
            try:
                result = await self._call_tool(name, arguments, progress, caller or Caller(), hears_logs)
                outcome = "isError" if result.is_error else "ok"
                return result
            except BaseException as err:
                outcome = outcome_of(err)
                raise
            finally:
                elapsed_ms = (time.perf_counter() - started) * 1e3
                logger.debug("client call ended: %s, %s in %.1f ms", name, outcome, elapsed_ms)

    async def _call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None,
        progress: ProgressFn | None,
        caller: Caller,
        hears_logs: bool = False,
    ) -> types.CallToolResult:
        local = self.local_tools.get(name)
        if local is not None and self.view(caller.profile).allows_local(name):
            try:
                with self.track_call():
                    answered = await local.handler(arguments or {}, progress, caller)
                if not local.fitted:
                    return answered
                return self.results.fit_own(local.tool, answered, self.config.mux.max_result_bytes)
            except CallCancelledError as err:
                return error_result(str(err))
        try:
            await self.wait_for_tool(name, caller.profile)
        except CallCancelledError as err:
            return error_result(str(err))
        await self.prepare(caller)
        route = self.resolve_tool(name, caller.profile, caller)
        set_upstream(route.upstream)  # for the log lines of this call
        try:
            with self.track_call(route.upstream) as tracked:
                upstream, dispatcher = await self.session(route.upstream, caller)
                async with self._turn(route.upstream, upstream, caller):
                    tracked.session = upstream
                    result = await dispatcher.call_tool(
                        route.name, arguments or {}, progress, caller.client, self._boost(caller), hears_logs
                    )
                    result = self.catalog.name_result(route.upstream, result)
                    return self.results.fit_model(dispatcher.plan(route.name), result, route.upstream)
        except CallFailedError as err:
            return error_result(str(err))

    def _boost(self, caller: Caller) -> int:
        """The caller's `[mux] client_priorities` entry, added to its calls' priority."""
        return priority_for(self.config.mux.client_priorities, caller.name) if caller.name else 0

    def _turn(self, server: str, upstream: Upstream, caller: Caller) -> AbstractAsyncContextManager[None]:
        sessions = self.sessions.get(server)
        return sessions.turn(upstream, caller) if sessions is not None else contextlib.nullcontext()

    async def session(self, server: str, caller: Caller | None) -> Session:
        """The session `caller`'s requests to `server` go to, started and waited for if it is a new one of
        its own (`[servers.X] sessions`), and its executor."""
        sessions = self.sessions.get(server)
        if sessions is None:  # being replaced by a reload: its calls are refused as they are tracked
            return self.upstreams[server], self.dispatchers[server]
        return await sessions.session(caller)

    async def prepare(self, caller: Caller | None) -> None:
        """Start, and wait for, the sessions of its own the caller should have with any server, so that
        what it lists and calls is what those servers show it (`[servers.X] sessions`)."""
        if caller is None or not (caller.lasting or caller.extensions):
            return
        if caller.handshakes and caller.can_be_asked:
            await self.wait_for_starting()  # whether it needs a 2025 session: known once its servers spoke
        pending = [sessions for sessions in list(self.sessions.values()) if sessions.find(caller) is None]
        if not pending:
            return

        async def start(sessions: ServerSessions) -> None:
            try:
                await sessions.session(caller)
            except UpstreamUnavailableError as err:  # its calls say so; the listing shows the shared session's
                logger.warning("%s", err)

        async with anyio.create_task_group() as tasks:
            for sessions in pending:
                tasks.start_soon(start, sessions)

    def model_refusal(self, name: str, profile: str | None = None) -> str | None:
        """Why the model may not call `name` through mcpmux's own tools, which it drives: a tool whose
        `_meta.ui.visibility` leaves out "model" is its server's views' alone. None: it may (or the call
        itself will say what is wrong with the name)."""
        if name in self.local_tools:
            return None
        try:
            route = self.resolve_tool(name, profile)
        except MuxError:
            return None
        if route not in self.catalog.app_only:
            return None
        return (
            f'tool {name!r} is only for its server\'s views (its _meta.ui.visibility leaves out "model"): '
            "the host calls it for them, the model cannot"
        )

    async def wait_for_tool(self, name: str, profile: str | None = None) -> None:
        """Wait for the upstream of the tool `name` if it is still starting (at most `[mux]
        startup_timeout`), as a call in flight: a call needs its own upstream, and no other, and a
        client may call a tool it knows before its upstream is listed. Returns at once for a listed
        or local tool, or one no starting upstream may offer. Raises `CallCancelledError` (with the
        reason) when shutdown or a reload cancels the wait."""
        if name in self.local_tools:
            return
        try:
            self.resolve_tool(name, profile)
            return
        except UnknownToolError:
            pass
        # A lone upstream's names are unprefixed where `prefix_single = false` (`serve -- CMD`).
        alone = len(self.upstreams) == 1 and not self.config.mux.prefix_single
        for upstream in list(self.upstreams.values()):
            if upstream.state == UpstreamState.STARTING and (
                alone or name.startswith(f"{upstream.name}{self.config.mux.separator}")
            ):
                with self.track_call(upstream.name):  # shutdown answers it, as any call in flight
                    await self.wait_for_upstreams([upstream.name])
                return

    async def _when_started(self, resolve: Callable[[], T]) -> T:
        """`resolve()`; if it finds nothing while upstreams are starting, again once they have
        (`wait_for_starting`): a prompt or resource of theirs is not known before they list it."""
        try:
            return resolve()
        except UnknownToolError:
            if not any(upstream.state == UpstreamState.STARTING for upstream in self.upstreams.values()):
                raise
        await self.wait_for_starting()
        return resolve()

    def resolve_tool(self, name: str, profile: str | None = None, caller: Caller | None = None) -> Route:
        """Where the upstream tool `name` goes (in `profile`'s view, as `caller` sees it). Raises
        `UnknownToolError`, or `UnlistedToolError` when the name's prefix is an upstream that is not
        connected (its tools are listed once it is)."""
        view = self.view(profile, caller)
        try:
            return view.resolve_tool(name)
        except UnknownToolError:
            separator = self.config.mux.separator
            for upstream in self.upstreams.values():
                if view.profile is not None and not view.profile.allows_server(upstream.name):
                    continue  # outside the profile: unknown, as if it did not exist
                if upstream.state != UpstreamState.READY and name.startswith(f"{upstream.name}{separator}"):
                    if upstream.state == UpstreamState.NEEDS_LOGIN and upstream.last_error:
                        # "upstream NAME needs login: run `mcpmux login NAME ...`": the one thing to do
                        raise UnlistedToolError(f"tool {name!r} is not listed: {upstream.last_error}") from None
                    reason = f" ({upstream.last_error})" if upstream.last_error else ""
                    raise UnlistedToolError(
                        f"tool {name!r} is not listed: upstream {upstream.name!r} is {upstream.state.value}{reason}; "
                        f"fix [servers.{upstream.name}] in {self.config.source} or wait for it to connect "
                        "(`mcpmux tools` shows each upstream's state)"
                    ) from None
            raise

    async def read_resource(
        self, uri: str, *, client: str | None = None, profile: str | None = None
    ) -> types.ReadResourceResult:
        """Read a resource from the upstream that lists it (in `profile`'s view), or whose `ui://` URI it is
        (`Catalog.locate_resource`); a 2026 `ttlMs` lets mcpmux serve it from cache. `cacheScope: private`
        entries are kept per `client`, `public` ones shared. The contents carry the URI in the form asked for.
        """
        if self.results.holds(uri):
            return self.results.read(uri)  # a tool result cut for the context, kept whole
        caller = _caller()
        owner, own = await self._when_started(lambda: self.view(profile, caller).locate_resource(uri))
        upstream, _ = await self.session(owner, caller)
        key = (owner, "resources/read", uri)
        shared = upstream.key  # a session of clients' own shares its public entries with nobody else
        for scope in (shared,) if client is None else (shared, client):
            cached = self.resource_cache.get(key, scope=scope)
            if cached is not None:
                return cached
        with self.track_call(owner, upstream):
            result: types.ReadResourceResult = await upstream.request(
                f"resource {own!r}", lambda session: session.read_resource(own, cache_mode="bypass")
            )
        if own != uri:
            result = self.catalog.name_read(owner, result)
        public = result.cache_scope == "public"
        if result.ttl_ms > 0 and (public or client is not None):
            self.resource_cache.put(
                key, result, scope=shared if public else client, ttl=result.ttl_ms / 1000, tags=(owner,)
            )
        return result

    async def get_prompt(
        self, name: str, arguments: dict[str, str] | None = None, profile: str | None = None
    ) -> types.GetPromptResult:
        caller = _caller()
        route = await self._when_started(lambda: self.view(profile, caller).resolve_prompt(name))
        upstream, _ = await self.session(route.upstream, caller)
        with self.track_call(route.upstream, upstream):
            result: types.GetPromptResult = await upstream.request(
                f"prompt {route.name!r}", lambda client: get_prompt(client, route.name, arguments, upstream.config)
            )
        return result

    async def complete(
        self,
        ref: types.PromptReference | types.ResourceTemplateReference,
        argument: dict[str, str],
        context_arguments: dict[str, str] | None = None,
        profile: str | None = None,
    ) -> types.CompleteResult:
        """Argument completion, routed by the prompt's public name or the template's owner (in `profile`'s
        view); like a prompt's name, one an upstream still starting may list is waited for."""
        upstream_ref: types.PromptReference | types.ResourceTemplateReference = ref
        caller = _caller()
        if isinstance(ref, types.PromptReference):
            route = await self._when_started(lambda: self.view(profile, caller).resolve_prompt(ref.name))
            owner, upstream_ref = route.upstream, ref.model_copy(update={"name": route.name})
        else:
            owner, own = await self._when_started(lambda: self._template_owner(ref.uri, self.view(profile, caller)))
            upstream_ref = ref if own == ref.uri else ref.model_copy(update={"uri": own})
        upstream, _ = await self.session(owner, caller)
        with self.track_call(owner, upstream):
            result: types.CompleteResult = await upstream.request(
                "completion", lambda client: client.complete(upstream_ref, argument, context_arguments)
            )
        return result

    def _template_owner(self, uri_template: str, view: CatalogView) -> tuple[str, str]:
        """The upstream that lists the template clients see as `uri_template`, and its own form of it."""
        for name, upstream in self.upstreams.items():
            if not view.allows_server(name):
                continue
            for template in upstream.listing.resource_templates:
                if self.catalog.public_uri(name, template.uri_template) == uri_template:
                    return name, template.uri_template
        raise UnknownToolError(f"no upstream offers the resource template {uri_template!r}")


def _caller() -> Caller | None:
    """Who the request being served is for (set by the front that received it)."""
    call = current_call()
    return call.caller if call is not None else None


def _profile(config: Config, name: str | None) -> ProfileSettings | None:
    if name is None:
        return None
    if name not in config.profiles:
        known = ", ".join(sorted(config.profiles)) or "none"
        raise ConfigError(f"{config.source}: no [profiles.{name}] table (profiles defined: {known})")
    return config.profiles[name]
