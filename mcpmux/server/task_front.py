"""Tasks as clients see them, in both protocol eras: the `tasks/*` requests, and the `tools/call`s
answered with a task for 2026-07-28 clients (the `io.modelcontextprotocol/tasks` extension).

- **2025-11-25** (`Mux.tasks`): `tasks/get`, `tasks/result`, `tasks/cancel` and `tasks/list` on the
  tasks a session created with a task-augmented call (relayed raw on the fast path). Their owner is
  the session (the one stdio client, or the HTTP session id).
- **2026-07-28** (`Mux.tasks.extension`): a `tools/call` whose request declares the extension, to a
  tool that may run as a task, is answered with mcpmux's `CreateTaskResult`; `tasks/get`,
  `tasks/update` and `tasks/cancel` follow it, each answered -32021 when its request does not declare
  the extension, and `tasks/result` and `tasks/list` (gone from the extension) -32601. The
  extension is declared in `server/discover` (the 2026 capabilities) and nowhere else.

A 2026 request has no session, so its tasks are owned by who sent it: over HTTP the bearer token the
edge accepted (by a keyed hash; the token itself is never kept) within the request's profile, or,
without a token, every tokenless request of that profile alike, for whom the task id (128 random
bits) is the only key; on stdio, the one client. Another owner's id is "not found".

Tools a 2026 upstream may answer with a task are called through the SDK path for a client that
declared the extension (`FastPath.route` leaves them to it): the fast path relays results, not tasks.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcpmux.core.call_plan import CallPlan
from mcpmux.core.call_tracker import CallCancelledError
from mcpmux.core.inbound import ClientRequest, ClientResult
from mcpmux.errors import (
    CallFailedError,
    MuxError,
    error_data,
    error_result,
)
from mcpmux.mux.ask_policies import ClientAsker
from mcpmux.mux.dispatcher import UpstreamDispatcher
from mcpmux.mux.multiplexer import Mux
from mcpmux.server.http.edge import PROFILE_SCOPE
from mcpmux.server.http.fast import task_owner
from mcpmux.server.stdio.fast import TASK_OWNER_STDIO
from mcpmux.upstream import task_extension as wire
from mcpmux.upstream.supervisor import Upstream

T = TypeVar("T")
CallHandler = Callable[[Any, types.CallToolRequestParams], Awaitable[Any]]


class UpdateTaskParams(types.GetTaskRequestParams):
    """`tasks/update`'s params: the task, and the client's answers to its `inputRequests`."""

    input_responses: dict[str, Any]


@dataclass(frozen=True, slots=True)
class _Target:
    upstream: Upstream
    dispatcher: UpstreamDispatcher
    plan: CallPlan


def task_target(mux: Mux, name: str, profile: str | None) -> _Target | None:
    """Where a call of the public tool `name` goes, if its upstream may run it as a task: a 2025
    upstream's tool it runs only as one, or any tool of a 2026 upstream that declared the extension."""
    try:
        route = mux.resolve_tool(name, profile)
    except MuxError:
        return None  # the plain path words it
    upstream, dispatcher = mux.upstreams.get(route.upstream), mux.dispatchers.get(route.upstream)
    if upstream is None or dispatcher is None:
        return None
    plan = dispatcher.plan(route.name)
    return _Target(upstream, dispatcher, plan) if plan.as_task or wire.offered(upstream.client) else None


def _profile(ctx: Any) -> str | None:
    """The request's profile, as the HTTP edge put it in its scope (None on stdio: the Mux's own)."""
    request = ctx.request
    return request.scope.get(PROFILE_SCOPE) if request is not None else None


def _modern(ctx: Any) -> bool:
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


def _method_not_found(method: str) -> MCPError:
    return MCPError(code=types.METHOD_NOT_FOUND, message="Method not found", data=method)


async def _worded(answer: Awaitable[T]) -> T:
    """`answer`, with mcpmux's errors as the client's JSON-RPC errors."""
    try:
        return await answer
    except CallFailedError:
        raise  # a tool call words it in its result
    except MuxError as err:
        raise MCPError.from_error_data(error_data(err)) from None


class TaskFront:
    """The `tasks/*` handlers of both eras, and the `tools/call` wrapper that gives 2026 clients tasks."""

    def __init__(self, mux: Mux) -> None:
        self.mux = mux
        self._key = secrets.token_bytes(32)
        """Keys the hash that names a 2026 client by its bearer token."""
        self._server: Server[Any] | None = None

    def register(self, server: Server[Any]) -> None:
        """Serve `tasks/*` and a `server/discover` that declares the extension on `server`."""
        self._server = server
        server.add_request_handler("tasks/get", types.GetTaskRequestParams, self._get)
        server.add_request_handler("tasks/result", types.GetTaskPayloadRequestParams, self._result)
        server.add_request_handler("tasks/cancel", types.CancelTaskRequestParams, self._cancel)
        server.add_request_handler("tasks/list", types.PaginatedRequestParams, self._list)
        server.add_request_handler("tasks/update", UpdateTaskParams, self._update)
        server.add_request_handler("server/discover", types.RequestParams, self._discover)

    def wrap(self, plain: CallHandler) -> CallHandler:
        """The `tools/call` handler: a task for a 2026 client that declared the extension, where the tool
        may run as one; `plain` for everything else (and for a 2026 upstream that asked for input first)."""

        async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> Any:
            try:
                # Every call the SDK front serves comes here first: one whose upstream is still
                # starting waits for it here (tracked: shutdown answers it), and is then routed.
                await self.mux.wait_for_tool(params.name, _profile(ctx))
            except CallCancelledError as err:
                return error_result(str(err))
            target = self._target(ctx, params)
            if target is None:
                return await plain(ctx, params)
            try:
                with self.mux.track_call(target.upstream.name):
                    owner, asks = self.owner(ctx), ctx.session.client_capabilities
                    arguments = params.arguments or {}
                    tasks = self.mux.tasks.extension
                    call = tasks.call(owner, target.upstream, target.dispatcher, target.plan, arguments, asks)
                    answer = await _worded(call)
            except CallFailedError as err:
                return error_result(str(err))  # as a plain call words them: the model reads what happened
            return await plain(ctx, params) if answer is None else answer

        return call_tool

    def asker(self, relay: ClientAsker) -> ClientAsker:
        """Asks an upstream's request about a task a 2026 client follows through mcpmux in that task's
        `inputRequests` (or nobody, when it cannot be asked there); any other request as `relay` does."""

        async def ask(upstream: str, request: ClientRequest, limit: float | None) -> ClientResult | None:
            followed = self.mux.tasks.extension.following(upstream, request)
            if followed is not None:
                return await followed.ask(request, limit)
            return await relay(upstream, request, limit)

        return ask

    def listen(self, listen: Callable[[Any, T], Awaitable[Any]]) -> Callable[[Any, T], Awaitable[Any]]:
        """`subscriptions/listen`: asking for `notifications/tasks` (`taskIds`) needs the extension (else
        -32021). mcpmux sends none: its acknowledgement agrees to no task id, and clients poll `tasks/get`."""

        async def listen_for(ctx: Any, params: T) -> Any:
            notifications = (ctx.params or {}).get("notifications")
            if isinstance(notifications, dict) and "taskIds" in notifications:
                self._extension_owner(ctx)
            return await listen(ctx, params)

        return listen_for

    def _target(self, ctx: Any, params: types.CallToolRequestParams) -> _Target | None:
        if not _modern(ctx) or not wire.declared(ctx.session.client_capabilities):
            return None
        if params.name in self.mux.local_tools or params.request_state is not None:
            return None
        return task_target(self.mux, params.name, _profile(ctx))

    def owner(self, ctx: Any) -> str:
        """Who owns a 2026 request's tasks (see the module's docstring)."""
        request = ctx.request
        if request is None:
            return "stdio"
        token = request.headers.get("authorization")
        who = "bearer:" + hmac.new(self._key, token.encode(), hashlib.sha256).hexdigest() if token else "tokenless"
        return f"{who} in profile {request.scope.get(PROFILE_SCOPE)!r}"

    def _extension_owner(self, ctx: Any) -> str:
        """A 2026 request's owner, once it declared the extension (else -32021)."""
        if not wire.declared(ctx.session.client_capabilities):
            raise wire.missing()
        return self.owner(ctx)

    @staticmethod
    def _legacy_owner(ctx: Any) -> str:
        """Who owns a 2025 session's tasks, as the fast fronts name it (a request with no session: nobody)."""
        request = ctx.request
        if request is None:
            return TASK_OWNER_STDIO
        session = request.headers.get("mcp-session-id")
        return task_owner(session) if session else f"sessionless:{uuid.uuid4().hex}"

    async def _get(self, ctx: Any, params: types.GetTaskRequestParams) -> Any:
        if _modern(ctx):
            return await _worded(self.mux.tasks.extension.get(self._extension_owner(ctx), params.task_id))
        return await _worded(self.mux.tasks.get(self._legacy_owner(ctx), params.task_id))

    async def _cancel(self, ctx: Any, params: types.CancelTaskRequestParams) -> Any:
        if _modern(ctx):
            return await _worded(self.mux.tasks.extension.cancel(self._extension_owner(ctx), params.task_id))
        return await _worded(self.mux.tasks.cancel(self._legacy_owner(ctx), params.task_id))

    async def _update(self, ctx: Any, params: UpdateTaskParams) -> dict[str, Any]:
        if not _modern(ctx):
            raise _method_not_found("tasks/update")
        owner = self._extension_owner(ctx)
        return await _worded(self.mux.tasks.extension.update(owner, params.task_id, params.input_responses))

    async def _result(self, ctx: Any, params: types.GetTaskPayloadRequestParams) -> types.CallToolResult:
        if _modern(ctx):
            raise _method_not_found("tasks/result")  # the extension polls `tasks/get` instead
        return await _worded(self.mux.tasks.result(self._legacy_owner(ctx), params.task_id))

    async def _list(self, ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListTasksResult:
        if _modern(ctx):
            raise _method_not_found("tasks/list")  # no listing in the extension: nothing tells of others' tasks
        return await _worded(self.mux.tasks.list(self._legacy_owner(ctx)))

    async def _discover(self, ctx: Any, params: types.RequestParams | None) -> types.DiscoverResult:
        """`server/discover`, as the SDK answers it, with the tasks extension among the capabilities."""
        server = self._server
        assert server is not None  # `register` set it: this handler is registered there
        capabilities = server.get_capabilities(protocol_version=ctx.protocol_version)
        extensions = {**(capabilities.extensions or {}), wire.EXTENSION: {}}
        return types.DiscoverResult(
            supported_versions=list(MODERN_PROTOCOL_VERSIONS),
            capabilities=capabilities.model_copy(update={"extensions": extensions}),
            instructions=server.instructions,
        )
