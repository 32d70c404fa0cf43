"""A low-level SDK server that lists 120 tools in pages of 50 (the catalog must walk every page)."""

from __future__ import annotations

import os
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

PAGE = 50
TOOLS = [
    types.Tool(name=f"tool_{index:03d}", description=f"tool number {index}", input_schema={"type": "object"})
    for index in range(120)
]


GROWING = os.environ.get("PAGED_GROWING") == "1"  # every listing adds a tool and is fresh for 300 ms
listings = 0


async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    global listings
    start = int(params.cursor) if params is not None and params.cursor else 0
    end = start + PAGE
    if not GROWING:
        return types.ListToolsResult(tools=TOOLS[start:end], next_cursor=str(end) if end < len(TOOLS) else None)
    listings += 1
    grown = [types.Tool(name=f"grown_{n}", input_schema={"type": "object"}) for n in range(listings)]
    return types.ListToolsResult(tools=grown, ttl_ms=300)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    if params.name == "tool_000":  # a JSON-RPC error with its own code and data, to be passed through
        raise MCPError(-32042, "tool_000 always refuses", {"why": "by design"})
    return types.CallToolResult(content=[types.TextContent(type="text", text=params.name)])


reads = 0


async def list_resources(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
    return types.ListResourcesResult(
        resources=[types.Resource(uri=f"paged://{scope}", name=scope) for scope in ("public", "private")],
        ttl_ms=60_000,
    )


async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
    """Each read says how many reads this process has served; the results may be cached for a minute."""
    global reads
    reads += 1
    scope = str(params.uri).removeprefix("paged://")
    return types.ReadResourceResult(
        contents=[types.TextResourceContents(uri=str(params.uri), text=f"read {reads}")],
        ttl_ms=60_000,
        cache_scope="public" if scope == "public" else "private",
    )


server = Server(
    "paged",
    on_list_tools=list_tools,
    on_call_tool=call_tool,
    on_list_resources=list_resources,
    on_read_resource=read_resource,
)


async def main() -> None:
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
