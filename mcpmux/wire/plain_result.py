"""Results the fast path passes on as they came, without the SDK's model: plain text, 2026 to 2026.

`FastPath._shape` reads each upstream result through the SDK's model and writes it back out (about
a twentieth of mcpmux's CPU per call). For the commonest result, text blocks with `isError`,
`resultType` and the upstream's serverInfo, that round trip gives back the same keys and values,
so it is skipped. `is_plain` accepts only that shape, with exact types and exact key sets; anything
else takes the model, which refuses an invalid result with the same error as before.
"""

from __future__ import annotations

from typing import Any

SERVER_INFO = "io.modelcontextprotocol/serverInfo"
_RESULT_KEYS = frozenset({"content", "isError", "resultType", "_meta"})
_TEXT_KEYS = frozenset({"type", "text"})


def is_plain(raw: Any) -> bool:
    """Whether the SDK's 2026 `CallToolResult` would read `raw` and write back exactly `raw`."""
    if type(raw) is not dict or not raw.keys() <= _RESULT_KEYS or raw.get("resultType") != "complete":
        return False
    content = raw.get("content")
    if type(raw.get("isError", False)) is not bool or type(content) is not list:
        return False
    for block in content:
        if type(block) is not dict or block.keys() != _TEXT_KEYS or block["type"] != "text":
            return False
        if type(block["text"]) is not str:
            return False
    if "_meta" not in raw:
        return True
    meta = raw["_meta"]
    if type(meta) is not dict or meta.keys() != {SERVER_INFO} or type(meta[SERVER_INFO]) is not dict:
        return False
    return all(type(key) is str and type(value) is str for key, value in meta[SERVER_INFO].items())
