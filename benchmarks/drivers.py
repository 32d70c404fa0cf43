"""The benchmarks' load: echo calls through a real `mcp.Client`, or through a raw HTTP/1.1 driver.

Both answer `await driver.echo(lane, text)` with the text the server's echo tool sent back (after
`sleep_ms` milliseconds, if given), and raise `CallFailed` if the server answered with an error.
`lane` is the caller's number: the raw driver keeps one keep-alive connection per lane, as a
client pool would under that many callers.

`RawHttpDriver` sends session-less 2026-07-28 `tools/call` POSTs with the headers the SDK's client
sends and reads each answer off the connection, parsing only what it checks. With `era="legacy"`
it first opens one 2025-06-18 session (`initialize`, then `notifications/initialized`) and sends
every call under its `Mcp-Session-Id`, for a server that predates 2026-07-28 (mcp-proxy 0.13 on
`mcp<2`); it reads JSON answers, not event streams. It costs a tenth of what `mcp.Client` does per
call, so when it drives a server, the server's side is what is timed: on a 2-core machine
`mcp.Client` under 64 callers is a saturated core of its own, and any process put between it and
the upstream takes CPU from it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from typing import Any, Literal
from urllib.parse import urlsplit

from mcp import Client

ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "mcpmux-bench", "version": "0"},
    "io.modelcontextprotocol/clientCapabilities": {},
}
LEGACY_VERSION = "2025-06-18"
KEEPALIVE_S = 2.0


class CallFailed(RuntimeError):
    """The server answered the call, with an error (a tool error, a JSON-RPC error, an HTTP error status)."""


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class ClientDriver:
    """Calls through one connected `mcp.Client`, shared by every lane."""

    def __init__(self, client: Client, tool: str) -> None:
        self.client, self.tool = client, tool

    async def echo(self, lane: int, text: str, sleep_ms: int = 0) -> str:
        result = await self.client.call_tool(self.tool, _arguments(text, sleep_ms))
        answer = getattr(result.content[0], "text", None) if result.content else None
        if result.is_error or not isinstance(answer, str):
            raise CallFailed(f"{self.tool}: the call failed: {result.model_dump_json(exclude_none=True)[:300]}")
        return answer


class RawHttpDriver:
    """Keep-alive connections to a streamable HTTP MCP endpoint, one per lane, opened on first use."""

    def __init__(self, url: str, tool: str, era: Literal["2026-07-28", "legacy"] = "2026-07-28") -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"the raw driver speaks plain HTTP to host:port, not {url!r}")
        self.host, self.port, self.tool, self.era = parts.hostname, parts.port, tool, era
        self.head = (
            f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: keep-alive\r\n"
            "accept: application/json, text/event-stream\r\ncontent-type: application/json\r\n"
        ).encode()
        if era == "2026-07-28":
            self.head += f"mcp-protocol-version: 2026-07-28\r\nmcp-method: tools/call\r\nmcp-name: {tool}\r\n".encode()
        self.session: asyncio.Task[None] | None = None
        self.lanes: dict[int, Connection] = {}
        self.used: dict[int, float] = {}
        """Lane -> when its connection was last given a request (time.monotonic)."""
        self.numbers = itertools.count()

    async def _connection(self, lane: int) -> Connection:
        connection = self.lanes.get(lane)
        now = time.monotonic()
        # A server closes a keep-alive connection left idle (uvicorn after 5 s): one idle for longer
        # than KEEPALIVE_S is not reused, lest the call cross the server's close on the wire.
        if connection is None or connection[0].at_eof() or now - self.used.get(lane, now) > KEEPALIVE_S:
            if connection is not None:
                connection[1].close()
            connection = self.lanes[lane] = await asyncio.open_connection(self.host, self.port)
        self.used[lane] = now
        return connection

    async def _post(self, lane: int, head: bytes, message: dict[str, Any]) -> tuple[bytes, dict[bytes, bytes], Any]:
        """One POST on `lane`'s connection: the status, the header fields (lower case) and the JSON body, if any."""
        reader, writer = await self._connection(lane)
        body = json.dumps(message).encode()
        writer.write(b"%scontent-length: %d\r\n\r\n%s" % (head, len(body), body))
        response = (await reader.readuntil(b"\r\n\r\n")).lower()
        fields = dict(line.split(b":", 1) for line in response.split(b"\r\n")[1:] if b":" in line)
        fields = {name.strip(): value.strip() for name, value in fields.items()}
        length = int(fields.get(b"content-length", b"0"))
        answer = json.loads(await reader.readexactly(length)) if length else None
        if fields.get(b"connection") == b"close":  # the server retires it: the next call opens anew
            writer.close()
            del self.lanes[lane]
        return response[9:12], fields, answer

    async def _open_session(self) -> None:
        """The legacy handshake; afterwards every call carries the session's id."""
        params = {
            "protocolVersion": LEGACY_VERSION,
            "capabilities": {},
            "clientInfo": ENVELOPE["io.modelcontextprotocol/clientInfo"],
        }
        initialize = {"jsonrpc": "2.0", "id": next(self.numbers), "method": "initialize", "params": params}
        status, fields, answer = await self._post(-1, self.head, initialize)
        if status != b"200" or b"mcp-session-id" not in fields:
            raise RuntimeError(f"initialize got HTTP {status.decode()} without a session: {json.dumps(answer)[:300]}")
        session = fields[b"mcp-session-id"].decode()
        self.head += f"mcp-session-id: {session}\r\nmcp-protocol-version: {LEGACY_VERSION}\r\n".encode()
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        status, _, _ = await self._post(-1, self.head, initialized)
        if status != b"202":
            raise RuntimeError(f"notifications/initialized got HTTP {status.decode()}, not 202")

    async def echo(self, lane: int, text: str, sleep_ms: int = 0) -> str:
        if self.era == "legacy":
            self.session = self.session or asyncio.create_task(self._open_session())
            await asyncio.shield(self.session)
        number = next(self.numbers)
        params: dict[str, Any] = {"name": self.tool, "arguments": _arguments(text, sleep_ms)}
        if self.era == "2026-07-28":
            params["_meta"] = ENVELOPE
        request = {"jsonrpc": "2.0", "id": number, "method": "tools/call", "params": params}
        status, _, answer = await self._post(lane, self.head, request)
        if status != b"200" or not isinstance(answer, dict) or answer.get("id") != number or "result" not in answer:
            raise CallFailed(f"{self.tool}: call {number} got HTTP {status.decode()}: {json.dumps(answer)[:300]}")
        result: dict[str, Any] = answer["result"]
        text = (result.get("content") or [{}])[0].get("text")
        if result.get("isError") or not isinstance(text, str):
            raise CallFailed(f"{self.tool}: call {number} failed: {json.dumps(result)[:300]}")
        return text

    async def aclose(self) -> None:
        for _, writer in self.lanes.values():
            writer.close()
        self.lanes.clear()


def _arguments(text: str, sleep_ms: int) -> dict[str, Any]:
    return {"text": text, "sleep_ms": sleep_ms} if sleep_ms else {"text": text}
