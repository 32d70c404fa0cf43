"""A minimal MCP server for the overhead benchmark: three echo tools, and optionally K inert others.

    python benchmarks/echo_upstream.py stdio [--tools K]
    python benchmarks/echo_upstream.py http PORT [--tools K]

Written on the SDK's low-level `Server` so that the upstream's own cost per call is as small as the
SDK allows (no argument validation, no structured output, no logging), and with
`get_tool_input_schema` set, so that a 2026-07-28 HTTP call does not run `tools/list` to check its
`Mcp-Param` headers: what the benchmark then sees on top of a direct call is the multiplexer.

The three echo tools answer alike (the `text` argument, back, after `sleep_ms` milliseconds if
given) and differ only in what they declare, so that each reaches a different rule of a multiplexer:

- `echo`: no annotations;
- `echo_ro`: annotated `readOnlyHint: true, idempotentHint: true`;
- `echo_cached`: no annotations, for a multiplexer configured to cache it by name.

`--tools K` adds K more tools (`tool_0` ...) with realistic schemas, to grow the catalog mcpmux
aggregates without changing what `echo` costs here.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

import anyio
import mcp_types as types
import uvicorn
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.stdio import stdio_server

ECHO_SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string"}, "sleep_ms": {"type": "number", "description": "wait this long first"}},
    "required": ["text"],
}
READ_ONLY = types.ToolAnnotations(read_only_hint=True, idempotent_hint=True)
ECHO_TOOLS = [
    types.Tool(name="echo", description="Return the text unchanged.", input_schema=ECHO_SCHEMA),
    types.Tool(
        name="echo_ro", description="Return the text unchanged.", input_schema=ECHO_SCHEMA, annotations=READ_ONLY
    ),
    types.Tool(name="echo_cached", description="Return the text unchanged.", input_schema=ECHO_SCHEMA),
]
ECHO_NAMES = frozenset(tool.name for tool in ECHO_TOOLS)


def _inert_tool(index: int) -> types.Tool:
    """A tool shaped like a real one (a few typed, described arguments); calling it is an error."""
    properties = {
        f"arg_{n}": {"type": kind, "description": f"argument {n} of tool {index}, a {kind}"}
        for n, kind in enumerate(("string", "integer", "boolean", "string"))
    }
    return types.Tool(
        name=f"tool_{index}",
        description=f"Inert tool number {index}, listed only to make the catalog realistically large.",
        input_schema={"type": "object", "properties": properties, "required": ["arg_0"]},
    )


def build_server(extra_tools: int = 0) -> Server[Any]:
    """The echo server: `tools/list` (the echo tools + `extra_tools` inert tools) and `tools/call` (echo tools only)."""
    tools = [*ECHO_TOOLS, *(_inert_tool(i) for i in range(extra_tools))]
    schemas = {tool.name: tool.input_schema for tool in tools}

    async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name not in ECHO_NAMES:
            text = f"tool {params.name!r} only pads the catalog; call 'echo'"
            return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)
        arguments = params.arguments or {}
        if sleep_ms := arguments.get("sleep_ms"):
            await anyio.sleep(float(sleep_ms) / 1000)
        text = str(arguments.get("text", ""))
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    def input_schema(name: str) -> Mapping[str, Any] | None:
        return schemas.get(name)

    return Server(
        "echo", version="1.0", on_list_tools=list_tools, on_call_tool=call_tool, get_tool_input_schema=input_schema
    )


async def _serve_stdio(server: Server[Any]) -> None:
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options(NotificationOptions()))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A minimal echo MCP server for benchmarks/mux_overhead.py")
    parser.add_argument("transport", choices=["stdio", "http"])
    parser.add_argument("port", type=int, nargs="?", default=0, help="loopback port (http only)")
    parser.add_argument("--tools", type=int, default=0, help="inert tools to list besides echo")
    args = parser.parse_args(argv)
    server = build_server(args.tools)
    if args.transport == "http":
        if not args.port:
            parser.error("http needs a PORT")
        app = server.streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")
        uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")
    else:
        anyio.run(_serve_stdio, server)


if __name__ == "__main__":
    main()
