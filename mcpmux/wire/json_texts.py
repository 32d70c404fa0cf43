"""Several JSON-RPC messages in one `application/json` body, split so they can be read one by one.

The streamable HTTP transport allows one JSON-RPC message in an `application/json` response; several
go as events of a `text/event-stream`. Some servers put several in one JSON body anyway: the MCP
conformance suite's reference server answers a call with a progress notification and then the
response as newline-separated JSON texts, and a 2025-03-26 server may answer with a JSON array (that
revision's batches). mcpmux's upstream transports read such a body as if its messages had come as
events (`mcpmux.upstream.json_bodies`, `mcpmux.upstream.http_connection`).
"""

from __future__ import annotations

import json
import re
from typing import Any

_JOINED = re.compile(rb"[}\]]\s*[{\[]")
"""Where one JSON text can end and the next begin: never inside one valid JSON text outside a string."""
_DECODER = json.JSONDecoder()


def several_messages(body: bytes) -> list[Any] | None:
    """The JSON values `body` holds when it holds more than one message: each of several JSON texts
    (separated by whitespace or nothing), or the elements of one JSON array. None for a body that is
    one JSON text and not an array (the transport's ordinary case), and for one that is not JSON
    (the caller words that error as it always did)."""
    stripped = body.strip()
    if not stripped.startswith(b"[") and _JOINED.search(stripped) is None:
        return None
    try:
        text = stripped.decode("utf-8")
    except UnicodeDecodeError:
        return None
    values: list[Any] = []
    at = 0
    while at < len(text):
        try:
            value, at = _DECODER.raw_decode(text, at)
        except json.JSONDecodeError:
            return None
        values.append(value)
        while at < len(text) and text[at] in " \t\r\n":
            at += 1
    if len(values) > 1:
        return values
    only = values[0] if values else None
    return only if isinstance(only, list) and only else None
