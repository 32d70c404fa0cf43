"""How many idle keep-alive connections each client address holds open to mcpmux's HTTP front.

A client's connection pool grows in a burst of calls and then keeps the extra connections idle
until its own expiry (httpx: 5 s). That costs both ends: a file descriptor and a keep-alive timer
here, and in the client, httpcore probes every idle pooled connection on every request (a `poll`
on its socket), so an MCP client on the Python SDK spends more per call the bigger its pool is.

Past `[http] idle_connections_per_client` idle connections from one address, the connection that
is answering is closed after its response, with `Connection: close`: the client learns it from
the response and opens no request on it, so the pool shrinks by one without the race that
closing an idle connection has (the client may be sending on it as it closes). Only a connection
with nothing more in progress is closed that way: no request pipelined behind the one answered.
"""

from __future__ import annotations

from typing import Any


class IdleConnections:
    """Idle keep-alive connections per client address, and whether an address holds too many."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        """Idle connections one address may hold; 0: no limit (nothing is tracked)."""
        self._idle: dict[str, set[Any]] = {}

    def resting(self, address: str, connection: object) -> None:
        """`connection` from `address` waits for its next request."""
        if self.limit:
            self._idle.setdefault(address, set()).add(connection)

    def busy(self, address: str, connection: object) -> None:
        """`connection` from `address` got data, or closed: it no longer counts as idle."""
        idle = self._idle.get(address)
        if idle is not None:
            idle.discard(connection)
            if not idle:
                del self._idle[address]

    def crowded(self, address: str) -> bool:
        """Whether `address` holds `limit` idle connections or more besides the one asking."""
        idle = self._idle.get(address)
        return idle is not None and len(idle) >= self.limit
