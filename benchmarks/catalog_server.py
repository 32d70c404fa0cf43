"""One stored server's tool list, served again over stdio: `python benchmarks/catalog_server.py NAME`.

`benchmarks/tool_search.py --startup` starts mcpmux in front of every server stored in
`tests/data/tool_catalogs.json` without their packages installed: each is this low-level SDK server
listing exactly the tools (names, titles, descriptions, input schemas) and the instructions the real
one gave. A call answers with an error: only listing and searching are measured.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
NAME = sys.argv[1]
TOOLS = [types.Tool.model_validate(tool) for tool in json.loads((DATA / "tool_catalogs.json").read_text())[NAME]]
INFO = json.loads((DATA / "tool_servers.json").read_text()).get(NAME, {})


async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    text = f"{NAME} is a stored catalog: {params.name} lists, and is not served"
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


server = Server(NAME, instructions=INFO.get("instructions") or None, on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
