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

Retiring helps only a client that then takes one of its idle connections. One that connects anew
instead (a load driver with a fixed connection per caller, a pool that never reuses its idle
connections) would pay a reconnection on every call while its idle surplus stays: once a new
connection follows a retirement from an address before any of its idle connections was taken up or
closed, that address's connections are no longer retired until one is.
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
        self._retired: dict[str, float] = {}
        """Per address a connection was retired from: when, until a connection idle then is taken up or closed."""
        self._reconnects: set[str] = set()
        """Addresses that connected anew after a retirement, rather than take an idle connection: not retired from."""

    def opened(self, address: str) -> None:
        """A new connection from `address`."""
        if address in self._retired:
            self._reconnects.add(address)

    def resting(self, address: str, connection: object) -> None:
        """`connection` from `address` waits for its next request."""
        if self.limit:
            idle = self._idle.setdefault(address, {})
            idle.pop(connection, None)  # to the end: the order is how long each has been idle
            idle[connection] = time.monotonic()

    def busy(self, address: str, connection: object) -> None:
        """`connection` from `address` got data, or closed: it no longer counts as idle."""
        idle = self._idle.get(address)
        went_idle = None if idle is None else idle.pop(connection, None)
        if went_idle is None:
            return
        if went_idle <= self._retired.get(address, -1.0):
            # A connection of the surplus, not the caller's own between two calls: the pool shrinks.
            del self._retired[address]
            self._reconnects.discard(address)
        if not idle:  # nothing idle left to retire: forget the address
            del self._idle[address]
            self._retired.pop(address, None)
            self._reconnects.discard(address)

    def retire(self, address: str) -> bool:
        """Whether the connection from `address` answering now is retired (and so counted): `address`
        holds `limit` idle connections or more besides it, the longest idle of them for `STALE_AFTER`
        seconds, and has not connected anew after the last retirement."""
        idle = self._idle.get(address)
        if idle is None or len(idle) < self.limit or address in self._reconnects:
            return False
        if time.monotonic() - next(iter(idle.values())) < STALE_AFTER:
            return False
        self._retired[address] = time.monotonic()
        return True
