"""The streamable HTTP half of the fast path: ASGI middleware in front of the SDK's MCP endpoint.

A `POST` to the MCP path whose body is a `tools/call` the fast path serves is answered here, as
`application/json` (which every streamable HTTP client accepts), and never reaches the SDK:

- a 2026-07-28 request when its envelope and `MCP-Protocol-Version` / `Mcp-Method` / `Mcp-Name`
  headers pass the SDK's own checks (`classify_inbound_request`); the client closing the connection
  cancels the call, as closing the response stream does on the SDK path;
- a 2025 request when its `mcp-session-id` is one the SDK's session manager holds (else the SDK
  answers 404 as ever) and it names its revision in `MCP-Protocol-Version`. Whether the client
  declared sampling is read off its `initialize` request as it goes by (paired with the session id
  its response carries); for a session opened before that, it counts as declared. The session's
  `notifications/cancelled` for such a call is taken here too: the call is cancelled and answered
  with the SDK's "Request cancelled" error (-32800).

Requests that ask for progress (`progressToken`) take the SDK path too: their notifications need
its SSE response stream. Every other request goes to the app behind, its body replayed unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import anyio
from cachetools import LRUCache
from mcp.server.streamable_http import REQUEST_CANCELLED
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.inbound import ERROR_CODE_HTTP_STATUS, find_duplicated_routing_header
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mcpmux.core.inbound import Caller
from mcpmux.errors import ConfigError
from mcpmux.mux.call_sink import answered
from mcpmux.mux.fast_path import FastCall, FastPath, ToSdk, decode, sampling_declared
from mcpmux.server.http.edge import PROFILE_SCOPE
from mcpmux.wire.batch_array import id_key
from mcpmux.wire.json_bytes import dumps

logger = logging.getLogger(__name__)

MAX_BODY = 4 * 1024 * 1024
"""Bodies above this go to the SDK, which applies its own limit."""
CANCELLED_ERROR = {"code": REQUEST_CANCELLED, "message": "Request cancelled"}
"""What the SDK answers a cancelled request with on a 2025 session (`mcp.server.streamable_http`)."""


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class FastPathMiddleware:
    """Answers fast-path `tools/call` POSTs on `path`; everything else goes to `app` unchanged."""

    def __init__(
        self,
        app: ASGIApp,
        fast: FastPath,
        session_manager: StreamableHTTPSessionManager,
        caller: Callable[[Scope], Caller],
        path: str = "/mcp",
        max_sessions: int = 10_000,
    ) -> None:
        """`caller`: who sent a request (its session's client, its token's, or an anonymous request's)."""
        self.app = app
        self.fast = fast
        self.caller = caller
        self.sessions = session_manager
        self.path = path.rstrip("/") or "/"
        self.declares_sampling: LRUCache[str, bool] = LRUCache(maxsize=max_sessions)
        """Per 2025 session id: whether its client declared sampling in `initialize`."""
        self.running: dict[tuple[str, str], Cancellable] = {}
        """2025 sessions' fast-path calls in flight, by (session id, request id key); also those
        `mcpmux.server.http.fast_front` serves below ASGI."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or (scope["path"].rstrip("/") or "/") != self.path
            or scope.get("user") is not None  # sessions bound to a credential are the SDK's to check
        ):
            await self.app(scope, receive, send)
            return
        body, complete = await _read_body(receive)
        if complete and b'"notifications/cancelled"' in body and self._cancel(scope, body):
            await send({"type": "http.response.start", "status": 202, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        call = self.route(scope, body) if complete else ToSdk.FRONT
        session = session_of(scope)
        if isinstance(call, FastCall) and session is not None and (session, id_key(call.request_id)) in self.running:
            call = ToSdk.DUPLICATE_ID  # the SDK path answers that as it always has
        if isinstance(call, ToSdk):
            self.fast.to_sdk(call)
            if b'"initialize"' in body:
                send = self._learning(body, send)
            await self.app(scope, _replaying(body, complete, receive), send)
            return
        response = await self._answer_unless_gone(call, session, receive)
        if response is None:
            return  # the client went away: the call was cancelled, nobody is left to answer
        status = http_status(response, call.version in MODERN_PROTOCOL_VERSIONS)
        payload = dumps(response)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    def route(self, scope: Scope, body: bytes, askable: Callable[[str], object] | None = None) -> FastCall | ToSdk:
        """The `FastCall` a POST of `body` is, or why the SDK must serve it.

        A 2025 session whose client declared sampling or elicitation is taken only where `askable`
        gives its session something (`HttpFastFront`: its connection, while its standalone stream is
        open), for what an upstream asks of the client to reach it there."""
        if b'"tools/call"' not in body:
            return ToSdk.NOT_A_CALL
        raw_headers = _raw_headers(scope)
        headers = dict(reversed(raw_headers))  # the first of a repeated header wins, as in Starlette's `Headers`
        content_type = headers.get("content-type", "").lower()
        if not content_type.startswith("application/json") or not _accepts_json_and_sse(headers.get("accept", "")):
            return ToSdk.FRONT
        message = decode(body)
        if not self._in_profile(message, scope.get(PROFILE_SCOPE)):
            return ToSdk.NOT_AN_UPSTREAM_TOOL  # the SDK path answers it: an unknown tool, as outside the profile
        version = headers.get("mcp-protocol-version")
        session = headers.get("mcp-session-id")
        call: FastCall | ToSdk
        if session is None:
            if version not in MODERN_PROTOCOL_VERSIONS or not isinstance(message, dict):
                return ToSdk.FRONT
            if find_duplicated_routing_header(raw_headers) is not None:
                return ToSdk.FRONT
            call = self.fast.route(message, self.caller(scope), None, headers=headers)
        else:
            # The SDK keeps its sessions here; an unknown one must get its 404.
            if version is None or version in MODERN_PROTOCOL_VERSIONS or session not in self.sessions._server_instances:
                return ToSdk.FRONT
            asks = self.declares_sampling.get(session, True) and (askable is None or askable(session) is None)
            call = self.fast.route(message, self.caller(scope), version, asks, owner=task_owner(session))
        if isinstance(call, FastCall) and call.progress_token is not None:
            return ToSdk.FRONT  # its progress needs the SDK's event stream
        return call

    def _in_profile(self, message: Any, profile: str | None) -> bool:
        """Whether a call's tool is in the client's profile (`HttpEdge` put it in the scope; None: every tool)."""
        if profile is None:
            return True
        params = message.get("params") if isinstance(message, dict) else None
        name = params.get("name") if isinstance(params, dict) else None
        try:
            view = self.fast.mux.view(profile)
        except ConfigError:  # a reload removed the profile: the SDK path words that
            return False
        return isinstance(name, str) and view.allows(name)

    async def _answer_unless_gone(self, call: FastCall, session: str | None, receive: Receive) -> dict[str, Any] | None:
        """`call`'s response (`answered`), or None when the client disconnects first (which cancels the call).

        A 2025 session's `notifications/cancelled` for the call cancels it too (see `_cancel`); the
        request is then answered with the error the SDK gives a cancelled request on such a session.
        """
        response: dict[str, Any] | None = None
        key = (session, id_key(call.request_id)) if session is not None else None
        async with anyio.create_task_group() as tasks:

            async def watch_client() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                tasks.cancel_scope.cancel()

            tasks.start_soon(watch_client)
            cancelled = anyio.CancelScope()
            if key is not None:
                self.running[key] = cancelled
            try:
                with cancelled:
                    response = await answered(self.fast, call, None)
            finally:
                if key is not None:
                    self.running.pop(key, None)
            if cancelled.cancelled_caught:
                response = {"jsonrpc": "2.0", "id": call.request_id, "error": CANCELLED_ERROR}
            tasks.cancel_scope.cancel()
        return response

    def _cancel(self, scope: Scope, body: bytes) -> bool:
        """Cancel the fast-path call a 2025 session's `notifications/cancelled` names; False if none."""
        session = session_of(scope)
        message = decode(body)
        params = message.get("params") if isinstance(message, dict) else None
        if session is None or not isinstance(params, dict) or message.get("method") != "notifications/cancelled":
            return False
        running = self.running.get((session, id_key(params.get("requestId"))))
        if running is None:
            return False
        running.cancel()
        return True

    def _learning(self, body: bytes, send: Send) -> Send:
        """`send`, also noting whether the client opening a session with `body` declared sampling."""
        message = decode(body)
        if not isinstance(message, dict) or message.get("method") != "initialize":
            return send
        params = message.get("params")
        capabilities = params.get("capabilities") if isinstance(params, dict) else None
        declares = sampling_declared(capabilities)

        async def learn(event: Message) -> None:
            if event["type"] == "http.response.start":
                for key, value in event.get("headers", []):
                    if key.lower() == b"mcp-session-id":
                        self.declares_sampling[value.decode("latin-1")] = declares
            await send(event)

        return learn


def http_status(response: dict[str, Any], modern: bool) -> int:
    """The HTTP status of a fast-path response: a 2026 error's comes from the SDK's table; a 2025
    session's errors ride a 200, as on its SSE."""
    return ERROR_CODE_HTTP_STATUS.get(response["error"]["code"], 200) if modern and "error" in response else 200


async def _read_body(receive: Receive) -> tuple[bytes, bool]:
    """The request body, and whether it is complete (False: over `MAX_BODY`, or the client left)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), False
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), True
        if size > MAX_BODY:
            return b"".join(chunks), False


def _replaying(body: bytes, complete: bool, receive: Receive) -> Receive:
    """A `receive` that first gives back what `_read_body` read, then reads on."""
    pending = True

    async def replay() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": not complete}
        return await receive()

    return replay


def session_of(scope: Scope) -> str | None:
    """The request's `mcp-session-id` (a 2025 session), if any."""
    return next((value.decode("latin-1") for key, value in scope["headers"] if key.lower() == b"mcp-session-id"), None)


def _raw_headers(scope: Scope) -> list[tuple[str, str]]:
    return [(key.decode("latin-1").lower(), value.decode("latin-1")) for key, value in scope["headers"]]


def _accepts_json_and_sse(accept: str) -> bool:
    """Whether `Accept` names both JSON and SSE (wildcards count), which the SDK requires of a POST."""
    types = {part.split(";")[0].strip().lower() for part in accept.split(",")}
    wildcard = "*/*" in types
    has_json = wildcard or "application/json" in types or "application/*" in types
    has_sse = wildcard or "text/event-stream" in types or "text/*" in types
    return has_json and has_sse


def task_owner(session: str) -> str:
    """Who owns the tasks a 2025 HTTP session creates (`Mux.tasks`)."""
    return f"session:{session}"
