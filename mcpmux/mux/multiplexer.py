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

import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
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
from mcpmux.core.logs import RequestContext, set_upstream
from mcpmux.core.metrics import MuxMetrics, outcome_of
from mcpmux.core.server_policy import priority_for
from mcpmux.errors import (
    ConfigError,
    MuxError,
    UnknownToolError,
    UnlistedToolError,
    UpstreamResultError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
    error_result,
)
from mcpmux.inference.serving.sampling_bridge import SamplingBridge
from mcpmux.mux.catalog import Catalog, CatalogView, Route
from mcpmux.mux.client_requests import ClientRequests
from mcpmux.mux.dispatcher import CachedResult, UpstreamDispatcher
from mcpmux.mux.reload import ReloadReport, UpstreamLifetime, reload_mux
from mcpmux.mux.result_store import ResultStore
from mcpmux.mux.task_relay import TaskRelay
from mcpmux.tools.base import Caller, LocalTool
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
        self.tasks = TaskRelay(self.upstreams)
        """The tasks clients created through mcpmux (2025-11-25), by mcpmux's ids."""
        for name, server in config.enabled_servers.items():
            self._add_upstream(name, server)
        self.calls = CallTracker()  # client calls in flight: shutdown drains them, a reload cancels some
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
        return await reload_mux(self, config)

    def track_call(self, upstream: str | None = None) -> TrackedCall:
        """`with mux.track_call(upstream):` around one client call (`upstream` None: a local tool).

        Shutdown waits for tracked calls and cancels those past its grace; a reload cancels those on the
        upstreams it stops. Enter it before looking the upstream up: it raises `CallCancelledError` (an
        `UpstreamUnavailableError`) when the call is refused or cancelled, with the reason."""
        return self.calls.track(upstream)

    async def drain(self, grace: float, skip: anyio.Event | None = None) -> int:
        """Refuse new calls, let those in flight finish within `grace` seconds (or until `skip` is set),
        then cancel the rest, each with an error saying so; returns how many were cancelled."""
        return await self.calls.drain(grace, skip)

    def _add_upstream(self, name: str, server: ServerConfig) -> None:
        requests = self.client_requests
        events = replace(
            self._events,
            sampling=self.sampling.callback(name, server.sampling),
            sampling_tools=server.sampling.asks_client,
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
        upstream = Upstream(name, server, self.config.mux, events)
        self.upstreams[name] = upstream
        self.dispatchers[name] = UpstreamDispatcher(
            upstream, self.cache, lambda: self.config.mux, self.metrics.observe_call
        )

    async def _start_upstream(self, name: str, server: ServerConfig) -> None:
        assert self._tasks is not None, "Mux was not entered"
        self._add_upstream(name, server)
        self._lifetimes[name] = await UpstreamLifetime.start(self._tasks, self.upstreams[name], self.dispatchers[name])

    def _detach_upstream(self, name: str) -> UpstreamLifetime:
        """Take an upstream out of the Mux; it runs until the returned lifetime's `stop()`."""
        del self.upstreams[name], self.dispatchers[name]
        return self._lifetimes.pop(name)

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
        for listener in list(self._resource_listeners):
            await listener(upstream, uri)

    async def subscribe_resource(self, uri: str) -> None:
        """Subscribe the upstream that lists `uri` to it (kept across its restarts); `UnknownToolError` if none does."""
        owner = self.catalog.resolve_resource(uri)
        await self.upstreams[owner].subscribe(uri)

    async def unsubscribe_resource(self, uri: str) -> None:
        try:
            owner = self.catalog.resolve_resource(uri)
        except UnknownToolError:  # no longer listed: nothing to unsubscribe from
            return
        upstream = self.upstreams.get(owner)
        if upstream is not None:
            await upstream.unsubscribe(uri)

    async def roots_changed(self) -> None:
        """A client's roots changed (or a client with roots connected): every upstream is told."""
        for upstream in list(self.upstreams.values()):
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

    def view(self, profile: str | None = None) -> CatalogView:
        """The part of the catalog `[profiles.NAME]` allows (None: all the Mux serves); `ConfigError` if
        there is no such profile. Over HTTP a client's profile comes from its path or its bearer token."""
        found = self._views.get(profile)
        settings = _profile(self.config, profile)
        if found is None or found.profile is not settings:  # a reload may have changed the profile
            found = CatalogView(self.catalog, self.local_tools, self._own_tools, profile, settings)
            self._views[profile] = found
        return found

    def list_tools(self, profile: str | None = None) -> list[types.Tool]:
        """Every tool in `profile`'s view: mcpmux's own first, then the upstreams'."""
        view = self.view(profile)
        local = [local.tool for name, local in self.local_tools.items() if view.allows_local(name)]
        return local + view.tools()

    def listed_tools(self, profile: str | None = None) -> list[types.Tool]:
        """What tools/list shows clients: every tool, or in search mode mcpmux's own and the pinned ones."""
        tools = self.list_tools(profile)
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
        """Each upstream's connection state, protocol version, restarts and last error."""
        return [upstream.status() for upstream in self.upstreams.values()]

    # -- routing ---------------------------------------------------------------------------------

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        progress: ProgressFn | None = None,
        client: str | None = None,
        client_name: str | None = None,
        profile: str | None = None,
        hears_logs: bool = False,
    ) -> types.CallToolResult:
        """Call a tool by its public name, through the upstream's queue, cache, coalescing and batching.

        Upstream `isError` results and JSON-RPC errors (`UpstreamError`) come back unchanged. An
        unavailable or timed-out upstream, or a call refused by a limit, gives an `isError` result whose
        text says what happened, so a model sees it and can carry on; an unknown name raises
        `UnknownToolError`. `client` identifies the caller for per-client cache scopes; `client_name` (its
        clientInfo name) adds its `[mux] client_priorities` entry to the call's priority. `profile`: the
        caller's profile; a name outside it is unknown (`view`). `hears_logs`: the caller relays the
        upstream's log messages of this call to its client (`on_log`), which must have them before the
        result.

        Every log line written while the call runs carries its request id (`mcpmux.core.logs`).
        """
        with RequestContext(tool=name):
            started = time.perf_counter()
            outcome = "error"
            logger.debug("client call started: %s", name)
            try:
                result = await self._call_tool(name, arguments, progress, client, client_name, profile, hears_logs)
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
        client: str | None,
        client_name: str | None,
        profile: str | None,
        hears_logs: bool = False,
    ) -> types.CallToolResult:
        local = self.local_tools.get(name)
        if local is not None and self.view(profile).allows_local(name):
            try:
                with self.track_call():
                    return await local.handler(arguments or {}, progress, Caller(client, client_name, profile))
            except CallCancelledError as err:
                return error_result(str(err))
        try:
            await self.wait_for_tool(name, profile)
        except CallCancelledError as err:
            return error_result(str(err))
        route = self.resolve_tool(name, profile)
        set_upstream(route.upstream)  # for the log lines of this call
        try:
            with self.track_call(route.upstream):
                boost = priority_for(self.config.mux.client_priorities, client_name) if client_name else 0
                dispatcher = self.dispatchers[route.upstream]
                result = await dispatcher.call_tool(route.name, arguments or {}, progress, client, boost, hears_logs)
                return self.results.fit_model(dispatcher.plan(route.name), result, route.upstream)
        except (UpstreamUnavailableError, UpstreamTimeoutError, UpstreamResultError) as err:
            return error_result(str(err))

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

    def resolve_tool(self, name: str, profile: str | None = None) -> Route:
        """Where the upstream tool `name` goes (in `profile`'s view). Raises `UnknownToolError`, or
        `UnlistedToolError` when the name's prefix is an upstream that is not connected (its tools are
        listed once it is)."""
        view = self.view(profile)
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
        """Read a resource from the upstream that lists it (in `profile`'s view); a 2026 `ttlMs` lets
        mcpmux serve it from cache. `cacheScope: private` entries are kept per `client`, `public` ones shared.
        """
        if self.results.holds(uri):
            return self.results.read(uri)  # a tool result cut for the context, kept whole
        owner = await self._when_started(lambda: self.view(profile).resolve_resource(uri))
        key = (owner, "resources/read", uri)
        for scope in (None,) if client is None else (None, client):
            cached = self.resource_cache.get(key, scope=scope)
            if cached is not None:
                return cached
        with self.track_call(owner):
            result: types.ReadResourceResult = await self.upstreams[owner].request(
                f"resource {uri!r}", lambda session: session.read_resource(uri, cache_mode="bypass")
            )
        public = result.cache_scope == "public"
        if result.ttl_ms > 0 and (public or client is not None):
            self.resource_cache.put(
                key, result, scope=None if public else client, ttl=result.ttl_ms / 1000, tags=(owner,)
            )
        return result

    async def get_prompt(
        self, name: str, arguments: dict[str, str] | None = None, profile: str | None = None
    ) -> types.GetPromptResult:
        route = await self._when_started(lambda: self.view(profile).resolve_prompt(name))
        with self.track_call(route.upstream):
            result: types.GetPromptResult = await self.upstreams[route.upstream].request(
                f"prompt {route.name!r}", lambda client: client.get_prompt(route.name, arguments)
            )
        return result

    async def complete(
        self,
        ref: types.PromptReference | types.ResourceTemplateReference,
        argument: dict[str, str],
        context_arguments: dict[str, str] | None = None,
        profile: str | None = None,
    ) -> types.CompleteResult:
        """Argument completion, routed by the prompt's public name or the template's owner (in `profile`'s view)."""
        upstream_ref: types.PromptReference | types.ResourceTemplateReference = ref
        view = self.view(profile)
        if isinstance(ref, types.PromptReference):
            route = view.resolve_prompt(ref.name)
            owner, upstream_ref = route.upstream, ref.model_copy(update={"name": route.name})
        else:
            owner = self._template_owner(ref.uri, view)
        with self.track_call(owner):
            result: types.CompleteResult = await self.upstreams[owner].request(
                "completion", lambda client: client.complete(upstream_ref, argument, context_arguments)
            )
        return result

    def _template_owner(self, uri_template: str, view: CatalogView) -> str:
        for name, upstream in self.upstreams.items():
            if view.allows_server(name) and any(
                t.uri_template == uri_template for t in upstream.listing.resource_templates
            ):
                return name
        raise MuxError(f"no upstream offers the resource template {uri_template!r}")


def _profile(config: Config, name: str | None) -> ProfileSettings | None:
    if name is None:
        return None
    if name not in config.profiles:
        known = ", ".join(sorted(config.profiles)) or "none"
        raise ConfigError(f"{config.source}: no [profiles.{name}] table (profiles defined: {known})")
    return config.profiles[name]
