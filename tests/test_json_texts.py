"""Several JSON-RPC messages in one JSON body (`mcpmux.wire.json_texts.several_messages`)."""

from __future__ import annotations

import pytest

from mcpmux.wire.json_texts import several_messages

NOTE = b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}'
ANSWER = b'{"jsonrpc":"2.0","id":1,"result":{"text":"} {"}}'


@pytest.mark.parametrize(
    "body",
    [
        NOTE + b"\n" + ANSWER + b"\n",
        NOTE + ANSWER,
        b"\r\n " + NOTE + b"\r\n\r\n" + ANSWER,
        b"[" + NOTE + b"," + ANSWER + b"]",
    ],
    ids=["lines", "abutting", "blank-lines", "array"],
)
def test_each_message_in_order(body: bytes) -> None:
    messages = several_messages(body)
    assert messages is not None
    assert [message.get("method", message.get("id")) for message in messages] == ["notifications/progress", 1]


@pytest.mark.parametrize(
    "body",
    [ANSWER, b"  " + ANSWER + b"\n", b'{"a": ["} {", "]["]}', b"[]", NOTE + b"\n{broken", b"\xff}{", b""],
    ids=["one", "one-padded", "braces-in-strings", "empty-array", "broken-second", "not-utf8", "empty"],
)
def test_one_message_or_no_json_is_left_to_the_ordinary_reading(body: bytes) -> None:
    """None: the transport reads it as ever (one message), or words why it is not JSON."""
    assert several_messages(body) is None


def test_an_array_of_one_is_that_message() -> None:
    messages = several_messages(b"[" + ANSWER + b"]")
    assert messages is not None
    assert [message["id"] for message in messages] == [1]
