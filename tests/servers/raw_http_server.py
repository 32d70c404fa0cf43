"""A streamable HTTP MCP server written without the SDK (JSON responses): `raw_http_server.py PORT [OPTION...]`.

It speaks 2026-07-28 (`server/discover`, no session) and 2025-11-25 (`initialize`, session `s1`),
and answers with plain `application/json`, so no byte of an answer exists before the tool is done.
Options:
- `drop`: it closes a keep-alive connection the moment a second `tools/call` arrives on it,
  unanswered, as a server whose idle timeout fires just as a request goes out does;
- `cookie`: it sets a cookie when its session opens, and answers 404 "Session not found" to any
  later request without it (a load balancer's affinity);
- `vhost`: it serves only requests whose Host header is `mcp.example` (404 otherwise);
- `sse-break`: it answers every `tools/call` on an event stream that gives an event id and
  `retry: 300`, then ends before the answer; a `GET` with that id in `Last-Event-ID` gets the
  answer (SEP-1699). `whoami` reports each such reconnection (`resumed`: the id, and the
  milliseconds since the stream ended);
- `joined`: it answers every `tools/call` as the suite's 2026 reference server answers
  `test_streaming_elicitation`: a progress notification (for a request that gave a progress token)
  and then the response, as two newline-separated JSON texts in one `application/json` body;
  `joined-array`: the same two messages as one JSON array (a 2025-03-26 batch's shape);
- `listen-json`: it answers `subscriptions/listen` as the suite's 2026 reference server does, with
  its acknowledgement as a line of an `application/json` body that it never finishes.

Tools: `whoami` (the JSON-RPC id it was called with, what was dropped and run so far, and the
request's Accept-Encoding), `slow` (answers after 1 s), `vanish` (closes the connection 0.2 s
into the call, unanswered, as a crashing worker would), `forget` (it forgets its 2025 session, as a
restarted server does: 404 "Session not found" until a new `initialize`), `refuse` (a JSON-RPC error),
`bare` (a result that names no `resultType`, which SEP-2322 says is complete).
`whoami` also reports the levels `logging/setLevel` asked for (`levels`), in order.
"""

from __future__ import annotations

import asyncio
import collections
import json
import sys
import time
from typing import Any

TOOLS = [
    {"name": name, "inputSchema": {"type": "object"}}
    for name in ("whoami", "slow", "vanish", "forget", "refuse", "bare")
]
INFO = {"name": "rawhttp", "version": "1.0"}
OPTIONS = set(sys.argv[2:])
COOKIE = "affinity=node-a"
REFUSED = (
    b"404 Not Found",
    json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Session not found"}}).encode(),
)
dropped = 0
RETRY_MS = 300
broken: dict[str, tuple[float, bytes]] = {}
"""Answers whose stream ended first, by the event id it gave: when it ended, and the answer."""
resumed: list[dict[str, Any]] = []
levels: list[str] = []
"""Each `logging/setLevel` level asked, in order."""
ran: collections.Counter[str] = collections.Counter()
sessions = {"opened": 0, "current": ""}


class Vanish(Exception):
    """The connection ends here, unanswered."""


async def answer(request: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    method, request_id, params = request.get("method"), request.get("id"), request.get("params", {})
    if method == "server/discover":
        result: dict[str, Any] = {"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}}
        result["serverInfo"] = INFO
    elif method == "initialize":
        sessions["opened"] += 1
        sessions["current"] = f"s{sessions['opened']}"
        result = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}, "logging": {}}, "serverInfo": INFO}
    elif method == "tools/list":
        result = {"tools": TOOLS, "ttlMs": 60_000, "cacheScope": "public"}
    elif method == "tools/call":
        name = params.get("name")
        ran[name] += 1
        if name == "slow":
            await asyncio.sleep(1.0)
        elif name == "vanish":
            await asyncio.sleep(0.2)
            raise Vanish
        elif name == "forget":
            sessions["current"] = ""
        elif name == "refuse":
            return {"jsonrpc": "2.0", "id": request_id, "error": {"code": -32603, "message": "refused by the server"}}
        seen = {"id": request_id, "dropped": dropped, "ran": ran, "encoding": headers.get("accept-encoding")}
        seen["resumed"] = resumed
        seen["levels"] = levels
        result = {"content": [{"type": "text", "text": json.dumps(seen)}], "isError": False}
    elif method == "ping":
        result = {}
    elif method == "logging/setLevel":
        levels.append(params["level"])
        result = {}
    else:
        error = {"code": -32601, "message": f"Method not found: {method}"}
        return {"jsonrpc": "2.0", "id": request_id, "error": error}
    if "_meta" in params and params.get("name") != "bare":  # a 2026 request: its results say they are complete
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
            status, payload = (b"405 Method Not Allowed", b"") if method == "GET" else (b"200 OK", b"")
            opening = b'"initialize"' in body or b'"server/discover"' in body
            unknown = "mcp-session-id" in headers and headers["mcp-session-id"] != sessions["current"]
            if (
                unknown
                or ("vhost" in OPTIONS and headers.get("host") != "mcp.example")
                or ("cookie" in OPTIONS and not opening and COOKIE not in headers.get("cookie", ""))
            ):
                status, payload = REFUSED
            elif method == "GET" and "sse-break" in OPTIONS and headers.get("last-event-id") in broken:
                await resume_stream(headers["last-event-id"], writer)
                continue
            elif method == "POST":
                request = json.loads(body)
                if request.get("method") == "tools/call" and "sse-break" in OPTIONS:
                    await break_off(request, headers, writer)
                    continue
                if request.get("method") == "subscriptions/listen" and "listen-json" in OPTIONS:
                    await listen_forever(request, reader, writer)
                    return
                if request.get("method") == "tools/call":
                    calls += 1
                    if "drop" in OPTIONS and calls > 1:
                        dropped += 1
                        return
                if "id" in request:
                    payload = json.dumps(await answer(request, headers)).encode()
                    if request.get("method") == "tools/call" and OPTIONS & {"joined", "joined-array"}:
                        payload = joined(request, payload)
                else:
                    status = b"202 Accepted"
            session = f"mcp-session-id: {sessions['current']}\r\n".encode() if b'"initialize"' in body else b""
            if opening and "cookie" in OPTIONS:
                session += f"set-cookie: {COOKIE}; Path=/\r\n".encode()
            length = b"content-length: " + str(len(payload)).encode() + b"\r\n\r\n"
            writer.write(b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n" + session + length + payload)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, Vanish):
        pass
    finally:
        writer.close()


def joined(request: dict[str, Any], answered: bytes) -> bytes:
    """The call's progress, then its answer, in one JSON body: newline-separated texts, or an array."""
    token = request.get("params", {}).get("_meta", {}).get("progressToken")
    progress = {"progressToken": token, "progress": 1, "total": 2, "message": "half way"}
    texts = [json.dumps({"jsonrpc": "2.0", "method": "notifications/progress", "params": progress}).encode()]
    texts = texts if token is not None else []
    if "joined-array" in OPTIONS:
        return b"[" + b",".join([*texts, answered]) + b"]"
    return b"\n".join([*texts, answered]) + b"\n"


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


async def break_off(request: dict[str, Any], headers: dict[str, str], writer: asyncio.StreamWriter) -> None:
    """The call runs; its stream gives an event id and a retry time, and ends without the answer."""
    answered = json.dumps(await answer(request, headers)).encode()
    event_id = f"{request.get('id')}-1"
    writer.write(SSE_HEAD + chunk(f"id: {event_id}\nretry: {RETRY_MS}\ndata: \n\n".encode()) + chunk(b""))
    await writer.drain()
    broken[event_id] = (time.monotonic(), answered)


async def resume_stream(event_id: str, writer: asyncio.StreamWriter) -> None:
    ended, answered = broken.pop(event_id)
    resumed.append({"last_event_id": event_id, "after_ms": round((time.monotonic() - ended) * 1000)})
    writer.write(SSE_HEAD + chunk(b"event: message\nid: " + event_id.encode() + b"-2\ndata: " + answered + b"\n\n"))
    writer.write(chunk(b""))
    await writer.drain()


async def listen_forever(request: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The acknowledgement, then nothing: the body stays open until the client goes."""
    ack = {"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged", "params": {"notifications": {}}}
    ack["params"]["_meta"] = {"io.modelcontextprotocol/subscriptionId": str(request.get("id"))}
    line = json.dumps(ack).encode() + b"\n"
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    writer.write(head + f"{len(line):x}\r\n".encode() + line + b"\r\n")
    await writer.drain()
    await reader.read()  # b"" once the client closed the connection


async def main() -> None:
    server = await asyncio.start_server(serve_connection, "127.0.0.1", int(sys.argv[1]))
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
