"""The MCP server clients talk to: a thin adapter from protocol messages to `Mux` methods.

Both protocol eras are served from one `Server`: 2025 clients (initialize, sessions) get
list_changed as notifications on their session; 2026-07-28 clients get them on
`subscriptions/listen` streams. Progress from an upstream rides back on the request it belongs to;
a client's cancellation cancels the handler, which cancels the upstream request.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import itertools
import logging
import secrets
import socket
import uuid
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import mcp_types as types
import uvicorn
from mcp.server.connection import Connection
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.models import InitializationOptions
from mcp.server.session import ServerSession
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    PromptsListChanged,
    ResourcesListChanged,
    ToolsListChanged,
)
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from sse_starlette.sse import AppStatus
from starlette.types import ASGIApp

from mcpmux import __version__
from mcpmux.core.config import Config
from mcpmux.core.inbound import ANONYMOUS, Caller, InboundCall, may_be_asked, serving
from mcpmux.core.metrics import metrics_route
from mcpmux.errors import InputRequired, MuxError, error_data
from mcpmux.mux.call_sink import answered
from mcpmux.mux.fast_path import FastCall, FastPath, ToSdk
from mcpmux.mux.multiplexer import Mux
from mcpmux.server.client_relay import ClientRelay
from mcpmux.server.found_tools import FoundTools
from mcpmux.server.http.batch import BatchArrayMiddleware
from mcpmux.server.http.dashboard import dashboard_routes
from mcpmux.server.http.edge import PROFILE_SCOPE, HttpEdge
from mcpmux.server.http.edge_policy import EdgePolicy
from mcpmux.server.http.fast import FastPathMiddleware, task_owner
from mcpmux.server.http.fast_front import HttpFastFront, protocol_class
from mcpmux.server.http.quiet_server import DatedProtocol, QuietServer
from mcpmux.server.http.standalone_stream import StandaloneStreamWatch
from mcpmux.server.input_rounds import InputRounds, ParkedCall, parks
from mcpmux.server.reach import ask_on, by_rounds, on_session
from mcpmux.server.resource_subscriptions import ResourceSubscriptions
from mcpmux.server.stdio.batch import StdioClientWire, claimed_stdio
from mcpmux.server.stdio.fast import TASK_OWNER_STDIO, StdioFastFront
from mcpmux.server.task_front import TaskFront
from mcpmux.upstream.supervisor import Upstream

logger = logging.getLogger(__name__)
T = TypeVar("T")

KEEP_ALIVE_TIMEOUT = 75
"""Seconds an idle HTTP connection stays open (nginx's default). Longer than the clients' own idle
expiry (httpx, under the SDK's client: 5 s), so that they close first: a server that closes an idle
connection as a client reuses it fails that request. Surplus idle connections are retired sooner, on
an answer (`mcpmux.server.http.keepalive`)."""


class _MuxServer(Server[Any]):
    """Advertises listChanged for tools, prompts and resources on every transport."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        everything = NotificationOptions(prompts_changed=True, resources_changed=True, tools_changed=True)
        options = super().create_initialization_options(
            notification_options or everything, experimental_capabilities, extensions
        )
        # 2025-11-25 tasks: task-augmented tool calls are relayed to upstreams that run tasks (`Mux.tasks`).
        tasks = types.ServerTasksCapability(
            list=types.TasksListCapability(),
            cancel=types.TasksCancelCapability(),
            requests=types.ServerTasksRequestsCapability(
                tools=types.TasksToolsCapability(call=types.TasksCallCapability())
            ),
        )
        options.capabilities = options.capabilities.model_copy(update={"tasks": tasks})
        return options


_LOG_ORDER: list[types.LoggingLevel] = ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]


def _page(items: list[T], cursor: str | None, size: int) -> tuple[list[T], str | None]:
    """Offset pagination with opaque-looking cursors; a bad cursor is the client's error."""
    try:
        start = int(cursor) if cursor else 0
    except ValueError:
        raise MCPError(types.INVALID_PARAMS, f"invalid cursor {cursor!r}") from None
    end = start + size
    return items[start:end], (str(end) if end < len(items) else None)


def _as_mcp_error(err: MuxError) -> MCPError:
    return MCPError.from_error_data(error_data(err))


def _profile_of(ctx: Any) -> str | None:
    """The request's profile: over HTTP, from its path or token (`HttpEdge`); on stdio, the Mux's own."""
    request = ctx.request
    return request.scope.get(PROFILE_SCOPE) if request is not None else None


def _resumes(ctx: Any) -> dict[str, Any] | None:
    """A 2026-07-28 retry's `inputResponses` and `requestState`, as its client wrote them (None: no retry)."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return None
    params = ctx.params or {}
    resumes = {key: params[key] for key in ("inputResponses", "requestState") if params.get(key) is not None}
    return resumes or None


def _declares_roots(connection: Connection) -> bool:
    capabilities = connection.client_capabilities
    return capabilities is not None and capabilities.roots is not None


def _client_name(session: ServerSession) -> str | None:
    """The name the client gave in its clientInfo (2025 initialize), if any."""
    params = session.client_params
    return params.client_info.name if params is not None else None


class Frontend:
    """Serves one `Mux` to any number of clients over stdio or streamable HTTP."""

    def __init__(self, mux: Mux) -> None:
        self.mux = mux
        self.page_size = mux.config.mux.page_size
        self.bus = InMemorySubscriptionBus()
        self._connections: weakref.WeakSet[Connection] = weakref.WeakSet()
        self._sessions: weakref.WeakValueDictionary[str, Connection] = weakref.WeakValueDictionary()
        """2025 HTTP sessions' connections, by session id."""
        self._streams_open: dict[str, int] = {}
        """2025 HTTP sessions with their standalone stream open (how many GETs each holds open)."""
        self._client_ids: weakref.WeakKeyDictionary[Connection, str] = weakref.WeakKeyDictionary()
        self._stdio_client: str | None = None
        """The one client of `serve_stdio`, once it serves."""
        self._stdio_front: StdioFastFront | None = None
        """`serve_stdio`'s fast path, told the client's session once it is initialized."""
        self._anonymous = itertools.count()
        """Numbers the requests that have no identity of their own (`_identity`)."""
        self._token_key = secrets.token_bytes(32)
        """Keys the hash that names an HTTP client by its bearer token (the token itself is never kept)."""
        # 2026-07-28 callers' upstream calls parked while the client answers sampling (input-required rounds).
        self.rounds = InputRounds(idle_timeout=mux.config.mux.sampling_round_timeout)
        # Tasks of both eras: `tasks/*`, and tools/call answered with a task for 2026 clients that ask.
        self.task_front = TaskFront(mux)
        self.server = _MuxServer(
            "mcpmux",
            version=__version__,
            instructions="mcpmux: tools from several MCP servers, named server__tool.",
            on_list_tools=self._list_tools,
            on_call_tool=self.task_front.wrap(self._call_tool),
            on_list_resources=self._list_resources,
            on_list_resource_templates=self._list_resource_templates,
            on_read_resource=self._read_resource,
            on_list_prompts=self._list_prompts,
            on_get_prompt=self._get_prompt,
            on_completion=self._complete,
            on_subscriptions_listen=ListenHandler(self.bus),
            lifespan=self.rounds.lifespan,
            # Without it the SDK runs the whole tools/list handler on every 2026 HTTP call.
            get_tool_input_schema=mux.input_schema,
        )
        # Every front's routed calls: 2026 results get this front's `serverInfo` stamp.
        self.fast = FastPath(mux, self.server.server_info_stamp)
        mux.on_catalog_changed(self._announce_changes)
        mux.on_log(self._relay_log)
        mux.sampling.client_sampler = self._sample_via_client
        # Upstream sampling, elicitation and roots requests go to the client whose call caused them.
        self.relay = ClientRelay(mux.calls, self._connections, self._reach, self._unlinked)
        requests = mux.client_requests
        requests.asker, requests.noter = self.task_front.asker(self.relay.ask), self.relay.note
        requests.complete_listener = self.relay.elicitation_complete
        # Added here, not passed to the constructor: that warns (logging and roots are deprecated in 2026-07-28).
        self._log_levels: weakref.WeakKeyDictionary[Connection, types.LoggingLevel] = weakref.WeakKeyDictionary()
        self.server.add_request_handler("logging/setLevel", types.SetLevelRequestParams, self._set_log_level)
        self.server.add_notification_handler("notifications/initialized", types.NotificationParams, self._initialized)
        self.server.add_notification_handler(
            "notifications/roots/list_changed", types.NotificationParams, self._roots_changed
        )
        # 2025 resources/subscribe: updates reach only the clients subscribed to the URI.
        self.subscriptions = ResourceSubscriptions(mux, self.bus)
        # [mux] tool_search_expose = "listing": what a 2025 session found joins its tools/list.
        self.found_tools = FoundTools(mux, self._client_ids)
        if mux.tool_search is not None:
            mux.tool_search.on_found = self.found_tools.found
        self.server.add_request_handler(
            "subscriptions/listen",
            types.SubscriptionsListenRequestParams,
            self.task_front.listen(self.subscriptions.listen),
        )
        mux.on_resource_updated(self.subscriptions.updated)
        mux.on_catalog_changed(self.subscriptions.renew)
        self.server.add_request_handler("resources/subscribe", types.SubscribeRequestParams, self._subscribe)
        self.server.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, self._unsubscribe)
        self.task_front.register(self.server)
        mux.tasks.listener = self._task_status

    def _seen(self, ctx: Any) -> ServerSession:
        session: ServerSession = ctx.session
        # A ServerSession lives for one request; list_changed needs the connection behind it.
        connection = session._connection
        self._connections.add(connection)
        if connection.session_id is not None:
            self._sessions[connection.session_id] = connection
        return session

    def _askable_session(self, session_id: str) -> Connection | None:
        """A 2025 HTTP session's connection while its standalone stream is open (requests can reach it)."""
        return self._sessions.get(session_id) if session_id in self._streams_open else None

    def _hearing(self, connection: Connection | None) -> Callable[[types.LoggingLevel], bool]:
        """At which levels a client (by its 2025 connection) hears logs: what it set with `logging/setLevel`."""
        return functools.partial(self._hears, connection)

    def _connection_caller(self, connection: Connection, client: str, profile: str | None) -> Caller:
        params = connection.client_params
        name = params.client_info.name if params is not None else None
        era = connection.protocol_version if params is not None else None  # a handshake's, once it happened
        return Caller(client, name, profile, connection.client_capabilities, era)

    def _stdio_caller(self, connection: Connection | None) -> Caller:
        """The one stdio client, as a fast-path call's caller (its session's capabilities, once initialized)."""
        client = self._stdio_client
        if connection is None:
            return Caller(client)
        return self._connection_caller(connection, client or "", None)

    def _scope_caller(self, scope: Any) -> Caller:
        """Who sent an HTTP request, as the SDK path's `_client_id` names it (`_identity`)."""
        profile = scope.get(PROFILE_SCOPE)
        token = session_id = None
        for key, value in scope["headers"]:
            if key == b"authorization":
                token = value
            elif key == b"mcp-session-id":
                session_id = value
        connection = self._sessions.get(session_id.decode("latin-1")) if session_id is not None else None
        client = self._identity(connection, token, session_id is None, stdio=False)
        if connection is None:
            return Caller(client, profile=profile)
        return self._connection_caller(connection, client, profile)

    def _client_id(self, ctx: Any) -> str:
        """Which client sent a request (`Caller.client`): the scope of its private cache entries and the
        key of its upstream sessions of its own (`_identity`)."""
        session: ServerSession = ctx.session
        request = ctx.request
        token = request.headers.get("authorization") if request is not None else None
        modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        return self._identity(session._connection, token.encode() if token else None, modern, request is None)

    def _identity(self, connection: Connection | None, token: bytes | None, modern: bool, stdio: bool) -> str:
        """A client's identity. On stdio the process serves one client. Over HTTP a 2025 client is its
        session (two sessions are two clients, whatever token opened them); a 2026 request has no
        session, so the bearer token the edge accepted names the client (by a keyed hash: the token
        itself is never kept), and a request without one is a client of its own, with no identity that
        lasts (`ANONYMOUS`): nothing cached for it is served to another request."""
        session = connection if not modern else None
        if stdio and self._stdio_client is not None:
            identity = self._stdio_client
        elif session is not None:
            identity = self._client_ids.get(session) or uuid.uuid4().hex
        elif token:
            return "token:" + hmac.new(self._token_key, token, hashlib.sha256).hexdigest()
        else:
            return f"{ANONYMOUS}{next(self._anonymous)}"  # unique in this process: all it must be
        if session is None:
            return identity
        return self._client_ids.setdefault(session, identity)  # a 2025 session: found again by its id

    def _caller(self, ctx: Any) -> Caller:
        """Who sent a request: its identity, clientInfo name, profile and declared capabilities."""
        session: ServerSession = ctx.session
        capabilities = session.client_capabilities
        return Caller(self._client_id(ctx), _client_name(session), _profile_of(ctx), capabilities, ctx.protocol_version)

    def _inbound(self, ctx: Any, hears_logs: bool) -> InboundCall:
        """The request as an inbound call: a 2025 session is asked, and hears the upstream's logs, on the
        request's own stream; a 2026 request only hears logs it asked for (`hears_logs`), and is asked
        only in input-required rounds (`_call_tool`)."""
        session: ServerSession = ctx.session
        call = InboundCall(self._caller(ctx), ctx.request_id, ctx.protocol_version)
        connection = session._connection
        ask, log = on_session(session, ctx.request_id, lambda level: self._hears(connection, level))
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            call.ask, call.notify = ask, connection.notify
        else:
            call.takes_rounds = True  # an upstream's input-required rounds are relayed to it
        if hears_logs:
            call.log = log
        return call

    def _reach(self, client: str) -> InboundCall | None:
        """A 2025 client asked outside any call of its own (its standalone channel), by its identity."""
        if client == self._stdio_client and self._stdio_front is not None:
            connection = self._stdio_front.connection
        else:
            connection = next((conn for conn, known in list(self._client_ids.items()) if known == client), None)
        if connection is None or not connection.has_standalone_channel:
            return None
        caller = Caller(client, capabilities=connection.client_capabilities)
        return InboundCall(caller, ask=ask_on(connection), notify=connection.notify)

    def _unlinked(self, upstream: Upstream, ambiguous: bool) -> None:
        """An upstream asked something with no link to its call: `sessions = "auto"` may isolate its clients."""
        sessions = self.mux.sessions.get(upstream.name)
        if sessions is not None:
            sessions.asked(ambiguous)

    async def _list_page(
        self, ctx: Any, params: types.PaginatedRequestParams | None, items: Callable[[], list[T]]
    ) -> tuple[list[T], str | None]:
        """One page of a list, after refetching upstream listings whose `ttlMs` ran out."""
        self._seen(ctx)
        await self.mux.refresh_stale_listings()
        return _page(items(), params.cursor if params is not None else None, self.page_size)

    async def _list_tools(self, ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        caller = self._caller(ctx)
        await self.mux.prepare(caller)  # what the servers show this client, on its own sessions
        listing = functools.partial(self.found_tools.listing, ctx.session._connection, caller)
        tools, next_cursor = await self._list_page(ctx, params, listing)
        return types.ListToolsResult(tools=tools, next_cursor=next_cursor)

    async def _list_prompts(self, ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListPromptsResult:
        prompts, next_cursor = await self._list_page(ctx, params, lambda: self.mux.list_prompts(_profile_of(ctx)))
        return types.ListPromptsResult(prompts=prompts, next_cursor=next_cursor)

    async def _list_resources(self, ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
        resources, next_cursor = await self._list_page(ctx, params, lambda: self.mux.list_resources(_profile_of(ctx)))
        return types.ListResourcesResult(resources=resources, next_cursor=next_cursor)

    async def _list_resource_templates(
        self, ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        templates, next_cursor = await self._list_page(
            ctx, params, lambda: self.mux.list_resource_templates(_profile_of(ctx))
        )
        return types.ListResourceTemplatesResult(resource_templates=templates, next_cursor=next_cursor)

    async def _call_tool(
        self, ctx: Any, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult | dict[str, Any]:
        session = self._seen(ctx)
        # A 2025 session hears the upstream's logs at its level; a 2026 request only if it asked for a level.
        hears_logs = ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS or bool(
            ((ctx.params or {}).get("_meta") or {}).get(types.LOG_LEVEL_META_KEY)
        )
        inbound = self._inbound(ctx, hears_logs)
        if params.name in self.mux.local_tools:
            # mcpmux's own tools' inner calls answer their rounds here: a retry would name the local tool.
            inbound.takes_rounds = False
        caller = inbound.caller
        asks_client = False
        resumes_parked = params.request_state is not None  # a retry of mcpmux's own rounds
        if params.name not in self.mux.local_tools and not self.rounds.issued(params.request_state):
            try:
                await self.mux.prepare(caller)
                route = self.mux.resolve_tool(params.name, caller.profile, caller)
            except MuxError as err:
                raise _as_mcp_error(err) from None
            asks_client = self.mux.dispatchers[route.upstream].plan(route.name).asks_client
            # A retry of an upstream's own round (relayed as it was) goes back to that upstream; any
            # other state is refused by `InputRounds.resume`, never sent to an upstream that cannot read it.
            resumes_parked = resumes_parked and not self._speaks_2026(route.upstream)
            inbound.resumes = _resumes(ctx) if not resumes_parked else None
            fast = self._routed(ctx, inbound)
            if fast is not None:
                return await self._served(fast, session)

        async def call(progress_to: Callable[[], ServerSession | None]) -> types.CallToolResult:
            async def relay_progress(progress: float, total: float | None, message: str | None) -> None:
                target = progress_to()  # a parked call's progress rides whichever request waits on it
                if target is not None:
                    await target.report_progress(progress, total, message)

            with serving(inbound):
                result = await self.mux.call_tool(
                    params.name, params.arguments, progress=relay_progress, caller=caller, hears_logs=hears_logs
                )
            notes = inbound.take_notes()  # e.g. why an elicitation was declined
            if notes:
                blocks = [types.TextContent(type="text", text=note) for note in notes]
                result = result.model_copy(update={"content": [*result.content, *blocks]})
            return result

        def parked(call_: ParkedCall) -> Awaitable[types.CallToolResult]:
            inbound.ask = by_rounds(call_.ask)  # a 2026 client is asked in the call's input-required rounds
            return call(lambda: call_.current)

        try:
            if resumes_parked:  # a 2026-07-28 client's retry of a call parked for sampling
                return await self.rounds.resume(params, session)
            # A 2026-07-28 client has no back channel: sampling it may answer goes out in input-required rounds.
            if self.rounds.available and parks(session, asks_client):
                return await self.rounds.start(params.name, params.arguments or {}, session, parked)
            return await call(lambda: session)
        except MuxError as err:
            raise _as_mcp_error(err) from None
        except InputRequired as relayed:  # the upstream's round, the client's own to answer
            return types.InputRequiredResult.model_validate(relayed.raw, by_name=False)

    def _routed(self, ctx: Any, inbound: InboundCall) -> FastCall | None:
        """The call as `FastPath.route` takes it, as the fast fronts' calls are; None where it needs
        what only this handler does (a local tool, logs for a 2026 request, rounds, a task, a retry).
        A 2025 call's client is asked on its session, and hears the upstream's logs at its level."""
        session: ServerSession = ctx.session
        message = {"jsonrpc": "2.0", "id": ctx.request_id, "method": "tools/call", "params": ctx.params}
        modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        declared = may_be_asked(session.client_capabilities)
        call = self.fast.route(message, inbound.caller, None if modern else ctx.protocol_version, declared)
        if isinstance(call, ToSdk):
            return None
        if not modern:
            call.inbound.ask, call.inbound.log, call.inbound.notify = inbound.ask, inbound.log, inbound.notify
        return call

    async def _served(self, call: FastCall, session: ServerSession) -> dict[str, Any]:
        """The result of a routed call, served as every front serves one (`answered`); its error raised."""

        async def relay_progress(progress: float, total: float | None, message: str | None) -> None:
            await session.report_progress(progress, total, message)

        response = await answered(self.fast, call, relay_progress if call.progress_token is not None else None)
        if "error" in response:
            raise MCPError.from_error_data(types.ErrorData.model_validate(response["error"]))
        result: dict[str, Any] = response["result"]
        return result

    def _speaks_2026(self, server: str) -> bool:
        """Whether `server`'s upstream speaks 2026-07-28 (it may have issued the input-required round
        a client retries)."""
        client = self.mux.upstreams[server].client
        return client is not None and client.protocol_version in MODERN_PROTOCOL_VERSIONS

    async def _read_resource(self, ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        self._seen(ctx)
        try:
            with serving(self._inbound(ctx, hears_logs=False)):
                return await self.mux.read_resource(
                    str(params.uri), client=self._client_id(ctx), profile=_profile_of(ctx)
                )
        except MuxError as err:
            raise _as_mcp_error(err) from None

    async def _get_prompt(
        self, ctx: Any, params: types.GetPromptRequestParams
    ) -> types.GetPromptResult | types.InputRequiredResult:
        self._seen(ctx)
        inbound = self._inbound(ctx, hears_logs=False)
        inbound.resumes = _resumes(ctx)  # a retry of the upstream's round: its answers go back with it
        try:
            with serving(inbound):
                return await self.mux.get_prompt(params.name, params.arguments, _profile_of(ctx))
        except MuxError as err:
            raise _as_mcp_error(err) from None
        except InputRequired as relayed:  # the upstream's round, the client's own to answer
            return types.InputRequiredResult.model_validate(relayed.raw, by_name=False)

    async def _complete(self, ctx: Any, params: types.CompleteRequestParams) -> types.CompleteResult:
        self._seen(ctx)
        context = params.context.arguments if params.context is not None else None
        try:
            with serving(self._inbound(ctx, hears_logs=False)):
                return await self.mux.complete(params.ref, params.argument.model_dump(), context, _profile_of(ctx))
        except MuxError as err:
            raise _as_mcp_error(err) from None

    async def _announce_changes(self) -> None:
        for event in (ToolsListChanged(), PromptsListChanged(), ResourcesListChanged()):
            await self.bus.publish(event)
        for connection in list(self._connections):
            if connection.protocol_version in MODERN_PROTOCOL_VERSIONS:
                continue  # reached through subscriptions/listen above
            try:
                await connection.send_tool_list_changed()
                await connection.send_prompt_list_changed()
                await connection.send_resource_list_changed()
            except Exception as err:  # a client that went away must not stop the others hearing of it
                logger.debug("could not notify a client of list changes: %s", err)
                self._connections.discard(connection)

    async def _relay_log(self, upstream: str, params: types.LoggingMessageNotificationParams) -> None:
        """An upstream's log message goes to the client of the call it belongs to (`ClientRelay.log`); one
        that belongs to no call is about the upstream itself, and every 2025 client hears it at its level."""
        try:
            if await self.relay.log(upstream, params):
                return
            for connection in list(self._connections):
                if connection.protocol_version not in MODERN_PROTOCOL_VERSIONS and self._hears(
                    connection, params.level
                ):
                    await connection.log(params.level, params.data, logger=params.logger)
        except Exception as err:  # see _announce_changes
            logger.debug("could not relay a log message: %s", err)

    async def _sample_via_client(
        self, upstream: str, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.CreateMessageResultWithTools | None:
        """Forward an upstream's sampling request to the client whose call caused it (`ClientRelay`):
        a 2025 session by a pushed request, a 2026-07-28 client in its parked call's next round.
        None when there is no such client."""
        answer = await self.relay.ask(upstream, types.CreateMessageRequest(params=params), None)
        if isinstance(answer, types.CreateMessageResult | types.CreateMessageResultWithTools):
            return answer
        return None

    # -- logging levels and roots (2025 sessions) ------------------------------------------------

    async def _set_log_level(self, ctx: Any, params: types.SetLevelRequestParams) -> types.EmptyResult:
        """`logging/setLevel`: this client hears upstream logs at `level` and above (each client its own);
        the upstreams log at the most verbose level any client asked for."""
        self._seen(ctx)
        self._log_levels[ctx.session._connection] = params.level
        await self.mux.set_log_level(min(self._log_levels.values(), key=_LOG_ORDER.index))
        return types.EmptyResult()

    def _hears(self, connection: Connection | None, level: types.LoggingLevel) -> bool:
        """Whether a client hears a log at `level`: everything until it sets a level with `logging/setLevel`."""
        wanted = self._log_levels.get(connection) if connection is not None else None
        return wanted is None or _LOG_ORDER.index(level) >= _LOG_ORDER.index(wanted)

    async def _task_status(self, owner: str, params: dict[str, Any]) -> None:
        """`notifications/tasks/status` to the client that owns the task: on stdio, or on its HTTP session's stream."""
        if owner == TASK_OWNER_STDIO:
            stdio = self._stdio_front.connection if self._stdio_front is not None else None
            connections = [stdio] if stdio is not None else []
        else:
            connections = [c for c in list(self._connections) if c.session_id and task_owner(c.session_id) == owner]
        for connection in connections:
            await connection.notify("notifications/tasks/status", params)

    async def _initialized(self, ctx: Any, params: types.NotificationParams) -> None:
        """A 2025 client is ready; one that declared roots may change what upstreams' `roots/list` gets."""
        session = self._seen(ctx)
        if self._stdio_front is not None:  # upstreams' requests during its fast-path calls go out on this session
            self._stdio_front.connection = session._connection
        connection = session._connection
        # Over HTTP its roots can be asked for only on its standalone stream: they are announced once both
        # it is initialized and that stream is open, whichever comes last (here, or in `_stream_opened`).
        if ctx.request is not None and connection.session_id not in self._streams_open:
            return
        if _declares_roots(connection):
            await self.mux.roots_changed()

    def _stream_closed(self, session_id: str) -> None:
        count = self._streams_open.pop(session_id, 0) - 1
        if count > 0:
            self._streams_open[session_id] = count

    async def _stream_opened(self, session_id: str) -> None:
        """A 2025 HTTP client opened its standalone stream: upstreams may now ask it for its roots."""
        self._streams_open[session_id] = self._streams_open.get(session_id, 0) + 1
        connection = self._sessions.get(session_id)  # None until it is initialized (`_initialized` announces)
        if connection is not None and _declares_roots(connection):
            await self.mux.roots_changed()

    async def _subscribe(self, ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
        session = self._seen(ctx)
        try:
            await self.subscriptions.subscribe(session._connection, str(params.uri), _profile_of(ctx))
        except MuxError as err:
            raise _as_mcp_error(err) from None
        return types.EmptyResult()

    async def _unsubscribe(self, ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        session = self._seen(ctx)
        try:
            await self.subscriptions.unsubscribe(session._connection, str(params.uri))
        except MuxError as err:
            raise _as_mcp_error(err) from None
        return types.EmptyResult()

    async def _roots_changed(self, ctx: Any, params: types.NotificationParams) -> None:
        """`notifications/roots/list_changed` from a client: passed on to every upstream."""
        self._seen(ctx)
        await self.mux.roots_changed()

    # -- transports ------------------------------------------------------------------------------

    async def serve_stdio(self) -> None:
        """Serve one client on this process's stdin/stdout until stdin closes (2025-03-26 batch arrays too)."""
        self._stdio_client = uuid.uuid4().hex
        with claimed_stdio() as (wire_in, wire_out):
            edge = StdioClientWire(wire_in, wire_out)
            async with anyio.create_task_group() as fast_calls:
                front = None
                if self.mux.config.mux.fast_path:
                    front = self._stdio_front = StdioFastFront(
                        self.fast, edge, fast_calls, self._stdio_caller, self._hearing
                    )
                    edge.take = front.take
                try:
                    async with stdio_server(edge.stdin, edge.stdout) as (read_stream, write_stream):
                        await self.server.run(read_stream, write_stream, self.server.create_initialization_options())
                finally:
                    if front is not None:
                        front.close()
                fast_calls.cancel_scope.cancel()

    def http_app(self, host: str, policy: EdgePolicy, path: str = "/mcp") -> tuple[ASGIApp, HttpFastFront | None]:
        """The streamable HTTP app behind the `HttpEdge` security checks (2025-03-26 batch arrays too),
        and the fast path's front below ASGI (`mcpmux.server.http.fast_front`; None with the fast path off)."""
        # The edge checks Host/Origin on every route; the SDK's own check (/mcp only, loopback names only)
        # would refuse the hosts `[http] allowed_hosts` adds.
        unchecked = TransportSecuritySettings(enable_dns_rebinding_protection=False)
        limit = policy.max_body_bytes
        app = self.server.streamable_http_app(
            streamable_http_path=path, host=host, transport_security=unchecked, max_request_body_size=limit
        )
        app.add_middleware(BatchArrayMiddleware, path=path, max_body=limit)
        app.add_middleware(StandaloneStreamWatch, path=path, opened=self._stream_opened, closed=self._stream_closed)
        inference = self.mux.inference
        if inference is not None and inference.settings.openai_api:
            from mcpmux.inference.openai.routes import openai_mount  # imported here: it pulls in torch

            app.router.routes.append(openai_mount(inference))
        app.router.routes.append(metrics_route(self.mux.metrics.registry))
        app.router.routes.extend(dashboard_routes(self.mux, lambda: list(self._connections)))
        if not self.mux.config.mux.fast_path:
            return HttpEdge(app, policy=policy, mcp_path=path, config=self._running_config), None
        fast = FastPathMiddleware(app, self.fast, self.server.session_manager, self._scope_caller, path=path)
        # outermost: in front of every route
        edge = HttpEdge(fast, policy=policy, mcp_path=path, config=self._running_config)
        return edge, HttpFastFront(fast, edge, self._askable_session, self._hearing)

    def _running_config(self) -> Config:
        """The Mux's config, replaced by each reload (the HTTP edge follows its profiles and their tokens)."""
        return self.mux.config

    async def serve_http(
        self,
        sock: socket.socket,
        policy: EdgePolicy,
        path: str = "/mcp",
        stop: anyio.Event | None = None,
        shutdown_timeout: int | None = None,
        drained: anyio.Event | None = None,
    ) -> None:
        """Serve streamable HTTP on an already-bound socket until `stop` is set (or cancelled).

        Once stopped, no new connection is accepted. With `drained`, open connections are served until
        it is set too (the calls in flight finish); then open responses get `shutdown_timeout` seconds
        (None: no limit) before they are closed, so a held-open SSE stream cannot block the exit.
        """
        app, front = self.http_app(sock.getsockname()[0], policy, path)
        config = uvicorn.Config(
            app,
            http=protocol_class(front) if front is not None else DatedProtocol,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=shutdown_timeout,
            timeout_keep_alive=KEEP_ALIVE_TIMEOUT,
        )
        server = QuietServer(config)
        async with anyio.create_task_group() as tasks:
            if stop is not None:

                async def stop_when_asked() -> None:
                    await stop.wait()
                    if drained is not None:
                        for listener in getattr(server, "servers", []):  # set by uvicorn's startup
                            listener.close()  # existing connections stay open
                        await drained.wait()
                        # The process is ending: sse_starlette closes the held-open streams (2025 GET
                        # streams, 2026 listens) on this process-wide flag instead of at the timeout.
                        AppStatus.should_exit = True
                    server.should_exit = True

                tasks.start_soon(stop_when_asked)
            await server.serve(sockets=[sock])
            tasks.cancel_scope.cancel()


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket; port 0 picks a free one (read it back with `getsockname()`). Raises
    `MuxError` saying what to do when the address cannot be had (in use, not this host's)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only then, and without it Nagle plus delayed
    # ACKs hold each response back by ~40 ms.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise MuxError(
            f"cannot listen on {host}:{port}: {err.strerror}; pass another --port (or [http] port), "
            "or stop what holds that one"
        ) from None
    sock.listen(1024)
    sock.setblocking(False)
    return sock
