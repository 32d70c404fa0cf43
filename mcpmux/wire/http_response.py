"""HTTP/1.1 responses and server-sent events, parsed as their bytes arrive.

What mcpmux's own HTTP lane client (`mcpmux.upstream.http_lane`) reads off a keep-alive connection to a
streamable HTTP upstream: a status line and headers, then a body framed by `Content-Length`, by
chunked transfer coding, or by the connection's end; the body of a `text/event-stream` response is
cut into events as it arrives, so that a progress notification reaches the caller while the call
still runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import httptools

MAX_HEAD = 64 * 1024
"""Bytes a status line and its headers may take (llhttp sets no bound of its own)."""


class HttpWireError(Exception):
    """The upstream sent something that is not an HTTP/1.1 response (or one larger than allowed)."""


@dataclass(slots=True)
class Head:
    status: int
    headers: dict[str, str]
    """Names in lower case; a repeated header's values joined with ", "."""
    keep_alive: bool
    """Whether the connection may carry another request once this response has ended."""

    def content_type(self) -> str:
        return self.headers.get("content-type", "").partition(";")[0].strip().lower()


class ResponseReader:
    """Parses the responses of one connection: `on_head` once each, `on_body` per piece of body, `on_end` at its end.

    llhttp (through httptools, as uvicorn parses requests) does the framing; it is stricter than
    h11, the SDK's client, in one way only that a server may meet: a `Content-Length` repeated,
    even with the same value, is refused (as Node's clients and nginx refuse it). Line ends may be
    bare LFs, as h11 allows. `feed` raises `HttpWireError` for malformed input; the connection is
    then of no further use.
    """

    def __init__(
        self, on_head: Callable[[Head], None], on_body: Callable[[bytes], None], on_end: Callable[[], None]
    ) -> None:
        self._on_head = on_head
        self.on_body = on_body  # httptools calls it for each piece of body, with nothing of ours between
        self._on_end = on_end
        self._parser = httptools.HttpResponseParser(self)
        self._parser.set_dangerous_leniencies(lenient_optional_cr_before_lf=True)
        self._headers: dict[str, str] = {}
        self._in_head = False
        self._head_size = 0
        self._interim = False
        self._until_close = False
        self._awaited = True
        """A request is out whose response has not ended."""

        self.started = False
        """Whether any byte of the current response has arrived."""

    def expect_next(self) -> None:
        """A new request went out: what arrives next is its response."""
        self._awaited = True
        self.started = False

    def feed(self, data: bytes) -> None:
        self.started = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as err:
            raise (err.__context__ or err) from None  # what a callback raised, as it raised it
        except httptools.HttpParserError as err:
            raise HttpWireError(str(err)) from None
        if self._in_head:
            self._head_size += len(data)
            if self._head_size > MAX_HEAD:
                raise HttpWireError(f"the response's headers exceed {MAX_HEAD} bytes")

    def eof(self) -> None:
        """The connection ended: that ends a body read until close; any other unfinished response is broken."""
        if self._until_close:
            self._until_close = False
            self._finish()
        elif self._awaited:
            raise HttpWireError("the connection ended before the response did")

    # -- httptools' callbacks ----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if not self._awaited:
            raise HttpWireError("the upstream sent bytes after the end of a response")
        self._headers = {}
        self._in_head = True
        self._head_size = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._in_head:
            return  # a trailer
        key, text = name.decode("latin-1").lower(), value.decode("latin-1").strip()
        headers = self._headers
        headers[key] = f"{headers[key]}, {text}" if key in headers else text

    def on_headers_complete(self) -> None:
        self._in_head = False
        status = self._parser.get_status_code()
        self._interim = 100 <= status < 200  # 100 Continue, 103 Early Hints: the real response follows
        if self._interim:
            return
        headers = self._headers
        framed = "content-length" in headers or "chunked" in headers.get("transfer-encoding", "").lower()
        self._until_close = not framed and status not in (204, 304)
        self._on_head(Head(status, headers, self._parser.should_keep_alive()))

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self._finish()

    def _finish(self) -> None:
        self._awaited = False
        self._on_end()


@dataclass(slots=True)
class Event:
    data: str
    event: str = "message"
    id: str | None = None


class EventStream:
    """Cuts a `text/event-stream` body into events (the WHATWG rules), handing each to `on_event`.

    Keeps what a reconnection needs (SEP-1699): the last event id the stream set (`last_id`) and the
    reconnection time in milliseconds its `retry` field last gave (`retry`). Raises `HttpWireError`
    when one event grows past `max_size` bytes.
    """

    def __init__(self, on_event: Callable[[Event], None], max_size: int) -> None:
        self._on_event = on_event
        self._max_size = max_size
        self._pending = bytearray()
        self._data: list[str] = []
        self._event = ""
        self._id: str | None = None
        self._size = 0
        self._after_cr = False
        self.retry: int | None = None

    @property
    def last_id(self) -> str | None:
        """The last event id the stream set (an empty `id:` clears it), whether or not its event carried data."""
        return self._id or None

    def feed(self, chunk: bytes) -> None:
        """Take the next piece of the body; lines end with CRLF, LF or CR, as the spec allows."""
        if not chunk:
            return
        if self._whole_data_event(chunk):
            return
        pending = self._pending
        if self._after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]  # the LF of a CRLF split across two pieces
        self._after_cr = chunk.endswith(b"\r")
        pending += chunk
        start = 0
        while (end := _line_end(pending, start)) >= 0:
            self._line(bytes(pending[start:end]).decode("utf-8", errors="replace"))
            start = end + 2 if pending[end : end + 2] == b"\r\n" else end + 1
        del pending[:start]
        if len(self._pending) + self._size > self._max_size:
            raise HttpWireError(f"a server-sent event exceeds {self._max_size} bytes")

    def _whole_data_event(self, chunk: bytes) -> bool:
        """Dispatch `chunk` at once if it is exactly one event of one `data: ` line, between events (what
        each piece of a streamed completion is): the same event the line-by-line rules make, read in one go."""
        if self._pending or self._data or self._event or self._after_cr or not chunk.startswith(b"data: "):
            return False
        if chunk.find(b"\n") != len(chunk) - 2 or not chunk.endswith(b"\n\n") or b"\r" in chunk:
            return False
        data = chunk[6:-2].decode("utf-8", errors="replace")
        if len(data) > self._max_size:
            raise HttpWireError(f"a server-sent event exceeds {self._max_size} bytes")
        self._on_event(Event(data, "message", self._id))
        return True

    def _line(self, line: str) -> None:
        if not line:
            if self._data:
                self._on_event(Event("\n".join(self._data), self._event or "message", self._id))
            self._data, self._event, self._size = [], "", 0
            return
        if line.startswith(":"):
            return  # a comment (keep-alive pings)
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
            self._size += len(value)
            if self._size > self._max_size:
                raise HttpWireError(f"a server-sent event exceeds {self._max_size} bytes")
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry = int(value)


def _line_end(data: bytearray, start: int) -> int:
    """Where the first line from `start` ends (its CR or LF), or -1; a CR last in `data` ends it too."""
    lf, cr = data.find(b"\n", start), data.find(b"\r", start)
    if cr < 0:
        return lf
    return cr if lf < 0 else min(lf, cr)
