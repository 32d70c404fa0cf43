"""Compact JSON for the wire (`mcpmux.wire.json_bytes.dumps`)."""

from __future__ import annotations

import json

import pytest

from mcpmux.wire.json_bytes import dumps


def test_compact_utf8_that_reads_back_the_same() -> None:
    message = {"jsonrpc": "2.0", "id": "mux.1", "result": {"text": "héllo ✓ 🚀", "n": 2**70, "f": 0.5, "l": [1, None]}}
    data = dumps(message)
    assert b" " not in data.replace("héllo ✓ 🚀".encode(), b"")  # no padding between tokens
    assert "héllo".encode() in data  # UTF-8, not \\u escapes
    assert json.loads(data) == message


def test_a_lone_surrogate_is_escaped_not_refused() -> None:
    """Only `json.dumps`'s escapes can carry it; the message still goes out, whole."""
    message = {"text": "a\ud800b"}
    assert json.loads(dumps(message)) == message


def test_what_no_json_can_carry_raises() -> None:
    with pytest.raises(TypeError):
        dumps({"x": object()})
