"""An upstream's `application/json` responses that hold several JSON-RPC messages, read one by one.

The transport allows one message in such a body, and the SDK's streamable HTTP client fails the
call on a second ("Failed to parse JSON response: trailing characters"). Servers that send a
notification and then the response in one JSON body exist (the MCP conformance suite's reference
server does), and nothing is lost by reading them as the events of a stream, which is what they
stand for (`mcpmux.wire.json_texts`). On the SDK's path an httpx response hook on the client mcpmux
hands it (`on_response`) gives such a body to the SDK as that event stream, which the SDK reads
message by message in the call's context; the fast path's connections ask `split`. Either way the
server's deviation is logged once per upstream.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx2

from mcpmux.wire.json_bytes import dumps
from mcpmux.wire.json_texts import several_messages

logger = logging.getLogger(__name__)


class JoinedBodies:
    """One upstream's JSON response bodies, split where they hold several messages."""

    def __init__(self, server: str) -> None:
        self.server = server
        self._warned = False

    def split(self, body: bytes) -> list[Any] | None:
        """The messages of `body` when it holds several; None when it is one (or not JSON)."""
        messages = several_messages(body)
        if messages is not None and not self._warned:
            self._warned = True
            logger.warning(
                "upstream %r answered with %d JSON-RPC messages in one application/json body (the transport "
                "allows one; several go in text/event-stream): reading them one by one",
                self.server,
                len(messages),
            )
        return messages

    async def on_response(self, response: httpx2.Response) -> None:
        """An httpx response hook: an MCP POST's JSON body holding several messages becomes the event
        stream they stand for. Any other body is left as it came (read, and given back whole); the
        client's other requests (an OAuth flow's, which accept no event stream) are not looked at."""
        request = response.request
        kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
        mcp_post = request.method == "POST" and "text/event-stream" in request.headers.get("accept", "")
        if not mcp_post or not response.is_success or kind != "application/json":
            return
        stream = response.stream
        assert isinstance(stream, httpx2.AsyncByteStream)
        try:
            raw = b"".join([piece async for piece in stream])
        finally:
            await stream.aclose()
        response.stream = httpx2.ByteStream(raw)
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        try:
            body = raw if encoding == "identity" else _decoded(raw, encoding)
        except httpx2.DecodingError:
            return  # the SDK meets the same error reading it, and words it
        messages = self.split(body)
        if messages is None:
            return
        events = b"".join(b"event: message\ndata: " + dumps(message) + b"\n\n" for message in messages)
        response.headers.pop("content-encoding", None)
        response.headers["content-type"] = "text/event-stream"
        response.headers["content-length"] = str(len(events))
        response.stream = httpx2.ByteStream(events)


def _decoded(raw: bytes, encoding: str) -> bytes:
    """A compressed body, decoded by httpx's own decoders (those the response itself would use)."""
    return httpx2.Response(200, headers={"content-encoding": encoding}, content=raw).content
