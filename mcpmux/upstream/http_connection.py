"""One keep-alive HTTP/1.1 connection of the fast path's HTTP client (`mcpmux.upstream.http_lane`).

A `Connection` carries one request at a time (no pipelining) and turns its response into JSON-RPC
messages, handed to its `Pool` as they arrive; an error the response stands for is worded as the
SDK's streamable HTTP transport words it. An event stream that ends before its answer, having given
an event id, is resumed (SEP-1699): the pool reconnects with `Last-Event-ID` after the stream's
`retry`, and the request itself is never sent again (the server has it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Protocol, cast
from urllib.parse import urlsplit

import mcp_types as types
from mcp_types.jsonrpc import CONNECTION_CLOSED
from pydantic import ValidationError
from pydantic_core import from_json

from mcpmux.wire import idle
from mcpmux.wire.http_response import Event, EventStream, Head, HttpWireError, ResponseReader

LINGER = 1.0
"""Seconds a connection whose call is answered waits for the rest of its event stream before it is closed."""
MAX_EVENT_SIZE = 1024 * 1024  # as the SDK's transport
MAX_RESUMPTIONS = 2
"""Reconnections in a row that bring no new event before a call's stream is given up on (as the SDK's)."""
RESEND_WINDOW = 0.05
"""A reused connection that ends this soon after a request went out on it, before any byte of answer
and not closed by mcpmux, was closed idle by the server as the request crossed it: the server read
none of it, and only then is a request sent again. Later, the server may have acted on it."""


class Pool(Protocol):
    """What a connection tells the client that owns it."""

    session_id: str | None

    def deliver(self, message: dict[str, Any], request_id: str | None = None) -> None: ...
    def several(self, body: bytes) -> list[Any] | None: ...
    def carrying(self, request_id: str, connection: Connection | None) -> None: ...
    def rest(self, connection: Connection) -> None: ...
    def forget(self, connection: Connection) -> None: ...
    def resend(self, request_id: str, data: bytes) -> None: ...
    def resume(self, request_id: str, data: bytes, resumption: Resumption) -> None: ...


class Resumption:
    """Where a request's event stream broke off: the last event id it gave, its `retry`, and how many
    reconnections in a row have brought nothing new."""

    __slots__ = ("failures", "last_id", "retry")

    def __init__(self, last_id: str | None = None, retry: int | None = None, failures: int = 0) -> None:
        self.last_id = last_id
        self.retry = retry
        self.failures = failures


class Exchange:
    """One request on a connection and what has arrived of its response."""

    __slots__ = (
        "answered",
        "body",
        "data",
        "events",
        "head",
        "request_id",
        "resend",
        "resumed",
        "sent_at",
        "unread",
    )

    def __init__(self, request_id: str | None, data: bytes, resend: bool, resumed: Resumption | None) -> None:
        self.request_id = request_id
        self.data = data
        self.resend = resend
        self.resumed = resumed or Resumption()
        """Where the stream this request reconnects to broke off (a fresh `Resumption` for a first send)."""
        """Whether the pool sends it again itself if it went unread (nobody awaits `unread`)."""
        self.sent_at = time.monotonic()
        self.unread: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        """True when the connection ended with the request unread (send it again); False once that cannot be."""
        self.head: Head | None = None
        self.body = bytearray()
        self.events: EventStream | None = None
        self.answered = request_id is None


class Connection(asyncio.Protocol):
    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.reader = ResponseReader(self._head, self._body, self._end)
        self.exchange: Exchange | None = None
        self.used = 0
        self.idle_since = 0.0
        self.dropped = False
        self._linger: asyncio.TimerHandle | None = None
        self._arrived: list[tuple[dict[str, Any], str | None]] | None = None
        """While a read is parsed: the messages it carried, handed to the pool once it is (`data_received`)."""

    def start(
        self, request_id: str | None, data: bytes, *, resend: bool = False, resumed: Resumption | None = None
    ) -> Exchange:
        assert self.transport is not None
        self.exchange = exchange = Exchange(request_id, data, resend, resumed)
        self.used += 1
        self.reader.expect_next()
        if request_id is not None:
            self.pool.carrying(request_id, self)
        self.transport.write(data)
        return exchange

    def reusable(self) -> bool:
        """Open, and nothing waiting to be read on it: an idle connection's next byte can only be the
        server's close, which a busy event loop may not have read yet (httpcore checks the same before
        reusing one). A close still on the wire as the request goes out is met by `RESEND_WINDOW`."""
        return not self.dropped and idle.reusable(self.transport)

    def drop(self) -> None:
        """Close it now (a 2026 cancellation, a broken response, shutdown); what it carried is not sent again."""
        self.dropped = True
        if self.transport is not None:
            self.transport.abort()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses

    def data_received(self, data: bytes) -> None:
        """Parse what was read; the messages it carried go to the pool after that, once the
        connection has rested if their response ended: an answer that frees a slot at the gate lets
        the next call go out on this very connection, with no task to open another."""
        exchange = self.exchange
        if exchange is not None and not exchange.unread.done():
            exchange.unread.set_result(False)
        arrived: list[tuple[dict[str, Any], str | None]] = []
        self._arrived = arrived
        try:
            self.reader.feed(data)
        except HttpWireError as err:
            self._fail(f"the upstream's response was not valid HTTP: {err}")
            self.drop()
        finally:
            self._arrived = None
            for message, request_id in arrived:
                self.pool.deliver(message, request_id)

    def eof_received(self) -> bool:
        with contextlib.suppress(HttpWireError):  # connection_lost, right after this, fails what was unfinished
            self.reader.eof()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self._linger is not None:
            self._linger.cancel()
        self.pool.forget(self)
        exchange = self.exchange
        if exchange is None:
            return
        unread = (
            self.used > 1
            and not self.dropped
            and not self.reader.started
            and not exchange.answered
            and time.monotonic() - exchange.sent_at < RESEND_WINDOW
        )
        if not unread and not self._resumed(exchange):
            self._fail("Connection closed")
        self._finish(exchange)
        if not exchange.unread.done():
            exchange.unread.set_result(unread)
        if unread and exchange.resend and exchange.request_id is not None:
            self.pool.resend(exchange.request_id, exchange.data)

    def _head(self, head: Head) -> None:
        exchange = self.exchange
        if exchange is None:
            raise HttpWireError("a response arrived that no request asked for")
        exchange.head = head
        if head.status == 202 or not 200 <= head.status < 300:
            return
        kind = head.content_type()
        if kind == "text/event-stream":
            exchange.events = EventStream(self._event, MAX_EVENT_SIZE)
        elif kind != "application/json" and not exchange.answered:
            self._fail(
                f"Unexpected content type: {head.headers.get('content-type', '').lower()}", types.INVALID_REQUEST
            )

    def _body(self, piece: bytes) -> None:
        exchange = self.exchange
        if exchange is None or exchange.answered:
            return
        if exchange.events is not None:
            exchange.events.feed(piece)
        else:
            exchange.body += piece

    def _end(self) -> None:
        exchange = self.exchange
        if exchange is None:
            return
        head = exchange.head
        if head is not None and not exchange.answered:
            if head.status == 202:
                self._fail("server answered a request with 202 Accepted", types.INVALID_REQUEST)
            elif 300 <= head.status < 400:
                self._fail(_unfollowed(head.headers.get("location", "")), types.INVALID_REQUEST)
            elif head.status >= 400:
                self._http_error(head.status)
            elif exchange.events is None:
                self._json_body(bytes(exchange.body))
            elif not self._resumed(exchange):
                self._fail("SSE stream ended without a response")
        self._finish(exchange)
        if head is not None and head.keep_alive and not self.dropped:
            self.pool.rest(self)
        else:
            self.drop()

    def _event(self, event: Event) -> None:
        exchange = self.exchange
        if exchange is None or exchange.answered or event.event != "message" or not event.data:
            return
        message = self._parsed(event.data, "SSE message")
        if message is None:
            self.drop()  # as the SDK's transport, which stops reading the stream (at 2026, a cancellation)
            return
        if "method" not in message:
            message["id"] = exchange.request_id  # as the SDK's transport: the answer is the request's
            exchange.answered = True
            self._linger = asyncio.get_running_loop().call_later(LINGER, self._overstayed)
        self._deliver(message)

    def _json_body(self, body: bytes) -> None:
        """A JSON response: its message, or the several it holds (a server's deviation, read as the
        events of a stream would be: `Pool.several`), each handed on in order. Parsed once: only a body
        that is not one JSON object is looked at again."""
        message: Any = None
        error: ValueError | None = None
        try:
            message = from_json(body)
        except ValueError as err:
            error = err
        several = None if isinstance(message, dict) else self.pool.several(body)
        if several is None:
            if error is not None:
                self._fail(f"Failed to parse JSON response: {error}", types.PARSE_ERROR)
            elif not _is_jsonrpc(message):
                self._fail("Failed to parse JSON response: not a JSON-RPC message", types.PARSE_ERROR)
            else:
                self._answer(message)
            return
        for item in several:
            if not _is_jsonrpc(item):
                self._fail("Failed to parse JSON response: not a JSON-RPC message", types.PARSE_ERROR)
                return
            if "method" in item:
                self._deliver(item)
            else:
                item["id"] = self.exchange.request_id if self.exchange is not None else None  # as on a stream
                self._answer(item)
                return  # what follows the answer is not the request's, as on an event stream
        self._fail("SSE stream ended without a response")

    def _answer(self, message: dict[str, Any]) -> None:
        exchange = self.exchange
        assert exchange is not None
        exchange.answered = True
        self._deliver(message)

    def _resumed(self, exchange: Exchange) -> bool:
        """Whether the pool reconnects to the broken-off event stream of `exchange`'s unanswered request:
        the stream gave an event id, and mcpmux did not close it (a cancellation, shutdown)."""
        events = exchange.events
        if exchange.answered or exchange.request_id is None or events is None or self.dropped:
            return False
        before = exchange.resumed
        last_id = events.last_id or before.last_id
        if last_id is None:
            return False
        failures = 0 if events.last_id not in (None, before.last_id) else before.failures + 1
        if failures >= MAX_RESUMPTIONS:
            self._fail("SSE stream ended and reconnection attempts were exhausted")
            return True
        exchange.answered = True  # by the stream the pool reconnects to, not by this connection
        retry = events.retry if events.retry is not None else before.retry
        self.pool.resume(exchange.request_id, exchange.data, Resumption(last_id, retry, failures))
        return True

    def _parsed(self, data: str | bytes, what: str) -> dict[str, Any] | None:
        """A JSON-RPC message as raw JSON; None (and the request failed, as the SDK words it) if it is none."""
        try:
            message = from_json(data)
        except ValueError as err:
            self._fail(f"Failed to parse {what}: {err}", types.PARSE_ERROR)
            return None
        if not _is_jsonrpc(message):
            self._fail(f"Failed to parse {what}: not a JSON-RPC message", types.PARSE_ERROR)
            return None
        return cast(dict[str, Any], message)

    def _http_error(self, status: int) -> None:
        """An error status; a JSON-RPC error in its body is the answer, as on the SDK's transport."""
        exchange = self.exchange
        assert exchange is not None
        assert exchange.head is not None
        if exchange.head.content_type() == "application/json":
            error = _error_in(bytes(exchange.body))
            if error is not None:
                self._fail(str(error["message"]), error=error)
                return
        if status == 404:
            if self.pool.session_id is None:
                self._fail("Not Found", types.METHOD_NOT_FOUND)
            else:
                self._fail("Session terminated", types.INVALID_REQUEST)
        else:
            self._fail("Server returned an error response", types.INTERNAL_ERROR)

    def _fail(self, message: str, code: int = CONNECTION_CLOSED, error: dict[str, Any] | None = None) -> None:
        """Answer the request with an error, once."""
        exchange = self.exchange
        if exchange is None or exchange.answered:
            return
        exchange.answered = True
        error = error or {"code": code, "message": message}
        self._deliver({"jsonrpc": "2.0", "id": exchange.request_id, "error": error})

    def _deliver(self, message: dict[str, Any]) -> None:
        """Hand on a message of the response to the request the connection carries (whose id goes with it)."""
        request_id = self.exchange.request_id if self.exchange is not None else None
        if self._arrived is not None:
            self._arrived.append((message, request_id))  # `data_received` hands it on
        else:
            self.pool.deliver(message, request_id)

    def _finish(self, exchange: Exchange) -> None:
        self.exchange = None
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if exchange.request_id is not None:
            self.pool.carrying(exchange.request_id, None)

    def _overstayed(self) -> None:
        """An answered call's stream did not end in time: its connection goes (a 2026 server reads it as a cancel)."""
        self._linger = None
        if self.exchange is not None:
            self.drop()


def _is_jsonrpc(message: object) -> bool:
    return (
        isinstance(message, dict)
        and message.get("jsonrpc") == "2.0"
        and ("method" in message or "result" in message or "error" in message)
    )


def _error_in(body: bytes) -> dict[str, Any] | None:
    """The JSON-RPC error an error response's body carries, if it is one (as the SDK's transport reads it)."""
    try:
        message = from_json(body)
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0" or "result" in message:
            return None
        return types.ErrorData.model_validate(message.get("error")).model_dump(mode="json", exclude_none=True)
    except (ValueError, ValidationError):
        return None


def _unfollowed(location: str) -> str:
    """The SDK transport's words for a redirect it does not follow (query and credentials left out)."""
    parts = urlsplit(location)
    where = f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}{parts.path}"
    return f"Redirect to {where} not followed; use that URL as the endpoint if it is the intended server"
