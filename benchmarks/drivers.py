"""The benchmarks' load: echo calls through a real `mcp.Client`, or through a raw HTTP/1.1 driver.

Both answer `await driver.echo(lane, text)` with the text the server's `echo` tool sent back, and
raise if the call failed. `lane` is the caller's number: the raw driver keeps one keep-alive
connection per lane, as a client pool would under that many callers.

`RawHttpDriver` sends session-less 2026-07-28 `tools/call` POSTs with the headers the SDK's client
sends and reads each answer off the connection, parsing only what it checks. It costs a tenth of
what `mcp.Client` does per call, so when it drives a server, the server's side is what is timed:
on a 2-core machine `mcp.Client` under 64 callers is a saturated core of its own, and any process
put between it and the upstream takes CPU from it (docs/mux_overhead.md, session 13).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any
from urllib.parse import urlsplit

from mcp import Client

ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "mcpmux-bench", "version": "0"},
    "io.modelcontextprotocol/clientCapabilities": {},
}


class ClientDriver:
    """Calls through one connected `mcp.Client`, shared by every lane."""

    def __init__(self, client: Client, tool: str) -> None:
        self.client, self.tool = client, tool

    async def echo(self, lane: int, text: str) -> str:
        result = await self.client.call_tool(self.tool, {"text": text})
        answer = getattr(result.content[0], "text", None) if result.content else None
        if result.is_error or not isinstance(answer, str):
            raise RuntimeError(f"{self.tool}: the call failed: {result.model_dump_json(exclude_none=True)[:300]}")
        return answer


class RawHttpDriver:
    """Keep-alive connections to a streamable HTTP MCP endpoint, one per lane, opened on first use."""

    def __init__(self, url: str, tool: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"the raw driver speaks plain HTTP to host:port, not {url!r}")
        self.host, self.port, self.tool = parts.hostname, parts.port, tool
        self.head = (
            f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: keep-alive\r\n"
            "accept: application/json, text/event-stream\r\ncontent-type: application/json\r\n"
            f"mcp-protocol-version: 2026-07-28\r\nmcp-method: tools/call\r\nmcp-name: {tool}\r\n"
        ).encode()
        self.lanes: dict[int, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
        self.numbers = itertools.count()

    async def _connection(self, lane: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        connection = self.lanes.get(lane)
        # A server closes a keep-alive connection left idle (uvicorn after 5 s): its end has been read by now.
        if connection is None or connection[0].at_eof():
            if connection is not None:
                connection[1].close()
            connection = self.lanes[lane] = await asyncio.open_connection(self.host, self.port)
        return connection

    async def echo(self, lane: int, text: str) -> str:
        reader, writer = await self._connection(lane)
        number = next(self.numbers)
        params = {"name": self.tool, "arguments": {"text": text}, "_meta": ENVELOPE}
        body = json.dumps({"jsonrpc": "2.0", "id": number, "method": "tools/call", "params": params}).encode()
        writer.write(b"%scontent-length: %d\r\n\r\n%s" % (self.head, len(body), body))
        head = (await reader.readuntil(b"\r\n\r\n")).lower()
        status = head[9:12]
        fields = dict(line.split(b":", 1) for line in head.split(b"\r\n")[1:] if b":" in line)
        answer = json.loads(await reader.readexactly(int(fields[b"content-length"])))
        if fields.get(b"connection", b"").strip() == b"close":  # the server retires it: the next call opens anew
            writer.close()
            del self.lanes[lane]
        if status != b"200" or answer.get("id") != number or "result" not in answer:
            raise RuntimeError(f"{self.tool}: call {number} got HTTP {status.decode()}: {json.dumps(answer)[:300]}")
        result: dict[str, Any] = answer["result"]
        text = (result.get("content") or [{}])[0].get("text")
        if result.get("isError") or not isinstance(text, str):
            raise RuntimeError(f"{self.tool}: call {number} failed: {json.dumps(result)[:300]}")
        return text

    async def aclose(self) -> None:
        for _, writer in self.lanes.values():
            writer.close()
        self.lanes.clear()
