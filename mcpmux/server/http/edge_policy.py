"""Who may reach mcpmux over HTTP: the `[http]` security settings, read and checked at start.

`[http]` changes take effect at a restart (a reload reports them); the profiles and their tokens
follow a reload (`EdgePolicy.reloaded`). `EdgePolicy.load` resolves the bearer tokens (from an
environment variable or a file: `[http]`'s, and each `[profiles.NAME]`'s, which bind their tokens
to that profile), the allowed Host and Origin names, the profiles served at `/mcp/NAME` and the
limits; `prepare_edge` also refuses to serve a non-loopback address without tokens unless told to.
`mcpmux.server.http.edge.HttpEdge` enforces the policy on every request.
"""

from __future__ import annotations

import dataclasses
import hmac
import ipaddress
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from mcpmux.core.config import Config
from mcpmux.core.oauth_settings import ResourceServerSettings
from mcpmux.errors import ConfigError, MuxError

logger = logging.getLogger(__name__)

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
    token_profiles: tuple[str | None, ...] = ()
    """Per token (same order as `tokens`): the profile it is bound to, or None (`[http]`'s tokens)."""
    profiles: frozenset[str] = frozenset()
    """The `[profiles.NAME]` defined: each is served at `<path>/NAME` too."""
    oauth: ResourceServerSettings | None = None
    """`[http.oauth]`: OAuth access tokens are taken too (`mcpmux.server.http.oauth_resource`)."""

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
        tokens = _load_tokens(config, os.environ if environ is None else environ)
        return cls(
            tokens=tuple(token.encode() for token, _ in tokens),
            token_profiles=tuple(profile for _, profile in tokens),
            profiles=frozenset(config.profiles),
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
            oauth=http.oauth,
        )

    def reloaded(self, config: Config, environ: Mapping[str, str] | None = None) -> EdgePolicy:
        """This policy with `config`'s profiles and their tokens read again (a token file too); `[http]`'s
        tokens stay as loaded at start. A token keeps its index (which sessions and rate limits are
        keyed by) while it stays bound to the same profile; a token removed or bound elsewhere leaves
        a slot no request matches. If a profile's tokens cannot be read, no profile token is accepted
        until a reload reads them (logged, naming the key)."""
        try:
            fresh = _profile_tokens(config, os.environ if environ is None else environ, self._http_tokens())
        except ConfigError as err:
            logger.error("config reload: %s; until it is fixed, no [profiles] token is accepted", err)
            fresh = []
        wanted = {token.encode(): profile for token, profile in fresh}
        tokens, bound = list(self.tokens), list(self.token_profiles)
        for index, (token, profile) in enumerate(zip(self.tokens, self.token_profiles, strict=True)):
            if profile is not None and wanted.get(token, _GONE) != profile:
                tokens[index], bound[index] = b"", None  # b"" matches no presented token
            elif profile is not None:
                del wanted[token]
        for token, profile in wanted.items():
            tokens.append(token)
            bound.append(profile)
        return dataclasses.replace(
            self, tokens=tuple(tokens), token_profiles=tuple(bound), profiles=frozenset(config.profiles)
        )

    def _http_tokens(self) -> dict[str, str]:
        return {
            token.decode(): "http"
            for token, profile in zip(self.tokens, self.token_profiles, strict=True)
            if token and profile is None
        }

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
            if hmac.compare_digest(token, given) and token:
                found = index
        return found


def _load_tokens(config: Config, environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """Every accepted token and the profile it is bound to (None: `[http]`'s, any profile), from the
    `auth_token_env` and `auth_token_file` keys; errors name the key, never a value."""
    http = config.http
    tokens: list[tuple[str, str | None]] = [
        (token, None) for token in _tokens_of(config, "http", http.auth_token_env, http.auth_token_file, environ)
    ]
    return tokens + _profile_tokens(config, environ, {token: "http" for token, _ in tokens})


def _profile_tokens(config: Config, environ: Mapping[str, str], seen: dict[str, str]) -> list[tuple[str, str | None]]:
    """Each `[profiles.NAME]`'s tokens and NAME; `seen`: the tokens taken already, and where from."""
    tokens: list[tuple[str, str | None]] = []
    for name, profile in config.profiles.items():
        where = f"profiles.{name}"
        for token in _tokens_of(config, where, profile.auth_token_env, profile.auth_token_file, environ):
            if seen.setdefault(token, where) != where:
                raise ConfigError(
                    f"{config.source}: {where}: one of its tokens is also one of {seen[token]}'s: a token "
                    "is bound to one profile at most (or, in [http], to none); give each its own"
                )
            tokens.append((token, name))
    return tokens


_GONE = object()


def _tokens_of(config: Config, where: str, env: str | None, file: str | None, environ: Mapping[str, str]) -> list[str]:
    tokens: list[str] = []
    if env is not None:
        found = environ.get(env, "").replace(",", " ").split()
        if not found:
            raise ConfigError(
                f"{config.source}: {where}.auth_token_env: environment variable {env} is not set or "
                "empty: set it to the bearer token clients must send, or remove the key"
            )
        tokens += found
    if file is not None:
        path = config.path_of(file)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as err:
            reason = err.strerror if isinstance(err, OSError) else "not UTF-8 text"
            raise ConfigError(f"{config.source}: {where}.auth_token_file: cannot read {path} ({reason})") from None
        found = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
        if not found:
            raise ConfigError(f"{config.source}: {where}.auth_token_file: {path} holds no token (one a line)")
        tokens += found
    return tokens


def prepare_edge(config: Config, host: str, allow_unauthenticated_remote: bool) -> EdgePolicy:
    """The edge policy for serving on `host`; refuses a non-loopback bind without tokens unless allowed."""
    policy = EdgePolicy.load(config, host)
    if not policy.tokens and policy.oauth is None and not is_loopback(host) and not allow_unauthenticated_remote:
        raise MuxError(
            f"refusing to serve HTTP on {host} without authentication: anyone who can reach that address could "
            f"use every upstream tool. Set [http] auth_token_env or auth_token_file in {config.source} (clients "
            "then send 'Authorization: Bearer <token>'), bind 127.0.0.1, or pass --allow-unauthenticated-remote "
            "if a proxy in front already authenticates"
        )
    return policy
