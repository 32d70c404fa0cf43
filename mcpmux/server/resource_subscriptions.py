"""Resource subscriptions: 2025 `resources/subscribe`/`unsubscribe` and 2026-07-28 `subscriptions/listen`.

Clients subscribe to a URI through mcpmux (a 2026-07-28 client by naming it in a listen stream's
`resourceSubscriptions`, for as long as the stream is open); mcpmux subscribes its upstream session once per URI,
however many clients asked, and unsubscribes when the last one leaves (or is gone: a client that
disconnects without unsubscribing is noticed on the next update). An upstream's
`notifications/resources/updated` reaches only the clients subscribed to that URI (on a listen
stream, through the server's subscription bus, which delivers it to the streams that named it). The upstream
keeps its URIs and subscribes again after a restart (`Upstream.subscriptions`); after a reload
replaced an upstream, `renew` subscribes the new one.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

import anyio
import mcp_types as types
from mcp.server.connection import Connection
from mcp.server.subscriptions import ListenHandler, ResourceUpdated, SubscriptionBus

from mcpmux.errors import MuxError
from mcpmux.mux.multiplexer import Mux
from mcpmux.server.http.edge import PROFILE_SCOPE

logger = logging.getLogger(__name__)


class ResourceSubscriptions:
    """Which client connections subscribed to which resource URI."""

    def __init__(self, mux: Mux, bus: SubscriptionBus) -> None:
        self._mux = mux
        self._bus = bus
        self._listen = ListenHandler(bus)
        # Per URI: 2025 connections, and 2026 listen streams (a `_Listen` each).
        self._subscribers: dict[str, weakref.WeakSet[Any]] = {}
        self._lock = anyio.Lock()  # subscribe/unsubscribe upstream in the order clients asked

    def subscribers(self, uri: str) -> list[Any]:
        return list(self._subscribers.get(uri, ()))

    async def listen(self, ctx: Any, params: types.SubscriptionsListenRequestParams) -> types.SubscriptionsListenResult:
        """`subscriptions/listen` (2026-07-28): its resource URIs are subscribed upstream while it is open."""
        stream = _Listen()
        profile = ctx.request.scope.get(PROFILE_SCOPE) if ctx.request is not None else None
        uris = list(params.notifications.resource_subscriptions or ())
        subscribed: list[str] = []
        try:
            for uri in uris:
                try:
                    await self.subscribe(stream, uri, profile)
                    subscribed.append(uri)
                except MuxError as err:  # an unknown URI is honored and never fires, as the spec says
                    logger.debug("listen stream: %s", err)
            return await self._listen(ctx, params)
        finally:
            with anyio.CancelScope(shield=True):
                for uri in subscribed:
                    try:
                        await self.unsubscribe(stream, uri)
                    except MuxError as err:
                        logger.debug("listen stream ended: could not unsubscribe %s: %s", uri, err)

    async def subscribe(self, connection: Any, uri: str, profile: str | None = None) -> None:
        """Subscribe `connection` to `uri`; the upstream that lists it is subscribed on the first one.
        A URI outside the client's `profile` is refused as one no upstream offers."""
        self._mux.view(profile).resolve_resource(uri)  # raises for a URI outside the profile
        async with self._lock:
            clients = self._subscribers.get(uri)
            if clients is None or not clients:
                await self._mux.subscribe_resource(uri)  # raises for a URI no upstream offers
                clients = self._subscribers[uri] = weakref.WeakSet()
            clients.add(connection)

    async def unsubscribe(self, connection: Any, uri: str) -> None:
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
                    owner, own = self._mux.catalog.locate_resource(uri)  # `own`: the URI as its server names it
                except MuxError:
                    continue  # not listed now: subscribed again when it is
                upstream = self._mux.upstreams.get(owner)
                if upstream is None or own in upstream.subscriptions:
                    continue
                try:
                    await upstream.subscribe(own)
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
        if any(isinstance(client, _Listen) for client in clients):
            await self._bus.publish(ResourceUpdated(uri))  # to the listen streams that named `uri`
        for connection in clients:
            if not isinstance(connection, Connection):
                continue
            try:
                await connection.send_resource_updated(uri)
            except Exception as err:  # a client that went away must not stop the others hearing of it
                logger.debug("could not tell a client that %s was updated: %s", uri, err)


class _Listen:
    """One open `subscriptions/listen` stream, as a subscriber (held while the stream is open)."""
