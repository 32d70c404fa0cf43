"""The HTTP front as an OAuth 2.1 resource server (`[http.oauth]`): which access tokens it takes.

A bearer token that is not one of the static `[http]` tokens is checked once: at the authorization
server's introspection endpoint (RFC 7662), or as a JWT (RFC 9068) signed with one of the keys at
`jwks_uri`. A token that is active, issued for this server (`aud` holding `[http.oauth] audience`),
by the issuer, with the required scopes, is then taken from a cache until it expires
(`CACHE_SECONDS` at most), so the fast path, which checks requests without awaiting anything,
admits it too. The token stays here: an upstream never sees it.
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
import jwt
from cachetools import LRUCache

from mcpmux.core.oauth_settings import ResourceServerSettings
from mcpmux.errors import ConfigError

logger = logging.getLogger(__name__)

CACHE_SECONDS = 60.0
"""Longest a token is taken on one introspection: a revoked token is refused within it."""
REFUSED_SECONDS = 5.0
"""How long an inactive token is refused without asking again."""
METADATA_PATH = "/.well-known/oauth-protected-resource"
JWKS_SECONDS = 300.0
"""How long fetched signing keys are used before they are fetched again."""
REFETCH_SECONDS = 10.0
"""Shortest time between fetches for a key id the keys lack: random ids cannot make mcpmux hammer the issuer."""
_JWT_ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]
"""Public-key signatures only: a token signed with a shared secret, or none, is never taken."""


class TokenChecker:
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
        self._keys: jwt.PyJWKSet | None = None
        self._keys_until = self._refetch_after = 0.0
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
        good, until = await (self._verify(token) if self.settings.jwks_uri else self._introspect(token))
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

    async def _verify(self, token: str) -> tuple[bool, float]:
        """A JWT access token: its signature by one of the issuer's keys, then its claims."""
        now = time.time()
        try:
            key_id = jwt.get_unverified_header(token).get("kid")
            key = await self._signing_key(key_id)
            claims = jwt.decode(
                token,
                key,
                algorithms=_JWT_ALGORITHMS,
                audience=self.settings.audience,
                issuer=self.settings.issuer,
                options={"require": ["exp", "iss", "aud"]},
            )
        except (jwt.PyJWTError, LookupError, httpx2.HTTPError, ValueError) as err:
            logger.info("an OAuth token was refused: %s", type(err).__name__)
            return False, now + REFUSED_SECONDS
        why = self._refusal({**claims, "active": True})
        if why is not None:
            logger.info("an OAuth token was refused: %s", why)
            return False, now + REFUSED_SECONDS
        return True, min(float(claims["exp"]), now + CACHE_SECONDS)

    async def _signing_key(self, key_id: str | None) -> jwt.PyJWK:
        """The issuer's key `key_id` (the only key, when the token names none). Keys are fetched again
        once stale, and for an unknown id (the issuer rotated them) at most every `REFETCH_SECONDS`."""
        if self._keys is None or time.time() >= self._keys_until:
            await self._fetch_keys()
        key = self._key(key_id)
        if key is None and time.time() >= self._refetch_after:
            await self._fetch_keys()
            key = self._key(key_id)
        if key is None:
            raise LookupError(f"no signing key {key_id!r} at {self.settings.jwks_uri}")
        return key

    def _key(self, key_id: str | None) -> jwt.PyJWK | None:
        keys = self._keys.keys if self._keys is not None else []
        if key_id is None:
            return keys[0] if len(keys) == 1 else None
        return next((key for key in keys if key.key_id == key_id), None)

    async def _fetch_keys(self) -> None:
        assert self.settings.jwks_uri is not None
        async with httpx2.AsyncClient(timeout=10.0) as http:
            response = await http.get(self.settings.jwks_uri)
        response.raise_for_status()
        self._keys = jwt.PyJWKSet.from_dict(response.json())
        now = time.time()
        self._keys_until, self._refetch_after = now + JWKS_SECONDS, now + REFETCH_SECONDS

    async def _introspect(self, token: str) -> tuple[bool, float]:
        now = time.time()
        assert self.settings.introspection_endpoint is not None
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
