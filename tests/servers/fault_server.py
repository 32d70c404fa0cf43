"""A real MCP server (mcp SDK) that misbehaves on purpose: `python fault_server.py NAME [stdio|http PORT]`.

Its `echo` tool answers `NAME: text` like demo_server's, after the fault chosen by `FAULT_MODE`:

- `none` (default): no fault;
- `hang`: never answers (the call must end at mcpmux's timeout);
- `slow`: answers after `FAULT_DELAY` seconds (default 0.5);
- `garbage`: writes junk lines to stdout first (text, cut-off JSON, a response to an id nobody sent, a
  JSON array, a blank line), then answers; over HTTP the junk goes nowhere and the call is plain;
- `binary`: like `garbage`, but the junk line is not valid UTF-8;
- `exit`: the process dies without answering with probability `FAULT_EXIT_PROB` (default 0.05),
  drawn from `random.Random(FAULT_SEED)` when a seed is given.

`pid` returns the process id, so a test can tell a restarted process from the first one.
"""

from __future__ import annotations

import os
import random
import sys

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import _claims as stdio_claims

NAME = sys.argv[1] if len(sys.argv) > 1 else "fault"
MODE = os.environ.get("FAULT_MODE", "none")
DELAY = float(os.environ.get("FAULT_DELAY", "0.5"))
EXIT_PROB = float(os.environ.get("FAULT_EXIT_PROB", "0.05"))
RANDOM = random.Random(os.environ.get("FAULT_SEED"))
ON_STDIO = len(sys.argv) <= 2 or sys.argv[2] != "http"
JUNK = [
    b"this is not json\n",
    b'{"jsonrpc": "2.0", "id": \n',
    b'{"jsonrpc": "2.0", "id": 987654321, "result": {"content": []}}\n',
    b'[{"jsonrpc": "2.0"}]\n',
    b"\n",
]
BINARY_JUNK = [b"\xff\xfe\xfd not utf-8\n"]
if MODE not in {"none", "hang", "slow", "garbage", "binary", "exit"}:
    raise SystemExit(f"fault_server: unknown FAULT_MODE {MODE!r} (none, hang, slow, garbage, binary, exit)")

server = MCPServer(NAME)


@server.tool()
async def echo(text: str) -> str:
    """Return the text, after this server's fault."""
    if MODE == "hang":
        await anyio.sleep_forever()
    elif MODE == "slow":
        await anyio.sleep(DELAY)
    elif MODE in ("garbage", "binary") and ON_STDIO:
        for junk in JUNK if MODE == "garbage" else BINARY_JUNK:
            os.write(_wire(), junk)  # each is one whole line: a pipe write this small is atomic
    elif MODE == "exit" and RANDOM.random() < EXIT_PROB:
        os._exit(7)
    return f"{NAME}: {text}"


def _wire() -> int:
    """The descriptor of the real stdout: while serving, the SDK points fd 1 at stderr so that stray
    prints miss the wire, and keeps the wire on a private duplicate (a `print()` here reaches nobody)."""
    claim = stdio_claims.get(1)
    return claim.private_fd if claim is not None and claim.private_fd is not None else 1


@server.tool()
def pid() -> int:
    """This server's process id."""
    return os.getpid()


if __name__ == "__main__":
    if not ON_STDIO:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[3]))
    else:
        server.run()
