"""An MCP Apps server that shows its views only to hosts that declare the extension, as ext-apps'
`getUiCapability` pattern has servers do: `python apps_server.py NAME [stdio|http PORT]`.

Every client gets `clock_text` (the text-only fallback). A client that declared
`io.modelcontextprotocol/ui` with the `text/html;profile=mcp-app` MIME type (on its `initialize`
in 2025, on each request in 2026-07-28: the SDK's `client_supports_apps` reads either) also gets
`show_clock` (a view, `ui://clock/view.html`, which this server does not list, as the spec allows),
`tick` (only its views may call it: `visibility: ["app"]`) and `model_note` (the model's alone:
`visibility: ["model"]`). It lists `ui://app/index.html`, a URI every copy of this server shares,
and the template `ui://widgets/{id}` (its `id` completes to 7).
Every answer names the server, so a test can tell which copy served it. With `APPS_UNGATED=1` every
client gets every tool (for tests of what mcpmux does with views, whatever reaches the server).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import anyio
import mcp_types as types
import uvicorn
from mcp.server.apps import APP_MIME_TYPE, client_supports_apps
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

NAME = sys.argv[1] if len(sys.argv) > 1 else "apps"
UNGATED = os.environ.get("APPS_UNGATED") == "1"
VIEW = "ui://clock/view.html"
SHARED = "ui://app/index.html"
WIDGETS = "ui://widgets/{id}"
HTML = {VIEW: f"<!doctype html><p>clock view of {NAME}</p>", SHARED: f"<!doctype html><p>index of {NAME}</p>"}
CSP = {"ui": {"csp": {"connectDomains": ["https://example.com"]}, "prefersBorder": True}}
EMPTY: dict[str, Any] = {"type": "object"}

FALLBACK = types.Tool(name="clock_text", description="The time, as text.", input_schema=EMPTY)
UI_TOOLS = [
    types.Tool(
        name="show_clock",
        description="Shows a clock.",
        input_schema=EMPTY,
        meta={"ui": {"resourceUri": VIEW}, "ui/resourceUri": VIEW},
    ),
    types.Tool(
        name="tick", description="Advances the view's clock.", input_schema=EMPTY, meta={"ui": {"visibility": ["app"]}}
    ),
    types.Tool(
        name="model_note",
        description="A note for the model.",
        input_schema=EMPTY,
        meta={"ui": {"visibility": ["model"]}},
    ),
]


async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    # Per client: never cached for another (`private`, the SDK's default scope).
    shows_views = UNGATED or client_supports_apps(ctx)
    return types.ListToolsResult(tools=[FALLBACK, *UI_TOOLS] if shows_views else [FALLBACK])


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    text = types.TextContent(type="text", text=f"{NAME}: {params.name}")
    if params.name == "show_clock":
        link = types.ResourceLink(type="resource_link", uri=VIEW, name="view", mime_type=APP_MIME_TYPE)
        page = types.TextResourceContents(uri=SHARED, mime_type=APP_MIME_TYPE, text=HTML[SHARED])
        embedded = types.EmbeddedResource(type="resource", resource=page)
        return types.CallToolResult(content=[text, link, embedded], meta={"ui": {"resourceUri": VIEW}})
    if params.name in ("clock_text", "tick", "model_note"):
        return types.CallToolResult(content=[text])
    raise MCPError(types.INVALID_PARAMS, f"unknown tool {params.name!r}")


async def list_resources(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
    shared = types.Resource(uri=SHARED, name="index", mime_type=APP_MIME_TYPE, meta=CSP)
    return types.ListResourcesResult(resources=[shared])


async def list_templates(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListResourceTemplatesResult:
    widget = types.ResourceTemplate(uri_template=WIDGETS, name="widget", mime_type=APP_MIME_TYPE)
    return types.ListResourceTemplatesResult(resource_templates=[widget])


async def complete(ctx: Any, params: types.CompleteRequestParams) -> types.CompleteResult:
    known = isinstance(params.ref, types.ResourceTemplateReference) and params.ref.uri == WIDGETS
    return types.CompleteResult(completion=types.Completion(values=["7"] if known else []))


async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
    uri = str(params.uri)
    html = HTML.get(uri) or (
        f"<p>widget {uri.removeprefix('ui://widgets/')} of {NAME}</p>" if uri.startswith("ui://widgets/") else None
    )
    if html is None:
        raise MCPError(types.INVALID_PARAMS, f"no resource {params.uri!r} on {NAME}")
    page = types.TextResourceContents(uri=str(params.uri), mime_type=APP_MIME_TYPE, text=html, meta=CSP)
    return types.ReadResourceResult(contents=[page])


server = Server(
    NAME,
    on_list_tools=list_tools,
    on_call_tool=call_tool,
    on_list_resources=list_resources,
    on_list_resource_templates=list_templates,
    on_read_resource=read_resource,
    on_completion=complete,
)


async def main() -> None:
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[2] == "http":
        app = server.streamable_http_app(streamable_http_path="/mcp")
        uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[3]), log_level="warning")
    else:
        anyio.run(main)
