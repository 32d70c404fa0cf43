"""mcpmux: one MCP server in front of many."""

__version__ = "0.1.0"
