"""A stdio MCP server written without the SDK (2025-11-25 handshake), for what only the wire shows.

Its one tool, `log_then_answer`, sends a log notification and then its result in a single write, so
that whoever reads the pipe gets both lines at once. An SDK server writes them one at a time, and
a reader that keeps up sees them apart: only this server makes their order a question for mcpmux.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

TOOL = {"name": "log_then_answer", "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}}}
INFO = {"name": "raw", "version": "1.0"}


def line(message: dict[str, Any]) -> str:
    return json.dumps({"jsonrpc": "2.0", **message}) + "\n"


def reply(request: dict[str, Any]) -> str:
    """The lines that answer one request."""
    method, request_id = request.get("method"), request["id"]
    if method == "initialize":
        capabilities = {"tools": {}, "logging": {}}
        result = {"protocolVersion": "2025-11-25", "capabilities": capabilities, "serverInfo": INFO}
    elif method == "tools/list":
        result = {"tools": [TOOL]}
    elif method == "tools/call":
        message = request["params"].get("arguments", {}).get("message", "")
        log = line({"method": "notifications/message", "params": {"level": "info", "data": message}})
        answer = {"content": [{"type": "text", "text": "answered"}], "isError": False}
        return log + line({"id": request_id, "result": answer})
    elif method in ("ping", "logging/setLevel"):
        result = {}
    else:  # `server/discover` among them: the 2026 client falls back to `initialize`
        return line({"id": request_id, "error": {"code": -32601, "message": f"Method not found: {method}"}})
    return line({"id": request_id, "result": result})


def main() -> None:
    for raw in sys.stdin:
        request = json.loads(raw)
        if "id" in request and "method" in request:
            os.write(sys.stdout.fileno(), reply(request).encode())


if __name__ == "__main__":
    main()
