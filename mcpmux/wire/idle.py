"""Whether an idle keep-alive connection may carry another request.

Both of mcpmux's own HTTP/1.1 clients (the MCP fast path's lane, the inference backends' event
streams) keep connections open between requests. A server may close one while it idles; the close
is then the only thing the connection can have to read, and an event loop busy elsewhere may not
have read it yet. httpcore checks the same before reusing a connection.
"""

from __future__ import annotations

import asyncio
import select


def reusable(transport: asyncio.BaseTransport | None) -> bool:
    """Open, and nothing waiting to be read on it."""
    if transport is None or transport.is_closing():
        return False
    sock = transport.get_extra_info("socket")
    return sock is None or not _readable(sock.fileno())


def _readable(fd: int) -> bool:
    """Whether the socket `fd` has input (or its peer's close) waiting, without reading it."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([fd], [], [], 0)[0])
