"""A minimal MCP server for the overhead benchmark: one `echo` tool, nothing else.

    python benchmarks/echo_upstream.py stdio
    python benchmarks/echo_upstream.py http PORT

Written on the SDK's low-level `Server` so that the upstream's own cost per call is as small as the
SDK allows (no schema validation of arguments, no structured output, no logging): what the benchmark
then sees on top of a direct call is the multiplexer. Any extra arguments (the benchmark passes a run
tag) are ignored; they only make this run's processes findable.
"""

from __future__ import annotations

import sys
from typing import Any

import anyio
import mcp_types as types
import uvicorn
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.stdio import stdio_server

ECHO_TOOL = types.Tool(
    name="echo",
    description="Return the text unchanged.",
    input_schema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
)


async def _list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[ECHO_TOOL])


async def _call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    if params.name != "echo":
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=f"no tool {params.name!r}")], is_error=True
        )
    text = str((params.arguments or {}).get("text", ""))
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


def build_server() -> Server[Any]:
    """The echo server: `tools/list` and `tools/call` only."""
    return Server("echo", version="1.0", on_list_tools=_list_tools, on_call_tool=_call_tool)


async def _serve_stdio(server: Server[Any]) -> None:
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options(NotificationOptions()))


def main(argv: list[str]) -> None:
    server = build_server()
    if len(argv) >= 2 and argv[0] == "http":
        app = server.streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")
        uvicorn.run(app, host="127.0.0.1", port=int(argv[1]), log_level="warning")
    elif not argv or argv[0] == "stdio":
        anyio.run(_serve_stdio, server)
    else:
        sys.exit(f"usage: echo_upstream.py stdio | http PORT (got {' '.join(argv)!r})")


if __name__ == "__main__":
    main(sys.argv[1:])
