"""The HTTP front as an OAuth 2.1 resource server (`[http.oauth]`): which access tokens it takes.

A bearer token that is not one of the static `[http]` tokens is asked about at the authorization
server's introspection endpoint (RFC 7662) once; an active token issued for this server (`aud`
holding `[http.oauth] audience`, `iss` the issuer where given, the required scopes) is then taken
from a cache until it expires (`CACHE_SECONDS` at most), so the fast path, which checks requests
without awaiting anything, admits it too. The token stays here: an upstream never sees it.
`/.well-known/oauth-protected-resource` (RFC 9728) names the audience and the issuer, and a
refusal's `WWW-Authenticate` points to it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from urllib.parse import urlsplit

import httpx2
from cachetools import LRUCache

from mcpmux.core.oauth_settings import ResourceServerSettings
from mcpmux.errors import ConfigError

logger = logging.getLogger(__name__)

CACHE_SECONDS = 60.0
"""Longest a token is taken on one introspection: a revoked token is refused within it."""
REFUSED_SECONDS = 5.0
"""How long an inactive token is refused without asking again."""
METADATA_PATH = "/.well-known/oauth-protected-resource"


class TokenIntrospector:
    """Checks OAuth access tokens against `[http.oauth]` and keeps the answers."""

    def __init__(self, settings: ResourceServerSettings, source: str = "<config>") -> None:
        self.settings = settings
        self._secret: str | None = None
        if settings.client_secret_env is not None:
            self._secret = os.environ.get(settings.client_secret_env)
            if not self._secret:
                raise ConfigError(
                    f"{source}: http.oauth.client_secret_env: environment variable {settings.client_secret_env} "
                    "is not set (set it to the secret of mcpmux's client at the authorization server)"
                )
        self._answers: LRUCache[bytes, tuple[bool, float]] = LRUCache(maxsize=10_000)
        parts = urlsplit(settings.audience)
        self.metadata_url = f"{parts.scheme}://{parts.netloc}{METADATA_PATH}{parts.path.rstrip('/')}"
        self.metadata_paths = frozenset({METADATA_PATH, METADATA_PATH + parts.path.rstrip("/")})

    def admits(self, authorization: str | None) -> bool:
        """Whether the header carries a token already found good and not yet expired (no I/O)."""
        key = _key(authorization)
        answer = self._answers.get(key) if key is not None else None
        return answer is not None and answer[0] and time.time() < answer[1]

    async def check(self, authorization: str | None) -> None:
        """Introspect the header's token unless an answer about it is still fresh (`admits` reads it)."""
        key = _key(authorization)
        if key is None or (key in self._answers and time.time() < self._answers[key][1]):
            return
        token = (authorization or "").strip().partition(" ")[2].strip()
        good, until = await self._introspect(token)
        self._answers[key] = (good, until)

    def challenge(self, invalid: bool) -> bytes:
        """`WWW-Authenticate` for a refusal: where the metadata is, and `invalid_token` for a token refused."""
        error = ', error="invalid_token"' if invalid else ""
        return f'Bearer resource_metadata="{self.metadata_url}"{error}'.encode()

    def metadata(self) -> bytes:
        document = {
            "resource": self.settings.audience,
            "authorization_servers": [self.settings.issuer],
            "bearer_methods_supported": ["header"],
        }
        if self.settings.scopes:
            document["scopes_supported"] = self.settings.scopes
        return json.dumps(document).encode()

    async def _introspect(self, token: str) -> tuple[bool, float]:
        now = time.time()
        data = {"token": token, "token_type_hint": "access_token"}
        auth = None
        if self.settings.client_id is not None:
            if self._secret is None:
                data["client_id"] = self.settings.client_id
            else:
                auth = httpx2.BasicAuth(self.settings.client_id, self._secret)
        try:
            async with httpx2.AsyncClient(timeout=10.0, auth=auth) as http:
                response = await http.post(self.settings.introspection_endpoint, data=data)
            answer = response.json() if response.status_code == 200 else {}
        except (httpx2.HTTPError, ValueError) as err:
            logger.warning("token introspection at %s failed: %s", self.settings.introspection_endpoint, err)
            return False, now  # not kept: the next request asks again
        why = self._refusal(answer if isinstance(answer, dict) else {})
        if why is not None:
            logger.info("an OAuth token was refused: %s", why)
            return False, now + REFUSED_SECONDS
        expires = float(answer.get("exp") or now + CACHE_SECONDS)
        return True, min(expires, now + CACHE_SECONDS)

    def _refusal(self, answer: dict[str, object]) -> str | None:
        """Why an introspection answer does not admit its token; None when it does."""
        if answer.get("active") is not True:
            return "not active"
        audiences = answer.get("aud")
        listed = audiences if isinstance(audiences, list) else [audiences]
        if self.settings.audience.rstrip("/") not in {str(aud).rstrip("/") for aud in listed if aud}:
            return f"issued for {audiences!r}, not {self.settings.audience}"
        issuer = answer.get("iss")
        if issuer is not None and str(issuer).rstrip("/") != self.settings.issuer.rstrip("/"):
            return f"issued by {issuer!r}, not {self.settings.issuer}"
        granted = set(str(answer.get("scope") or "").split())
        missing = [scope for scope in self.settings.scopes if scope not in granted]
        return f"missing scopes {missing}" if missing else None


def _key(authorization: str | None) -> bytes | None:
    """What the cache keeps for a bearer token: its digest, never the token."""
    scheme, _, presented = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        return None
    return hashlib.sha256(presented.strip().encode()).digest()
