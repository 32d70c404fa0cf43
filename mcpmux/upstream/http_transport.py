"""The transport to a streamable HTTP upstream: the SDK's, with the fast path's own client beside it.

The SDK's `streamable_http_client` carries the session (handshake, listings, the SDK path's calls,
the 2025 GET stream). Where `raw_lane_allowed`, the lane's `tools/call` requests go through
`HttpLane` instead, on connections of its own; what their responses carry that is not the lane's
(a log, a 2025 server's sampling request) joins the session's read stream here, in the context of
the inbound call whose stream carried it, so the session handles it as if its own transport had
read it on that call's POST (where the SDK's transport keeps the sending task's context).
"""

from __future__ import annotations

import asyncio
import contextvars
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import mcp_types as types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from mcpmux.core.inbound import InboundCall, in_call
from mcpmux.upstream.http_lane import HttpLane, raw_lane_allowed
from mcpmux.upstream.json_bodies import JoinedBodies
from mcpmux.upstream.lane import UpstreamLane, session_sender
from mcpmux.upstream.oauth.upstream_auth import UpstreamOAuth

_Item = SessionMessage | Exception


@asynccontextmanager
async def http_transport(
    url: str,
    headers: dict[str, str],
    lane: UpstreamLane,
    joined: JoinedBodies,
    oauth: UpstreamOAuth | None = None,
) -> AsyncIterator[tuple[Any, Any]]:
    """The (read, write) streams an SDK `Client` takes; `lane` is attached to an `HttpLane` where one can serve.

    `joined` reads the upstream's JSON bodies that hold several messages, on both paths. `oauth` signs
    the SDK's requests; a connection that carries a token has no `HttpLane`, which sends none.
    """
    # The HTTP client stays ours to close: left open, each reconnection would leak the old pool's sockets.
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=None), auth=oauth)
    signed = oauth is not None and oauth.active
    raw = HttpLane(url, http, lane, joined) if raw_lane_allowed(url) and _on_asyncio() and not signed else None
    http.event_hooks = {"response": [*([raw.on_sdk_response] if raw is not None else []), joined.on_response]}
    async with http, streamable_http_client(url, http_client=http) as (read, write):
        if raw is None:
            yield read, write
            return
        raw.fallback = session_sender(write)
        lane.attach(raw.send, raw.send_now)
        merged = _MergedReadStream(read, lane)
        raw.pass_on = merged.put
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(merged.pump)
                try:
                    yield merged, write
                finally:
                    tasks.cancel_scope.cancel()
        finally:
            raw.close()


def _on_asyncio() -> bool:
    """`HttpLane` is made of asyncio protocols."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class _MergedReadStream:
    """The SDK transport's read stream, plus what `HttpLane` passes on, as one stream for the session.

    Keeps the sender's context of each SDK message (`last_context`, which the SDK's dispatcher reads).
    """

    def __init__(self, inner: Any, lane: UpstreamLane) -> None:
        self._inner = inner
        self._lane = lane
        self._send, self._receive = anyio.create_memory_object_stream[tuple[contextvars.Context | None, _Item]](
            math.inf
        )
        self.last_context: contextvars.Context | None = None

    async def pump(self) -> None:
        """Move the SDK transport's messages over, until its stream ends."""
        with self._send:
            try:
                while True:
                    item = await self._inner.receive()
                    self._send.send_nowait((getattr(self._inner, "last_context", None), item))
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass  # the SDK transport's stream ended, or the session stopped reading

    def put(self, message: dict[str, Any], caller: InboundCall | None = None) -> None:
        """A message `HttpLane` read that is not the lane's, on the stream of `caller`'s request: the
        session handles it next, in that call's context (`mcpmux.core.inbound.current_call`)."""
        item: _Item
        try:
            item = SessionMessage(types.jsonrpc_message_adapter.validate_python(message))
        except ValidationError as err:
            item = err  # the session words it, as when its own transport reads something that is not MCP
        try:
            self._send.send_nowait((in_call(caller) if caller is not None else None, item))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return  # the session is gone
        self._lane.passed_on()

    async def receive(self) -> _Item:
        context, item = await self._receive.receive()
        self.last_context = context
        return item

    async def aclose(self) -> None:
        await self._receive.aclose()
