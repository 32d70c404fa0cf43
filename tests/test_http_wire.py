"""HTTP/1.1 responses and server-sent events as mcpmux's HTTP lane client reads them (mcpmux.wire.http_response).

Every response is fed whole and one byte at a time: a TCP read can end anywhere.
"""

from __future__ import annotations

from typing import Any

import pytest

from mcpmux.wire.http_response import Event, EventStream, Head, HttpWireError, ResponseReader


def read(raw: bytes, *, bytewise: bool, eof: bool = False) -> dict[str, Any]:
    seen: dict[str, Any] = {"heads": [], "body": b"", "ends": 0}

    def on_body(piece: bytes) -> None:
        seen["body"] += piece

    def on_end() -> None:
        seen["ends"] += 1

    reader = ResponseReader(seen["heads"].append, on_body, on_end)
    for piece in [raw[i : i + 1] for i in range(len(raw))] if bytewise else [raw]:
        reader.feed(piece)
    if eof:
        reader.eof()
    return seen


CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nX-Trailer: 1\r\n\r\n"
)


@pytest.mark.parametrize("bytewise", [False, True])
def test_bodies_framed_by_length_by_chunks_and_by_the_connections_end(bytewise: bool) -> None:
    fixed = read(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nX-A: 1\r\nx-a: 2\r\n\r\nbody", bytewise=bytewise)
    assert fixed["body"] == b"body"
    assert fixed["ends"] == 1
    head: Head = fixed["heads"][0]
    assert (head.status, head.keep_alive, head.headers["x-a"]) == (200, True, "1, 2")

    chunked = read(CHUNKED, bytewise=bytewise)
    assert chunked["body"] == b"hello, world"
    assert chunked["ends"] == 1
    assert chunked["heads"][0].content_type() == "text/event-stream"

    until_close = read(b"HTTP/1.0 200 OK\r\n\r\nall of it", bytewise=bytewise, eof=True)
    assert until_close["body"] == b"all of it"
    assert until_close["ends"] == 1
    assert not until_close["heads"][0].keep_alive


def test_interim_responses_are_skipped_and_bodiless_statuses_end_at_once() -> None:
    seen = read(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n", bytewise=False)
    assert [head.status for head in seen["heads"]] == [202]
    assert seen["ends"] == 1
    assert read(b"HTTP/1.1 204 No Content\r\n\r\n", bytewise=False)["ends"] == 1
    closing = read(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", bytewise=False)
    assert not closing["heads"][0].keep_alive


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"SSH-2.0-OpenSSH\r\n\r\n", "Expected HTTP/"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "Invalid header token"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "Invalid character in chunk size"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA", "after the end of a response"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -3\r\n\r\n", "Invalid character in Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok", "Duplicate Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok", "Duplicate Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-2\r\n", "Invalid character in chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n+3\r\n", "Invalid character in chunk size"),
        (b"HTTP/1.1 200 OK\r\nX-Big: " + b"x" * (70 * 1024), "headers exceed 65536 bytes"),
    ],
)
def test_what_is_not_http_is_refused(raw: bytes, why: str) -> None:
    with pytest.raises(HttpWireError, match=why):
        read(raw, bytewise=False)


def test_bare_line_feeds_are_read_as_h11_reads_them() -> None:
    seen = read(b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok", bytewise=True)
    assert seen["body"] == b"ok"
    assert seen["ends"] == 1


def test_one_reader_parses_each_response_of_a_keep_alive_connection_in_turn() -> None:
    seen: dict[str, Any] = {"heads": [], "ends": 0}
    reader = ResponseReader(
        seen["heads"].append, lambda piece: None, lambda: seen.__setitem__("ends", seen["ends"] + 1)
    )
    for n in range(3):
        reader.expect_next()
        reader.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nX-N: %d\r\n\r\n" % n)
        assert reader.started
        reader.feed(b"x")
    assert [head.headers["x-n"] for head in seen["heads"]] == ["0", "1", "2"]
    assert seen["ends"] == 3
    reader.eof()  # between responses: nothing is broken
    with pytest.raises(HttpWireError, match="after the end of a response"):
        reader.feed(b"HTTP/1.1 200 OK\r\n")  # no request asked for it


def test_a_response_cut_short_is_broken() -> None:
    with pytest.raises(HttpWireError, match="ended before the response did"):
        read(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", bytewise=False, eof=True)


@pytest.mark.parametrize("bytewise", [False, True])
def test_events_with_any_line_ending_multiline_data_comments_and_ids(bytewise: bool) -> None:
    events: list[Event] = []
    stream = EventStream(events.append, max_size=1024)
    raw = (
        b": ping\r\n\r\n"  # a comment alone dispatches nothing
        b'event: message\r\nid: 7\r\ndata: {"a":\r\ndata: 1}\r\n\r\n'
        b"data:no space\n\n"
        b"id\nevent: other\ndata: x\n\n"
    ) + "data: caf\u00e9\r\rdata: cr\r\r".encode()
    for piece in [raw[i : i + 1] for i in range(len(raw))] if bytewise else [raw]:
        stream.feed(piece)
    assert events == [
        Event('{"a":\n1}', "message", "7"),
        Event("no space", "message", "7"),  # the last event id stays until another is set
        Event("x", "other", ""),
        Event("caf\u00e9", "message", ""),
        Event("cr", "message", ""),  # bare CR line endings
    ]


@pytest.mark.parametrize("bytewise", [False, True])
def test_pieces_that_are_whole_data_events_read_as_their_lines_do(bytewise: bool) -> None:
    """A streamed completion sends each event as one piece (read at once); around it, what came before counts."""
    events: list[Event] = []
    stream = EventStream(events.append, max_size=1024)
    pieces = [b"id: 7\n", b'data: {"a": 1}\n\n', b"event: other\n", b"data: x\n\n", b"data: y\n", b"data: z\n\n"]
    pieces += [b"data: \xff\n\n", b"data: cr\r\n\r\n", b"data: a\n\ndata: b\n\n"]
    raw = b"".join(pieces)
    for piece in [raw[i : i + 1] for i in range(len(raw))] if bytewise else pieces:
        stream.feed(piece)
    assert events == [
        Event('{"a": 1}', "message", "7"),
        Event("x", "other", "7"),  # the event name came in the piece before
        Event("y\nz", "message", "7"),
        Event("\ufffd", "message", "7"),
        Event("cr", "message", "7"),
        Event("a", "message", "7"),
        Event("b", "message", "7"),
    ]


@pytest.mark.parametrize("whole", [False, True])
def test_an_event_larger_than_allowed_is_refused(whole: bool) -> None:
    stream = EventStream(lambda event: None, max_size=100)
    with pytest.raises(HttpWireError, match="exceeds 100 bytes"):
        stream.feed(b"data: " + b"x" * 200 + (b"\n\n" if whole else b""))
