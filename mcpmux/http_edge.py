"""HTTP edge security: one ASGI middleware in front of everything mcpmux serves over HTTP.

`HttpEdge` wraps the whole app (`/mcp`, `/v1`, `/metrics`) and checks every request, in order:

1. Host and Origin (403): DNS-rebinding protection. Loopback names and the bind host are accepted
   on any port, plus `[http] allowed_hosts` / `allowed_origins`; a request without Origin (any
   non-browser client) passes.
2. Bearer token (401 with `WWW-Authenticate`), when tokens are configured; compared in constant time.
3. Declared body size (413) from Content-Length.
4. Per-client rate limit (429 with `Retry-After`): a token bucket per token, else per client IP.
5. Streamed body size (413): the body is read and counted before the app sees it, so a chunked
   body cannot slip past the limit.
6. Session binding: an `mcp-session-id` opened under one token is refused (404, exactly as the SDK
   answers an unknown session) when another token presents it.

It is pure ASGI (no BaseHTTPMiddleware, which buffers responses and breaks SSE streams). Refusals
never echo a token or an Authorization header; logs name the check that failed, not header values.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from cachetools import LRUCache
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mcpmux.config import Config
from mcpmux.errors import ConfigError, MuxError

logger = logging.getLogger(__name__)

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
REALM = 'Bearer realm="mcpmux"'
METRICS_PATH = "/metrics"
_SESSION = b"mcp-session-id"
_INVALID_REQUEST = -32600  # JSON-RPC codes, as the SDK's streamable HTTP transport answers refusals
_SERVER_ERROR = -32000
_MAX_BOUND_SESSIONS = 100_000
_READ = frozenset({b"host", b"origin", b"authorization", b"content-length", _SESSION})
_Headers = list[tuple[bytes, bytes]]
_Refusal = tuple[int, str, _Headers]
# OpenAI's error `type` and `code` per status, so OpenAI clients surface refusals as they do OpenAI's own.
_OPENAI_TYPES = {
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "forbidden"),
    404: ("invalid_request_error", "not_found"),
    413: ("invalid_request_error", "request_too_large"),
    429: ("requests", "rate_limit_exceeded"),
}


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


class HttpEdge:
    """The security checks (module docstring) in front of `app`; `mcp_path` gets JSON-RPC error bodies."""

    def __init__(self, app: ASGIApp, policy: EdgePolicy, mcp_path: str | None = None) -> None:
        self.app = app
        self.policy = policy
        self.mcp_path = mcp_path.rstrip("/") if mcp_path else None
        self.limiter = RateLimiter(policy.rate_limit, policy.rate_burst)
        self.session_owners: LRUCache[str, int] = LRUCache(maxsize=_MAX_BOUND_SESSIONS)
        """The token (by index) that opened each session, when tokens are configured."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan; the app serves no websocket routes
            await self.app(scope, receive, send)
            return
        # ASGI servers give header names in lower case; only the few the checks read are decoded.
        headers = {key.decode(): value.decode("latin-1") for key, value in scope["headers"] if key in _READ}
        client = self.policy.client_of(headers.get("authorization")) if self.policy.tokens else None
        refusal = self._check_headers(scope, headers, client) or self._check_rate(_client_key(scope, client))
        if refusal is not None:
            await self._refuse(scope, send, *refusal)
            return
        body = await _read_body(receive, self.policy.max_body_bytes)
        if body is None:
            await self._refuse(scope, send, 413, self._too_large())
            return
        replay = _replaying(body, receive)
        session = headers.get(_SESSION.decode())
        if client is None or not self._is_mcp(scope):
            await self.app(scope, replay, send)
        elif session is None:
            await self.app(scope, replay, self._binding(send, client))
        elif self.session_owners.get(session) != client:
            # The SDK's answer to an unknown session (and the edge's, to ids it never saw opened under a
            # token): nothing tells a client that another's session exists.
            await self._refuse(scope, send, 404, "Session not found")
        else:
            await self.app(scope, replay, send)
            if scope["method"] == "DELETE":
                self.session_owners.pop(session, None)

    def _check_headers(self, scope: Scope, headers: dict[str, str], client: int | None) -> _Refusal | None:
        """Host/Origin (403), token (401) and declared size (413): the checks that need no body."""
        if not self.policy.host_allowed(headers.get("host")):
            return 403, "Host header not allowed (DNS-rebinding protection): add it to [http] allowed_hosts", []
        if not self.policy.origin_allowed(headers.get("origin")):
            return 403, "Origin not allowed (DNS-rebinding protection): add it to [http] allowed_origins", []
        metrics_open = not self.policy.metrics_auth and scope["path"].rstrip("/") == METRICS_PATH
        if self.policy.tokens and client is None and not metrics_open:
            if "authorization" not in headers:
                problem = "this server needs a bearer token: send 'Authorization: Bearer <token>'"
                return 401, problem, [(b"www-authenticate", REALM.encode())]
            challenge = f'{REALM}, error="invalid_token"'.encode()
            return 401, "the bearer token was not accepted", [(b"www-authenticate", challenge)]
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.policy.max_body_bytes:
            return 413, self._too_large(), []
        return None

    def _check_rate(self, key: str) -> _Refusal | None:
        wait = self.limiter.take(key, time.monotonic())
        if wait <= 0:
            return None
        seconds = str(max(1, math.ceil(wait)))
        message = (
            f"rate limit of {self.policy.rate_limit:g} requests/s ([http] rate_limit) exceeded: retry in {seconds} s"
        )
        return 429, message, [(b"retry-after", seconds.encode())]

    def _too_large(self) -> str:
        return f"the request body is larger than the {self.policy.max_body_bytes} byte limit ([http] max_body_bytes)"

    def _is_mcp(self, scope: Scope) -> bool:
        return self.mcp_path is not None and scope["path"].rstrip("/") == self.mcp_path

    def _binding(self, send: Send, client: int) -> Send:
        """`send`, recording which token opened the session a response announces."""

        async def record(message: Message) -> None:
            if message["type"] == "http.response.start":
                session = next((value for key, value in message.get("headers", []) if key.lower() == _SESSION), None)
                if session is not None:
                    self.session_owners[session.decode("latin-1")] = client
            await send(message)

        return record

    async def _refuse(self, scope: Scope, send: Send, status: int, message: str, extra: _Headers | None = None) -> None:
        path = scope["path"]
        logger.info("refused %s %s: HTTP %d, %s", scope["method"], path, status, message)
        payload: object
        if self._is_mcp(scope):
            code = _SERVER_ERROR if status == 429 else _INVALID_REQUEST
            payload = {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}
        elif path == "/v1" or path.startswith("/v1/"):
            kind, code_name = _OPENAI_TYPES[status]
            payload = {"error": {"message": message, "type": kind, "param": None, "code": code_name}}
        else:
            payload = {"error": message}
        body = json.dumps(payload, separators=(",", ":")).encode()  # compact, as the SDK writes its errors
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *(extra or [])]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


@dataclass(slots=True)
class _Bucket:
    tokens: float
    stamp: float


class RateLimiter:
    """Token buckets per client key: `burst` requests at once, refilled at `rate` per second (0: no limit)."""

    def __init__(self, rate: float, burst: int, max_clients: int = 10_000) -> None:
        self.rate = rate
        self.burst = burst
        self.buckets: LRUCache[str, _Bucket] = LRUCache(maxsize=max_clients)

    def take(self, key: str, now: float) -> float:
        """Spend one request of `key`'s bucket: 0 when allowed, else the seconds until one is available."""
        if self.rate <= 0:
            return 0.0
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = _Bucket(float(self.burst), now)
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.stamp) * self.rate)
        bucket.stamp = now
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return 0.0
        return (1 - bucket.tokens) / self.rate


def _client_key(scope: Scope, client: int | None) -> str:
    if client is not None:
        return f"token:{client}"
    peer = scope.get("client")
    return f"ip:{peer[0] if peer else 'unknown'}"


async def _read_body(receive: Receive, limit: int) -> list[Message] | None:
    """The request's messages up to the end of its body, or None once it passes `limit` bytes."""
    messages: list[Message] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages
        size += len(message.get("body", b""))
        if size > limit:
            return None
        if not message.get("more_body", False):
            return messages


def _replaying(messages: list[Message], receive: Receive) -> Receive:
    """A `receive` that gives back the messages already read, then reads on."""
    pending = list(messages)

    async def replay() -> Message:
        return pending.pop(0) if pending else await receive()

    return replay
