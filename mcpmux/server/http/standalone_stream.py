"""Notices when a 2025 HTTP client opens its standalone stream (`GET /mcp` with its session id).

A request mcpmux sends a client outside any call (an upstream's `roots/list` after the client
connected with roots) can only ride that stream; sent before the stream is open, the SDK drops it
and the upstream waits for an answer that never comes. So a client's roots are announced upstream
once its stream is open (`Frontend`), not when it is initialized. Likewise a fast-path call's client
is asked what an upstream asks of it only while that stream is open (`mcpmux.server.client_stand_in`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

_SESSION = b"mcp-session-id"


class StandaloneStreamWatch:
    """ASGI middleware: calls `opened(session_id)` once the response to a session's GET has started,
    and `closed(session_id)` once that response is over."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        path: str,
        opened: Callable[[str], Awaitable[None]],
        closed: Callable[[str], None],
    ) -> None:
        self.app = app
        self.path = path.rstrip("/") or "/"
        self.opened = opened
        self.closed = closed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        session = _session_of(scope) if scope["type"] == "http" and scope["method"] == "GET" else None
        if session is None or (scope["path"].rstrip("/") or "/") != self.path:
            await self.app(scope, receive, send)
            return

        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            await send(message)
            if message["type"] == "http.response.start" and message["status"] == 200:
                started = True
                await self.opened(session)

        try:
            await self.app(scope, receive, watched)
        finally:
            if started:
                self.closed(session)


def _session_of(scope: Any) -> str | None:
    value = next((value for key, value in scope["headers"] if key == _SESSION), None)
    return value.decode("latin-1") if value is not None else None
