"""HTTP edge security: one ASGI middleware in front of everything mcpmux serves over HTTP.

`HttpEdge` wraps the whole app (`/mcp`, `/v1`, `/metrics`, the dashboard) and checks every request, in order:

1. Host and Origin (403): DNS-rebinding protection. Loopback names and the bind host are accepted
   on any port, plus `[http] allowed_hosts` / `allowed_origins`; a request without Origin (any
   non-browser client) passes.
2. Bearer token (401 with `WWW-Authenticate`), when tokens are configured; compared in constant time.
   Two things pass without one: `/metrics` where `[http] metrics_auth = false`, and the dashboard's
   page at `/` (static, no data in it: its state, `/dashboard/state`, needs the token like `/mcp`).
3. Declared body size (413) from Content-Length.
4. Per-client rate limit (429 with `Retry-After`): a token bucket per token, else per client IP.
5. Streamed body size (413): the body is read and counted before the app sees it, so a chunked
   body cannot slip past the limit.
6. Profiles (`[profiles.NAME]`): `<path>/NAME` serves profile NAME (an unknown NAME: 404 naming the
   defined ones), `<path>` the whole catalog; a token bound to a profile sees only that profile, on
   `<path>` or its own `<path>/NAME` (another profile's path: 403). The request goes on to `<path>`
   with the profile in its scope (`PROFILE_SCOPE`), which the front and the fast path read. Any
   other request has its token's profile there, if it is bound to one (the dashboard refuses it).
7. Session binding: an `mcp-session-id` opened under one token or profile is refused (404, exactly
   as the SDK answers an unknown session) when another token or profile presents it.

It is pure ASGI (no BaseHTTPMiddleware, which buffers responses and breaks SSE streams). Refusals
never echo a token or an Authorization header; logs name the check that failed, not header values.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from cachetools import LRUCache
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mcpmux.core.config import Config
from mcpmux.server.http.edge_policy import EdgePolicy
from mcpmux.server.http.oauth_resource import TokenChecker

logger = logging.getLogger(__name__)

REALM = 'Bearer realm="mcpmux"'
METRICS_PATH = "/metrics"
DASHBOARD_PATH = "/"
"""The dashboard's page (`mcpmux.server.http.dashboard`): served without a token, as it holds no data."""
PROFILE_SCOPE = "mcpmux.profile"
"""The ASGI scope key holding an MCP request's profile name (None: the whole catalog)."""
_SESSION = b"mcp-session-id"
_INVALID_REQUEST = -32600  # JSON-RPC codes, as the SDK's streamable HTTP transport answers refusals
_SERVER_ERROR = -32000
_MAX_BOUND_SESSIONS = 100_000
_READ = frozenset({b"host", b"origin", b"authorization", b"content-length", _SESSION})
_Headers = list[tuple[bytes, bytes]]
_Refusal = tuple[int, str, _Headers]
_Owner = tuple[int | None, str | None]
# OpenAI's error `type` and `code` per status, so OpenAI clients surface refusals as they do OpenAI's own.
_OPENAI_TYPES = {
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "forbidden"),
    404: ("invalid_request_error", "not_found"),
    413: ("invalid_request_error", "request_too_large"),
    429: ("requests", "rate_limit_exceeded"),
}


class HttpEdge:
    """The security checks (module docstring) in front of `app`; `mcp_path` gets JSON-RPC error bodies."""

    def __init__(
        self,
        app: ASGIApp,
        policy: EdgePolicy,
        mcp_path: str | None = None,
        config: Callable[[], Config] | None = None,
    ) -> None:
        """`config`: the running config; when a reload replaces it, the profiles and their tokens are read
        again (`EdgePolicy.reloaded`) before the next request is checked."""
        self.app = app
        self.policy = policy
        self._config = config
        self._followed = config() if config is not None else None
        self.mcp_path = mcp_path.rstrip("/") if mcp_path else None
        self.limiter = RateLimiter(policy.rate_limit, policy.rate_burst)
        self.binds = bool(policy.tokens or policy.profiles)
        """Whether sessions are bound to the token and profile that opened them."""
        self.session_owners: LRUCache[str, _Owner] = LRUCache(maxsize=_MAX_BOUND_SESSIONS)
        """The token (by index) and profile that opened each session, when tokens or profiles are configured."""
        self.oauth = TokenChecker(policy.oauth) if policy.oauth is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan; the app serves no websocket routes
            await self.app(scope, receive, send)
            return
        headers, client = self._read(scope)
        if self.oauth is not None:
            if scope["path"].rstrip("/") in self.oauth.metadata_paths:
                await _send_json(send, 200, self.oauth.metadata())
                return
            if client is None:
                await self.oauth.check(headers.get("authorization"))  # `_check_headers` reads the answer
        refusal = (
            self._check_headers(scope, headers, client)
            or self._check_profile(scope, client)
            or self._check_rate(_client_key(scope, client))
        )
        if refusal is not None:
            await self._refuse(scope, send, *refusal)
            return
        body = await _read_body(receive, self.policy.max_body_bytes)
        if body is None:
            await self._refuse(scope, send, 413, self._too_large())
            return
        replay = _replaying(body, receive)
        session = headers.get(_SESSION.decode())
        mcp = self._is_mcp(scope)
        if not mcp:
            scope[PROFILE_SCOPE] = self.policy.token_profiles[client] if client is not None else None
        owner = (client, self._enter(scope, client)) if mcp else (client, None)
        if not self.binds or not mcp:
            await self.app(scope, replay, send)
        elif session is None:
            await self.app(scope, replay, self._binding(send, owner))
        elif self.session_owners.get(session) != owner:
            # The SDK's answer to an unknown session (and the edge's, to ids it never saw opened under a
            # token): nothing tells a client that another's session exists.
            await self._refuse(scope, send, 404, "Session not found")
        else:
            await self.app(scope, replay, send)
            if scope["method"] == "DELETE":
                self.session_owners.pop(session, None)

    def admits(self, scope: Scope, body_size: int) -> bool:
        """Whether an MCP request whose body the HTTP protocol held, its headers passed already
        (`refuses_at_once`, before the body, as `__call__` checks them), passes the checks that remain
        (its request counted against the rate limit); if not, `__call__` must see it, to word the refusal."""
        headers, client = self._read(scope)
        if body_size > self.policy.max_body_bytes:
            return False
        session = headers.get(_SESSION.decode())
        owner = (client, self._enter(scope, client))
        if self.binds and session is not None and self.session_owners.get(session) != owner:
            return False
        return self._check_rate(_client_key(scope, client)) is None

    def refuses_at_once(self, scope: Scope) -> bool:
        """Whether `__call__` refuses the request on its headers alone (the rate limit aside, and not counted)."""
        headers, client = self._read(scope)
        return (self._check_headers(scope, headers, client) or self._check_profile(scope, client)) is not None

    def enter(self, scope: Scope) -> None:
        """Put an MCP request's profile in its scope (`PROFILE_SCOPE`), its path made `<path>`, as
        `__call__` does; for a request served below ASGI whose checks passed (`refuses_at_once`)."""
        if self.binds and self._is_mcp(scope):
            self._enter(scope, self._read(scope)[1])

    def _named_profile(self, scope: Scope) -> str | None:
        """NAME, for a request to `<path>/NAME`."""
        head, _, name = scope["path"].rstrip("/").rpartition("/")
        return name if self.mcp_path is not None and head == self.mcp_path and name else None

    def _check_profile(self, scope: Scope, client: int | None) -> _Refusal | None:
        """An unknown profile's path (404), or another profile's than the token's (403)."""
        named = self._named_profile(scope)
        if named is None:
            return None
        path = self.mcp_path
        if named not in self.policy.profiles:
            defined = ", ".join(sorted(self.policy.profiles)) or "none"
            return (
                404,
                (
                    f"no profile {named!r} is defined (profiles defined: {defined}); {path}/NAME serves "
                    f"[profiles.NAME], {path} every tool"
                ),
                [],
            )
        bound = self.policy.token_profiles[client] if client is not None else None
        if bound is not None and bound != named:
            return (
                403,
                (f"this bearer token is bound to profile {bound!r}: use {path} or {path}/{bound}, not {path}/{named}"),
                [],
            )
        return None

    def _enter(self, scope: Scope, client: int | None) -> str | None:
        """The request's profile (its token's, else its path's), put in its scope; its path made `<path>`."""
        named = self._named_profile(scope)
        if named is not None and self.mcp_path is not None:
            scope["path"], scope["raw_path"] = self.mcp_path, self.mcp_path.encode()
        bound = self.policy.token_profiles[client] if client is not None else None
        profile = scope[PROFILE_SCOPE] = bound or named
        return profile

    def _read(self, scope: Scope) -> tuple[dict[str, str], int | None]:
        """The headers the checks read, and which configured token the request carries (None: none, or none set)."""
        if self._config is not None and (config := self._config()) is not self._followed:
            self._followed = config
            self.policy = self.policy.reloaded(config)
            self.binds = bool(self.policy.tokens or self.policy.profiles)
        # ASGI servers give header names in lower case; only the few the checks read are decoded.
        headers = {key.decode(): value.decode("latin-1") for key, value in scope["headers"] if key in _READ}
        return headers, self.policy.client_of(headers.get("authorization")) if self.policy.tokens else None

    def _check_headers(self, scope: Scope, headers: dict[str, str], client: int | None) -> _Refusal | None:
        """Host/Origin (403), token (401), declared size (413), one session id (400): the checks that need no body."""
        if sum(key == _SESSION for key, _ in scope["headers"]) > 1:
            # Which one would count? The SDK reads the first, session binding the last: neither may be trusted.
            return 400, "more than one Mcp-Session-Id header", []
        if not self.policy.host_allowed(headers.get("host")):
            return 403, "Host header not allowed (DNS-rebinding protection): add it to [http] allowed_hosts", []
        if not self.policy.origin_allowed(headers.get("origin")):
            return 403, "Origin not allowed (DNS-rebinding protection): add it to [http] allowed_origins", []
        metrics_open = not self.policy.metrics_auth and scope["path"].rstrip("/") == METRICS_PATH
        page = scope["path"] == DASHBOARD_PATH and scope["method"] in ("GET", "HEAD")
        oauth = self.oauth
        needs_token = bool(self.policy.tokens) or oauth is not None
        if needs_token and client is None and not metrics_open and not page:
            if oauth is not None and oauth.admits(headers.get("authorization")):
                return None
            if "authorization" not in headers:
                problem = "this server needs a bearer token: send 'Authorization: Bearer <token>'"
                return 401, problem, [(b"www-authenticate", self._challenge(invalid=False))]
            return 401, "the bearer token was not accepted", [(b"www-authenticate", self._challenge(invalid=True))]
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.policy.max_body_bytes:
            return 413, self._too_large(), []
        return None

    def _challenge(self, *, invalid: bool) -> bytes:
        """`WWW-Authenticate` for a 401: with `[http.oauth]`, where its metadata is (RFC 9728)."""
        if self.oauth is not None:
            return self.oauth.challenge(invalid)
        return f'{REALM}, error="invalid_token"'.encode() if invalid else REALM.encode()

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
        """Whether the request is to `<path>` or to a profile's `<path>/NAME`."""
        on_path = self.mcp_path is not None and scope["path"].rstrip("/") == self.mcp_path
        return on_path or self._named_profile(scope) is not None

    def _binding(self, send: Send, client: _Owner) -> Send:
        """`send`, recording which token and profile opened the session a response announces."""

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


async def _send_json(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
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
