"""Who may reach mcpmux over HTTP: the `[http]` security settings, read and checked once at start.

`EdgePolicy.load` resolves the bearer tokens (from an environment variable or a file), the allowed
Host and Origin names and the limits; `prepare_edge` also refuses to serve a non-loopback address
without tokens unless told to. `mcpmux.server.http_edge.HttpEdge` enforces the policy on every request.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from mcpmux.core.config import Config
from mcpmux.errors import ConfigError, MuxError

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def is_loopback(host: str) -> bool:
    """Whether binding `host` serves only this machine."""
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _split_host(value: str) -> tuple[str, str | None]:
    """`name[:port]` or `[v6][:port]` as (lower-case name, port or None)."""
    value = value.strip().lower()
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        return name, rest[1:] if rest.startswith(":") and rest[1:] != "*" else None
    if value.count(":") == 1:
        name, port = value.split(":")
        return name, None if port == "*" else port
    return value, None


@dataclass(slots=True, frozen=True)
class EdgePolicy:
    """The resolved `[http]` security settings that `HttpEdge` enforces."""

    tokens: tuple[bytes, ...]
    host_names: frozenset[str]
    host_ports: frozenset[tuple[str, str]]
    origins: frozenset[str]
    any_host: bool
    any_origin: bool
    max_body_bytes: int
    rate_limit: float
    rate_burst: int
    metrics_auth: bool
    idle_per_client: int

    @classmethod
    def load(cls, config: Config, bind_host: str, environ: Mapping[str, str] | None = None) -> EdgePolicy:
        """Read the tokens and allow-lists for serving on `bind_host`; a `ConfigError` names the bad key."""
        http = config.http
        names = set(LOOPBACK_NAMES) | {bind_host.strip("[]").lower()}
        ports: set[tuple[str, str]] = set()
        for entry in http.allowed_hosts:
            name, port = _split_host(entry)
            if port is None:
                names.add(name)
            else:
                ports.add((name, port))
        return cls(
            tokens=tuple(token.encode() for token in _load_tokens(config, os.environ if environ is None else environ)),
            host_names=frozenset(names),
            host_ports=frozenset(ports),
            origins=frozenset(origin.lower().rstrip("/") for origin in http.allowed_origins),
            any_host="*" in http.allowed_hosts,
            any_origin="*" in http.allowed_origins,
            max_body_bytes=http.max_body_bytes,
            rate_limit=http.rate_limit,
            rate_burst=http.rate_burst,
            metrics_auth=http.metrics_auth,
            idle_per_client=http.idle_connections_per_client,
        )

    def host_allowed(self, host: str | None) -> bool:
        if self.any_host:
            return True
        if not host:
            return False
        name, port = _split_host(host)
        return name in self.host_names or (port is not None and (name, port) in self.host_ports)

    def origin_allowed(self, origin: str | None) -> bool:
        if origin is None or self.any_origin:
            return True
        origin = origin.strip().lower().rstrip("/")
        if origin in self.origins:
            return True
        parts = urlsplit(origin)
        name = parts.hostname or ""
        any_port = f"{parts.scheme}://{f'[{name}]' if ':' in name else name}:*"
        # A page served from a name this server answers to is the server's own site.
        return name in self.host_names or any_port in self.origins

    def client_of(self, authorization: str | None) -> int | None:
        """Index of the configured token the Authorization header carries, else None (every token is compared)."""
        scheme, _, presented = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            return None
        given = presented.strip().encode()
        found = None
        for index, token in enumerate(self.tokens):
            if hmac.compare_digest(token, given):
                found = index
        return found


def _load_tokens(config: Config, environ: Mapping[str, str]) -> list[str]:
    """The accepted tokens from `auth_token_env` and `auth_token_file`; errors name the key, never a value."""
    http, tokens = config.http, []
    if http.auth_token_env is not None:
        found = environ.get(http.auth_token_env, "").replace(",", " ").split()
        if not found:
            raise ConfigError(
                f"{config.source}: http.auth_token_env: environment variable {http.auth_token_env} is not set or "
                "empty: set it to the bearer token clients must send, or remove the key"
            )
        tokens += found
    if http.auth_token_file is not None:
        source = Path(config.source)
        path = Path(http.auth_token_file).expanduser()
        path = path if path.is_absolute() or not source.is_file() else source.parent / path
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as err:
            reason = err.strerror if isinstance(err, OSError) else "not UTF-8 text"
            raise ConfigError(f"{config.source}: http.auth_token_file: cannot read {path} ({reason})") from None
        found = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
        if not found:
            raise ConfigError(f"{config.source}: http.auth_token_file: {path} holds no token (one a line)")
        tokens += found
    return tokens


def prepare_edge(config: Config, host: str, allow_unauthenticated_remote: bool) -> EdgePolicy:
    """The edge policy for serving on `host`; refuses a non-loopback bind without tokens unless allowed."""
    policy = EdgePolicy.load(config, host)
    if not policy.tokens and not is_loopback(host) and not allow_unauthenticated_remote:
        raise MuxError(
            f"refusing to serve HTTP on {host} without authentication: anyone who can reach that address could "
            f"use every upstream tool. Set [http] auth_token_env or auth_token_file in {config.source} (clients "
            "then send 'Authorization: Bearer <token>'), bind 127.0.0.1, or pass --allow-unauthenticated-remote "
            "if a proxy in front already authenticates"
        )
    return policy
