"""JSON-RPC batch arrays on streamable HTTP: ASGI middleware in front of the SDK's MCP endpoint.

A POST whose body is a JSON array, on a session (`mcp-session-id`) that negotiated 2025-03-26, is
split into one POST per message to the app behind (same headers, same session); their answers,
JSON or SSE, are gathered and returned as one `application/json` array, or `202 Accepted` with no
body when the array held no requests. Other requests pass through untouched, except that the
response to each session-opening POST is read as it goes by, to learn the session's protocol
version. Progress and log notifications sent while a batched request runs are not relayed: the
answer is a plain JSON array.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
from cachetools import LRUCache
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mcpmux.wire.batch_array import BatchPlan, array_refusal, error_message, id_key, is_response, plan_batch

logger = logging.getLogger(__name__)

MAX_BODY = 4 * 1024 * 1024
"""Largest batch body accepted by default, in bytes (`[http] max_body_bytes` sets it when serving)."""
_SESSION = b"mcp-session-id"
_OPENING_RESPONSE_LIMIT = 64 * 1024


@dataclass(slots=True)
class _Captured:
    """One inner response, kept whole."""

    status: int = 0
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytearray = field(default_factory=bytearray)

    def header(self, name: bytes) -> str | None:
        return next((value.decode("latin-1") for key, value in self.headers if key.lower() == name), None)

    def messages(self) -> list[Any]:
        """The JSON-RPC messages in the body: a JSON document, or the `data:` lines of SSE events."""
        text = self.body.decode("utf-8", errors="replace")
        if (self.header(b"content-type") or "").startswith("text/event-stream"):
            found: list[Any] = []
            for event in text.replace("\r\n", "\n").split("\n\n"):
                data = "\n".join(line[5:].lstrip() for line in event.split("\n") if line.startswith("data:"))
                if data:
                    found.extend(_decode(data))
            return found
        return _decode(text)


def _decode(text: str) -> list[Any]:
    try:
        decoded = json.loads(text)
    except json.JSONDecodeError:
        return []
    return decoded if isinstance(decoded, list) else [decoded]


def _header(scope: Scope, name: bytes) -> str | None:
    return next((value.decode("latin-1") for key, value in scope["headers"] if key.lower() == name), None)


class BatchArrayMiddleware:
    """Accepts 2025-03-26 batch arrays on `path`; everything else goes to `app` unchanged."""

    def __init__(self, app: ASGIApp, path: str = "/mcp", max_sessions: int = 10_000, max_body: int = MAX_BODY) -> None:
        self.app = app
        self.max_body = max_body
        self.path = path.rstrip("/") or "/"
        self.versions: LRUCache[str, str] = LRUCache(maxsize=max_sessions)
        """Negotiated protocol version per session id (the most recent `max_sessions` sessions)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (scope["path"].rstrip("/") or "/") != self.path:
            await self.app(scope, receive, send)
            return
        session = _header(scope, _SESSION)
        if scope["method"] == "DELETE" and session is not None:
            self.versions.pop(session, None)
        if scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        first, chunks, more = await _peek(receive)
        if first != "[":
            replay = _replaying(chunks, more, receive)
            await self.app(scope, replay, send if session is not None else self._learning(send))
            return
        body = b"".join(chunks)
        while more and len(body) <= self.max_body:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if len(body) > self.max_body:
            problem = f"the batch body is larger than the {self.max_body} byte limit: send fewer messages per array"
            await _reply(send, 413, error_message(None, types.INVALID_REQUEST, problem))
            return
        await self._batch(scope, body, session, receive, send)

    async def _batch(self, scope: Scope, body: bytes, session: str | None, receive: Receive, send: Send) -> None:
        try:
            items = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            await _reply(send, 400, error_message(None, types.PARSE_ERROR, f"the body is not valid JSON: {err}"))
            return
        refusal = array_refusal(items, self.versions.get(session) if session is not None else None)
        if refusal is not None:
            await _reply(send, 400, refusal)
            return
        plan = plan_batch(items)
        disconnected = anyio.Event()

        async def watch_client() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            disconnected.set()

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(watch_client)
            async with anyio.create_task_group() as inner:
                for message in plan.forward:
                    inner.start_soon(self._one, scope, message, plan, disconnected)
            tasks.cancel_scope.cancel()
        responses = plan.responses()
        if not responses:
            await send({"type": "http.response.start", "status": 202, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await _reply(send, 200, responses, session)

    async def _one(self, scope: Scope, message: dict[str, Any], plan: BatchPlan, disconnected: anyio.Event) -> None:
        """POST one message of the batch to the app behind and record its answer in `plan`."""
        body = json.dumps(message).encode()
        headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        sent = False

        async def receive_one() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        captured = _Captured()

        async def capture(event: Message) -> None:
            if event["type"] == "http.response.start":
                captured.status, captured.headers = event["status"], list(event.get("headers", []))
            elif event["type"] == "http.response.body":
                captured.body += event.get("body", b"")

        await self.app({**scope, "headers": headers}, receive_one, capture)
        if "id" not in message or "method" not in message:
            if captured.status >= 400:
                logger.debug("a batched notification was refused with HTTP %d", captured.status)
            return
        for answer in captured.messages():
            if is_response(answer) and id_key(answer.get("id")) == id_key(message["id"]):
                plan.answer(answer)
                return
        # The app refused the request as a whole (e.g. HTTP 4xx with an id-less error): answer it by id.
        refused = next((answer for answer in captured.messages() if is_response(answer) and "error" in answer), None)
        error = refused["error"] if refused is not None else None
        problem = f"no response to this request (HTTP {captured.status})"
        plan.answer(
            {"jsonrpc": "2.0", "id": message["id"], "error": error}
            if error is not None
            else error_message(message["id"], types.INTERNAL_ERROR, problem)
        )

    def _learning(self, send: Send) -> Send:
        """`send`, also reading a session-opening response to learn the negotiated protocol version."""
        captured = _Captured()

        async def learn(event: Message) -> None:
            await send(event)
            if event["type"] == "http.response.start":
                captured.status, captured.headers = event["status"], list(event.get("headers", []))
            elif event["type"] == "http.response.body" and captured.header(_SESSION) is not None:
                if len(captured.body) < _OPENING_RESPONSE_LIMIT:
                    captured.body += event.get("body", b"")
                if not event.get("more_body", False):
                    self._remember(captured)

        return learn

    def _remember(self, captured: _Captured) -> None:
        session = captured.header(_SESSION)
        for message in captured.messages():
            result = message.get("result") if is_response(message) else None
            if session is not None and isinstance(result, dict) and "protocolVersion" in result:
                self.versions[session] = str(result["protocolVersion"])


async def _peek(receive: Receive) -> tuple[str, list[bytes], bool]:
    """The first non-blank character of the body (or ""), the chunks read to find it, and whether more follow."""
    chunks: list[bytes] = []
    more = True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            return "", chunks, False
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
        stripped = chunks[-1].lstrip()
        if stripped:
            return chr(stripped[0]), chunks, more
    return "", chunks, more


def _replaying(chunks: list[bytes], more: bool, receive: Receive) -> Receive:
    """A `receive` that first gives back the chunks `_peek` read, then reads on."""
    pending = True

    async def replay() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": b"".join(chunks), "more_body": more}
        return await receive()

    return replay


async def _reply(send: Send, status: int, payload: object, session: str | None = None) -> None:
    body = json.dumps(payload, separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if session is not None:
        headers.append((_SESSION, session.encode("latin-1")))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
