"""A stdio server that outlives its stdin closing, as server-pdf does (a 60 s timer keeps it up):
`python stubborn_server.py`, with `STUBBORN_TERM=ignore` to ignore SIGTERM too. Its `pid` tool says
which process to look for afterwards."""

from __future__ import annotations

import contextlib
import os
import signal
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("stubborn")


@server.tool()
def pid() -> int:
    """This server's process id."""
    return os.getpid()


if __name__ == "__main__":
    if os.environ.get("STUBBORN_TERM") == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(Exception):  # its last flush may find the pipe closed
        server.run()  # returns once stdin closes
    time.sleep(60)
