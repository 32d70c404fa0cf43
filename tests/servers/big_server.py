"""A real MCP server (mcp SDK) whose tools answer as large as asked: `python big_server.py [stdio|http PORT]`.

For the result-size limit: `log` (numbered lines), `blocks` (several text blocks), `table`
(structuredContent that no outputSchema validates), `report` (structuredContent its outputSchema
validates), `chart_data` (app-only: `_meta.ui.visibility == ["app"]`, called by an MCP App's view)
and `unicode` (multi-byte text, so a cut must keep whole characters).
"""

from __future__ import annotations

import json
import sys

from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult, TextContent
from pydantic import BaseModel

server = MCPServer("big")


def log_text(lines: int) -> str:
    return "".join(f"{index:06d} GET /api/items/{index} 200 {index % 97} ms\n" for index in range(lines))


@server.tool()
def log(lines: int) -> CallToolResult:
    """A log of `lines` numbered lines, as text only."""
    return CallToolResult(content=[TextContent(type="text", text=log_text(lines))])


@server.tool()
def blocks(count: int, size: int) -> CallToolResult:
    """`count` text blocks of `size` characters each (block i is made of the digit i % 10)."""
    return CallToolResult(content=[TextContent(type="text", text=str(i % 10) * size) for i in range(count)])


@server.tool()
def table(rows: int) -> CallToolResult:
    """Rows as structuredContent with no outputSchema, and as JSON text."""
    data = {"rows": [{"id": i, "name": f"item {i}"} for i in range(rows)]}
    return CallToolResult(content=[TextContent(type="text", text=json.dumps(data))], structured_content=data)


class Report(BaseModel):
    rows: list[str]


@server.tool()
def report(rows: int) -> Report:
    """Rows in a result its outputSchema validates."""
    return Report(rows=[f"row {i} " + "x" * 40 for i in range(rows)])


@server.tool(meta={"ui": {"visibility": ["app"]}})
def chart_data(points: int) -> str:
    """Data for a chart an MCP App draws: only its view calls this."""
    return json.dumps([[i, i * i] for i in range(points)])


@server.tool()
def unicode(count: int) -> str:
    """`count` four-byte characters in one line: no line end, no space to cut at."""
    return "😀" * count


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
