"""How many idle keep-alive connections each client address holds open to mcpmux's HTTP front.

A client's connection pool grows in a burst of calls and then keeps the extra connections idle
until its own expiry (httpx: 5 s). That costs both ends: a file descriptor and a keep-alive timer
here, and in the client, httpcore probes every idle pooled connection on every request (a `poll`
on its socket), so an MCP client on the Python SDK spends more per call the bigger its pool is.

When one address holds `[http] idle_connections_per_client` idle connections or more, and the one
idle longest has waited `STALE_AFTER` seconds, the connection that is answering is closed after
its response, with `Connection: close`: the client learns it from the response and opens no request
on it, so the pool shrinks by one without the race that closing an idle connection has (the client
may be sending on it as it closes). The wait spares clients that share an address and each keep
one connection busy (local agents and editors all come from 127.0.0.1): their connections are idle
only briefly. Only a connection with nothing more in progress is closed: no request behind the one
answered.
"""

from __future__ import annotations

import time

STALE_AFTER = 0.25
"""Seconds the longest-idle connection of an address has waited before a surplus counts."""


class IdleConnections:
    """Idle keep-alive connections per client address, and whether an address holds a stale surplus."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        """Idle connections one address may hold; 0: no limit (nothing is tracked)."""
        self._idle: dict[str, dict[object, float]] = {}
        """Per address: its idle connections, longest idle first, with the time each went idle."""

    def resting(self, address: str, connection: object) -> None:
        """`connection` from `address` waits for its next request."""
        if self.limit:
            idle = self._idle.setdefault(address, {})
            idle.pop(connection, None)  # to the end: the order is how long each has been idle
            idle[connection] = time.monotonic()

    def busy(self, address: str, connection: object) -> None:
        """`connection` from `address` got data, or closed: it no longer counts as idle."""
        idle = self._idle.get(address)
        if idle is not None and idle.pop(connection, None) is not None and not idle:
            del self._idle[address]

    def crowded(self, address: str) -> bool:
        """Whether `address` holds `limit` idle connections or more besides the one asking, the
        longest idle of them for `STALE_AFTER` seconds."""
        idle = self._idle.get(address)
        if idle is None or len(idle) < self.limit:
            return False
        return time.monotonic() - next(iter(idle.values())) >= STALE_AFTER
