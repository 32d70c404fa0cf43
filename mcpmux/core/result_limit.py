"""Results that fit a model's context: a tool result beyond its byte limit, cut where a reader expects.

A tool can answer with megabytes (a log, a table, a file): relayed whole, it fills or overflows
the context of the model that reads it (Claude Code refuses a result over 25,000 tokens outright).
`fit` takes one raw `tools/call` result and its limit, and when the text a model reads is larger,
gives back:

- the result with its text cut at a clean boundary (the last line end, else the last space, else
  a whole character, within the limit), the rest of its text blocks left out, and a last text
  block saying what was cut and where the whole is, plus a `resource_link` block to it;
- the whole result as resource contents (each text block as it was; a dropped `structuredContent`
  as JSON), for `resources/read` of that link.

What counts is UTF-8 text: text blocks and embedded text resources, and `structuredContent` when
no `outputSchema` validates it. Images, audio and blobs pass untouched and uncounted (they are not
text a model reads). A `structuredContent` that an `outputSchema` validates is never changed and
not counted: a client that reads it relies on its shape. Which tools are cut at all (never an
app-only tool, whose result a view asked for) and at what limit is the call plan's to say.

Pure: no state, no I/O; the caller names the resource (`uri`) and keeps it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MIMETYPE = "text/plain"
_MIN_TEXT = 256
"""Bytes of text kept at least, even under a tiny limit: a cut that keeps nothing tells the model nothing."""


@dataclass(frozen=True, slots=True)
class Kept:
    """The whole of a result that was cut: what `resources/read` of `uri` returns."""

    uri: str
    contents: list[dict[str, Any]]
    """`resources/read` contents (`TextResourceContents`/`BlobResourceContents` as dicts, wire names)."""
    size: int
    """Bytes of the text that was counted."""


def text_size(raw: dict[str, Any], keeps_structured: bool) -> int:
    """Bytes of the text a model reads in `raw` (see the module docstring)."""
    size = 0
    for block in raw.get("content") or ():
        text = _text_of(block)
        if text is not None:
            size += _utf8_len(text)
    if not keeps_structured and raw.get("structuredContent") is not None:
        size += len(_json(raw["structuredContent"]))
    return size


def fits(raw: Any, limit: int, keeps_structured: bool) -> bool:
    """Whether `raw` needs no cut: not a result with content, or its text within `limit` bytes.

    Cheap for the common small result: a character is at most 4 UTF-8 bytes, so text of at most
    `limit / 4` characters fits without being encoded."""
    if limit <= 0 or type(raw) is not dict or type(raw.get("content")) is not list:
        return True
    chars = 0
    for block in raw["content"]:
        text = _text_of(block)
        if text is not None:
            chars += len(text)
    if not keeps_structured and raw.get("structuredContent") is not None:
        return text_size(raw, keeps_structured) <= limit
    return chars * 4 <= limit or text_size(raw, keeps_structured) <= limit


def fit(
    raw: dict[str, Any], limit: int, keeps_structured: bool, tool: str, uri: Callable[[], str]
) -> tuple[dict[str, Any], Kept | None]:
    """`raw` cut to `limit` bytes of text, and the whole kept as a resource; `(raw, None)` when it fits.

    `keeps_structured`: an `outputSchema` validates `structuredContent` (never changed nor counted).
    `tool`: its public name, for the note. `uri`: names the resource, called only when there is a cut.
    `raw` is not changed."""
    if fits(raw, limit, keeps_structured):
        return raw, None
    total = text_size(raw, keeps_structured)
    name = uri()
    budget = max(limit, _MIN_TEXT)
    content: list[Any] = []
    kept_bytes, omitted_blocks, cut_at_line = 0, 0, None
    for block in raw["content"]:
        text = _text_of(block)
        if text is None:
            content.append(block)
            continue
        size = _utf8_len(text)
        if kept_bytes + size <= budget and cut_at_line is None:
            content.append(block)
            kept_bytes += size
            continue
        room = budget - kept_bytes
        if cut_at_line is None and room > 0:
            head = clean_prefix(text, room)
            content.append(_with_text(block, head))
            kept_bytes += _utf8_len(head)
            cut_at_line = head.count("\n") + 1
        else:
            omitted_blocks += 1
    structured = raw.get("structuredContent")
    shaped = {key: value for key, value in raw.items() if key != "content"}
    if structured is not None and not keeps_structured:
        shaped.pop("structuredContent")
    content.append({"type": "text", "text": _note(tool, total, limit, kept_bytes, cut_at_line, omitted_blocks, name)})
    content.append(
        {"type": "resource_link", "uri": name, "name": f"{tool} result", "mimeType": MIMETYPE, "size": total}
    )
    shaped["content"] = content
    return shaped, Kept(name, _contents(raw, name, keeps_structured), total)


def clean_prefix(text: str, limit: int) -> str:
    """The longest start of `text` of at most `limit` UTF-8 bytes that ends at a line end; else at a
    space; else at a whole character. A boundary in the first half of the room is not clean enough
    to be worth the loss: the character boundary is taken then."""
    head = text.encode()[:limit].decode(errors="ignore")  # whole characters only
    if len(head) == len(text):
        return text
    for boundary in ("\n", " "):
        at = head.rfind(boundary)
        if at >= len(head) // 2:
            return head[: at + 1]
    return head


def _note(tool: str, total: int, limit: int, kept: int, line: int | None, omitted: int, uri: str) -> str:
    where = f", in line {line}" if line is not None else ""
    rest = f" and {omitted} more block(s)" if omitted else ""
    return (
        f"[mcpmux: {tool} answered {total:,} bytes of text, more than its limit of {limit:,} "
        f"(max_result_bytes). Shown: the first {kept:,} bytes, cut at a clean boundary{where}; "
        f"left out: the rest{rest}. The whole result is the resource {uri}: read it with resources/read, "
        "or call the tool again asking for less (a range, a page, a filter).]"
    )


def _contents(raw: dict[str, Any], uri: str, keeps_structured: bool) -> list[dict[str, Any]]:
    contents: list[dict[str, Any]] = []
    for block in raw.get("content") or ():
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            contents.append({"uri": uri, "mimeType": MIMETYPE, "text": block["text"]})
        elif block.get("type") == "resource" and isinstance(block.get("resource"), dict):
            contents.append(block["resource"])
    structured = raw.get("structuredContent")
    if structured is not None and not keeps_structured:
        contents.append({"uri": uri, "mimeType": "application/json", "text": _json(structured).decode()})
    return contents


def _text_of(block: Any) -> str | None:
    """The text a model reads in one content block: a text block's, or an embedded text resource's."""
    if type(block) is not dict:
        return None
    kind = block.get("type")
    if kind == "text":
        text = block.get("text")
        return text if type(text) is str else None
    if kind == "resource":
        resource = block.get("resource")
        text = resource.get("text") if type(resource) is dict else None
        return text if type(text) is str else None
    return None


def _with_text(block: dict[str, Any], text: str) -> dict[str, Any]:
    if block.get("type") == "resource":
        return {**block, "resource": {**block["resource"], "text": text}}
    return {**block, "text": text}


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
