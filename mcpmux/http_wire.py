"""HTTP/1.1 responses and server-sent events, parsed as their bytes arrive.

What mcpmux's own HTTP lane client (`mcpmux.http_lane`) reads off a keep-alive connection to a
streamable HTTP upstream: a status line and headers, then a body framed by `Content-Length`, by
chunked transfer coding, or by the connection's end; the body of a `text/event-stream` response is
cut into events as it arrives, so that a progress notification reaches the caller while the call
still runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, auto

MAX_HEAD = 64 * 1024
"""Bytes a status line and its headers may take."""
_DECIMAL = re.compile(r"[0-9]+")
_HEX = re.compile(r"[0-9A-Fa-f]+")
_HEAD_END = re.compile(rb"\r?\n\r?\n")


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


class _State(Enum):
    HEAD = auto()
    FIXED = auto()
    CHUNK_SIZE = auto()
    CHUNK_DATA = auto()
    CHUNK_END = auto()
    TRAILERS = auto()
    UNTIL_CLOSE = auto()
    DONE = auto()


class ResponseReader:
    """Parses one response at a time: `on_head` once, `on_body` per piece of body, `on_end` at its end.

    `feed` raises `HttpWireError` for malformed input; the connection is then of no further use.
    """

    def __init__(
        self, on_head: Callable[[Head], None], on_body: Callable[[bytes], None], on_end: Callable[[], None]
    ) -> None:
        self._on_head = on_head
        self._on_body = on_body
        self._on_end = on_end
        self._buffer = bytearray()
        self._state = _State.HEAD
        self._remaining = 0

        self.started = False
        """Whether any byte of the current response has arrived."""

    def expect_next(self) -> None:
        """A new request went out: what arrives next is its response."""
        self._state = _State.HEAD
        self._buffer.clear()
        self.started = False

    def feed(self, data: bytes) -> None:
        if self._state is _State.DONE:
            raise HttpWireError("the upstream sent bytes after the end of a response")
        self.started = True
        self._buffer += data
        while self._step():
            pass
        if self._state is _State.DONE and self._buffer:
            raise HttpWireError("the upstream sent bytes after the end of a response")

    def eof(self) -> None:
        """The connection ended: that ends a body read until close; any other unfinished response is broken."""
        if self._state is _State.UNTIL_CLOSE:
            self._finish()
        elif self._state is not _State.DONE:
            raise HttpWireError("the connection ended before the response did")

    def _step(self) -> bool:
        """Consume what the current state can from the buffer; True if the next state may go on."""
        state, buffer = self._state, self._buffer
        if state is _State.HEAD:
            return self._read_head()
        if state is _State.FIXED or state is _State.CHUNK_DATA:
            if not buffer and self._remaining:
                return False
            piece = bytes(buffer[: self._remaining])
            del buffer[: len(piece)]
            self._remaining -= len(piece)
            if piece:
                self._on_body(piece)
            if self._remaining:
                return False
            if state is _State.FIXED:
                self._finish()
                return False
            self._state = _State.CHUNK_END
            return True
        if state is _State.UNTIL_CLOSE:
            if buffer:
                piece = bytes(buffer)
                buffer.clear()
                self._on_body(piece)
            return False
        line = self._line()
        if line is None:
            return False
        if state is _State.CHUNK_SIZE:
            size = line.split(b";", 1)[0].strip().decode("latin-1")
            if not _HEX.fullmatch(size):
                raise HttpWireError(f"bad chunk size {bytes(line[:40])!r}")
            self._remaining = int(size, 16)
            self._state = _State.CHUNK_DATA if self._remaining else _State.TRAILERS
        elif state is _State.CHUNK_END:
            if line:
                raise HttpWireError("a chunk did not end with CRLF")
            self._state = _State.CHUNK_SIZE
        elif not line:  # TRAILERS: an empty line ends them
            self._finish()
            return False
        return True

    def _line(self) -> bytes | None:
        end = self._buffer.find(b"\n")
        if end < 0:
            if len(self._buffer) > MAX_HEAD:
                raise HttpWireError("a line of the response is too long")
            return None
        line = bytes(self._buffer[:end]).rstrip(b"\r")
        del self._buffer[: end + 1]
        return line

    def _read_head(self) -> bool:
        end = _HEAD_END.search(self._buffer)
        if end is None:
            if len(self._buffer) > MAX_HEAD:
                raise HttpWireError(f"the response's headers exceed {MAX_HEAD} bytes")
            return False
        lines = [line.rstrip("\r") for line in bytes(self._buffer[: end.start()]).decode("latin-1").split("\n")]
        del self._buffer[: end.end()]
        version, _, rest = lines[0].partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise HttpWireError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        status = int(code)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon:
                raise HttpWireError(f"bad header line {line[:80]!r}")
            name, value = name.strip().lower(), value.strip()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        if 100 <= status < 200:
            return True  # an interim response (100 Continue, 103 Early Hints): the real one follows
        connection = headers.get("connection", "").lower()
        keep_alive = "close" not in connection and (version == "HTTP/1.1" or "keep-alive" in connection)
        self._frame(status, headers)
        self._on_head(Head(status, headers, keep_alive and self._state is not _State.UNTIL_CLOSE))
        if self._state is _State.DONE:
            self._on_end()
            return False
        return True

    def _frame(self, status: int, headers: dict[str, str]) -> None:
        if status in (204, 304):
            self._state = _State.DONE
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            self._state = _State.CHUNK_SIZE
        elif "content-length" in headers:
            lengths = {value.strip() for value in headers["content-length"].split(",")}
            length = lengths.pop()
            if lengths or not _DECIMAL.fullmatch(length):  # repeated, it must say the same each time
                raise HttpWireError(f"bad Content-Length {headers['content-length']!r}")
            self._remaining = int(length)
            self._state = _State.FIXED if self._remaining else _State.DONE
        else:
            self._state = _State.UNTIL_CLOSE

    def _finish(self) -> None:
        self._state = _State.DONE
        self._on_end()


@dataclass(slots=True)
class Event:
    data: str
    event: str = "message"
    id: str | None = None


class EventStream:
    """Cuts a `text/event-stream` body into events (the WHATWG rules), handing each to `on_event`.

    Raises `HttpWireError` when one event grows past `max_size` bytes.
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

    def feed(self, chunk: bytes) -> None:
        """Take the next piece of the body; lines end with CRLF, LF or CR, as the spec allows."""
        if not chunk:
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


def _line_end(data: bytearray, start: int) -> int:
    """Where the first line from `start` ends (its CR or LF), or -1; a CR last in `data` ends it too."""
    lf, cr = data.find(b"\n", start), data.find(b"\r", start)
    if cr < 0:
        return lf
    return cr if lf < 0 else min(lf, cr)
