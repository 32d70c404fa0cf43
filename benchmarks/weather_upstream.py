"""A real MCP upstream for `batching_e2e.py`: `get_weather` costs A, `get_weather_many` costs A + B·n.

`python weather_upstream.py A_MS B_MS` serves over stdio.
"""

from __future__ import annotations

import sys

import anyio
from mcp.server.mcpserver import MCPServer

FIXED = float(sys.argv[1]) / 1000 if len(sys.argv) > 1 else 0.02
PER_ITEM = float(sys.argv[2]) / 1000 if len(sys.argv) > 2 else 0.001
server = MCPServer("weather")


@server.tool()
async def get_weather(location: str) -> str:
    """The weather at one location."""
    await anyio.sleep(FIXED + PER_ITEM)
    return f"sunny in {location}"


@server.tool()
async def get_weather_many(locations: list[str]) -> list[str]:
    """The weather at many locations, in order."""
    await anyio.sleep(FIXED + PER_ITEM * len(locations))
    return [f"sunny in {location}" for location in locations]


if __name__ == "__main__":
    server.run()
