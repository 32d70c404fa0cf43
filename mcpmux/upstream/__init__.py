"""One upstream MCP server: its supervisor, transports (stdio, streamable HTTP) and raw lanes."""
