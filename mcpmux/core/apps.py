"""MCP Apps (the extension `io.modelcontextprotocol/ui`) as a gateway must relay it.

A server ships an interactive view as a `ui://` resource (`text/html;profile=mcp-app`) that a tool
names in `_meta.ui.resourceUri`; the host renders it and the view calls its server's tools back
through the host. Behind mcpmux, two servers may both serve `ui://app/index.html`, so where mcpmux
prefixes tool names it names `ui://` URIs after their server too:

    ui://app/index.html of server `pdf`  ->  ui://pdf+app/index.html

The scheme stays `ui://` (hosts render nothing else), the path is the server's own, and the
rewrite is undone without a table: a server's name (`[A-Za-z0-9_.-]`, from the config) holds no
`+` and no `/`, so the first `+` of the authority ends it. Other schemes keep their URIs (clients
show and store them). Every place a `ui://` URI reaches a client is rewritten the same way: listed
resources and templates, `resources/read` contents, a tool's `_meta.ui.resourceUri` (and the
deprecated flat `_meta["ui/resourceUri"]`) in `tools/list` and in `tools/call` results, resource
links and embedded resources.

`_meta.ui.visibility` says who may call a tool: `"model"` (the agent), `"app"` (its server's views),
both when absent. An app-only tool is listed (the host hides it from the model and lets its views
call it), but mcpmux's own tools, which the model drives, never offer or call it.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types

EXTENSION_ID = "io.modelcontextprotocol/ui"
SCHEME = "ui://"
FLAT_KEY = "ui/resourceUri"
"""The deprecated flat form of `_meta.ui.resourceUri`, which ext-apps' `registerAppTool` still writes."""
_LINKS = ("resource_link", "resource")


def public_uri(server: str, uri: str) -> str:
    """`uri` as mcpmux's clients see it: a `ui://` URI named after its server, any other unchanged."""
    return f"{SCHEME}{server}+{uri[len(SCHEME) :]}" if uri.startswith(SCHEME) else uri


def split_uri(uri: str) -> tuple[str, str] | None:
    """(server, the server's own URI) of a `ui://` URI `public_uri` made; None for any other URI."""
    if not uri.startswith(SCHEME):
        return None
    server, plus, rest = uri[len(SCHEME) :].partition("+")
    if not plus or not server or "/" in server:
        return None
    return server, SCHEME + rest


def resource_uri(meta: dict[str, Any] | None) -> str | None:
    """The `ui://` view a tool names (`_meta.ui.resourceUri`, else the deprecated flat key)."""
    if not meta:
        return None
    ui = meta.get("ui")
    uri = ui.get("resourceUri") if isinstance(ui, dict) else None
    if uri is None:
        uri = meta.get(FLAT_KEY)
    return uri if isinstance(uri, str) and uri.startswith(SCHEME) else None


def app_only(meta: dict[str, Any] | None) -> bool:
    """Whether a tool's `_meta.ui.visibility` leaves the model out: its server's views alone call it."""
    ui = meta.get("ui") if meta else None
    visibility = ui.get("visibility") if isinstance(ui, dict) else None
    return isinstance(visibility, list) and "model" not in visibility


def app_callable(meta: dict[str, Any] | None) -> bool:
    """Whether a view may call the tool (`"app"` in its visibility, or no visibility: both)."""
    ui = meta.get("ui") if meta else None
    visibility = ui.get("visibility") if isinstance(ui, dict) else None
    return not isinstance(visibility, list) or "app" in visibility


def for_views(meta: dict[str, Any] | None) -> bool:
    """Whether a host must see the tool in `tools/list` to serve views: it has a view, or only views call it."""
    return resource_uri(meta) is not None or app_only(meta)


def named_meta(server: str, meta: dict[str, Any] | None) -> dict[str, Any] | None:
    """A copy of a tool's or result's `_meta` with its view's URI named after `server`; None when it names none."""
    if not meta:
        return None
    ui = meta.get("ui")
    ui = ui if isinstance(ui, dict) else {}
    nested = _ui_uri(ui.get("resourceUri"))
    flat = _ui_uri(meta.get(FLAT_KEY))
    if nested is None and flat is None:
        return None  # most results: nothing copied
    named = dict(meta)
    if nested is not None:
        named["ui"] = {**ui, "resourceUri": public_uri(server, nested)}
    if flat is not None:
        named[FLAT_KEY] = public_uri(server, flat)
    return named


def _ui_uri(value: object) -> str | None:
    return value if isinstance(value, str) and value.startswith(SCHEME) else None


def name_raw_result(server: str, result: Any) -> None:
    """Name, in place, the `ui://` URIs of a raw `tools/call` result of `server`'s (`_meta`, links, embedded)."""
    if not isinstance(result, dict):
        return
    meta = result.get("_meta")
    if isinstance(meta, dict):
        named = named_meta(server, meta)
        if named is not None:
            result["_meta"] = named
    content = result.get("content")
    if not isinstance(content, list):
        return
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind not in _LINKS:
            continue
        target = block if kind == "resource_link" else block.get("resource")
        uri = target.get("uri") if isinstance(target, dict) else None
        if isinstance(uri, str) and uri.startswith(SCHEME):
            target["uri"] = public_uri(server, uri)


def name_result(server: str, result: types.CallToolResult) -> types.CallToolResult:
    """A `tools/call` result from `server` with its `ui://` URIs named (the same object when it has none)."""
    meta = named_meta(server, result.meta)
    content = [_named_block(server, block) for block in result.content]
    if meta is None and all(new is old for new, old in zip(content, result.content, strict=True)):
        return result
    return result.model_copy(update={"meta": meta if meta is not None else result.meta, "content": content})


def name_read(server: str, result: types.ReadResourceResult) -> types.ReadResourceResult:
    """A `resources/read` result from `server` with its contents' `ui://` URIs named."""
    if not any(item.uri.startswith(SCHEME) for item in result.contents):
        return result
    contents = [item.model_copy(update={"uri": public_uri(server, item.uri)}) for item in result.contents]
    return result.model_copy(update={"contents": contents})


def _named_block(server: str, block: types.ContentBlock) -> types.ContentBlock:
    if isinstance(block, types.ResourceLink) and block.uri.startswith(SCHEME):
        return block.model_copy(update={"uri": public_uri(server, block.uri)})
    if isinstance(block, types.EmbeddedResource) and block.resource.uri.startswith(SCHEME):
        resource = block.resource.model_copy(update={"uri": public_uri(server, block.resource.uri)})
        return block.model_copy(update={"resource": resource})
    return block
