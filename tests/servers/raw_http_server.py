"""A streamable HTTP MCP server written without the SDK (JSON responses): `raw_http_server.py PORT`.

It speaks 2026-07-28 (`server/discover`, no session) and 2025-11-25 (`initialize`, session `s1`).

It closes a keep-alive connection the moment a second `tools/call` arrives on it, unanswered, as a
server whose idle timeout fires just as a request goes out does. Its one tool, `whoami`, answers
with the JSON-RPC id it was called with and how many requests it has dropped so far.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

TOOL = {"name": "whoami", "inputSchema": {"type": "object"}}
INFO = {"name": "rawhttp", "version": "1.0"}
dropped = 0


def answer(request: dict[str, Any]) -> dict[str, Any]:
    method, request_id = request.get("method"), request.get("id")
    if method == "server/discover":
        result = {"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}, "serverInfo": INFO}
    elif method == "initialize":
        result: dict[str, Any] = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": INFO}
    elif method == "tools/list":
        result = {"tools": [TOOL], "ttlMs": 60_000, "cacheScope": "public"}
    elif method == "tools/call":
        text = json.dumps({"id": request_id, "dropped": dropped})
        result = {"content": [{"type": "text", "text": text}], "isError": False}
    elif method == "ping":
        result = {}
    else:
        error = {"code": -32601, "message": f"Method not found: {method}"}
        return {"jsonrpc": "2.0", "id": request_id, "error": error}
    if "_meta" in request.get("params", {}):  # a 2026 request: its results say they are complete
        result["resultType"] = "complete"
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


async def serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    global dropped
    calls = 0
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method = lines[0].split(" ")[0]
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            if method != "POST":
                status, payload = (b"405 Method Not Allowed", b"") if method == "GET" else (b"200 OK", b"")
            else:
                request = json.loads(body)
                if request.get("method") == "tools/call":
                    calls += 1
                    if calls > 1:
                        dropped += 1
                        writer.close()
                        return
                status, payload = (b"202 Accepted", b"") if "id" not in request else (b"200 OK", b"")
                if "id" in request:
                    payload = json.dumps(answer(request)).encode()
            session = b"mcp-session-id: s1\r\n" if b'"initialize"' in body else b""
            writer.write(
                b"HTTP/1.1 "
                + status
                + b"\r\ncontent-type: application/json\r\n"
                + session
                + b"content-length: "
                + str(len(payload)).encode()
                + b"\r\n\r\n"
                + payload
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


async def main() -> None:
    server = await asyncio.start_server(serve_connection, "127.0.0.1", int(sys.argv[1]))
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
