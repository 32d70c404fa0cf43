"""2025 `resources/subscribe` and `resources/unsubscribe`, and `notifications/resources/updated` back.

Clients subscribe to a URI through mcpmux; mcpmux subscribes its upstream session once per URI,
however many clients asked, and unsubscribes when the last one leaves (or is gone: a client that
disconnects without unsubscribing is noticed on the next update). An upstream's
`notifications/resources/updated` reaches only the clients subscribed to that URI. The upstream
keeps its URIs and subscribes again after a restart (`Upstream.subscriptions`); after a reload
replaced an upstream, `renew` subscribes the new one.
"""

from __future__ import annotations

import logging
import weakref

import anyio
from mcp.server.connection import Connection

from mcpmux.errors import MuxError
from mcpmux.mux.multiplexer import Mux

logger = logging.getLogger(__name__)


class ResourceSubscriptions:
    """Which client connections subscribed to which resource URI."""

    def __init__(self, mux: Mux) -> None:
        self._mux = mux
        self._subscribers: dict[str, weakref.WeakSet[Connection]] = {}
        self._lock = anyio.Lock()  # subscribe/unsubscribe upstream in the order clients asked

    def subscribers(self, uri: str) -> list[Connection]:
        return list(self._subscribers.get(uri, ()))

    async def subscribe(self, connection: Connection, uri: str) -> None:
        """Subscribe `connection` to `uri`; the upstream that lists it is subscribed on the first one."""
        async with self._lock:
            clients = self._subscribers.get(uri)
            if clients is None or not clients:
                await self._mux.subscribe_resource(uri)  # raises for a URI no upstream offers
                clients = self._subscribers[uri] = weakref.WeakSet()
            clients.add(connection)

    async def unsubscribe(self, connection: Connection, uri: str) -> None:
        """Unsubscribe `connection`; the upstream is unsubscribed when no client is left."""
        async with self._lock:
            clients = self._subscribers.get(uri)
            if clients is None:
                return
            clients.discard(connection)
            if not clients:
                del self._subscribers[uri]
                await self._mux.unsubscribe_resource(uri)

    async def renew(self) -> None:
        """After a catalog change (an upstream reconnected, or a reload replaced it): every URI with
        subscribers is subscribed on the upstream that lists it now, if that one is not yet."""
        async with self._lock:
            for uri in [uri for uri, clients in self._subscribers.items() if clients]:
                try:
                    owner = self._mux.catalog.resolve_resource(uri)
                except MuxError:
                    continue  # not listed now: subscribed again when it is
                upstream = self._mux.upstreams.get(owner)
                if upstream is None or uri in upstream.subscriptions:
                    continue
                try:
                    await upstream.subscribe(uri)
                except MuxError as err:
                    logger.warning("could not subscribe upstream %r to %s again: %s", owner, uri, err)

    async def updated(self, upstream: str, uri: str) -> None:
        """An upstream's `notifications/resources/updated`: to the clients subscribed to `uri` only."""
        clients = self.subscribers(uri)
        if not clients:
            async with self._lock:
                if not self._subscribers.get(uri):  # every subscriber went away without unsubscribing
                    self._subscribers.pop(uri, None)
                    await self._mux.unsubscribe_resource(uri)
            return
        for connection in clients:
            try:
                await connection.send_resource_updated(uri)
            except Exception as err:  # a client that went away must not stop the others hearing of it
                logger.debug("could not tell a client that %s was updated: %s", uri, err)
